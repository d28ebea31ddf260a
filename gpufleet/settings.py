"""Every ``gpufleet_*`` setting in one table: name, parser, default, type, documentation, example, stage.

The parser and the default of each key are the validating module's own (:mod:`gpufleet.config` for the converge
keys, :mod:`gpufleet.verify.settings` for ``gpufleet_verify_*``), read from there, never restated; this table adds
what people read. The settings tables of ``docs/converging.md`` (a summary) and ``docs/configuration.md`` (the
reference) are generated from it::

    python -m gpufleet.settings --markdown          # the summary table on stdout
    python -m gpufleet.settings --write             # rewrite both tables in place
    python -m gpufleet.settings --check             # exit 1 when a table is stale (a unit test runs it)

A key the validators know and this table does not (or the reverse) is an error (:func:`table`), so a new key
cannot ship undocumented.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet import config, connection
from gpufleet.monitoring import config as monitoring_config
from gpufleet.verify import settings as verify_settings

UNSET = "unset"
# a bcrypt hash of a random password nobody knows (a copied example opens no account)
_BCRYPT_EXAMPLE = '{"alice": "$2b$10$X4CP/UzQapI.c8X7Rm1yqOv0el456QV8uX5OP5HLD7EnZwFT7WGPq"}'


@dataclass(frozen=True)
class Setting:
    name: str
    type: str  # allowed values, as people read them
    stage: str  # the stage(s) that use it, or "verify", "all"
    doc: str  # one line
    example: str  # Python source, as in group_data
    parser: Callable[..., Any] | None = None  # the validating function (None: validated as a group, see doc)
    default: Any = None  # the validator's default (None: unset, the node is left alone)
    default_text: str | None = None  # how the default reads where it is not a plain value

    @property
    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        value = self.default
        if value is None:
            return UNSET
        if isinstance(value, bool):
            return f"`{value}`"
        if isinstance(value, tuple):
            value = list(value)
        return f"`{json.dumps(value)}`"


# the listeners' default address (gpufleet.config.management_address)
_MGMT = "the host's management address (`ssh_hostname` when an IP address, else `0.0.0.0`), port "

# name: (type, stage, doc, example, default_text)
_DOCS: dict[str, tuple[str, str, str, str, str | None]] = {
    "gpufleet_config_version": ("int", "all", "the configuration schema this inventory is written for", "1", None),
    "gpufleet_stages": ("list of stage names, in order", "all", "the stages to converge (empty: not a GPU node)",
                        '["driver", "persistence", "power"]', None),
    "gpufleet_allow_reboot": ("bool", "driver, mig", "reboot the node when a stage needs it", "True", None),
    "gpufleet_driver_branch": ("str, 3 digits", "driver", "the NVIDIA driver branch to install and hold", '"570"',
                               None),
    "gpufleet_driver_flavour": ("`auto` \\| `open` \\| `proprietary`", "driver", "kernel module flavour", '"open"',
                                None),
    "gpufleet_driver_repo_url": ("http(s) URL", "driver", "NVIDIA's repository or your mirror",
                                 '"http://mirror.internal/nvidia/ubuntu2404/x86_64/"',
                                 "NVIDIA's CUDA repository for the OS"),
    "gpufleet_driver_repo_keyring_url": ("http(s) URL", "driver", "the repository's signing key",
                                         '"http://mirror.internal/nvidia/3bf863cc.pub"', "the repository's keyring"),
    "gpufleet_driver_repo_key_fingerprint": ("the key's full fingerprint (40 hex digits)", "driver",
                                             "install the repository key only if it has this fingerprint "
                                             "(needs gpg on the node)",
                                             '"EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC"',
                                             "unset (not checked)"),
    "gpufleet_driver_packages_style": ("`ubuntu` \\| `nvidia`", "driver", "package names: Ubuntu's or NVIDIA's",
                                       '"nvidia"', "by OS"),
    "gpufleet_driver_secure_boot_signing": ("bool (DKMS signing is set up)", "driver",
                                            "allow DKMS modules under Secure Boot", "True", None),
    "gpufleet_power_limit": ('watts, `"N%"` of default, or `"default"`', "power", "every GPU's power limit",
                             '"80%"', "unset (left alone)"),
    "gpufleet_power_limit_by_model": ("{catalog key or nvidia-smi name: limit}", "power",
                                      "power limit per GPU model (wins over the fleet-wide one)",
                                      '{"h100-sxm": 600}', "`{}`"),
    "gpufleet_power_limit_by_uuid": ("{GPU UUID: limit} (wins over model, then fleet-wide)", "power",
                                     "power limit of one GPU", '{"GPU-5e2a…": "90%"}', "`{}`"),
    "gpufleet_mig": ("mig-parted layout: list of `{devices, mig-enabled, mig-devices}`", "mig",
                     "the MIG layout, inline",
                     '[{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]', None),
    "gpufleet_mig_config_file": ("path of a mig-parted `version: v1` file", "mig",
                                 "the MIG layout from a mig-parted file (with `gpufleet_mig_config`)",
                                 '"inventories/mig/hgx-h100.yaml"', None),
    "gpufleet_mig_config": ("str (a label of the file's `mig-configs`)", "mig",
                            "which layout of `gpufleet_mig_config_file`", '"inference-2-training-6"', None),
    "gpufleet_nccl": ("{NCCL variable: value}, known variables only", "nccl", "the lines of /etc/nccl.conf",
                      '{"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "WARN"}', "`{}`"),
    "gpufleet_clocks": ('`{"lock_gpu_mhz": [min, max]}` \\| `"reset"`', "clocks", "locked GPU clocks, or reset them",
                        '{"lock_gpu_mhz": [1980, 1980]}', None),
    "gpufleet_catalog_dir": ("directory on the control machine, one for the whole fleet", "all",
                            "GPU model files (`<key>.json`) that join gpufleet's catalog; one with a packaged key "
                            "replaces that model", '"gpufleet_catalog"', None),
    "gpufleet_templates_dir": ("directory on the control machine", "all",
                               "templates found there (by name) replace gpufleet's own", '"site-templates"', None),
    "gpufleet_verify_textfile_dir": ("absolute directory path, or `False`", "verify",
                                     "node_exporter's textfile directory for verify's results",
                                     '"/srv/node_exporter/textfiles"', None),
    "gpufleet_verify_python": ("command name or absolute path", "verify", "the node's Python 3 (>= 3.9)",
                               '"/usr/bin/python3.11"', None),
    "gpufleet_verify_out": ("local directory", "verify",
                            "report directory of `pyinfra INVENTORY verify/gpu_node.py` (`gpufleet verify`: --out)",
                            '"build/verify"', None),
    "gpufleet_verify_bench": ("`none` \\| `quick` \\| `full`", "verify",
                              "benchmarks of `pyinfra INVENTORY verify/gpu_node.py` (`gpufleet verify`: --bench)",
                              '"quick"', None),
    "gpufleet_slurm_gres": ("`auto` \\| `files` \\| `nvml`", "slurm",
                            "gres.conf: every GPU listed (files), AutoDetect=nvml (nvml), or files unless a MIG "
                            "layout is configured (auto)", '"nvml"', None),
    # exporters: the doc is config.EXPORTER_SETTINGS' own (None here)
    "gpufleet_exporters_gpu": ("`auto` \\| `dcgm` \\| `nvml` \\| `none`", "exporters", None, '"nvml"', None),
    "gpufleet_exporters_gpu_listen": ("ADDRESS:PORT", "exporters", None, '"10.0.0.5:9400"', _MGMT + "9400"),
    "gpufleet_exporters_node": ("bool", "exporters", None, "False", None),
    "gpufleet_exporters_node_listen": ("ADDRESS:PORT", "exporters", None, '"10.0.0.5:9100"', _MGMT + "9100"),
    "gpufleet_exporters_node_tls_server_config": ("{cert_file, key_file, min_version, max_version}", "exporters",
                                                  None, '{"cert_file": "/etc/ssl/gpu01.crt", '
                                                  '"key_file": "/etc/ssl/private/gpu01.key"}', None),
    "gpufleet_exporters_gpu_tls_server_config": ("{cert_file, key_file, min_version, max_version}", "exporters",
                                                 None, '{"cert_file": "/etc/ssl/gpu01.crt", '
                                                 '"key_file": "/etc/ssl/private/gpu01.key"}', None),
    "gpufleet_exporters_tls_fleet_ca": ("bool", "exporters", None, "True", None),
    "gpufleet_exporters_textfile_dir": ("absolute directory path", "exporters, verify", None,
                                        '"/var/lib/node_exporter/textfile_collector"', None),
    "gpufleet_exporters_gpu_count": ("int 1..64", "exporters, monitoring", None, "8", None),
    "gpufleet_exporters_collect_interval": ("duration 1s..1h", "exporters", None, '"15s"',
                                            "the scrape interval, else `\"15s\"`"),
    # SSH bounds (gpufleet.connection): the type is its SETTINGS' allowed text (None here)
    "gpufleet_ssh_connect_timeout": (None, "all, verify", "TCP connect, SSH banner and authentication timeout", "5",
                                     None),
    "gpufleet_ssh_keepalive_interval": (None, "all, verify", "SSH keepalive sent after this many idle seconds", "10",
                                        None),
    "gpufleet_ssh_dead_after": (None, "all, verify",
                                "unacknowledged data for this long drops the host (it is reported failed)", "60",
                                None),
    # monitoring (deploys/monitoring.py): the type is gpufleet.monitoring.config.KEYS' allowed text (None here)
    "gpufleet_monitoring_scrape_interval": (None, "monitoring", "Prometheus scrape interval", '"15s"', None),
    "gpufleet_monitoring_evaluation_interval": (None, "monitoring", "Prometheus rule evaluation interval", '"15s"',
                                                None),
    "gpufleet_monitoring_alert_for": (None, "monitoring", "an alert's `for` duration, per alert",
                                      '{"GpuOverheating": "2m"}', "`{}`"),
    "gpufleet_monitoring_verify_max_age": (None, "monitoring", "verify results older than this alert as stale",
                                           '"8d"', None),
    "gpufleet_monitoring_retention": (None, "monitoring", "how long Prometheus keeps samples (checked against the "
                                      "longest range any rule reads)", '"90d"', None),
    "gpufleet_monitoring_prometheus_listen": (None, "monitoring", "Prometheus' listen address (basic auth always)",
                                              '"10.0.0.9:9090"', _MGMT + "9090"),
    "gpufleet_monitoring_alertmanager_listen": (None, "monitoring", "Alertmanager's listen address (basic auth "
                                                "always)", '"127.0.0.1:9093"', _MGMT + "9093"),
    "gpufleet_monitoring_prometheus_tls_server_config": (None, "monitoring", "Prometheus serves HTTPS with these "
                                                         "files (the role's prometheus_web_config.tls_server_config)",
                                                         '{"cert_file": "/etc/ssl/mon.crt", '
                                                         '"key_file": "/etc/ssl/private/mon.key"}', None),
    "gpufleet_monitoring_alertmanager_tls_server_config": (None, "monitoring", "Alertmanager serves HTTPS with "
                                                           "these files", '{"cert_file": "/etc/ssl/mon.crt", '
                                                           '"key_file": "/etc/ssl/private/mon.key"}', None),
    "gpufleet_monitoring_prometheus_basic_auth_users": (None, "monitoring", "people's own accounts on "
                                                        "Prometheus beside gpufleet's (the role's "
                                                        "prometheus_web_config.basic_auth_users)",
                                                        _BCRYPT_EXAMPLE, None),
    "gpufleet_monitoring_alertmanager_basic_auth_users": (None, "monitoring", "people's own accounts on "
                                                          "Alertmanager beside gpufleet's",
                                                          _BCRYPT_EXAMPLE, None),
    "gpufleet_monitoring_tls_fleet_ca": (None, "monitoring", "HTTPS for Prometheus and Alertmanager without a "
                                         "*_tls_server_config of their own, with a certificate of gpufleet's fleet CA",
                                         "True", None),
    "gpufleet_monitoring_tls_ca_file": (None, "monitoring", "CA certificates (a file on the monitoring host) "
                                        "Prometheus checks the HTTPS listeners against", '"/etc/ssl/fleet-ca.crt"',
                                        "the system's CAs"),
    "gpufleet_monitoring_receivers": (None, "monitoring", "Alertmanager receivers",
                                      '[{"name": "ops", "type": "webhook", "url": "http://hooks.internal/gpu"}]',
                                      "`[]`"),
    "gpufleet_monitoring_routes": (None, "monitoring", "Alertmanager routes to the receivers",
                                   '[{"receiver": "ops", "matchers": {"severity": "critical"}}]', "`[]`"),
    "gpufleet_monitoring_group_wait": (None, "monitoring", "Alertmanager's group_wait", '"30s"', None),
    "gpufleet_monitoring_grafana": (None, "monitoring", "install and provision Grafana", "False", None),
    "gpufleet_monitoring_grafana_admin_password": (None, "monitoring",
                                                   "Grafana's admin password (required with Grafana on)",
                                                   '"long-site-secret-42"', None),
    "gpufleet_monitoring_grafana_repo_url": (None, "monitoring", "apt source of Grafana's package",
                                             '"http://mirror.internal/grafana stable main"', None),
    "gpufleet_monitoring_grafana_repo_key_fingerprint": (None, "monitoring",
                                                         "the Grafana repository key is trusted only with this "
                                                         "fingerprint", '"B53AE77BADB630A683046005963FA27710458545"',
                                                         "not checked"),
    "gpufleet_monitoring_grafana_listen": (None, "monitoring", "Grafana's listen address", '"0.0.0.0:3000"',
                                           _MGMT + "3000"),
    "gpufleet_monitoring_cluster": (None, "monitoring", "the `cluster` label of this host's scrape targets",
                                    '"cluster-a"', None),
    "gpufleet_monitoring_gpu_model": (None, "monitoring", "the `gpu_model` label of this host's scrape targets",
                                      '"h100-sxm"', "the catalog key of the GPUs the node reports"),
}

_MIG_NOTE = "validated together by gpufleet.config (inline layout or file + label, never both)"


def _verify_defaults() -> dict[str, Any]:
    fields = {f.name: f.default for f in dataclasses.fields(verify_settings.VerifySettings)}
    return {f"{verify_settings.VERIFY_PREFIX}{name}": value for name, value in fields.items()}


def _monitoring_defaults() -> dict[str, Any]:
    fields = [*dataclasses.fields(monitoring_config.MonitoringSettings),
              *dataclasses.fields(monitoring_config.TargetSettings)]
    found = {}
    for f in fields:
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        found[f"{monitoring_config.PREFIX}{f.name}"] = value
    return found


def table() -> list[Setting]:
    """Every setting, in documentation order; raises if the validators and this table disagree on the keys."""
    validated: dict[str, tuple[Callable[..., Any] | None, Any]] = dict(config._KEYS)
    for key in config.KNOWN_KEYS:
        validated.setdefault(key, (config._mig, None))  # the MIG keys: one parser for the three
    verify_defaults = _verify_defaults()
    for key in verify_settings.VERIFY_KEYS:
        validated[key] = (verify_settings.load_verify_settings, verify_defaults.get(key))
    monitoring_defaults = _monitoring_defaults()
    for key in monitoring_config.KEYS:
        validated[key] = (monitoring_config.load_monitoring_settings, monitoring_defaults.get(key))
    ssh_defaults = {f"{connection.PREFIX}{f.name}": f.default for f in dataclasses.fields(connection.SshBounds)}
    for key in connection.SETTINGS:
        validated[key] = (connection.load_bounds, ssh_defaults[key])
    exporter_docs = {key: doc for key, _parser, _default, doc in config.EXPORTER_SETTINGS}
    missing, extra = sorted(set(validated) - set(_DOCS)), sorted(set(_DOCS) - set(validated))
    if missing or extra:
        raise LookupError(f"gpufleet/settings.py is out of step with the validators: undocumented {missing}, "
                          f"documented but not validated {extra}")
    rows = []
    for name, (type_, stage, doc, example, default_text) in _DOCS.items():
        parser, default = validated[name]
        if type_ is None:
            type_ = connection.SETTINGS[name][3] if name in connection.SETTINGS else monitoring_config.KEYS[name]
            type_ = type_.replace("|", "\\|")
        doc = doc if doc is not None else exporter_docs[name]
        rows.append(Setting(name=name, type=type_, stage=stage, doc=doc, example=example, parser=parser,
                            default=default, default_text=default_text))
    return rows


# ---------------------------------------------------------------------------------------------- markdown

BEGIN = "<!-- settings table: generated by `python -m gpufleet.settings --write`, do not edit -->"
END = "<!-- end of settings table -->"
DOCS = {"docs/converging.md": "summary", "docs/configuration.md": "reference"}


def _anchor(name: str) -> str:
    if name in ("gpufleet_mig_config_file", "gpufleet_mig_config"):
        return "gpufleet_mig_config_file-and-gpufleet_mig_config"
    return name


def markdown(kind: str = "summary") -> str:
    """The settings table: ``summary`` (key, type, default, example) or ``reference`` (with links and stages)."""
    rows = table()
    if kind == "summary":
        lines = ["| key | type | default | example |", "|---|---|---|---|"]
        lines += [f"| `{s.name}` | {s.type} | {s.shown_default} | `{s.example}` |" for s in rows]
    elif kind == "reference":
        lines = ["| Key | Type | Default | Stage | What |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| [`{s.name}`](#{_anchor(s.name)}) | {s.type} | {s.shown_default} | {s.stage} | {s.doc} |"
                  for s in rows]
    else:
        raise ValueError(f"kind {kind!r}; allowed: summary, reference")
    return "\n".join(lines) + "\n"


def render_into(text: str, kind: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by the current table."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise LookupError(f"no generated settings table (between {BEGIN!r} and {END!r})")
    return pattern.sub(lambda _: f"{BEGIN}\n{markdown(kind)}{END}", text, count=1)


def stale(root: Path) -> list[str]:
    """The documentation files under ``root`` whose table is not the current one."""
    return [name for name, kind in DOCS.items()
            if render_into((root / name).read_text(), kind) != (root / name).read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.settings", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", choices=("summary", "reference"), nargs="?", const="summary",
                       help="print a table")
    group.add_argument("--write", action="store_true", help="rewrite the tables of " + ", ".join(DOCS))
    group.add_argument("--check", action="store_true", help="exit 1 when a table is stale")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: .)")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown(args.markdown))
        return 0
    if args.write:
        for name, kind in DOCS.items():
            path = args.root / name
            path.write_text(render_into(path.read_text(), kind))
        return 0
    found = stale(args.root)
    for name in found:
        print(f"{name}: the settings table is stale: run python -m gpufleet.settings --write", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
