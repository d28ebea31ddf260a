"""The simulated GPU state file: read, write under lock, reset at power cycle.

Stdlib only: this module also runs inside simulated hosts (installed as ``simgpu``), see STATE.md.
"""

from __future__ import annotations

import fcntl
import os

DEFAULT_PATH = "/var/lib/gpufleet-sim/hw/gpus.state"
INSTALLED_DRIVER_VERSION_FILE = "usr/lib/gpufleet-sim/driver-version"
INSTALLED_CUDA_VERSION_FILE = "usr/lib/gpufleet-sim/cuda-version"
VOLATILE_PREFIXES = ("mig.gi.", "mig.ci.", "client.", "proc.")


def state_path() -> str:
    return os.environ.get("GPUFLEET_SIM_STATE", DEFAULT_PATH)


def own_driver_version_path() -> str:
    """Inside a host: the installed driver package's version file, which nvidia-smi and the daemons read."""
    return os.environ.get("GPUFLEET_SIM_DRIVER_VERSION_FILE", "/" + INSTALLED_DRIVER_VERSION_FILE)


def parse(text: str) -> dict[str, str]:
    state: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        state[key] = value
    return state


def render(state: dict[str, str]) -> str:
    return "".join(f"{key}={state[key]}\n" for key in sorted(state))


def read_state(path: str | None = None) -> dict[str, str]:
    path = path or state_path()
    with open(path, encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        return parse(handle.read())


class locked:  # used as a function: ``with locked(path) as state``
    """``with locked(path) as state``: the state for modification, under an exclusive lock; it is written back
    when the block ends without error. (A class, not ``contextlib.contextmanager``: contextlib's imports cost every
    simulated program's start more than its use.)"""

    def __init__(self, path: str | None = None):
        self.path = path or state_path()

    def __enter__(self) -> dict[str, str]:
        self.handle = open(self.path, "r+", encoding="utf-8")  # closed by __exit__
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX)
            self.state = parse(self.handle.read())
        except BaseException:
            self.handle.close()
            raise
        return self.state

    def __exit__(self, kind, value, traceback) -> None:
        with self.handle:
            if kind is None:
                self.handle.seek(0)
                self.handle.truncate()
                self.handle.write(render(self.state))


def write_state(path: str, state: dict[str, str]) -> None:
    """Create or replace the whole state (used when a host's hardware is built)."""
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(render(state))


def gpu_count(state: dict[str, str]) -> int:
    return int(state.get("gpu.count", "0"))


def gpu(state: dict[str, str], index: int) -> dict[str, str]:
    """The fields of one GPU, without the ``gpu.<i>.`` prefix."""
    prefix = f"gpu.{index}."
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holders(state: dict[str, str], index: int, exclude_pid: int | None = None) -> list[tuple[int, str]]:
    """Live processes holding GPU ``index`` open: (pid, name), clients and compute processes."""
    found = []
    for field, value in gpu(state, index).items():
        kind, _, pid_text = field.partition(".")
        if kind not in ("client", "proc") or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid != exclude_pid and pid_alive(pid):
            found.append((pid, value.split(",")[0]))
    return sorted(found)


def _read_installed(host_root: str, relative: str) -> str:
    try:
        with open(os.path.join(host_root, relative), encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return ""


def installed_driver_version(host_root: str = "/") -> str:
    return _read_installed(host_root, INSTALLED_DRIVER_VERSION_FILE)


def installed_cuda_version(host_root: str = "/") -> str:
    return _read_installed(host_root, INSTALLED_CUDA_VERSION_FILE)


# CUDA driver API version per driver branch (nvidia-smi header "CUDA Version"; reference captures:
# 590 -> 13.1, 595 -> 13.2; older branches from NVIDIA's CUDA/driver compatibility table)
CUDA_BY_BRANCH = {
    525: "12.0", 530: "12.1", 535: "12.2", 545: "12.3", 550: "12.4", 555: "12.5", 560: "12.6",
    565: "12.7", 570: "12.8", 575: "12.9", 580: "13.0", 590: "13.1", 595: "13.2", 600: "13.2", 610: "13.3",
}  # fmt: skip


def cuda_version_for(driver_version: str) -> str:
    """The CUDA version a driver branch reports (``570.172.08`` -> ``12.8``); empty when unknown."""
    head = driver_version.split(".", 1)[0]
    if not head.isdigit():
        return ""
    branch = int(head)
    known = [b for b in CUDA_BY_BRANCH if b <= branch]
    return CUDA_BY_BRANCH[max(known)] if known else ""


def gi_id(start: int, size: int, memory_slices: int = 8) -> int:
    """MIG GPU instance id the driver gives a GI at placement ``start:size`` (buddy numbering, STATE.md)."""
    return (memory_slices // size - 1) + start // size


def load_driver(state: dict[str, str], version: str, cuda_version: str) -> None:
    state["driver.loaded"] = "1" if version else "0"
    state["driver.version"] = version
    state["driver.cuda_version"] = cuda_version if version else ""


def reset_for_boot(state: dict[str, str], installed_version: str, installed_cuda: str = "") -> None:
    """Apply what a power cycle does to the GPUs and the driver (see STATE.md)."""
    for key in [k for k in state if k.startswith("gpu.") and k.count(".") >= 2]:
        if key.split(".", 2)[2].startswith(VOLATILE_PREFIXES):
            del state[key]
    for index in range(gpu_count(state)):
        g = f"gpu.{index}."
        state[g + "power.limit_mw"] = state[g + "power.default_mw"]
        state[g + "persistence"] = "0"
        state[g + "mig.current"] = state.get(g + "mig.pending", "0")
        state[g + "clocks.locked.min"] = "0"
        state[g + "clocks.locked.max"] = "0"
        state[g + "ecc.current"] = state.get(g + "ecc.pending", "0")
        state[g + "ecc.volatile.corrected"] = "0"
        state[g + "ecc.volatile.uncorrected"] = "0"
        state[g + "remap.pending"] = "0"
    load_driver(state, installed_version, installed_cuda or cuda_version_for(installed_version))
    if int(state.get("nvswitch.count", "0")):
        state["fabric.state"] = "not_started"
