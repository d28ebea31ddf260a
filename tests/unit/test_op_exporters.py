"""exporters.gpu_exporter (nvml / none paths: exact commands and no-ops), the counters file and unit text."""

from __future__ import annotations

import hashlib
import json

from pyinfra_harness import managed_state, run_operation

from gpufleet.exporter import bundle
from gpufleet.operations import exporters
from gpufleet.operations._systemd import ManagedState

SETTINGS = json.dumps({"persistence_managed": True}, sort_keys=True) + "\n"
UNIT = exporters.nvml_unit_text("0.0.0.0:9400")


def nvml_state(bundle_bytes: bytes | None = None, unit_text: str | None = UNIT, settings: str | None = SETTINGS,
               units: dict | None = None):
    fact = managed_state(files={exporters.NVML_SETTINGS: settings, exporters.NVML_UNIT_PATH: unit_text},
                         units=units)

    def with_bundle(paths=(), read=(), units=()):
        out = fact(paths, read, units)
        if bundle_bytes is not None:
            out["files"][exporters.NVML_BUNDLE] = {"type": "file", "mode": "644", "user": "root", "group": "root",
                                                   "target": None, "sha1": hashlib.sha1(bundle_bytes).hexdigest()}
        return out

    return with_bundle


RUNNING = {exporters.NVML_UNIT: {"active_state": "active", "unit_file_state": "enabled"}}


def test_nvml_first_install_uploads_bundle_settings_unit_then_enables_and_starts():
    commands, noops = run_operation(exporters.gpu_exporter, facts={ManagedState: nvml_state(None, None, None)},
                                    kind="nvml")
    assert commands[0] == "mkdir -p /opt/gpufleet/exporter"
    assert commands[1].startswith("upload /opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz\n")
    assert commands[2:] == [
        "chown root:root /opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz && chmod 644 "
        "/opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz",
        "mkdir -p /etc/gpufleet",
        f"upload /etc/gpufleet/exporter.json\n{SETTINGS}",
        "chown root:root /etc/gpufleet/exporter.json && chmod 644 /etc/gpufleet/exporter.json",
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


def test_unit_is_hardened_and_binds_the_listen_address():
    for line in ("DynamicUser=yes", "CapabilityBoundingSet=", "NoNewPrivileges=yes", "ProtectSystem=strict",
                 "ProtectHome=yes", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
                 "ExecStart=/usr/bin/python3 /opt/gpufleet/exporter/gpufleet-gpu-exporter.pyz --listen 0.0.0.0:9400 "
                 "--settings-dir /etc/gpufleet"):
        assert line in UNIT.splitlines()


def test_counters_file_switches_on_the_health_counters_alerts_need():
    text = exporters.counters_csv(profiling=False)
    fields = {line.split(",")[0] for line in text.splitlines() if not line.startswith("#")}
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_PERSISTENCE_MODE",
            "DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"} <= fields
    assert not any(f.startswith("DCGM_FI_PROF_") for f in fields)
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge," in exporters.counters_csv(profiling=True)


def test_node_exporter_arguments():
    assert exporters.node_exporter_defaults("/var/lib/prometheus/node-exporter", "0.0.0.0:9100") == (
        "# Managed by gpufleet (stage exporters): read by prometheus-node-exporter.service.\n"
        "ARGS='--collector.textfile.directory=/var/lib/prometheus/node-exporter --web.listen-address=0.0.0.0:9100'\n")
