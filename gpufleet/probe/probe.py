#!/usr/bin/env python3
"""gpufleet node probe: one JSON document describing a GPU node, read through NVML.

Runs ON the node with only the Python standard library (>= 3.9) and nvidia-ml-py (``import pynvml``). It imports
nothing else from gpufleet, so the ``probe/`` directory can be copied to a node and run as
``python3 probe.py`` (or ``python3 -m gpufleet.probe`` where gpufleet is installed). It never changes anything.

Every NVML call that fails is recorded per field as a status string in the ``errors`` map next to the field
(the field itself is ``null``) and never aborts the probe. When NVML cannot be initialised at all, the document
has a top-level ``nvml_error`` and no GPUs; services, /etc/nccl.conf and the kernel log are still read.

Document (``schema`` = ``gpufleet.probe``, ``schema_version`` = 1) — see ``SCHEMA_FIELDS`` below for the list.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

try:
    from .probe_nvml import collect_nvml, utc_timestamp  # package mode
except ImportError:  # script mode: this directory is sys.path[0]
    from probe_nvml import collect_nvml, utc_timestamp  # type: ignore[no-redef]

SCHEMA = "gpufleet.probe"
SCHEMA_VERSION = 1
PROBE_VERSION = "0.1.0"

DEFAULT_SERVICES = (
    "nvidia-persistenced",
    "nvidia-fabricmanager",
    "nvidia-dcgm-exporter",
    "nvidia-dcgm",
    "node_exporter",
)
NCCL_CONF_PATH = "/etc/nccl.conf"
MAX_XID_LINES = 200
SUBPROCESS_TIMEOUT_S = 10.0

SCHEMA_FIELDS = """
schema, schema_version, probe_version, host, timestamp (UTC ISO 8601), duration_s, python_version,
nvml_error (null or status), nvml_error_message, driver_version, cuda_driver_version, nvml_version,
errors {field: status}, gpu_count,
gpus[]: index, status (ok | gpu_lost | <status of the handle call>), errors {dotted field: status},
  uuid, serial, name, pci_bus_id, pci_device_id, vbios_version, compute_capability, compute_mode, pstate,
  persistence_mode (bool), recovery_action (NVML's nvmlDeviceGpuRecoveryAction_t value: 0 none, 1 GPU reset, ...),
  power {limit_w, default_limit_w, min_limit_w, max_limit_w, enforced_limit_w, draw_w},
  temperature {gpu_c, memory_c, shutdown_c, slowdown_c, memory_max_c, gpu_max_c},
  clocks {sm_mhz, memory_mhz, graphics_mhz, max_sm_mhz, max_memory_mhz, max_graphics_mhz},
  clock_event_reasons {active_mask, supported_mask (hex strings), active [names], hardware_problems [names]},
  memory {total_mib, used_mib, free_mib}, utilization {gpu_pct, memory_pct},
  ecc {mode_current, mode_pending (bool), volatile_corrected, volatile_uncorrected, aggregate_corrected,
       aggregate_uncorrected},
  row_remap {correctable, uncorrectable, pending (bool), failure (bool)}, retired_pages_pending (bool),
  pcie {gen_current, gen_max, gen_gpu_max, width_current, width_max},
  nvlink {supported (bool), links [{link, up}], up, down [link ids]},
  mig {mode_current, mode_pending (bool), gpu_instances [{id, profile_id, profile_name, placement {start, size},
       compute_instances [{id, profile_id, profile_name, placement {start, size}, uuid}]}]},
  processes [{pid, name, used_mib, gpu_instance_id, compute_instance_id}],
services {status (ok | no_systemd | error), error, units {name: {load, active, sub, enabled}}},
nccl_conf {path, exists, content, values {KEY: VALUE}, error},
kernel_log {status (ok | unavailable | error), source (journalctl | dmesg | file), error, xid_lines []},
bench (null, or the document of bench.py)
"""


def _run(argv: list[str], timeout: float = SUBPROCESS_TIMEOUT_S) -> tuple[int | None, str, str]:
    """(returncode or None when it could not run, stdout, stderr-or-reason)."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout,
                              text=True, errors="replace", check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", f"{type(exc).__name__}: {exc}"
    return proc.returncode, proc.stdout, proc.stderr


def parse_systemctl_show(text: str, units: list[str] | tuple[str, ...]) -> dict[str, dict[str, str | None]]:
    """Parse ``systemctl show --property=Id,LoadState,ActiveState,SubState,UnitFileState UNIT...``.

    systemd prints one block of KEY=VALUE lines per unit, in the order asked, separated by a blank line.
    """
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition("=")
        if sep:
            current[key] = value
    if current:
        blocks.append(current)
    result: dict[str, dict[str, str | None]] = {}
    for i, unit in enumerate(units):
        block = blocks[i] if i < len(blocks) else {}
        load = block.get("LoadState") or None
        enabled = block.get("UnitFileState") or None
        if enabled is None and load == "not-found":
            enabled = "not-found"
        result[unit] = {
            "load": load,
            "active": block.get("ActiveState") or None,
            "sub": block.get("SubState") or None,
            "enabled": enabled,
        }
    return result


def collect_services(units: list[str] | tuple[str, ...] = DEFAULT_SERVICES,
                     systemctl: str | None = None) -> dict[str, Any]:
    """is-active / is-enabled of each unit in one ``systemctl show`` call; tolerates a host without systemd."""
    result: dict[str, Any] = {"status": "ok", "error": None, "units": {}}
    if not units:  # `systemctl show` without a unit would describe the manager itself
        return result
    exe = systemctl or shutil.which("systemctl")
    if exe is None:
        result.update(status="no_systemd", error="systemctl not found")
        return result
    names = [u if "." in u else u + ".service" for u in units]
    rc, out, err = _run([exe, "show", "--no-pager", "--property=Id,LoadState,ActiveState,SubState,UnitFileState",
                         *names])
    if rc is None:
        result.update(status="error", error=err.strip())
        return result
    if rc != 0 or not out.strip():
        message = (err or out).strip().splitlines()
        text = message[0] if message else f"systemctl exited {rc}"
        no_systemd = any(w in text for w in ("not been booted with systemd", "Failed to connect to bus",
                                             "System has not been booted"))
        result.update(status="no_systemd" if no_systemd else "error", error=text)
        return result
    parsed = parse_systemctl_show(out, names)
    result["units"] = {unit: parsed[name] for unit, name in zip(units, names)}  # noqa: B905 - py3.9 on nodes
    return result


def parse_nccl_conf(text: str) -> dict[str, str]:
    """KEY=VALUE pairs as NCCL reads them (src/misc/param.cc): no trimming, '#' comments, lines without '='
    ignored, and the first occurrence of a key wins (NCCL calls setenv without overwrite)."""
    values: dict[str, str] = {}
    for raw in text.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            continue
        values.setdefault(name, value)
    return values


def collect_nccl_conf(path: str = NCCL_CONF_PATH) -> dict[str, Any]:
    result: dict[str, Any] = {"path": path, "exists": False, "content": None, "values": {}, "error": None}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            content = fh.read(1 << 20)
    except FileNotFoundError:
        return result
    except OSError as exc:
        result.update(exists=os.path.exists(path), error=f"{type(exc).__name__}: {exc.strerror}")
        return result
    result.update(exists=True, content=content, values=parse_nccl_conf(content))
    return result


_XID_MARK = "NVRM: Xid"


def collect_kernel_log(journalctl: str | None = None, dmesg: str | None = None, path: str | None = None,
                       max_lines: int = MAX_XID_LINES) -> dict[str, Any]:
    """The kernel log lines of this boot that carry an NVIDIA Xid (the control side parses them)."""
    result: dict[str, Any] = {"status": "unavailable", "source": None, "error": None, "xid_lines": []}
    if path is not None:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            result.update(status="error", source="file", error=str(exc))
            return result
        lines = [line for line in text.splitlines() if _XID_MARK in line]
        result.update(status="ok", source="file", xid_lines=lines[-max_lines:])
        return result
    errors = []
    candidates = []
    exe = journalctl or shutil.which("journalctl")
    if exe:
        candidates.append(("journalctl", [exe, "-k", "-b", "--no-pager", "-q", "-o", "short-iso"]))
    exe = dmesg or shutil.which("dmesg")
    if exe:
        candidates.append(("dmesg", [exe]))
    for source, argv in candidates:
        rc, out, err = _run(argv)
        if rc == 0:
            lines = [line for line in out.splitlines() if _XID_MARK in line]
            result.update(status="ok", source=source, xid_lines=lines[-max_lines:])
            return result
        errors.append("{}: {}".format(source, (err.strip().splitlines() or [f"exit {rc}"])[0]))
    result["error"] = "; ".join(errors) if errors else "neither journalctl nor dmesg found"
    return result


# ----------------------------------------------------------------------------------------------------------------
# The document
# ----------------------------------------------------------------------------------------------------------------


def collect(nvml: Any = None, *, services: list[str] | tuple[str, ...] = DEFAULT_SERVICES,
            nccl_conf: str = NCCL_CONF_PATH, kernel_log: bool | str = True, hostname: str | None = None,
            bench: str = "none", bench_runner: Callable[..., dict[str, Any]] | None = None,
            exporters: dict | None = None) -> dict[str, Any]:
    """Build the probe document. ``kernel_log``: True (journalctl/dmesg), False (skip) or a file path.

    ``bench``: none | quick | full. With a profile other than ``none``, bench.py runs after the probe and its
    document is stored under ``bench``.
    """
    start = time.time()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "host": hostname or socket.gethostname(),
        "timestamp": utc_timestamp(start),
        "duration_s": None,
        "python_version": platform.python_version(),
    }
    doc.update(collect_nvml(nvml))
    doc["services"] = collect_services(services)
    doc["nccl_conf"] = collect_nccl_conf(nccl_conf)
    # the exporters ask for credentials: scraped only with the endpoints verify passes (None: not scraped)
    doc["exporters"] = _load_exporters().collect_exporters(exporters) if exporters else None
    if kernel_log is False:
        doc["kernel_log"] = {"status": "skipped", "source": None, "error": None, "xid_lines": []}
    else:
        doc["kernel_log"] = collect_kernel_log(path=kernel_log if isinstance(kernel_log, str) else None)
    doc["duration_s"] = round(time.time() - start, 4)
    doc["bench"] = None
    if bench != "none":
        if bench_runner is None:
            bench_runner = _load_bench().run_bench
        doc["bench"] = bench_runner(bench, gpus=doc["gpus"])
    return doc


def _load_exporters() -> Any:
    try:
        from . import exporters  # package mode
    except ImportError:
        import exporters  # type: ignore[no-redef]  # script mode
    return exporters


def _load_bench() -> Any:
    try:
        from . import bench  # package mode: python3 -m gpufleet.probe
    except ImportError:
        import bench  # type: ignore[no-redef]  # script mode: the probe directory is sys.path[0]
    return bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe", description="gpufleet node probe: prints one JSON document")
    parser.add_argument("--bench", choices=("none", "quick", "full"), default="none",
                        help="also run the benchmarks (default: none)")
    parser.add_argument("--services", default=",".join(DEFAULT_SERVICES),
                        help="comma-separated systemd units to report (default: %(default)s)")
    parser.add_argument("--nccl-conf", default=NCCL_CONF_PATH, help="NCCL config file (default: %(default)s)")
    parser.add_argument("--kernel-log", default=None,
                        help="read Xid lines from this file instead of journalctl/dmesg ('none' to skip)")
    parser.add_argument("--hostname", default=None, help="host name to report (default: this host's)")
    parser.add_argument("--output", "-o", default="-", help="write the JSON here instead of stdout")
    parser.add_argument("--indent", type=int, default=None)
    parser.add_argument("--exporters-stdin", action="store_true",
                        help="scrape the exporters whose URL, user and password stdin's first line holds (JSON)")
    args = parser.parse_args(argv)
    exporters = _load_exporters().read_endpoints(sys.stdin) if args.exporters_stdin else None
    kernel_log: bool | str = True
    if args.kernel_log == "none":
        kernel_log = False
    elif args.kernel_log:
        kernel_log = args.kernel_log
    services = tuple(s for s in args.services.split(",") if s)
    doc = collect(services=services, nccl_conf=args.nccl_conf, kernel_log=kernel_log, hostname=args.hostname,
                  bench=args.bench, exporters=exporters)
    text = json.dumps(doc, indent=args.indent, sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        # a random name beside it (O_EXCL: never through a symlink another user left), then an atomic rename
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(args.output)}.", dir=os.path.dirname(args.output) or ".")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
