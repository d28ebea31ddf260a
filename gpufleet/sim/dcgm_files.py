"""The files the simulated DCGM packages install beside their stand-in binaries: nvidia-dcgm.service,
nvidia-dcgm-exporter.service and dcgm-exporter's default counters file.

gpufleet writes them itself (NVIDIA's files are not copied into the repository); they carry the unit names, install
paths, directives and enabled counter rows NVIDIA's packages have, as recorded with their provenance in
tests/reference/upstream (``dcgm/facts.json``, ``dcgm-exporter/facts.json``), so that the product meets on the
simulated fleet what it would meet on a real node. tests/unit/test_upstream_dcgm.py holds them to those facts.
"""

from __future__ import annotations

# datacenter-gpu-manager-4-core: the host engine's unit (DCGM's build installs it under lib/systemd/system of
# prefix /usr; systemctl also knows it by its alias dcgm.service)
DCGM_UNIT_PATH = "usr/lib/systemd/system/nvidia-dcgm.service"
DCGM_UNIT_TEXT = """\
# gpufleet simulator: the host engine unit of the simulated datacenter-gpu-manager-4-core
[Unit]
Description=DCGM host engine (gpufleet simulator)
After=nvidia-gpu-reset.target
Wants=nvidia-gpu-reset.target

[Service]
User=root
PrivateTmp=false
Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
Alias=dcgm.service
WantedBy=multi-user.target
"""

# datacenter-gpu-manager-exporter: the exporter's unit and the counters file its ExecStart names
DCGM_EXPORTER_UNIT_PATH = "lib/systemd/system/nvidia-dcgm-exporter.service"
DCGM_EXPORTER_UNIT_TEXT = """\
# gpufleet simulator: the exporter unit of the simulated datacenter-gpu-manager-exporter
[Unit]
Description=DCGM exporter (gpufleet simulator)
Wants=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
User=root
PrivateTmp=false
StandardOutput=append:/var/log/dcgm-exporter.log
StandardError=append:/var/log/dcgm-exporter.log
ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

DEFAULT_COUNTERS_PATH = "etc/dcgm-exporter/default-counters.csv"
# (DCGM field, Prometheus type, help): the rows the packaged default file has enabled; the help texts are ours (no
# commas: dcgm-exporter splits each row on them)
DEFAULT_COUNTERS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock in MHz."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock in MHz."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature in degrees C."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature in degrees C."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw in W."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy used since the driver loaded in mJ."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe replays."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU busy percent."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory busy percent."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder busy percent."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder busy percent."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Last Xid the GPU raised."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Free framebuffer in MiB."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Used framebuffer in MiB."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Reserved framebuffer in MiB."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink traffic over all links."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU licence state."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped after uncorrectable errors."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped after correctable errors."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 when a row remap failed."),
    ("DCGM_FI_DRIVER_VERSION", "label", "Driver version."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Share of time the graphics engine is busy."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Share of cycles the tensor pipe is busy."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Share of cycles the memory interface is busy."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "PCIe bytes sent per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "PCIe bytes received per second."),
)


def default_counters_text() -> str:
    """The default counters file in dcgm-exporter's format (``#`` comments; field, type, help)."""
    lines = ["# gpufleet simulator: the default counters of the simulated datacenter-gpu-manager-exporter",
             "# DCGM field, Prometheus type, help"]
    lines += [f"{field}, {kind}, {text}" for field, kind, text in DEFAULT_COUNTERS]
    return "\n".join(lines) + "\n"


# package -> {path inside the package: text}
PACKAGE_FILES = {
    "datacenter-gpu-manager-4-core": {DCGM_UNIT_PATH: DCGM_UNIT_TEXT},
    "datacenter-gpu-manager-exporter": {DCGM_EXPORTER_UNIT_PATH: DCGM_EXPORTER_UNIT_TEXT,
                                        DEFAULT_COUNTERS_PATH: default_counters_text()},
}
