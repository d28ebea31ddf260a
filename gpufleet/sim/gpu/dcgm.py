"""Simulated NVIDIA DCGM: ``nv-hostengine`` and ``dcgm-exporter``, answering from the simulated GPU state.

Stand-ins for the binaries of NVIDIA's packages (``datacenter-gpu-manager-4-core``, ``datacenter-gpu-manager-exporter``
of each release sim/repo_dcgm.py publishes), run by the packages' units (``gpufleet/sim/dcgm_files.py``: gpufleet's own
files with the directives NVIDIA's packaged units have).

``nv-hostengine``: takes DCGM 4's options (``-n``, ``-p PORT``, ``-b ADDRESS``, ``--service-account``, ...; an unknown
one is refused), listens on 127.0.0.1:5555 as the real one does, and holds the GPUs open (an NVML client: MIG mode
changes must stop it first). Without ``-n`` it daemonizes (pid file ``--pid``).

``dcgm-exporter``: parses dcgm-exporter's flags as Go's flag package does (``-f``/``--collectors``, ``-a``, ``-c`` in
milliseconds, ``-r``/``--remote-hostengine-info``, ``-n``, ...; an unknown flag or a bad value is refused with exit 1)
and reads its counters file as the real one does (CSV, ``#`` comments, three fields, a DCGM field its release's field
map knows and a Prometheus type, else the whole file is refused). With ``-r`` it connects to that host engine and reads
every value through it (it exits 1 when none listens there: systemd restarts it); without ``-r`` it embeds its own host
engine (it then holds the GPUs itself: a second engine beside nv-hostengine). It collects every ``-c`` milliseconds
(default 30000) and answers ``/metrics`` with its last collection, in the exposition of the version it claims: labels
``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname`` (the host part of ``-r`` when connected to a
host engine, else the host's name; none with ``-n``), then the label fields, then on ``DCGM_FI_DEV_XID_ERRORS``
``err_code`` and ``err_msg`` (the shape of the release; the text is gpufleet's, ``xid_err_msg.py``, not the release's
own); integer fields printed as integers, floating ones with six decimals; a blank field is left out. ``DCGM_FI_PROF_*``
are collected only on datacenter GPUs, and on Ampere and earlier only with the proprietary package's profiling module
installed (else "metric not enabled", as the real exporter logs).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import daemon, state

try:  # on a simulated host: gpufleet/exporter/web.py copied beside this file (sim/repo.py)
    from . import web
except ImportError:  # from the gpufleet source tree (unit tests)
    from gpufleet.exporter import web
from .xid_err_msg import err_msg

VERSION = "4.5.3"
EXPORTER_VERSION = "4.5.3-4.8.2"
HOSTENGINE_PORT = 5555
HOSTENGINE_BIND = "127.0.0.1"
HOSTENGINE_PID = "/var/run/nvhostengine.pid"  # nv-hostengine's --pid default
DEFAULT_COUNTERS = "/etc/dcgm-exporter/default-counters.csv"
FIELD_MAP = "/usr/lib/gpufleet-sim/dcgm-exporter-fields"  # installed by the simulated exporter package
# installed by the simulated datacenter-gpu-manager-4-proprietary (the profiling module of Ampere and earlier)
PROFILING_MODULE = "/usr/lib/gpufleet-sim/dcgm-proprietary"
_GEFORCE_BRANDS = ("GeForce", "Titan", "NvidiaRTX", "Quadro")
_PROFILING_PACKAGE_ARCHITECTURES = ("Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere")
INT64, DOUBLE, STRING = "int64", "double", "string"
# DCGM fields the simulator knows: name -> (field id, type), as dcgm_fields.h / go-dcgm name them (DCGM 4.5).
FIELDS = {
    "DCGM_FI_DRIVER_VERSION": (1, STRING),
    "DCGM_FI_DEV_PERSISTENCE_MODE": (66, INT64),
    "DCGM_FI_DEV_MIG_MODE": (67, INT64),
    "DCGM_FI_DEV_SM_CLOCK": (100, INT64),
    "DCGM_FI_DEV_MEM_CLOCK": (101, INT64),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (112, INT64),
    "DCGM_FI_DEV_MEMORY_TEMP": (140, INT64),
    "DCGM_FI_DEV_GPU_TEMP": (150, INT64),
    "DCGM_FI_DEV_POWER_USAGE": (155, DOUBLE),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (156, INT64),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": (158, INT64),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": (159, INT64),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": (160, DOUBLE),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": (202, INT64),
    "DCGM_FI_DEV_GPU_UTIL": (203, INT64),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (204, INT64),
    "DCGM_FI_DEV_ENC_UTIL": (206, INT64),
    "DCGM_FI_DEV_DEC_UTIL": (207, INT64),
    "DCGM_FI_DEV_XID_ERRORS": (230, INT64),
    "DCGM_FI_DEV_FB_FREE": (251, INT64),
    "DCGM_FI_DEV_FB_USED": (252, INT64),
    "DCGM_FI_DEV_FB_RESERVED": (253, INT64),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": (310, INT64),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (311, INT64),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (312, INT64),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (313, INT64),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (393, INT64),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (394, INT64),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": (395, INT64),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": (396, INT64),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (409, INT64),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (419, INT64),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (429, INT64),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (439, INT64),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (449, INT64),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": (526, INT64),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (1001, DOUBLE),
    "DCGM_FI_PROF_SM_ACTIVE": (1002, DOUBLE),
    "DCGM_FI_PROF_SM_OCCUPANCY": (1003, DOUBLE),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (1004, DOUBLE),
    "DCGM_FI_PROF_DRAM_ACTIVE": (1005, DOUBLE),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": (1006, DOUBLE),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": (1007, DOUBLE),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": (1008, DOUBLE),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (1009, INT64),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (1010, INT64),
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": (1523, INT64),
}
# dcgm-exporter's own fields (no DCGM field id) and the Prometheus types its counters file may name
EXPORTER_FIELDS = ("DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_GPU_HEALTH_STATUS",
                   "DCGM_EXP_P2P_STATUS")
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
DCP_FIELDS = range(1000, 1100)
NVLINK_ERRORS = {"CRC_FLIT": "crc_flit", "CRC_DATA": "crc_data", "REPLAY": "replay", "RECOVERY": "recovery"}


class Refused(Exception):
    """A flag, value or counters file the real program refuses (it exits 1)."""


def _log(level: str, msg: str, **attrs: str) -> None:
    """slog's text handler, as dcgm-exporter logs to stderr."""
    extra = "".join(f" {k}={v!r}" if " " in str(v) else f" {k}={v}" for k, v in attrs.items())
    print(f'time={time.strftime("%Y-%m-%dT%H:%M:%S")} level={level} msg="{msg}"{extra}', file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ field values


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


def nvlink_errors(g: dict[str, str], kind: str) -> int:
    """NVML's *_ERROR_COUNT_TOTAL field of a GPU: its per-link counters (``nvlink.errors.KIND``, one count per link,
    comma-separated) summed, as the driver totals them for every link."""
    return sum(int(v) for v in g.get(f"nvlink.errors.{kind}", "").split(",") if v.strip().isdigit())


def profiling_supported(g: dict[str, str]) -> bool:
    """DCGM's profiling module answers on datacenter GPUs; on Ampere and earlier only with NVIDIA's proprietary
    package installed."""
    if g.get("brand", "") in _GEFORCE_BRANDS:
        return False
    return g.get("architecture") not in _PROFILING_PACKAGE_ARCHITECTURES or os.path.exists(PROFILING_MODULE)


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
        "DCGM_FI_DEV_SLOWDOWN_TEMP": _num(g.get("temp.slowdown")),
        "DCGM_FI_DEV_SHUTDOWN_TEMP": _num(g.get("temp.shutdown")),
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
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": _num(g.get("recovery_action")) or 0.0,
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
    for name, kind in NVLINK_ERRORS.items():
        values[f"DCGM_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL"] = float(nvlink_errors(g, kind)) if nvlink else None
    return values


# ------------------------------------------------------------------------------------------------ counters file


def field_map(path: str = FIELD_MAP) -> tuple[str, frozenset[str]]:
    """(release, the DCGM field names its counters file may hold): the field map the simulated package of a
    dcgm-exporter release installs (sim/repo_dcgm.py, from the record); without one, the newest release and the
    fields the simulator knows."""
    try:
        with open(path, encoding="utf-8") as fh:
            tag, *names = fh.read().split()
    except FileNotFoundError:
        return EXPORTER_VERSION, frozenset(FIELDS)
    return tag, frozenset(names)


def read_counters(path: str, known: frozenset[str] | None = None) -> list[tuple[str, str, str]]:
    """(field, type, help) of a dcgm-exporter counters file, checked as dcgm-exporter's ``ExtractCounters`` does
    (Go's encoding/csv with Comment '#') against the field map of its release (``known``; None: the installed
    one's); raises :class:`Refused` with the real message."""
    known = field_map()[1] if known is None else known
    rows = []
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh.read().splitlines() if line.strip() and not line.startswith("#")]
    for i, line in enumerate(lines):
        record = [part.strip(" ") for part in line.split(",")]
        if len(record) != 3:
            raise Refused(f"malformed CSV record; err: failed to parse line {i} (`[{' '.join(record)}]`), "
                          "expected 3 fields")
        field, kind, help_text = record
        if field not in known and field not in EXPORTER_FIELDS:
            raise Refused(f"could not find DCGM field; err: unknown metric type '{field}'")
        if kind not in PROM_TYPES:
            raise Refused(f"could not find Prometheus metric type '{kind}'")
        rows.append((field, kind, help_text))
    return rows


# ------------------------------------------------------------------------------------------------ exposition


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format(field: str, value: float) -> str:
    """dcgm-exporter's toString: int64 fields as integers, double fields with %f."""
    return f"{value:f}" if FIELDS.get(field, (0, INT64))[1] == DOUBLE else f"{int(value)}"


def render(counters: list[tuple[str, str, str]], gpus: dict[str, str], hostname: str | None,
           profiling: bool | None = None) -> str:
    """The exposition of one collection of ``gpus`` (the state), as dcgm-exporter 4.5.3-4.8.2 renders it.
    ``profiling``: whether DCGM_FI_PROF_* are collected (None: as the GPUs and the profiling module allow)."""
    label_fields = sorted(field for field, kind, _ in counters if kind == "label")
    rows = []
    if gpus.get("driver.loaded") == "1":
        for index in range(state.gpu_count(gpus)):
            g = state.gpu(gpus, index)
            if g.get("lost") == "1":
                continue
            labels = [("gpu", str(index)), ("UUID", g.get("uuid", "")), ("pci_bus_id", g.get("pci.bus_id", "")),
                      ("device", f"nvidia{index}"), ("modelName", g.get("name", ""))]
            if hostname:
                labels.append(("Hostname", hostname))
            for field in label_fields:
                labels.append((field, gpus.get("driver.version", "") if field == "DCGM_FI_DRIVER_VERSION" else ""))
            dcp = profiling if profiling is not None else profiling_supported(g)
            rows.append((labels, field_values(g), dcp))
    out = []
    for field, kind, help_text in counters:
        if kind == "label" or field not in FIELDS:
            continue
        samples = []
        for labels, values, dcp in rows:
            value = values.get(field)
            if value is None or (FIELDS[field][0] in DCP_FIELDS and not dcp):
                continue
            attrs = []
            if field == "DCGM_FI_DEV_XID_ERRORS":
                attrs = [("err_code", str(int(value))), ("err_msg", err_msg(int(value)))]
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in [*labels, *attrs])
            samples.append(f"{field}{{{text}}} {_format(field, value)}")
        if not samples:
            continue
        out += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}", *samples]
    return "\n".join(out) + "\n" if out else ""


# ------------------------------------------------------------------------------------------------ flags

# dcgm-exporter 4.5.3-4.8.2's flags (pkg/cmd/app.go): name -> (aliases, kind, default)
EXPORTER_FLAGS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "collectors": (("f",), "string", DEFAULT_COUNTERS),
    "address": (("a",), "string", ":9400"),
    "collect-interval": (("c",), "int", "30000"),
    "kubernetes": (("k",), "bool", "false"),
    "use-old-namespace": (("o",), "bool", "false"),
    "cpu-devices": (("p",), "string", "f"),
    "configmap-data": (("m",), "string", "none"),
    "remote-hostengine-info": (("r",), "string", "localhost:5555"),
    "kubernetes-enable-pod-labels": ((), "bool", "false"),
    "kubernetes-enable-pod-uid": ((), "bool", "false"),
    "kubernetes-gpu-id-type": ((), "string", "uid"),
    "kubernetes-pod-label-allowlist-regex": ((), "string", ""),
    "devices": (("d",), "string", "f"),
    "no-hostname": (("n",), "bool", "false"),
    "switch-devices": (("s",), "string", "f"),
    "fake-gpus": ((), "bool", "false"),
    "web-config-file": ((), "string", ""),
    "xid-count-window-size": (("x",), "int", "300000"),
    "replace-blanks-in-model-name": (("rbmn",), "bool", "false"),
    "debug": ((), "bool", "false"),
    "clock-events-count-window-size": ((), "int", "300000"),
    "enable-dcgm-log": ((), "bool", "false"),
    "dcgm-log-level": ((), "string", "NONE"),
    "log-format": ((), "string", "text"),
    "pod-resources-kubelet-socket": ((), "string", "/var/lib/kubelet/pod-resources/kubelet.sock"),
    "hpc-job-mapping-dir": ((), "string", ""),
    "nvidia-resource-names": ((), "string", ""),
    "kubernetes-virtual-gpus": ((), "bool", "false"),
    "dump-enabled": ((), "bool", "false"),
    "dump-directory": ((), "string", "/tmp/dcgm-exporter-debug"),
    "dump-retention": ((), "int", "24"),
    "dump-compression": ((), "bool", "true"),
    "kubernetes-enable-dra": ((), "bool", "false"),
    "disable-startup-validate": ((), "bool", "false"),
    "enable-gpu-bind-unbind-watch": ((), "bool", "false"),
    "gpu-bind-unbind-poll-interval": ((), "string", "1s"),
    "enable-pprof": ((), "bool", "false"),
    "web-systemd-socket": ((), "bool", "false"),
    "help": (("h",), "bool", "false"),
    "version": (("v",), "bool", "false"),
}


def parse_flags(argv: list[str], flags: dict[str, tuple[tuple[str, ...], str, str]]) -> tuple[dict[str, str], set]:
    """Go's flag package (which urfave/cli parses with): ``-x V``, ``-x=V``, ``--name V``, ``--name=V``; booleans take
    no separate value; parsing stops at the first non-flag argument or ``--``. Returns ({name: value}, names set)."""
    by_alias = {alias: name for name, (aliases, _, _) in flags.items() for alias in (name, *aliases)}
    values = {name: default for name, (_, _, default) in flags.items()}
    given: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        key, eq, inline = arg.lstrip("-").partition("=")
        name = by_alias.get(key)
        if name is None:
            raise Refused(f"flag provided but not defined: -{key}")
        kind = flags[name][1]
        if kind == "bool":
            value = inline if eq else "true"
            if value not in ("true", "false", "1", "0", "t", "f", "TRUE", "FALSE", "True", "False"):
                raise Refused(f'invalid boolean value "{value}" for -{key}: parse error')
            i += 1
        else:
            if not eq and i + 1 >= len(argv):
                raise Refused(f"flag needs an argument: -{key}")
            value = inline if eq else argv[i + 1]
            i += 1 if eq else 2
            if kind == "int":
                try:
                    int(value, 0)
                except ValueError:
                    raise Refused(f'invalid value "{value}" for flag -{key}: parse error') from None
        values[name] = value
        given.add(name)
    return values, given


# ------------------------------------------------------------------------------------------------ nv-hostengine

# nv-hostengine's options (DCGM 4, hostengine/src/HostEngineCommandLine.cpp): name -> (short, kind, default)
HOSTENGINE_OPTIONS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "term": (("t",), "bool", "false"),
    "port": (("p",), "int", str(HOSTENGINE_PORT)),
    "domain-socket": (("d",), "string", "/tmp/nv-hostengine"),
    "no-daemon": (("n",), "bool", "false"),
    "bind-interface": (("b",), "string", HOSTENGINE_BIND),
    "vsock-cid": (("c",), "string", ""),
    "pid": ((), "string", HOSTENGINE_PID),
    "log-level": ((), "string", ""),
    "log-filename": (("f",), "string", ""),
    "log-rotate": ((), "bool", "false"),
    "denylist-modules": ((), "string", ""),
    "service-account": ((), "string", ""),
    "home-dir": ((), "string", ""),
}


def _serve_engine(server: socket.socket, stop: threading.Event) -> None:
    """The host engine's API, as the simulator needs it: a client sends ``STATE`` lines, each answered with the
    GPU state (what the engine watches) followed by a line ``.``."""

    def client(conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                if line.strip() != b"STATE":
                    break
                stream.write(state.render(state.read_state()).encode() + b".\n")
                stream.flush()

    server.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=client, args=(conn,), daemon=True).start()


def hostengine_main(argv: list[str]) -> int:
    try:
        options, _ = parse_flags(argv, HOSTENGINE_OPTIONS)
    except Refused as error:
        print(f"PARSE ERROR: {error}\n\nBrief USAGE:\n   nv-hostengine  [-t] [-p <PORT>] ...", file=sys.stderr)
        return 1
    bind = "0.0.0.0" if options["bind-interface"] == "ALL" else options["bind-interface"]
    server = socket.create_server((bind, int(options["port"])), reuse_port=False)
    if options["no-daemon"] not in ("true", "1", "t", "TRUE", "True"):
        daemon.daemonize(options["pid"])
    try:  # hold the GPUs open as the real host engine does (an NVML client)
        ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()
    except (OSError, AttributeError):
        pass
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"Started host engine version {VERSION} using port number: {options['port']}", flush=True)
    threading.Thread(target=_serve_engine, args=(server, stop), daemon=True).start()
    stop.wait()
    server.close()
    return 0


# ------------------------------------------------------------------------------------------------ dcgm-exporter


class RemoteEngine:
    """The connection to nv-hostengine (``-r HOST:PORT``)."""

    def __init__(self, address: str):
        host, _, port = address.rpartition(":")
        if not host:
            host, port = address, str(HOSTENGINE_PORT)
        self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
        self.stream = self.sock.makefile("rwb")
        self.lock = threading.Lock()

    def read_state(self) -> dict[str, str]:
        with self.lock:
            self.stream.write(b"STATE\n")
            self.stream.flush()
            lines = []
            for line in self.stream:
                if line == b".\n":
                    return state.parse(b"".join(lines).decode())
                lines.append(line)
        raise ConnectionError("the host engine closed the connection")


def _hostname(options: dict[str, str], given: set, remote: bool) -> str | None:
    """dcgm-exporter's Hostname label (internal/pkg/hostname): none with -n, the host part of -r when connected to a
    host engine, else NODE_NAME or the host's name."""
    if options["no-hostname"] in ("true", "1", "t", "TRUE", "True"):
        return None
    if remote:  # Go's net.SplitHostPort, the address itself where it has no port
        address = options["remote-hostengine-info"]
        if address.startswith("[") and "]:" in address:
            return address[1:address.index("]:")]
        return address.partition(":")[0] if address.count(":") == 1 else address
    return os.environ.get("NODE_NAME") or socket.gethostname()


def exporter_main(argv: list[str]) -> int:
    try:
        options, given = parse_flags(argv, EXPORTER_FLAGS)
    except Refused as error:
        print(f"Incorrect Usage: {error}\n", file=sys.stderr)
        _log("ERROR", str(error))
        return 1
    release, known = field_map()
    _log("INFO", "Starting dcgm-exporter", Version=release)
    remote = "remote-hostengine-info" in given  # UseRemoteHE = c.IsSet(CLIRemoteHEInfo)
    if remote:
        _log("INFO", "Attempting to connect to remote hostengine at " + options["remote-hostengine-info"])
        try:
            engine = RemoteEngine(options["remote-hostengine-info"])
        except (OSError, ValueError) as error:
            _log("ERROR", "Failed to connect to remote hostengine", address=options["remote-hostengine-info"],
                 error=str(error), hint="Verify nv-hostengine is running and listening on the expected address.")
            return 1
        read = engine.read_state
    else:
        _log("INFO", "Attempting to initialize DCGM.")
        try:  # the embedded host engine opens the GPUs itself: a second engine beside any nv-hostengine
            ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()
        except (OSError, AttributeError) as error:
            _log("ERROR", f"libnvidia-ml.so.1 could not be loaded: {error}")
            return 1
        read = state.read_state
    _log("INFO", "Initialized DCGM Fields module.")
    try:
        counters = read_counters(options["collectors"], known)
    except (OSError, Refused) as error:
        _log("ERROR", str(error))
        return 1
    hostname = _hostname(options, given, remote)
    try:  # exporter-toolkit's web configuration (dcgm-exporter's --web-config-file): basic auth, TLS
        web_config = web.WebConfig(options["web-config-file"] or None)
    except web.WebConfigError as error:
        _log("ERROR", "Failed to load the web configuration", error=str(error))
        return 1
    interval = int(options["collect-interval"], 0) / 1000.0
    latest = {"text": "", "collections": 0}
    failed = threading.Event()

    def collect() -> None:
        while not failed.is_set():
            try:
                text = render(counters, read(), hostname)
            except (OSError, ConnectionError) as error:
                _log("ERROR", "Failed to collect metrics", error=str(error))
                failed.set()
                return
            latest["text"], latest["collections"] = text, latest["collections"] + 1
            time.sleep(interval)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            if not web.guard(self, web_config):
                return
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = latest["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            web.add_headers(self, web_config)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    host, _, port = options["address"].rpartition(":")
    server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
    try:
        web.wrap_tls(server, web_config)
    except web.WebConfigError as error:
        _log("ERROR", "Failed to load the web configuration", error=str(error))
        return 1
    threading.Thread(target=collect, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    _log("INFO", "Starting webserver", address=options["address"])
    threading.Thread(target=lambda: (failed.wait(), server.shutdown()), daemon=True).start()
    server.serve_forever()
    return 1 if failed.is_set() else 0


def main(argv: list[str]) -> int:
    """Entry point of both commands, chosen by the program name the wrapper passes first."""
    program, rest = (argv[0], argv[1:]) if argv else ("dcgm-exporter", [])
    return hostengine_main(rest) if program == "nv-hostengine" else exporter_main(rest)
