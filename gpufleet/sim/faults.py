"""Fault injection into a simulated host: `gpufleet sim fault HOST KIND [--gpu N]` and `... clear`.

Hardware faults change the host's GPU state file (original values are kept under ``fault.*`` keys so
``clear`` restores them); ``busy`` starts a process holding the GPU inside the host; ``host-down`` cuts
the host's network link (its carrier: the host keeps its addresses and routes, as a real one does); ``xid``
appends an Xid code to the GPU's Xid log (``gpu.N.xid.log``: NVML's Xid events, DCGM's last Xid) and its
``NVRM: Xid`` line to the host's kernel log.
"""

from __future__ import annotations

import shlex
import time

from . import network
from .gpu import state as gpu_state
from .hosts import Fleet, Host, SimError, run_on
from .hosts_paths import HW_MOUNT

THERMAL_BITS = 0x20 | 0x40  # SW thermal slowdown + HW thermal slowdown
OVERHEAT_C = 92
BUSY_UNIT = "gpufleet-sim-busy-{gpu}"
KINDS = ("overheat", "ecc", "lost", "xid", "busy", "driver-unloaded", "host-down", "clear")
DEFAULT_XID = 79  # GPU has fallen off the bus
XID_LOG_MAX = 64  # codes kept per GPU in `gpu.N.xid.log` (the driver's event queue is bounded too)
# The simulated kernel's messages: Xid lines as the driver prints them, in the host's hardware directory; a
# `journalctl` wrapper (first on root's PATH) prints them for `journalctl -k`, where verify's probe reads Xids.
KMSG = "kmsg"
JOURNALCTL_WRAPPER = "usr/local/bin/journalctl"


def _remember(gpus: dict[str, str], key: str) -> None:
    gpus.setdefault(f"fault.orig.{key}", gpus.get(key, ""))


def _overheat(gpus: dict[str, str], g: str) -> None:
    for field in ("temp.gpu", "temp.memory", "clocks.event_reasons", "clocks.sm", "clocks.graphics"):
        _remember(gpus, g + field)
    gpus[g + "temp.gpu"] = str(OVERHEAT_C)
    if gpus.get(g + "temp.memory"):
        gpus[g + "temp.memory"] = str(OVERHEAT_C + 4)
    reasons = int(gpus.get(g + "clocks.event_reasons", "0"), 16) & ~0x1
    gpus[g + "clocks.event_reasons"] = f"0x{reasons | THERMAL_BITS:016x}"
    for clock in ("clocks.sm", "clocks.graphics"):
        if gpus.get(g + clock):
            gpus[g + clock] = str(int(gpus[g + clock]) // 2)


def _ecc(gpus: dict[str, str], g: str, host: str, gpu: int) -> None:
    if gpus.get(g + "ecc.supported") != "1":
        raise SimError(f"{host}: GPU {gpu} ({gpus.get(g + 'name')}) has no ECC memory")
    for field in ("ecc.volatile.uncorrected", "ecc.aggregate.uncorrected", "remap.pending",
                  "remap.uncorrectable"):
        _remember(gpus, g + field)
    for field in ("ecc.volatile.uncorrected", "ecc.aggregate.uncorrected"):
        gpus[g + field] = str(int(gpus.get(g + field) or 0) + 2)
    if gpus.get(g + "remap.supported") == "1":
        gpus[g + "remap.pending"] = "1"
        gpus[g + "remap.uncorrectable"] = str(int(gpus.get(g + "remap.uncorrectable") or 0) + 1)


def _xid(gpus: dict[str, str], g: str, code: int) -> str:
    """Append ``code`` to the GPU's Xid log (NVML delivers it as an Xid event, DCGM exports it as the last Xid);
    return the kernel log line the driver prints for it."""
    log = [c for c in gpus.get(g + "xid.log", "").split(",") if c]
    gpus[g + "xid.log"] = ",".join([*log, str(code)][-XID_LOG_MAX:])
    domain, bus, device = gpus.get(g + "pci.bus_id", "00000000:00:00.0").split(".")[0].split(":")
    return (f"NVRM: Xid (PCI:{int(domain, 16):04x}:{bus.lower()}:{device.lower()}): {code}, pid='<unknown>', "
            "name=<unknown>, injected by gpufleet sim fault")


def _write_kernel_log(host: Host, line: str) -> None:
    with open(host.dir / "hw" / KMSG, "a", encoding="utf-8") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {host.name} kernel: {line}\n")
    wrapper = host.dir / "root" / JOURNALCTL_WRAPPER
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(
        "#!/bin/sh\n# gpufleet sim: the simulated kernel's messages (injected Xids) for `journalctl -k`\n"
        f"case \" $* \" in *\" -k \"*|*\" --dmesg \"*) cat {HW_MOUNT}/{KMSG} 2>/dev/null;; esac\n"
        "exec /usr/bin/journalctl \"$@\"\n")
    wrapper.chmod(0o755)


def _restore(gpus: dict[str, str]) -> None:
    for key in [k for k in gpus if k.startswith("fault.orig.")]:
        gpus[key[len("fault.orig."):]] = gpus.pop(key)
    for index in range(gpu_state.gpu_count(gpus)):
        gpus[f"gpu.{index}.lost"] = "0"
        gpus.pop(f"gpu.{index}.xid.log", None)


def inject(fleet: Fleet, host_name: str, kind: str, gpu: int = 0, code: int = DEFAULT_XID) -> str:
    """Apply a fault; return a one-line description of what was done. ``code``: the Xid of ``xid``."""
    if kind not in KINDS:
        raise SimError(f"unknown fault {kind!r}; allowed: {', '.join(KINDS)}")
    host = fleet.host(host_name)
    path = str(host.dir / "hw/gpus.state")
    if kind == "host-down":
        network.set_host_link(host.index, fleet.net, up=False)
        return f"{host.name}: network link down (sshd unreachable)"
    if kind == "clear":
        return _clear(fleet, host, path)
    with gpu_state.locked(path) as gpus:
        count = gpu_state.gpu_count(gpus)
        if not 0 <= gpu < count:
            raise SimError(f"{host.name}: --gpu {gpu} out of range; this host has GPUs 0..{count - 1}")
        g = f"gpu.{gpu}."
        if kind == "overheat":
            _overheat(gpus, g)
        elif kind == "ecc":
            _ecc(gpus, g, host.name, gpu)
        elif kind == "lost":
            gpus[g + "lost"] = "1"
        elif kind == "xid":
            if not 0 < code < 1000:
                raise SimError(f"{host.name}: --code {code}: an Xid is a number from 1 to 999")
            kernel_line = _xid(gpus, g, code)
        elif kind == "driver-unloaded":
            _remember(gpus, "driver.version")
            _remember(gpus, "driver.loaded")
            gpus["driver.loaded"] = "0"
            gpus["driver.version"] = ""
    if kind == "busy":
        _start_busy(host, gpu)
    if kind == "xid":
        _write_kernel_log(host, kernel_line)
        return f"{host.name}: Xid {code} on GPU {gpu}"
    return f"{host.name}: {kind} on GPU {gpu}" if kind != "driver-unloaded" else f"{host.name}: driver unloaded"


def _start_busy(host: Host, gpu: int) -> None:
    result = run_on(host, ["systemd-run", f"--unit={BUSY_UNIT.format(gpu=gpu)}",
                           "--setenv=PYTHONPATH=/usr/lib/gpufleet-sim", "python3", "-m", "simgpu.hold", str(gpu)])
    if result.returncode != 0:
        raise SimError(f"{host.name}: could not start a process on GPU {gpu} (is the driver installed?): "
                       f"{result.stderr.strip()}")


def _clear(fleet: Fleet, host: Host, path: str) -> str:
    network.set_host_link(host.index, fleet.net, up=True)
    with gpu_state.locked(path) as gpus:
        _restore(gpus)
        count = gpu_state.gpu_count(gpus)
    (host.dir / "hw" / KMSG).unlink(missing_ok=True)
    (host.dir / "root" / JOURNALCTL_WRAPPER).unlink(missing_ok=True)
    units = [BUSY_UNIT.format(gpu=i) + ".service" for i in range(count)]
    run_on(host, ["systemctl", "stop", *units], timeout=30)
    return f"{host.name}: faults cleared"


# ------------------------------------------------------------------------------------------------ gates
# A gate makes one program on a host stop, before it runs, when its arguments contain a given text, until the gate
# is opened: a deterministic point in a run (a driver install, a MIG mode change, a power limit change) at which
# tests inject a fault or a signal, waiting on `gate_reached` instead of sleeping. The wrapper shadows the program
# in /usr/local/sbin (first on root's PATH); its markers live in the host's hardware directory, which the
# controller sees even while the host's network is down.
GATE_BIN = "usr/local/sbin"


def _gate_paths(host: Host, program: str):
    hw = host.dir / "hw"
    return hw / f"gate.{program}.closed", hw / f"gate.{program}.reached", host.dir / "root" / GATE_BIN / program


def close_gate(host: Host, program: str, match: str, real: str | None = None) -> None:
    """Stop ``program`` on ``host`` before it runs when its arguments contain ``match``, until :func:`open_gate`.
    Only commands of an SSH session (a run) stop: the host's own services (boot units) pass."""
    closed, reached, wrapper = _gate_paths(host, program)
    real = real or f"/usr/bin/{program}"
    inside = f"{HW_MOUNT}/{closed.name}", f"{HW_MOUNT}/{reached.name}"
    closed.touch()
    reached.unlink(missing_ok=True)
    wrapper.write_text(
        "#!/bin/sh\n# gpufleet sim gate (test harness): wait here while the gate is closed\n"
        f"case \"${{SSH_CONNECTION:+ssh}} $* \" in \"ssh \"*{shlex.quote(match)}*)\n"
        f"  touch {inside[1]}\n"
        f"  while [ -e {inside[0]} ]; do sleep 0.1; done;;\n"
        "esac\n"
        f"exec {shlex.quote(real)} \"$@\"\n")
    wrapper.chmod(0o755)


def gate_reached(host: Host, program: str) -> bool:
    return _gate_paths(host, program)[1].exists()


def open_gate(host: Host, program: str) -> None:
    closed, reached, wrapper = _gate_paths(host, program)
    wrapper.unlink(missing_ok=True)
    closed.unlink(missing_ok=True)
