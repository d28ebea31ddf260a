"""The monitoring host(s): Prometheus, Alertmanager and Grafana from the same inventory as the GPU nodes.

Run against the whole inventory (``pyinfra INVENTORY deploys/monitoring.py``): the hosts of the ``monitoring``
group get the services; the other hosts are only read as data (scrape targets). Every host's gpufleet settings
(``gpufleet_*``, ``gpufleet_monitoring_*``) are validated, and the rendered Prometheus and Alertmanager
configurations are checked with the control machine's ``promtool`` / ``amtool`` when installed, before any host
is changed. On the host, ``promtool check config`` / ``amtool check-config`` run before every reload: a broken
configuration is never loaded. Grafana (docs/monitoring-grafana.md) is installed from Grafana's repository with its
packaged files left as shipped; gpufleet's settings are ``GF_*`` overrides in a unit drop-in.
"""

from __future__ import annotations

import posixpath
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import server, systemd
from pyinfra.operations.util import any_changed

from gpufleet import _pyinfra, fleet_ca, web_auth
from gpufleet.config import (
    FLEET_CA_FILE,
    FLEET_TLS,
    ConfigError,
    ConfigErrors,
    InputError,
    NodeConfig,
    catalog_model,
    validate_pyinfra_inventory,
)
from gpufleet.control_files import UnsafePath
from gpufleet.facts.files import ManagedState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.system import OsInfo
from gpufleet.masking import mask_urls
from gpufleet.monitoring import render, rules
from gpufleet.monitoring.config import (
    MonitoringSettings,
    check_monitoring_host,
    load_monitoring_settings,
    seconds,
    tls_files_of,
)
from gpufleet.operations import apt_lists, grafana
from gpufleet.operations.files import managed_file, secret_file

MONITORING_GROUP = "monitoring"
PROMETHEUS_PACKAGES = ("prometheus", "prometheus-alertmanager")
PROMETHEUS_CONFIG = f"{render.PROMETHEUS_DIR}/prometheus.yml"
ALERTMANAGER_CONFIG = f"{render.PROMETHEUS_DIR}/alertmanager.yml"
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
ALERTMANAGER_DEFAULTS = "/etc/default/prometheus-alertmanager"
ALERTMANAGER_GROUP = "prometheus"  # the service's group (Debian's package: adduser --system --group prometheus)
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"  # PROVISIONING_CFG_DIR of the packaged /etc/default file
GRAFANA_SOURCE = "/etc/apt/sources.list.d/grafana.list"
GRAFANA_KEY_FILE = "gpg-full.key"  # Grafana publishes its key at https://apt.grafana.com/gpg-full.key
GRAFANA_DROPIN = "/etc/systemd/system/grafana-server.service.d/gpufleet.conf"
# Grafana reads <provisioning>/datasources/*.yml and <provisioning>/dashboards/*.yml (tests/reference/upstream/grafana)
GRAFANA_DATASOURCE = f"{GRAFANA_PROVISIONING}/datasources/gpufleet.yml"
GRAFANA_DASHBOARD_PROVIDER = f"{GRAFANA_PROVISIONING}/dashboards/gpufleet.yml"
GRAFANA_GROUP = "grafana"  # the packaged grafana-server's group

_validated: dict[int, tuple[dict[str, NodeConfig], dict[str, MonitoringSettings], list[render.Target]]] = {}


def _in_monitoring(h) -> bool:
    return MONITORING_GROUP in h.groups


def _targets(configs, target_settings) -> list[render.Target]:
    everyone = {h.name for h in inventory}
    # groups that hold every host (pyinfra's group named after the inventory file) tell hosts apart no better
    # than "all": they are left out of the group label
    broad = {g for h in inventory for g in h.groups if {x.name for x in inventory.get_group(g)} == everyone}
    out = []
    for h in inventory:
        if _in_monitoring(h) or not configs[h.name].stage_enabled("exporters"):
            continue
        target = target_settings[h.name]
        if not target.gpu_model:
            target = replace(target, gpu_model=gpu_model_of(h))
        out.append(render.Target(host=h.name, address=h.data.get("ssh_hostname") or h.name,
                                 groups=tuple(sorted(g for g in h.groups if g != MONITORING_GROUP and g not in broad)),
                                 config=configs[h.name], target=target))
    return out


def gpu_model_of(node) -> str:
    """The catalog key of the GPUs nvidia-smi reports on ``node`` (the ``gpu_model`` label where the inventory
    does not set one): what the node has, not what its group's name suggests. Several models on one node: their
    keys joined with ``+``; no GPU seen (no driver yet) or a GPU the catalog does not know: empty, and Prometheus
    drops the label."""
    names = sorted({gpu["name"] for gpu in node.get_fact(GpuInventory)["gpus"] if gpu.get("name")})
    keys = [model.key for model in (catalog_model(name) for name in names) if model is not None]
    return "+".join(sorted(set(keys))) if len(keys) == len(names) else ""


def _check_with_tools(name: str, settings: MonitoringSettings, targets) -> list[str]:
    """promtool / amtool on the rendered files, on the control machine (skipped where not installed)."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-monitoring-") as tmp:
        base = Path(tmp)
        if shutil.which("promtool"):
            paths = []
            for file_name, text in rule_files(settings, targets).items():
                (base / file_name).write_text(text)
                paths.append(str(base / file_name))
            result = subprocess.run(["promtool", "check", "rules", *paths], capture_output=True, text=True,
                                    timeout=120)
            if result.returncode != 0:
                problems.append(f"{name}: promtool check rules failed: {result.stdout}{result.stderr}")
        if shutil.which("amtool"):
            path = base / "alertmanager.yml"
            path.write_text(render.alertmanager_config(settings))
            result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True,
                                    timeout=60)
            if result.returncode != 0:
                # amtool may quote the receivers' URLs (their tokens) back
                problems.append(f"{name}: amtool check-config failed: {mask_urls(result.stdout + result.stderr)}")
    return problems


def validated():
    """(node configs, monitoring settings of the monitoring hosts, scrape targets); the first call validates
    every host of the inventory and raises InputError with every problem."""
    key = id(inventory)
    if key in _validated:
        return _validated[key]
    errors: list[ConfigError] = []
    try:
        configs = validate_pyinfra_inventory(inventory)
    except ConfigErrors as error:
        errors += error.errors
        configs = {}
    monitoring: dict[str, MonitoringSettings] = {}
    target_settings = {}
    for h in inventory:
        data = h.data.dict()
        settings, target, host_errors = load_monitoring_settings(h.name, data)
        errors += host_errors
        if settings is None:
            continue
        target_settings[h.name] = target
        if _in_monitoring(h):
            tls = sorted({path for _, path in tls_files_of(settings)})  # read only where TLS is set
            files = (h.get_fact(ManagedState, paths=tuple(tls)).get("files") or {}) if tls else None
            errors += check_monitoring_host(h.name, settings, data, h.get_fact(OsInfo).get("addresses") or [], files)
            monitoring[h.name] = settings
    if not errors and not monitoring:
        raise InputError(f"no host in the inventory's '{MONITORING_GROUP}' group: nothing to deploy "
                         "(add the monitoring host to a group named monitoring)")
    if errors:
        raise InputError(f"invalid configuration, no host was changed:\n{ConfigErrors(errors)}")
    targets = _targets(configs, target_settings)
    problems = [p for name, s in monitoring.items() for p in _check_with_tools(name, s, targets)]
    if problems:
        raise InputError("invalid monitoring configuration, no host was changed:\n" + "\n".join(problems))
    _validated[key] = (configs, monitoring, targets)
    return _validated[key]


def rule_files(settings: MonitoringSettings, targets) -> dict[str, str]:
    """{file name: text} of the rule files for this monitoring host's settings."""
    source = "the inventory (deploys/monitoring.py)"
    return {
        rules.RECORDING_FILE: rules.dump(rules.recording_rules(
            verify_max_age_s=int(seconds(settings.verify_max_age))), source),
        rules.ALERTS_FILE: rules.dump(rules.alert_rules(settings.alert_for), source),
        rules.INVENTORY_FILE: rules.dump(rules.inventory_rules(render.expected_gpus(targets)), source),
    }


def _put(name: str, text: str, dest: str, mode: str = "644"):
    return managed_file(name=name, path=dest, content=text, mode=mode)  # files.put's upload name is predictable


def passwords() -> dict[str, str]:
    """{account: password} of the monitoring plane (gpufleet.web_auth), generated on first use."""
    try:
        return {account: web_auth.password(account) for account in web_auth.ACCOUNTS}
    except UnsafePath as error:
        raise InputError(f"the monitoring credentials: {error}") from None


def _web_config(secret: str, tls: dict, people: Mapping[str, str]) -> str:
    """gpufleet's account (its generated password's hash) and the people's accounts of ``*_basic_auth_users``."""
    return web_auth.web_config({**people, web_auth.USER: web_auth.bcrypt_hash(secret, web_auth.USER)},
                               tls_server_config=dict(tls))


def prometheus_stage(settings: MonitoringSettings, targets) -> None:
    apt_lists.packages(name="Prometheus and Alertmanager (distribution packages)", packages=list(PROMETHEUS_PACKAGES),
                       no_recommends=True)
    secrets = passwords()
    fleet_files(settings)
    # basic auth and TLS on both (exporter-toolkit's web configuration: read again on every request, but HTTP or
    # HTTPS is decided at start, so a change restarts), and the passwords Prometheus sends to the exporters, itself
    # and Alertmanager: never shown, 0640 root:prometheus from the start
    web = [secret_file(name=path, path=path, content=_web_config(secrets[account], tls, people), mode="640",
                       group=ALERTMANAGER_GROUP)
           for path, account, tls, people in (
               (render.PROMETHEUS_WEB_CONFIG, "prometheus", settings.prometheus_tls, settings.prometheus_users),
               (render.ALERTMANAGER_WEB_CONFIG, "alertmanager", settings.alertmanager_tls,
                settings.alertmanager_users))]
    for account, path in render.PASSWORD_FILES.items():
        secret_file(name=path, path=path, content=secrets[account] + "\n", mode="640", group=ALERTMANAGER_GROUP)
    prom_args = (f"--web.listen-address={settings.prometheus_listen} "
                 f"--web.config.file={render.PROMETHEUS_WEB_CONFIG} "
                 f"--storage.tsdb.retention.time={settings.retention}")
    am_args = (f"--web.listen-address={settings.alertmanager_listen} "
               f"--web.config.file={render.ALERTMANAGER_WEB_CONFIG} --cluster.listen-address=")
    defaults = [
        _put(PROMETHEUS_DEFAULTS, f"# Managed by gpufleet\nARGS={shlex.quote(prom_args)}\n", PROMETHEUS_DEFAULTS),
        _put(ALERTMANAGER_DEFAULTS, f"# Managed by gpufleet\nARGS={shlex.quote(am_args)}\n", ALERTMANAGER_DEFAULTS),
    ]
    # a changed password file is read at the next scrape or notification (no reload needed)
    prom_files = [_put(PROMETHEUS_CONFIG, render.prometheus_config(settings), PROMETHEUS_CONFIG)]
    for job, groups in render.scrape_targets(targets).items():
        path = f"{render.FILE_SD_DIR}/gpufleet-{job}.json"
        prom_files.append(_put(path, render.file_sd_text(groups), path))
    for file_name, text in rule_files(settings, targets).items():
        path = posixpath.join(render.RULES_DIR, file_name)
        prom_files.append(_put(path, text, path))
    # receiver URLs hold tokens: never shown by --diff/--json, 0640 root:prometheus from the start (Debian's
    # prometheus-alertmanager runs as User=prometheus; its postinst adds the prometheus user and group)
    am_files = [secret_file(name=ALERTMANAGER_CONFIG, path=ALERTMANAGER_CONFIG,
                            content=render.alertmanager_config(settings), mode="640", group=ALERTMANAGER_GROUP)]
    check = f"promtool check config {PROMETHEUS_CONFIG}"
    server.shell(name="promtool check config, then restart Prometheus (its arguments changed)",
                 commands=[f"{check} && systemctl restart prometheus"], _if=any_changed(defaults[0], web[0]))
    server.shell(name="promtool check config, then reload Prometheus",
                 commands=[f"{check} && systemctl reload prometheus"],
                 _if=lambda: (any(op.did_change() for op in prom_files) and not defaults[0].did_change()
                              and not web[0].did_change()))
    am_check = f"amtool check-config {ALERTMANAGER_CONFIG}"
    server.shell(name="amtool check-config, then restart Alertmanager",
                 commands=[f"{am_check} && systemctl restart prometheus-alertmanager"],
                 _if=lambda: defaults[1].did_change() or am_files[0].did_change() or web[1].did_change())
    for unit in ("prometheus", "prometheus-alertmanager"):
        systemd.service(name=f"{unit} enabled and running", service=unit, running=True, enabled=True)


def grafana_dropin(settings: MonitoringSettings) -> str:
    """The unit drop-in that carries gpufleet's Grafana settings as ``GF_<SECTION>_<KEY>`` overrides of
    ``grafana.ini`` (Grafana applies environment overrides over the ini file, then expands ``$__file{}``): the
    package's ``grafana.ini`` and ``/etc/default/grafana-server`` stay as packaged (no conffile prompts on
    upgrades, the user's own ``grafana.ini`` edits keep working). No secret in it: the admin password is read
    from its root:grafana 0640 file."""
    address, port = settings.grafana_listen.rsplit(":", 1)
    overrides = {
        "GF_SERVER_HTTP_ADDR": address.strip("[]"),
        "GF_SERVER_HTTP_PORT": port,
        "GF_SECURITY_ADMIN_PASSWORD": f"$__file{{{grafana.PASSWORD_FILE}}}",
    }
    # systemd's Environment= takes "KEY=VALUE" quoted as a whole; "$" has no meaning there, "%" would
    lines = [f'Environment="{key}={value}"' for key, value in overrides.items()]
    return "# Managed by gpufleet (deploys/monitoring.py)\n[Service]\n" + "\n".join(lines) + "\n"


def grafana_provisioning(settings: MonitoringSettings) -> dict[str, str]:
    """Grafana's provisioning files, {path on the monitoring host: text}: the Prometheus datasource (basic auth as
    the ``prometheus`` account; with Prometheus on the fleet CA's certificate, that CA as the one its certificate
    is checked against) and the provider of gpufleet's dashboards."""
    scheme = "https" if settings.prometheus_tls else "http"
    prometheus_url = f"{scheme}://{render.client_address(settings.prometheus_listen)}"
    fleet_ca_cert = (fleet_ca.ca()[0] if settings.tls_ca_file == FLEET_CA_FILE
                     and settings.prometheus_tls.get("cert_file") == FLEET_TLS["cert_file"] else None)
    return {GRAFANA_DATASOURCE: render.grafana_datasource(prometheus_url, passwords()["prometheus"], fleet_ca_cert),
            GRAFANA_DASHBOARD_PROVIDER: render.grafana_dashboard_provider()}


def grafana_stage(settings: MonitoringSettings) -> None:
    url = settings.grafana_repo_url.split()[0].rstrip("/")
    key = grafana.repository_key(name="Grafana repository key", url=f"{url}/{GRAFANA_KEY_FILE}",
                                 fingerprint=settings.grafana_repo_key_fingerprint,
                                 setting="gpufleet_monitoring_grafana_repo_key_fingerprint")
    # the whole file, as Grafana's instructions write it (a changed URL replaces the line, never adds one)
    source = _put("Grafana repository", render.grafana_apt_source(settings.grafana_repo_url, grafana.KEYRING),
                  GRAFANA_SOURCE)
    # apt's lists are read again after the repository is added: an earlier step's fresh lists do not know it
    installed = _installed("grafana")
    apt_lists.update(name="apt lists with Grafana's repository",
                     _if=lambda: installed and (key.did_change() or source.did_change()))
    apt_lists.packages(name="Grafana", packages=["grafana"], no_recommends=False)  # a checked update first
    grafana.packaged_defaults(name="Grafana's packaged /etc/default/grafana-server")
    files = grafana_provisioning(settings)
    # the datasource holds the prometheus account's password: 0640 root:grafana, never shown
    provisioning = [
        secret_file(name="Grafana datasource", path=GRAFANA_DATASOURCE, mode="640", group=GRAFANA_GROUP,
                    content=files[GRAFANA_DATASOURCE]),
        _put("Grafana dashboard provider", files[GRAFANA_DASHBOARD_PROVIDER], GRAFANA_DASHBOARD_PROVIDER),
        *(_put(f"Grafana dashboard {name}", render.dashboard(name), f"{render.GRAFANA_DASHBOARD_DIR}/{name}")
          for name in render.DASHBOARDS),
    ]
    # before Grafana's first start (which reads the password file) and applied to a Grafana that already exists
    grafana.admin_password(name="Grafana admin password", password=settings.grafana_admin_password)
    dropin = _put("Grafana settings (GF_* overrides of grafana.ini)", grafana_dropin(settings), GRAFANA_DROPIN)
    server.shell(name="restart Grafana (its settings or provisioning changed)",
                 commands=["systemctl daemon-reload && systemctl restart grafana-server"],
                 _if=any_changed(dropin, *provisioning))
    systemd.service(name="grafana-server enabled and running", service="grafana-server", running=True,
                    enabled=True)


def _installed(package: str) -> bool:
    return package in host.get_fact(DebPackages)


@deploy("gpufleet: monitoring")
def monitoring() -> None:
    _pyinfra.install_signal_report(host.state)  # SIGINT/SIGTERM/SIGHUP: exit 130/143/129 naming the hosts mid-change
    _configs, monitoring_hosts, targets = validated()
    if host.name not in monitoring_hosts:
        return
    settings = with_fleet_ca(monitoring_hosts[host.name], targets)
    prometheus_stage(settings, targets)
    if settings.grafana:
        grafana_stage(settings)


def with_fleet_ca(settings: MonitoringSettings, targets) -> MonitoringSettings:
    """The settings with the fleet CA's files where it is used: Prometheus and Alertmanager without a certificate of
    their own (``gpufleet_monitoring_tls_fleet_ca``), and the CA Prometheus checks against where a target or they
    use it (unless ``gpufleet_monitoring_tls_ca_file`` names another)."""
    targets_use_it = any(t.config.exporters.tls_fleet_ca for t in targets)
    if not (settings.tls_fleet_ca or targets_use_it):
        return settings
    own = dict(FLEET_TLS) if settings.tls_fleet_ca else {}
    return replace(settings, prometheus_tls=settings.prometheus_tls or own,
                   alertmanager_tls=settings.alertmanager_tls or own, tls_ca_file=settings.tls_ca_file or FLEET_CA_FILE)


def fleet_files(settings: MonitoringSettings) -> str | None:
    """The fleet CA's certificate on this host (and its own certificate and key where Prometheus or Alertmanager
    use them); returns the CA certificate's text where Prometheus is checked against it (Grafana's datasource)."""
    if settings.tls_ca_file != FLEET_CA_FILE:
        return None
    address = host.data.get("ssh_hostname") or host.name
    try:
        ca_cert, _ = fleet_ca.ca()
        if FLEET_TLS["cert_file"] in (settings.prometheus_tls.get("cert_file"),
                                      settings.alertmanager_tls.get("cert_file")):
            cert, key = fleet_ca.address_certificate(host.name, address)
            _put("this host's fleet certificate", cert, FLEET_TLS["cert_file"])
            secret_file(name="this host's fleet certificate key", path=FLEET_TLS["key_file"], content=key,
                        mode="640", group=ALERTMANAGER_GROUP)
    except UnsafePath as error:
        raise InputError(f"{host.name}: the fleet CA: {error}") from None
    _put("fleet CA certificate", ca_cert, FLEET_CA_FILE)
    return ca_cert if FLEET_TLS["cert_file"] == settings.prometheus_tls.get("cert_file") else None
