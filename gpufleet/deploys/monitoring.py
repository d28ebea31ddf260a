"""The monitoring host(s): Prometheus, Alertmanager and Grafana from the same inventory as the GPU nodes.

Run against the whole inventory (``pyinfra INVENTORY deploys/monitoring.py``): the hosts of the ``monitoring``
group get the services; the other hosts are only read as data (scrape targets). Every host's gpufleet settings
(``gpufleet_*``, ``gpufleet_monitoring_*``) are validated, and the rendered Prometheus and Alertmanager
configurations are checked with the control machine's ``promtool`` / ``amtool`` when installed, before any host
is changed. On the host, ``promtool check config`` / ``amtool check-config`` run before every reload: a broken
configuration is never loaded.
"""

from __future__ import annotations

import io
import posixpath
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from gpufleet import interruption
from gpufleet.config import ConfigError, ConfigErrors, NodeConfig, validate_pyinfra_inventory
from gpufleet.masking import mask_urls
from gpufleet.monitoring import render, rules
from gpufleet.monitoring.config import MonitoringSettings, check_monitoring_host, load_monitoring_settings, seconds
from gpufleet.operations import apt_lists
from gpufleet.operations.files import managed_file, secret_file

from ._inputs import InputError

MONITORING_GROUP = "monitoring"
PROMETHEUS_PACKAGES = ("prometheus", "prometheus-alertmanager")
PROMETHEUS_CONFIG = f"{render.PROMETHEUS_DIR}/prometheus.yml"
ALERTMANAGER_CONFIG = f"{render.PROMETHEUS_DIR}/alertmanager.yml"
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
ALERTMANAGER_DEFAULTS = "/etc/default/prometheus-alertmanager"
ALERTMANAGER_GROUP = "prometheus"  # the service's group (Debian's package: adduser --system --group prometheus)
GRAFANA_KEYRING = "/etc/apt/keyrings/grafana.asc"
GRAFANA_SOURCE = "/etc/apt/sources.list.d/grafana.list"
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"

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
        out.append(render.Target(host=h.name, address=h.data.get("ssh_hostname") or h.name,
                                 groups=tuple(sorted(g for g in h.groups if g != MONITORING_GROUP and g not in broad)),
                                 config=configs[h.name], target=target_settings[h.name]))
    return out


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
            errors += check_monitoring_host(h.name, settings, data)
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


def prometheus_stage(settings: MonitoringSettings, targets) -> None:
    apt_lists.packages(name="Prometheus and Alertmanager (distribution packages)", packages=list(PROMETHEUS_PACKAGES),
                       no_recommends=True)
    prom_args = (f"--web.listen-address={settings.prometheus_listen} "
                 f"--storage.tsdb.retention.time={settings.retention}")
    am_args = f"--web.listen-address={settings.alertmanager_listen} --cluster.listen-address="
    defaults = [
        _put(PROMETHEUS_DEFAULTS, f"# Managed by gpufleet\nARGS={shlex.quote(prom_args)}\n", PROMETHEUS_DEFAULTS),
        _put(ALERTMANAGER_DEFAULTS, f"# Managed by gpufleet\nARGS={shlex.quote(am_args)}\n", ALERTMANAGER_DEFAULTS),
    ]
    alertmanager = f"localhost:{settings.alertmanager_listen.rsplit(':', 1)[1]}"
    prom_files = [_put(PROMETHEUS_CONFIG, render.prometheus_config(settings, alertmanager), PROMETHEUS_CONFIG)]
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
                 commands=[f"{check} && systemctl restart prometheus"], _if=any_changed(defaults[0]))
    server.shell(name="promtool check config, then reload Prometheus",
                 commands=[f"{check} && systemctl reload prometheus"],
                 _if=lambda: any(op.did_change() for op in prom_files) and not defaults[0].did_change())
    am_check = f"amtool check-config {ALERTMANAGER_CONFIG}"
    server.shell(name="amtool check-config, then restart Alertmanager",
                 commands=[f"{am_check} && systemctl restart prometheus-alertmanager"],
                 _if=lambda: defaults[1].did_change() or am_files[0].did_change())
    for unit in ("prometheus", "prometheus-alertmanager"):
        systemd.service(name=f"{unit} enabled and running", service=unit, running=True, enabled=True)


def grafana_stage(settings: MonitoringSettings) -> None:
    url = settings.grafana_repo_url.split()[0]
    apt.key(name="Grafana repository key", src=f"{url.rstrip('/')}/gpg.key", dest=GRAFANA_KEYRING)
    apt.repo(name="Grafana repository", src=f"deb [signed-by={GRAFANA_KEYRING}] {settings.grafana_repo_url}",
             filename="grafana")
    apt_lists.packages(name="Grafana", packages=["grafana"], no_recommends=False)
    prometheus_url = f"http://localhost:{settings.prometheus_listen.rsplit(':', 1)[1]}"
    address, port = settings.grafana_listen.rsplit(":", 1)
    changed = [
        _put("Grafana datasource", render.grafana_datasource(prometheus_url),
             f"{GRAFANA_PROVISIONING}/datasources/gpufleet.yml"),
        _put("Grafana dashboard provider", render.grafana_dashboard_provider(),
             f"{GRAFANA_PROVISIONING}/dashboards/gpufleet.yml"),
        *(_put(f"Grafana dashboard {name}", render.dashboard(name), f"{render.GRAFANA_DASHBOARD_DIR}/{name}")
          for name in render.DASHBOARDS),
        files.put(name="Grafana admin password and listen address", dest="/etc/default/grafana-server",
                  src=io.StringIO("# Managed by gpufleet\n"
                                  f"GF_SECURITY_ADMIN_PASSWORD={shlex.quote(settings.grafana_admin_password)}\n"
                                  f"GF_SERVER_HTTP_ADDR={address.strip('[]')}\nGF_SERVER_HTTP_PORT={port}\n"),
                  mode="640", user="root", group="grafana"),
    ]
    systemd.service(name="grafana-server enabled and running", service="grafana-server", running=True,
                    enabled=True)
    server.shell(name="restart Grafana (provisioning changed)", commands=["systemctl restart grafana-server"],
                 _if=any_changed(*changed))


@deploy("gpufleet: monitoring")
def monitoring() -> None:
    interruption.install(host.state)  # SIGINT/SIGTERM/SIGHUP: exit 130/143/129 naming the hosts mid-change
    _configs, monitoring_hosts, targets = validated()
    if host.name not in monitoring_hosts:
        return
    settings = monitoring_hosts[host.name]
    prometheus_stage(settings, targets)
    if settings.grafana:
        grafana_stage(settings)
