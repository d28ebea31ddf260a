"""Facts read from ``nvidia-smi``: parse, never decide.

``GpuInventory`` runs ONE ``nvidia-smi --query-gpu`` for all GPUs and all fields of a host. The query uses
``--format=csv`` (header and units, exactly the form of the real captures in ``reference/captures``); the
header is checked against the fields asked for, and units (`` W``, `` MiB``, `` MHz``) are stripped.
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from .sections import parse_sections, section

# Query field (canonical name, as the header prints it) -> key in the fact's GPU dicts.
GPU_FIELDS = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "serial": "serial",
    "pci.bus_id": "pci_bus_id",
    "pci.device_id": "pci_device_id",
    "driver_version": "driver_version",
    "vbios_version": "vbios_version",
    "compute_cap": "compute_cap",
    "memory.total": "memory_total_mib",
    "persistence_mode": "persistence_mode",
    "power.limit": "power_limit_w",
    "enforced.power.limit": "power_enforced_w",
    "power.default_limit": "power_default_w",
    "power.min_limit": "power_min_w",
    "power.max_limit": "power_max_w",
    "temperature.gpu": "temperature_c",
    "mig.mode.current": "mig_current",
    "mig.mode.pending": "mig_pending",
    "ecc.mode.current": "ecc_current",
    "clocks.max.sm": "clocks_max_sm_mhz",
}
# nvidia-smi 595 deprecates the query field ``driver_version`` for ``kmd_version``, which 590 and older do not
# know; one unknown field fails the whole query. Every driver up to the newest known (610) still answers
# ``driver_version``, so the fact asks for it, and only when nvidia-smi rejects it (``Field "driver_version" is
# not a valid field to query.``, exit 2: a driver that dropped it) asks again with ``kmd_version``: one nvidia-smi
# call per read on every known driver, where asking ``--help-query-gpu`` first cost a second call on every read.
# Any other failure (a lost GPU prints the header, which names driver_version) is not asked again. Both land in the
# GPU dicts as "driver_version".
DRIVER_VERSION_FIELDS = ("driver_version", "kmd_version")  # asked in this order
_FIELD_MARKER = "gpufleet-version-field: "


def gpu_query_fields(version_field: str = "driver_version") -> dict[str, str]:
    """``GPU_FIELDS`` with the driver version asked for as ``version_field`` (one of DRIVER_VERSION_FIELDS)."""
    return {(version_field if name == "driver_version" else name): key for name, key in GPU_FIELDS.items()}


NUMERIC = {
    "index": int,
    "memory_total_mib": int,
    "temperature_c": int,
    "clocks_max_sm_mhz": int,
    "power_limit_w": float,
    "power_enforced_w": float,
    "power_default_w": float,
    "power_min_w": float,
    "power_max_w": float,
}
# Placeholders nvidia-smi prints for a value it does not have (nounits leaves them unchanged).
NOT_AVAILABLE = {
    "[N/A]",
    "N/A",
    "",
    "[Not Supported]",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "[GPU is lost]",
    "[Requested functionality has been deprecated]",
}
UNITS = (" W", " MiB", " MHz", " %")

# nvidia-smi exit codes (man page "RETURN VALUE"; 18 = NVML_ERROR_LIB_RM_VERSION_MISMATCH, seen on real hosts)
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_LOST = 15
RC_VERSION_MISMATCH = 18

STATUSES = ("ok", "absent", "driver_not_loaded", "version_mismatch", "no_devices", "gpu_lost", "error")

_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]$")
_LOST_RE = re.compile(r"device handle for GPU\s*([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")


def parse_csv_value(key: str, raw: str):
    """One CSV cell -> Python value: None for placeholders, int/float for numeric keys, else the string."""
    value = raw.strip()
    if value in NOT_AVAILABLE:
        return None
    for unit in UNITS:
        if value.endswith(unit):
            value = value[: -len(unit)]
            break
    convert = NUMERIC.get(key)
    if convert is None:
        return value
    try:
        return convert(value)
    except ValueError:
        return None


def classify_smi_failure(rc: int, message: str) -> str:
    """Map an nvidia-smi failure (exit code + message) to one of ``STATUSES``."""
    lowered = message.lower()
    if rc == RC_DRIVER_NOT_LOADED or "couldn't communicate with the nvidia driver" in lowered:
        return "driver_not_loaded"
    if rc == RC_VERSION_MISMATCH or "driver/library version mismatch" in lowered:
        return "version_mismatch"
    if "no devices were found" in lowered:
        return "no_devices"
    if rc == RC_GPU_LOST or "fallen off the bus" in lowered or "gpu is lost" in lowered:
        return "gpu_lost"
    return "error"


def parse_gpu_query(lines: list[str], fields: dict[str, str] = GPU_FIELDS) -> tuple[list[dict], list[str]]:
    """Parse ``--query-gpu=<fields> --format=csv`` output -> (gpu dicts, lines that were not GPU rows).

    The header (first line starting with the first field name) must name exactly ``fields`` in order.
    Rows whose cell count does not match are returned as unparsed lines (nvidia-smi prints per-GPU errors,
    e.g. a lost GPU, in between the rows).
    """
    names = list(fields)
    keys = list(fields.values())
    gpus: list[dict] = []
    other: list[str] = []
    header_seen = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if not header_seen and cells and cells[0] == names[0]:
            printed = [_HEADER_UNIT_RE.sub("", c) for c in cells]
            if printed != names:
                raise ValueError(f"nvidia-smi header does not match the query: {line!r}")
            header_seen = True
            continue
        if len(cells) == len(keys) and cells[0].isdigit():
            gpus.append({key: parse_csv_value(key, value) for key, value in zip(keys, cells, strict=True)})
        else:
            other.append(line)
    return gpus, other


class GpuInventory(FactBase):
    """
    The GPUs nvidia-smi sees: one query for all of them and all fields.

    .. code:: python

        {
            "status": "ok",            # ok | absent | driver_not_loaded | version_mismatch | no_devices
                                       # | gpu_lost | error
            "error": None,             # nvidia-smi's message when it failed (or a GPU was lost)
            "exit_code": 0,            # None when nvidia-smi is not installed
            "driver_version": "590.48.01",
            "driver_version_field": "driver_version",  # the query field used: kmd_version (610+) or
                                                       # driver_version (older drivers; None: not asked)
            "lost_gpus": [],           # PCI bus ids nvidia-smi could not reach ("fallen off the bus")
            "gpus": [{
                "index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-…", "serial": "1654…",
                "pci_bus_id": "00000000:18:00.0", "pci_device_id": "0x233010DE",
                "driver_version": "590.48.01", "vbios_version": "96.00.A5.00.01", "compute_cap": "9.0",
                "memory_total_mib": 81559, "persistence_mode": "Enabled",
                "power_limit_w": 700.0, "power_enforced_w": 700.0, "power_default_w": 700.0,
                "power_min_w": 200.0, "power_max_w": 700.0, "temperature_c": 41,
                "mig_current": "Disabled", "mig_pending": "Disabled",   # None: GPU without MIG
                "ecc_current": "Enabled", "clocks_max_sm_mhz": 1980,
            }],
        }

    Values are as nvidia-smi prints them (``Enabled``/``Disabled``); ``None`` where it prints a placeholder
    (``[N/A]``…). When nvidia-smi is not installed: ``status="absent"``, ``gpus=[]``,
    ``error="nvidia-smi not found"``. GPUs that answered are listed even when another GPU failed.
    """

    @staticmethod
    def default():
        return {
            "status": "absent",
            "error": "nvidia-smi not found",
            "exit_code": None,
            "driver_version": None,
            "driver_version_field": None,
            "lost_gpus": [],
            "gpus": [],
        }

    def command(self) -> str:
        first, fallback = DRIVER_VERSION_FIELDS
        query = f"nvidia-smi --query-gpu={','.join(gpu_query_fields('$version_field'))} --format=csv 2>&1"
        script = (
            f"version_field={first}; out=$({query}); rc=$?; "
            f'case "$rc $out" in "0 "*) ;; *{first}*"is not a valid field"*) version_field={fallback}; '
            f'out=$({query}); rc=$? ;; esac; '
            f'echo "{_FIELD_MARKER}$version_field"; printf \'%s\\n\' "$out"; (exit $rc)'
        )
        return section("query", script, requires="nvidia-smi")

    def process(self, output):
        sec = parse_sections(output).get("query")
        result = self.default()
        if sec is None:
            return {**result, "status": "error", "error": "no output from the nvidia-smi query"}
        if not sec.present:
            return result
        rc = sec.rc
        result["exit_code"] = rc
        lines = [line for line in sec.lines if not line.startswith(_FIELD_MARKER)]
        asked = [line[len(_FIELD_MARKER):].strip() for line in sec.lines if line.startswith(_FIELD_MARKER)]
        # without the marker (output of a bare `nvidia-smi --query-gpu=...`) the header tells
        field = asked[0] if asked else next(
            (f for f in DRIVER_VERSION_FIELDS for line in lines if line.startswith("index,") and f" {f}," in line),
            None)
        result["driver_version_field"] = field
        try:
            gpus, other = parse_gpu_query(lines, gpu_query_fields(field or "driver_version"))
        except ValueError as exc:
            return {**result, "status": "error", "error": str(exc), "gpus": []}
        message = " ".join(line for line in other if line)
        result["gpus"] = gpus
        result["lost_gpus"] = [m.group(1) for m in map(_LOST_RE.search, other) if m]
        versions = {g["driver_version"] for g in gpus if g["driver_version"]}
        result["driver_version"] = versions.pop() if len(versions) == 1 else None
        if rc is None:
            result.update(status="error", error=message or "nvidia-smi output was cut short")
        elif rc == 0 and gpus:
            result.update(status="ok", error=None)
        elif rc == 0:
            # "No devices were found" (some versions exit 0 with it)
            status = classify_smi_failure(rc, message)
            result.update(status="no_devices" if status == "error" else status,
                          error=message or "nvidia-smi listed no GPUs")
        else:
            result.update(status=classify_smi_failure(rc, message), error=message or f"nvidia-smi exited {rc}")
        return result
