"""Simulated NVIDIA DCGM: ``nv-hostengine`` and ``dcgm-exporter``, answering from the simulated GPU state.

``nv-hostengine [-n] [--service-account USER]``: stays in the foreground (``-n``, as the packaged unit runs it)
and holds the GPUs open (it registers as an NVML client, as the real host engine does: MIG mode changes must
stop it first).

``dcgm-exporter [-f COUNTERS.csv] [-a ADDRESS:PORT]``: serves ``/metrics`` in dcgm-exporter's exposition: the
fields of the counters file (``FIELD, type, help`` lines; ``label`` fields become labels), one series per GPU
with labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``hostname`` (+ label fields). Values
come from the state file at every scrape; a lost GPU exports nothing; ``DCGM_FI_PROF_*`` fields only on
datacenter GPUs (the real exporter cannot watch them elsewhere). It refuses to start without nv-hostengine's
pid file, as the real one fails without a host engine to connect to.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import state

HOSTENGINE_PID = "/run/nvidia-dcgm/nv-hostengine.pid"
DEFAULT_COUNTERS = "/etc/dcgm-exporter/default-counters.csv"
_GEFORCE_BRANDS = ("GeForce", "Titan", "NvidiaRTX", "Quadro")


def _num(value: str | None) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(int(value, 16)) if value.startswith("0x") else float(value)
    except ValueError:
        return None


def _last_xid(log: str) -> float:
    """DCGM_FI_DEV_XID_ERRORS: the value of the last Xid the host engine saw (0 before any)."""
    codes = [c for c in log.split(",") if c.strip()]
    return float(codes[-1]) if codes else 0.0


def field_values(g: dict[str, str]) -> dict[str, float | None]:
    """DCGM field -> value of one GPU (None: the field is blank for this GPU, as DCGM's blank values)."""
    mib = {k: _num(g.get(f"memory.{k}_mib")) or 0.0 for k in ("total", "reserved", "used")}
    ecc = g.get("ecc.supported") == "1" and g.get("ecc.current") == "1"
    remap = g.get("remap.supported") == "1"
    nvlink = (_num(g.get("nvlink.count")) or 0) > 0
    datacenter = g.get("brand", "") not in _GEFORCE_BRANDS
    util = _num(g.get("util.gpu")) or 0.0
    values: dict[str, float | None] = {
        "DCGM_FI_DEV_GPU_TEMP": _num(g.get("temp.gpu")),
        "DCGM_FI_DEV_MEMORY_TEMP": _num(g.get("temp.memory")),
        "DCGM_FI_DEV_POWER_USAGE": (_num(g.get("power.draw_mw")) or 0) / 1000,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": (_num(g.get("power.limit_mw")) or 0) / 1000,
        "DCGM_FI_DEV_SM_CLOCK": _num(g.get("clocks.sm")),
        "DCGM_FI_DEV_MEM_CLOCK": _num(g.get("clocks.mem")),
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_MEM_COPY_UTIL": _num(g.get("util.memory")),
        "DCGM_FI_DEV_FB_USED": mib["used"],
        "DCGM_FI_DEV_FB_FREE": mib["total"] - mib["reserved"] - mib["used"],
        "DCGM_FI_DEV_FB_RESERVED": mib["reserved"],
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": _num(g.get("clocks.event_reasons")),
        "DCGM_FI_DEV_PERSISTENCE_MODE": _num(g.get("persistence")),
        "DCGM_FI_DEV_MIG_MODE": _num(g.get("mig.current")) if g.get("mig.supported") == "1" else None,
        "DCGM_FI_DEV_XID_ERRORS": _last_xid(g.get("xid.log", "")),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _num(g.get("ecc.volatile.corrected")) if ecc else None,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _num(g.get("ecc.volatile.uncorrected")) if ecc else None,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _num(g.get("ecc.aggregate.corrected")) if ecc else None,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _num(g.get("ecc.aggregate.uncorrected")) if ecc else None,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": _num(g.get("remap.correctable")) if remap else None,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": _num(g.get("remap.uncorrectable")) if remap else None,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": _num(g.get("remap.pending")) if remap else None,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": _num(g.get("remap.failure")) if remap else None,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": util / 100 if datacenter else None,
        "DCGM_FI_PROF_SM_ACTIVE": util / 100 if datacenter else None,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0 if datacenter else None,
        "DCGM_FI_PROF_DRAM_ACTIVE": (_num(g.get("util.memory")) or 0) / 100 if datacenter else None,
    }
    for name in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"):
        values[f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL"] = 0.0 if nvlink else None
    return values


def read_counters(path: str) -> list[tuple[str, str, str]]:
    """(field, type, help) of a dcgm-exporter counters file."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split(",", 2)]
            if len(parts) == 3:
                rows.append((parts[0], parts[1], parts[2]))
    return rows


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(counters: list[tuple[str, str, str]], gpus: dict[str, str], hostname: str) -> str:
    """The exposition text for the current state."""
    label_fields = [field for field, kind, _ in counters if kind == "label"]
    rows = []
    if gpus.get("driver.loaded") == "1":
        for index in range(state.gpu_count(gpus)):
            g = state.gpu(gpus, index)
            if g.get("lost") == "1":
                continue
            labels = {"gpu": str(index), "UUID": g.get("uuid", ""), "pci_bus_id": g.get("pci.bus_id", ""),
                      "device": f"nvidia{g.get('minor', index)}", "modelName": g.get("name", ""),
                      "hostname": hostname}
            for field in label_fields:
                labels[field] = gpus.get("driver.version", "") if field == "DCGM_FI_DRIVER_VERSION" else ""
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            rows.append((text, field_values(g)))
    out = []
    for field, kind, help_text in counters:
        if kind == "label":
            continue
        samples = [(labels, values[field]) for labels, values in rows if values.get(field) is not None]
        if not samples:
            continue
        out.append(f"# HELP {field} {help_text}")
        out.append(f"# TYPE {field} {kind}")
        out += [f"{field}{{{labels}}} {value:g}" for labels, value in samples]
    return "\n".join(out) + "\n"


def _parse_args(argv: list[str], options: dict[str, str]) -> dict[str, str]:
    values = dict(options)
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, inline = arg.partition("=")
        if key in values and (eq or i + 1 < len(argv)):
            values[key] = inline if eq else argv[i + 1]
            i += 1 if eq else 2
            continue
        i += 1
    return values


def exporter_main(argv: list[str]) -> int:
    args = _parse_args(argv, {"-f": DEFAULT_COUNTERS, "-a": ":9400"})
    if not os.path.exists(HOSTENGINE_PID):
        print("level=ERROR msg=\"Failed to connect to the host engine (nv-hostengine is not running)\"",
              file=sys.stderr)
        return 1
    counters = read_counters(args["-f"])
    host, _, port = args["-a"].rpartition(":")
    hostname = socket.gethostname()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = render(counters, state.read_state(), hostname).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"level=INFO msg=\"Starting webserver\" address={args['-a']}", flush=True)
    server.serve_forever()
    return 0


def hostengine_main(argv: list[str]) -> int:
    try:  # hold the GPUs open as the real host engine does
        ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()
    except (OSError, AttributeError):
        pass
    os.makedirs(os.path.dirname(HOSTENGINE_PID), exist_ok=True)
    with open(HOSTENGINE_PID, "w") as fh:
        fh.write(f"{os.getpid()}\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("Started host engine version 4.2.3 using port number: 5555", flush=True)
    stop.wait()
    os.unlink(HOSTENGINE_PID)
    return 0


def main(argv: list[str]) -> int:
    """Entry point of both commands, chosen by the program name the wrapper passes first."""
    program, rest = (argv[0], argv[1:]) if argv else ("dcgm-exporter", [])
    return hostengine_main(rest) if program == "nv-hostengine" else exporter_main(rest)
