"""gpufleet/operations/exporters.py: exact commands and no-op messages of node_exporter, gpu_exporter (nvml, dcgm,
none) and desired_state for a fresh host, a converged host and a changed setting; the files they write."""

from __future__ import annotations

import gzip
import hashlib
import re
from datetime import datetime

import pytest
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.server import Date
from pyinfra_harness import managed_state, run_operation

from gpufleet.exporter import bundle
from gpufleet.facts.files import ManagedState
from gpufleet.facts.packages import DebInstalled, DebSelections
from gpufleet.facts.system import Distribution
from gpufleet.operations import apt_lists, exporters
from tests import upstream

UNIT = exporters.nvml_unit_text("0.0.0.0:9400")


def nvml_state(bundle_bytes: bytes | None = None, unit_text: str | None = UNIT, settings: str | None = None,
               units: dict | None = None, files: dict | None = None):
    fact = managed_state(files={exporters.NVML_SETTINGS: settings, exporters.NVML_UNIT_PATH: unit_text,
                                **(files or {})}, units=units)

    def with_bundle(paths=(), read=(), units=()):
        out = fact(paths, read, units)
        if bundle_bytes is not None:
            out["files"][exporters.NVML_BUNDLE] = {"type": "file", "mode": "644", "user": "root", "group": "root",
                                                   "target": None, "sha1": hashlib.sha1(bundle_bytes).hexdigest()}
        return out

    return with_bundle


RUNNING = {exporters.NVML_UNIT: {"active_state": "active", "unit_file_state": "enabled"}}


def test_nvml_first_install_uploads_bundle_and_unit_then_enables_and_starts():
    commands, noops = run_operation(exporters.gpu_exporter, facts={ManagedState: nvml_state(None, None, None)},
                                    kind="nvml")
    assert commands[0] == "mkdir -p /opt/gpufleet/exporter"
    assert commands[1].startswith("upload /opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz\n")
    assert commands[2:] == [
        "chown root:root /opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz && chmod 644 "
        "/opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz",
        "mkdir -p /etc/systemd/system",
        f"upload /etc/systemd/system/gpufleet-exporter.service\n{UNIT}",
        "chown root:root /etc/systemd/system/gpufleet-exporter.service && chmod 644 "
        "/etc/systemd/system/gpufleet-exporter.service",
        "systemctl daemon-reload",
        "systemctl enable gpufleet-exporter.service",
        "systemctl start gpufleet-exporter.service",
    ]
    assert noops == []


def test_nvml_converged_is_a_noop():
    commands, noops = run_operation(exporters.gpu_exporter, facts={ManagedState: nvml_state(bundle(), units=RUNNING)},
                                    kind="nvml")
    assert commands == []
    assert noops == ["GPU exporter nvml running on 0.0.0.0:9400"]


def test_nvml_removes_the_settings_file_of_earlier_versions():
    commands, _ = run_operation(exporters.gpu_exporter,
                                facts={ManagedState: nvml_state(bundle(), settings="{}\n", units=RUNNING)}, kind="nvml")
    assert commands == ["rm -f /etc/gpufleet/exporter.json"]


def test_nvml_new_listen_address_rewrites_unit_and_restarts():
    commands, _ = run_operation(exporters.gpu_exporter, facts={ManagedState: nvml_state(bundle(), units=RUNNING)},
                                kind="nvml", listen="10.0.0.5:9400")
    assert commands == [
        f"upload /etc/systemd/system/gpufleet-exporter.service\n{exporters.nvml_unit_text('10.0.0.5:9400')}",
        "systemctl daemon-reload",
        "systemctl restart gpufleet-exporter.service",
    ]


def test_none_stops_disables_and_removes_the_nvml_exporter():
    commands, _ = run_operation(exporters.gpu_exporter, facts={ManagedState: nvml_state(bundle(), units=RUNNING)},
                                kind="none")
    assert commands == [
        "systemctl stop gpufleet-exporter.service",
        "systemctl disable gpufleet-exporter.service",
        "rm -f /etc/systemd/system/gpufleet-exporter.service",
    ]


CERT, KEY = "/etc/gpufleet/tls/cert.pem", "/etc/gpufleet/tls/key.pem"
CREDENTIALS = (("tls-cert.pem", CERT), ("tls-key.pem", KEY))
WEB_CONFIG = '{"basic_auth_users": {}, "tls_server_config": {"cert_file": "tls-cert.pem", "key_file": "tls-key.pem"}}\n'
TLS_UNIT = exporters.nvml_unit_text("0.0.0.0:9400", True, CREDENTIALS)
WATCH_UNIT, WATCH_SERVICE = exporters.certificate_watch_texts((CERT, KEY))
WATCH_FILES = dict(zip(exporters.CERTIFICATE_WATCH_PATHS, (WATCH_UNIT, WATCH_SERVICE), strict=True))
WATCHING = {**RUNNING, exporters.CERTIFICATE_WATCH_PATH_UNIT: {"active_state": "active",
                                                               "unit_file_state": "enabled"}}


def tls_state(files: dict, units: dict):
    """A host with the exporter on TLS: its web configuration 0600 (the other files 0644)."""
    fact = nvml_state(bundle(), TLS_UNIT, units=units, files={exporters.NVML_WEB_CONFIG: WEB_CONFIG, **files})

    def with_private_web_config(paths=(), read=(), units=()):
        out = fact(paths, read, units)
        if out["files"].get(exporters.NVML_WEB_CONFIG):
            out["files"][exporters.NVML_WEB_CONFIG]["mode"] = "600"
        return out

    return with_private_web_config


def test_nvml_with_a_certificate_gets_a_path_unit_that_restarts_it_when_the_certificate_changes():
    """systemd copies the certificate for the dynamic user at start: a renewal needs a restart, which the path
    unit (PathChanged= on the certificate, the key and their directory) gives whenever one of them changes."""
    commands, _ = run_operation(exporters.gpu_exporter, facts={ManagedState: tls_state({}, RUNNING)}, kind="nvml",
                                web_config=WEB_CONFIG, credentials=CREDENTIALS)
    assert commands == [
        "mkdir -p /etc/systemd/system",
        f"upload /etc/systemd/system/gpufleet-exporter-certificate.path\n{WATCH_UNIT}",
        "chown root:root /etc/systemd/system/gpufleet-exporter-certificate.path && chmod 644 "
        "/etc/systemd/system/gpufleet-exporter-certificate.path",
        "mkdir -p /etc/systemd/system",
        f"upload /etc/systemd/system/gpufleet-exporter-certificate.service\n{WATCH_SERVICE}",
        "chown root:root /etc/systemd/system/gpufleet-exporter-certificate.service && chmod 644 "
        "/etc/systemd/system/gpufleet-exporter-certificate.service",
        "systemctl daemon-reload",
        "systemctl enable gpufleet-exporter-certificate.path",
        "systemctl start gpufleet-exporter-certificate.path",
    ]
    assert WATCH_UNIT.splitlines()[-7:] == [f"PathChanged={CERT}", f"PathChanged={KEY}",
                                            "PathChanged=/etc/gpufleet/tls",
                                            "Unit=gpufleet-exporter-certificate.service", "", "[Install]",
                                            "WantedBy=multi-user.target"]
    assert "ExecStart=/bin/systemctl try-restart gpufleet-exporter.service" in WATCH_SERVICE.splitlines()
    assert "StartLimitIntervalSec=0" in WATCH_SERVICE.splitlines()
    assert "ExecStartPre=/bin/sleep 5" in WATCH_SERVICE.splitlines()  # one restart per burst of changes
    converged = tls_state(WATCH_FILES, WATCHING)
    assert run_operation(exporters.gpu_exporter, facts={ManagedState: converged}, kind="nvml",
                         web_config=WEB_CONFIG, credentials=CREDENTIALS)[0] == []
    # other certificate files: the watch follows them (rewritten, then restarted to watch the new paths)
    other = (("tls-cert.pem", "/etc/ssl/site/node.crt"), ("tls-key.pem", "/etc/ssl/private/node.key"))
    commands, _ = run_operation(exporters.gpu_exporter, facts={ManagedState: converged}, kind="nvml",
                                web_config=WEB_CONFIG, credentials=other)
    assert [c.splitlines()[0] for c in commands[-3:]] == [
        "upload /etc/systemd/system/gpufleet-exporter-certificate.path", "systemctl daemon-reload",
        "systemctl restart gpufleet-exporter-certificate.path"]
    assert "PathChanged=/etc/ssl/site\nPathChanged=/etc/ssl/private\n" in exporters.certificate_watch_texts(
        ("/etc/ssl/site/node.crt", "/etc/ssl/private/node.key"))[0]


@pytest.mark.parametrize("change", [{"kind": "nvml"}, {"kind": "dcgm"}, {"kind": "none"}],
                         ids=["tls-off", "dcgm", "none"])
def test_the_certificate_watch_goes_with_tls_or_the_nvml_exporter(change):
    facts = {**apt_host({}, DCGM_INSTALLED), ManagedState: tls_state(WATCH_FILES, WATCHING)}
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, **change)
    assert [c for c in commands if "certificate" in c] == [
        "systemctl stop gpufleet-exporter-certificate.path",
        "systemctl disable gpufleet-exporter-certificate.path",
        "rm -f /etc/systemd/system/gpufleet-exporter-certificate.path",
        "rm -f /etc/systemd/system/gpufleet-exporter-certificate.service"]


def test_the_certificate_watch_uses_systemds_own_names():
    """PathChanged=, Unit=, StartLimitIntervalSec=, try-restart and systemctl's path as Debian's systemd package
    documents and ships them."""
    systemd = "debian/bookworm/systemd"

    def page(name):
        return gzip.decompress(upstream.path(f"{systemd}/usr/share/man/{name}").read_bytes()).decode()

    options = re.findall(r"^\\fI(\w+=)\\fR$", page("man5/systemd.path.5.gz"), re.M)  # systemd.path(5)'s [Path]
    keys = {line.split("=", 1)[0] + "=" for line in WATCH_UNIT.splitlines() if "=" in line and line[0] != "#"}
    assert keys - {"Description=", "WantedBy="} == {"PathChanged=", "Unit="} <= set(options), options
    assert "may be used to watch a file or directory" in page("man5/systemd.path.5.gz")
    assert "\\fIStartLimitIntervalSec=\\fR" in page("man5/systemd.unit.5.gz")
    assert "may be set to 0 to disable any kind of rate limiting" in page("man5/systemd.unit.5.gz")
    assert "\\fBtry\\-restart \\fR" in page("man1/systemctl.1.gz")
    assert f"{exporters.SYSTEMCTL} try-restart " in WATCH_SERVICE
    shipped = [line.split()[1] for line in upstream.read(f"{systemd}/DEBIAN/md5sums").splitlines()]
    assert exporters.SYSTEMCTL.lstrip("/") in shipped
    coreutils = [line.split()[1] for line in upstream.read("debian/bookworm/coreutils/DEBIAN/md5sums").splitlines()]
    assert exporters.SLEEP.lstrip("/") in coreutils and f"ExecStartPre={exporters.SLEEP} " in WATCH_SERVICE


def test_unit_is_hardened_and_binds_the_listen_address():
    for line in ("DynamicUser=yes", "CapabilityBoundingSet=", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "ProtectHome=yes", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
                 "ExecStart=/usr/bin/python3 /opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz --listen 0.0.0.0:9400 "
                 "--settings-dir /etc/gpufleet"):
        assert line in UNIT.splitlines()


def test_counters_file_switches_on_the_health_counters_alerts_need():
    text, left_out = exporters.counters_csv(profiling=False)
    assert left_out == []
    fields = {line.split(",")[0] for line in text.splitlines() if not line.startswith("#")}
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_PERSISTENCE_MODE",
            "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"} <= fields
    assert not any(f.startswith("DCGM_FI_PROF_") for f in fields)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge," in exporters.counters_csv(profiling=True)[0]


def test_node_exporter_arguments():
    assert exporters.node_exporter_defaults("/var/lib/prometheus/node-exporter", "0.0.0.0:9100") == (
        "# Managed by gpufleet (stage exporters): read by prometheus-node-exporter.service.\n"
        "ARGS='--collector.textfile.directory=/var/lib/prometheus/node-exporter --web.listen-address=0.0.0.0:9100'\n")


# ------------------------------------------------------------------------------------------------ dcgm

APT_INSTALL = ('DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
               '-o Dpkg::Options::="--force-confold" install --no-install-recommends')
APT_UPDATE = (apt_lists.checked_update(),)  # checked, no stamp (issue 20)
DEBIAN = {"name": "Debian", "major": 12, "minor": None,
          "release_meta": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"}}
DCGM_INSTALLED = {"datacenter-gpu-manager-4-core": {"1:4.5.3-1"},
                  "datacenter-gpu-manager-exporter": {"1:4.5.3-4.8.2-1"}}
DCGM_RUNNING = {u: {"active_state": "active", "unit_file_state": "enabled"}
                for u in (exporters.DCGM_UNIT, exporters.DCGM_EXPORTER_UNIT)}
COUNTERS = exporters.counters_csv(profiling=True)[0]
DROP_IN = exporters.dcgm_drop_in_text("0.0.0.0:9400", 15000)
EXPORTER_DROP_IN_PATH = "/etc/systemd/system/nvidia-dcgm-exporter.service.d/gpufleet.conf"


def test_dcgm_drop_in_runs_nvidias_unit_against_the_one_host_engine_at_the_scrape_interval():
    """The drop-in of NVIDIA's nvidia-dcgm-exporter.service: -r localhost:5555 (no second, embedded host engine),
    -c in milliseconds, started after and bound to nvidia-dcgm.service, restarted after any failure."""
    assert exporters.DCGM_DROP_IN == EXPORTER_DROP_IN_PATH
    assert exporters.dcgm_drop_in_text("0.0.0.0:9400", 15000) == (
        "# Managed by gpufleet (stage exporters)\n"
        "[Unit]\nRequires=nvidia-dcgm.service\nAfter=nvidia-dcgm.service\n\n"
        "[Service]\nExecStart=\n"
        "ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/gpufleet-counters.csv -a 0.0.0.0:9400 -c 15000 "
        "-r localhost:5555\n"
        "Restart=on-failure\nRestartSec=2s\nTimeoutStopSec=20s\n")
    assert " -c 30000 " in exporters.dcgm_drop_in_text("[::]:9400", 30000)
    assert " -a '[::]:9400' " in exporters.dcgm_drop_in_text("[::]:9400", 30000)


def test_counters_file_parses_as_dcgm_exporter_reads_it():
    """Go's encoding/csv with Comment '#': every record has exactly 3 fields (a comma in a help text would
    make dcgm-exporter refuse the whole file), and the types are ones it knows."""
    import csv
    import io

    for profiling in (False, True):
        text = exporters.counters_csv(profiling)[0]
        rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].startswith("#")]
        assert rows and all(len(r) == 3 for r in rows), [r for r in rows if len(r) != 3]
        assert {r[1].strip() for r in rows} <= {"gauge", "counter", "histogram", "summary", "label"}


def test_counters_file_exports_each_gpus_own_thresholds_and_recovery_action():
    fields = {line.split(",")[0] for line in exporters.counters_csv(False)[0].splitlines() if not line.startswith("#")}
    assert {"DCGM_FI_DEV_SLOWDOWN_TEMP", "DCGM_FI_DEV_SHUTDOWN_TEMP", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "DCGM_FI_DEV_MEMORY_TEMP"} <= fields


def apt_host(managed: dict, installed: dict | None = None, units: dict | None = None, distro=DEBIAN,
             held: tuple[str, ...] = ()) -> dict:
    """Facts of a Debian host; apt's lists were updated an hour ago when packages are installed, never otherwise."""
    stamp = {"mtime": datetime(2026, 12, 3, 11, 0, 0)} if installed else None
    return {
        Distribution: distro,
        DebPackages: dict(installed or {}),
        DebInstalled: lambda packages: {name: sorted(installed[name])[0] for name in packages
                                        if name in (installed or {})},
        DebSelections: lambda packages: {name: {"version": sorted(installed[name])[0], "held": name in held}
                                         for name in packages if name in (installed or {})},
        Date: datetime(2026, 12, 3, 12, 0, 0),
        File: lambda path: stamp if "update-success-stamp" in path else None,
        ManagedState: managed_state(files=managed, units=units),
    }


def test_dcgm_fresh_host_installs_paired_packages_writes_counters_and_starts_both_units():
    commands, noops = run_operation(exporters.gpu_exporter, facts=apt_host({}), kind="dcgm", profiling=True)
    assert commands == [
        *APT_UPDATE,
        f"{APT_INSTALL} datacenter-gpu-manager-4-core datacenter-gpu-manager-exporter",
        "mkdir -p /etc/dcgm-exporter",
        f"upload /etc/dcgm-exporter/gpufleet-counters.csv\n{COUNTERS}",
        "chown root:root /etc/dcgm-exporter/gpufleet-counters.csv && chmod 644 "
        "/etc/dcgm-exporter/gpufleet-counters.csv",
        "mkdir -p /etc/systemd/system/nvidia-dcgm-exporter.service.d",
        f"upload {EXPORTER_DROP_IN_PATH}\n{DROP_IN}",
        f"chown root:root {EXPORTER_DROP_IN_PATH} && chmod 644 {EXPORTER_DROP_IN_PATH}",
        "systemctl enable nvidia-dcgm.service",
        "systemctl start nvidia-dcgm.service",
        "systemctl daemon-reload",
        "systemctl enable nvidia-dcgm-exporter.service",
        "systemctl start nvidia-dcgm-exporter.service",
    ]
    assert noops == []


def test_dcgm_profiling_on_ampere_installs_the_proprietary_package_too():
    commands, _ = run_operation(exporters.gpu_exporter, facts=apt_host({}), kind="dcgm", profiling=True,
                                profiling_package=True)
    assert commands[len(APT_UPDATE)] == (f"{APT_INSTALL} datacenter-gpu-manager-4-core datacenter-gpu-manager-exporter "
                                         "datacenter-gpu-manager-4-proprietary")


def test_dcgm_converged_is_a_noop():
    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN}, DCGM_INSTALLED,
                     DCGM_RUNNING)
    commands, noops = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True)
    assert commands == []
    assert noops[-1] == "GPU exporter dcgm (dcgm-exporter 1:4.5.3-4.8.2-1) running on 0.0.0.0:9400"


def test_dcgm_drop_in_of_earlier_versions_under_the_wrong_unit_name_is_removed():
    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN,
                      "/etc/systemd/system/dcgm-exporter.service.d/gpufleet.conf": "[Service]\n"},
                     DCGM_INSTALLED, DCGM_RUNNING)
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True)
    assert commands == ["rm -f /etc/systemd/system/dcgm-exporter.service.d/gpufleet.conf"]


@pytest.mark.parametrize("sub_state, start", [("auto-restart", False), ("start", False), ("dead", True)])
def test_an_exporter_systemd_is_bringing_up_is_not_started_again(sub_state, start):
    """dcgm-exporter started before nv-hostengine listened exits, and systemd starts it again after RestartSec
    (activating/auto-restart): a run in that window changes nothing. A stopped one is started."""
    state = "inactive" if sub_state == "dead" else "activating"
    units = {**DCGM_RUNNING, exporters.DCGM_EXPORTER_UNIT: {"active_state": state, "sub_state": sub_state,
                                                            "unit_file_state": "enabled"}}
    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN}, DCGM_INSTALLED, units)
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True)
    assert commands == (["systemctl start nvidia-dcgm-exporter.service"] if start else [])


@pytest.mark.parametrize("change", [{"listen": "10.0.0.5:9400"}, {"collect_interval_ms": 30000}])
def test_dcgm_new_listen_address_or_interval_rewrites_the_drop_in_and_restarts_only_the_exporter(change):
    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN}, DCGM_INSTALLED,
                     DCGM_RUNNING)
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True, **change)
    args = {"listen": "0.0.0.0:9400", "collect_interval_ms": 15000, **change}
    assert commands == [
        f"upload {EXPORTER_DROP_IN_PATH}\n" + exporters.dcgm_drop_in_text(args["listen"], args["collect_interval_ms"]),
        "systemctl daemon-reload",
        "systemctl restart nvidia-dcgm-exporter.service",
    ]


def test_dcgm_is_refused_on_a_distribution_without_apt():
    rocky = {"name": "Rocky Linux", "major": 9, "minor": 4, "release_meta": {"ID": "rocky", "ID_LIKE": "rhel"}}
    with pytest.raises(Exception, match="testhost: the exporters stage installs Debian/Ubuntu packages; Rocky Linux"):
        run_operation(exporters.gpu_exporter, facts=apt_host({}, distro=rocky), kind="dcgm")


# ------------------------------------------------------------------------------------------------ node_exporter

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
NODE_DEFAULTS = exporters.node_exporter_defaults(TEXTFILE_DIR, "0.0.0.0:9100")
NODE_INSTALLED = {"prometheus-node-exporter": {"1.5.0-1"}}
NODE_RUNNING = {exporters.NODE_EXPORTER_UNIT: {"active_state": "active", "unit_file_state": "enabled"}}


def node_host(defaults: str | None, installed=None, units=None) -> dict:
    facts = apt_host({exporters.NODE_EXPORTER_DEFAULTS: defaults, TEXTFILE_DIR: "" if defaults else None},
                     installed, units)
    return facts


def test_node_exporter_fresh_host():
    commands, noops = run_operation(exporters.node_exporter, facts=node_host(None), textfile_dir=TEXTFILE_DIR)
    assert commands == [
        *APT_UPDATE,
        f"{APT_INSTALL} prometheus-node-exporter",
        f"mkdir -p {TEXTFILE_DIR}",
        "mkdir -p /etc/default",
        f"upload /etc/default/prometheus-node-exporter\n{NODE_DEFAULTS}",
        "chown root:root /etc/default/prometheus-node-exporter && chmod 644 /etc/default/prometheus-node-exporter",
        "systemctl daemon-reload",
        "systemctl enable prometheus-node-exporter.service",
        "systemctl start prometheus-node-exporter.service",
    ]
    assert noops == []


def test_node_exporter_converged_is_a_noop():
    commands, noops = run_operation(exporters.node_exporter,
                                    facts=node_host(NODE_DEFAULTS, NODE_INSTALLED, NODE_RUNNING),
                                    textfile_dir=TEXTFILE_DIR)
    assert commands == []
    assert noops[-1] == f"node_exporter running on 0.0.0.0:9100, textfile collector {TEXTFILE_DIR}"


def test_converged_exporters_change_nothing_however_old_the_apt_lists_are():
    """apt's lists are updated (a change) only on the way to installing a package that is missing."""
    stale = {"mtime": datetime(2026, 11, 1, 12, 0, 0)}  # a month before the host's date
    node = {**node_host(NODE_DEFAULTS, NODE_INSTALLED, NODE_RUNNING), File: lambda path: stale}
    assert run_operation(exporters.node_exporter, facts=node, textfile_dir=TEXTFILE_DIR)[0] == []
    dcgm = {**apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN}, DCGM_INSTALLED,
                       DCGM_RUNNING), File: lambda path: stale}
    assert run_operation(exporters.gpu_exporter, facts=dcgm, kind="dcgm", profiling=True)[0] == []
    missing = {**node_host(NODE_DEFAULTS, {}, NODE_RUNNING), File: lambda path: stale}
    assert run_operation(exporters.node_exporter, facts=missing, textfile_dir=TEXTFILE_DIR)[0][:2] == [
        *APT_UPDATE, f"{APT_INSTALL} prometheus-node-exporter"]


def test_a_missing_package_updates_the_lists_however_fresh_they_look():
    """No "fresh lists" shortcut (issue 20): an update minutes ago may have failed to fetch the index the package is
    in, so installing always updates first, with the checked update."""
    fresh = {"mtime": datetime(2026, 12, 3, 11, 59, 0)}  # a minute before the host's date
    missing = {**node_host(NODE_DEFAULTS, {}, NODE_RUNNING), File: lambda path: fresh}
    assert run_operation(exporters.node_exporter, facts=missing, textfile_dir=TEXTFILE_DIR)[0][:2] == [
        apt_lists.checked_update(), f"{APT_INSTALL} prometheus-node-exporter"]


def test_node_exporter_new_listen_address_rewrites_its_arguments_and_restarts():
    commands, _ = run_operation(exporters.node_exporter, facts=node_host(NODE_DEFAULTS, NODE_INSTALLED, NODE_RUNNING),
                                textfile_dir=TEXTFILE_DIR, listen="10.0.0.5:9100")
    assert commands == [
        "upload /etc/default/prometheus-node-exporter\n"
        + exporters.node_exporter_defaults(TEXTFILE_DIR, "10.0.0.5:9100"),
        "systemctl daemon-reload",
        "systemctl restart prometheus-node-exporter.service",
    ]


# ------------------------------------------------------------------------------------------------ desired_state

GPUS = [
    {"index": 1, "uuid": "GPU-b", "pci_bus_id": "00000000:2A:00.0", "power_limit_w": 337.5, "persistence": True,
     "mig_enabled": None},
    {"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0", "power_limit_w": 500.0, "persistence": True,
     "mig_enabled": True},
]
DESIRED_PATH = f"{TEXTFILE_DIR}/gpufleet_desired.prom"


def test_desired_textfile_has_one_series_per_gpu_and_managed_setting():
    assert exporters.desired_textfile(GPUS) == (
        "# Managed by gpufleet (stage exporters): desired GPU settings from the node plan.\n"
        "# HELP gpufleet_gpu_power_limit_desired_watts Power limit gpufleet's power stage sets on this GPU (in W), "
        "from the node plan.\n"
        "# TYPE gpufleet_gpu_power_limit_desired_watts gauge\n"
        'gpufleet_gpu_power_limit_desired_watts{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0"} 500\n'
        'gpufleet_gpu_power_limit_desired_watts{gpu="1",UUID="GPU-b",pci_bus_id="00000000:2A:00.0"} 337.5\n'
        "# HELP gpufleet_gpu_persistence_desired 1 when gpufleet's persistence stage keeps persistence mode on for "
        "this GPU, else 0.\n"
        "# TYPE gpufleet_gpu_persistence_desired gauge\n"
        'gpufleet_gpu_persistence_desired{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0"} 1\n'
        'gpufleet_gpu_persistence_desired{gpu="1",UUID="GPU-b",pci_bus_id="00000000:2A:00.0"} 1\n'
        "# HELP gpufleet_gpu_mig_mode_desired MIG mode gpufleet's MIG stage sets on this GPU (1 enabled), from the "
        "node plan.\n"
        "# TYPE gpufleet_gpu_mig_mode_desired gauge\n"
        'gpufleet_gpu_mig_mode_desired{gpu="0",UUID="GPU-a",pci_bus_id="00000000:18:00.0"} 1\n')


def test_desired_state_fresh_host_writes_the_textfile():
    commands, noops = run_operation(exporters.desired_state, facts={ManagedState: managed_state()},
                                    textfile_dir=TEXTFILE_DIR, gpus=GPUS)
    assert commands == [
        f"mkdir -p {TEXTFILE_DIR}",
        f"upload {DESIRED_PATH}\n{exporters.desired_textfile(GPUS)}",
        f"chown root:root {DESIRED_PATH} && chmod 644 {DESIRED_PATH}",
    ]
    assert noops == []


def test_desired_state_converged_is_a_noop():
    facts = {ManagedState: managed_state(files={DESIRED_PATH: exporters.desired_textfile(GPUS)})}
    commands, noops = run_operation(exporters.desired_state, facts=facts, textfile_dir=TEXTFILE_DIR, gpus=GPUS)
    assert commands == []
    assert noops == [f"desired GPU settings of 2 GPU(s) published in {DESIRED_PATH}"]


def test_desired_state_new_power_limit_rewrites_the_textfile():
    changed = [{**GPUS[0], "power_limit_w": 300.0}, GPUS[1]]
    facts = {ManagedState: managed_state(files={DESIRED_PATH: exporters.desired_textfile(GPUS)})}
    commands, _ = run_operation(exporters.desired_state, facts=facts, textfile_dir=TEXTFILE_DIR, gpus=changed)
    assert commands == [f"upload {DESIRED_PATH}\n{exporters.desired_textfile(changed)}"]
    assert 'gpu="1",UUID="GPU-b",pci_bus_id="00000000:2A:00.0"} 300' in commands[0]


# ------------------------------------------------------------------------------------------------ from the plan


def test_desired_gpu_settings_are_the_node_plans():
    from gpufleet.config import load_node_config
    from gpufleet.deploys.gpu_node import desired_gpu_settings
    from gpufleet.plan import gpus_from_facts

    uuids = ("GPU-76aef7ff-372d-2432-b4b4-beca4d8d3400", "GPU-c7a0294c-c2c2-5476-438c-fb468eaa223b",
             "GPU-00000000-0000-0000-0000-0000000000cc")
    gpus = gpus_from_facts({"gpus": [
        {"index": i, "uuid": u, "name": "NVIDIA H100 80GB HBM3", "power_default_w": 700.0,
         "pci_device_id": "0x233010DE", "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0"} for i, u in enumerate(uuids)]})
    config = load_node_config("n", {"gpufleet_power_limit": "80%", "gpufleet_mig": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"devices": [1], "mig-enabled": False}]})
    assert desired_gpu_settings(config, gpus) == [
        {"index": 0, "uuid": uuids[0], "pci_bus_id": "00000000:18:00.0", "power_limit_w": 560.0, "persistence": True,
         "mig_enabled": True},
        {"index": 1, "uuid": uuids[1], "pci_bus_id": "00000000:19:00.0", "power_limit_w": 560.0, "persistence": True,
         "mig_enabled": False},
        {"index": 2, "uuid": uuids[2], "pci_bus_id": "00000000:1A:00.0", "power_limit_w": 560.0, "persistence": True,
         "mig_enabled": None},
    ]
    unmanaged = load_node_config("n", {"gpufleet_stages": ["driver", "exporters"]})
    assert [(g["power_limit_w"], g["persistence"], g["mig_enabled"]) for g in desired_gpu_settings(unmanaged, gpus)] \
        == [(None, False, None)] * 3


def test_desired_state_is_kept_while_a_gpu_is_lost():
    facts = {ManagedState: managed_state(files={DESIRED_PATH: exporters.desired_textfile(GPUS)})}
    commands, noops = run_operation(exporters.desired_state, facts=facts, textfile_dir=TEXTFILE_DIR, gpus=GPUS[:1],
                                    lost=["0000:2A:00.0"])
    assert commands == []
    assert noops == [f"desired GPU settings in {DESIRED_PATH} kept while GPU(s) 0000:2A:00.0 are lost"]


# ------------------------------------------------------------------------------------------------ dcgm, pinned

PIN = "/etc/apt/preferences.d/gpufleet-dcgm-exporter"
OLD = "4.2.3-4.1.3"
OLD_INSTALLED = {"datacenter-gpu-manager-4-core": {"1:4.2.3-1"}, "datacenter-gpu-manager-exporter": {f"1:{OLD}-1"}}
OLD_COUNTERS, OLD_LEFT_OUT = exporters.counters_csv(profiling=True, release=(4, 1, 3))


def test_a_pinned_release_is_pinned_installed_held_and_given_only_the_counters_it_knows():
    from gpufleet.operations.dcgm_package import pin_text

    commands, noops = run_operation(exporters.gpu_exporter, facts=apt_host({}), kind="dcgm", profiling=True,
                                    version=OLD)
    assert commands[:6] == [
        "mkdir -p /etc/apt/preferences.d", f"upload {PIN}\n{pin_text(OLD)}",
        f"chown root:root {PIN} && chmod 644 {PIN}", *APT_UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages datacenter-gpu-manager-4-core "
        "datacenter-gpu-manager-exporter",
        "apt-mark hold datacenter-gpu-manager-exporter"]
    assert f"upload /etc/dcgm-exporter/gpufleet-counters.csv\n{OLD_COUNTERS}" in commands
    assert OLD_LEFT_OUT == ["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"]
    assert noops == [f"dcgm-exporter {OLD}: counters its field map does not know left out: "
                     "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"]


def test_a_pinned_release_installed_and_held_changes_nothing():
    from gpufleet.operations.dcgm_package import pin_text

    facts = apt_host({exporters.DCGM_COUNTERS: OLD_COUNTERS, exporters.DCGM_DROP_IN: DROP_IN, PIN: pin_text(OLD)},
                     OLD_INSTALLED, DCGM_RUNNING, held=("datacenter-gpu-manager-exporter",))
    commands, noops = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True, version=OLD)
    assert commands == []
    assert noops[-1] == f"GPU exporter dcgm (dcgm-exporter {OLD}) running on 0.0.0.0:9400"


def test_another_release_installed_is_replaced_by_the_pinned_one():
    from gpufleet.operations.dcgm_package import pin_text

    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN, PIN: pin_text(OLD)},
                     DCGM_INSTALLED, DCGM_RUNNING)
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True, version=OLD)
    assert commands[:3] == [*APT_UPDATE, f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages "
                            "datacenter-gpu-manager-4-core datacenter-gpu-manager-exporter",
                            "apt-mark hold datacenter-gpu-manager-exporter"]
    assert commands[-2:] == ["systemctl daemon-reload", "systemctl restart nvidia-dcgm-exporter.service"]


def test_unsetting_the_release_removes_gpufleets_pin_and_hold():
    from gpufleet.operations.dcgm_package import pin_text

    facts = apt_host({exporters.DCGM_COUNTERS: OLD_COUNTERS, exporters.DCGM_DROP_IN: DROP_IN, PIN: pin_text(OLD)},
                     OLD_INSTALLED, DCGM_RUNNING, held=("datacenter-gpu-manager-exporter",))
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True)
    assert commands[:2] == [f"rm -f {PIN}", "apt-mark unhold datacenter-gpu-manager-exporter"]


DCGM_WEB = '{"basic_auth_users": {"gpufleet": "$2b$..."}}\n'
DCGM_WEB_TLS = '{"basic_auth_users": {}, "tls_server_config": {"cert_file": "/c.pem", "key_file": "/k.pem"}}\n'


@pytest.mark.parametrize(("new", "restart"), [('{"basic_auth_users": {"gpufleet": "$2b$other"}}\n', False),
                                               (DCGM_WEB_TLS, True)], ids=["password", "https"])
def test_a_web_configuration_change_restarts_dcgm_exporter_only_when_http_or_https_changes(new, restart):
    """exporter-toolkit re-reads the web configuration on every request but decides HTTP or HTTPS at start
    (tests/reference/upstream/exporter-toolkit/facts.json)."""
    drop_in = exporters.dcgm_drop_in_text("0.0.0.0:9400", 15000, web_config=True)
    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: drop_in,
                      exporters.DCGM_WEB_CONFIG: DCGM_WEB}, DCGM_INSTALLED, DCGM_RUNNING)
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True, web_config=new)
    assert ("systemctl restart nvidia-dcgm-exporter.service" in commands) is restart
    assert any(exporters.DCGM_WEB_CONFIG in c for c in commands)


def test_the_drop_in_bounds_the_exporters_stop():
    """NVIDIA/dcgm-exporter#606 (recorded, open): a stop or restart of the packaged unit can hang, until systemd's
    stop timeout (the manager's default: 90 s, Debian 12's systemd) ends it."""
    assert upstream.facts("dcgm-exporter")["issues"]["606"]["state"] == "open"
    man = "debian/bookworm/systemd/usr/share/man/man5/"
    service = gzip.decompress(upstream.path(man + "systemd.service.5.gz").read_bytes()).decode()
    manager = gzip.decompress(upstream.path(man + "systemd-system.conf.5.gz").read_bytes()).decode()
    assert "\\fITimeoutStopSec=\\fR\n.RS 4\n" in service
    assert "\\fIDefaultTimeoutStopSec=\\fR\ndefault to 90s" in manager
    drop_in = upstream.parse_systemd_unit(exporters.dcgm_drop_in_text("0.0.0.0:9400", 15000))
    assert ("TimeoutStopSec", f"{exporters.DCGM_EXPORTER_STOP_TIMEOUT_S}s") in drop_in["Service"]
    assert 0 < exporters.DCGM_EXPORTER_STOP_TIMEOUT_S < 90


def test_a_replaced_release_restarts_the_exporter_even_with_the_same_counters():
    """The running process is the old program until restarted: 4.5.2-4.8.1 and 4.5.3-4.8.2 know the same counters."""
    from gpufleet.operations.dcgm_package import pin_text

    installed = {**DCGM_INSTALLED, "datacenter-gpu-manager-exporter": {"1:4.5.2-4.8.1-1"}}
    facts = apt_host({exporters.DCGM_COUNTERS: COUNTERS, exporters.DCGM_DROP_IN: DROP_IN,
                      PIN: pin_text("4.5.3-4.8.2")}, installed, DCGM_RUNNING, held=("datacenter-gpu-manager-exporter",))
    commands, _ = run_operation(exporters.gpu_exporter, facts=facts, kind="dcgm", profiling=True,
                                version="4.5.3-4.8.2")
    assert not any("gpufleet-counters.csv" in c for c in commands)
    assert commands[-2:] == ["systemctl daemon-reload", "systemctl restart nvidia-dcgm-exporter.service"]
