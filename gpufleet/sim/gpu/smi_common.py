"""Shared pieces of the simulated ``nvidia-smi``: NVML init, GPU views, selection, messages.

Stdlib only; runs inside simulated hosts as part of the ``simgpu`` package.
"""

from __future__ import annotations

import os
import time

from . import state as st

TYPE_CHECKING = False  # for annotations only: importing collections.abc slows every simulated program's start
if TYPE_CHECKING:
    from collections.abc import Callable

# nvmlReturn_t values nvidia-smi exits with (reference §2.1 / §5.2)
RC_INVALID_ARGUMENT = 2
RC_NOT_SUPPORTED = 3
RC_NO_PERMISSION = 4
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_IS_LOST = 15
RC_LIB_RM_VERSION_MISMATCH = 18
RC_IN_USE = 19
RC_INSUFFICIENT_RESOURCES = 23
RC_OTHER = 255

NOT_LOADED_MSG = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
TERMINATING = "Terminating early due to previous errors."
NO_DEVICES = "No devices were found"
IN_USE = "In use by another client"
NO_PERMISSION = "Insufficient Permissions"
NOT_SUPPORTED = "Not Supported"
DEPRECATED = "Requested functionality has been deprecated"
ALL_DONE = "All done."


class SmiExit(Exception):
    """Stop with ``rc`` after printing ``lines`` (to stdout, like the real tool)."""

    def __init__(self, rc: int, *lines: str):
        super().__init__(rc, lines)
        self.rc = rc
        self.lines = list(lines)


def bad_option(option: str) -> SmiExit:
    return SmiExit(
        RC_INVALID_ARGUMENT, f"ERROR: Option {option} is not recognized. Please run 'nvidia-smi -h' for help.", ""
    )


def invalid_combination() -> SmiExit:
    return SmiExit(
        RC_INVALID_ARGUMENT, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", ""
    )


def is_root() -> bool:
    return os.geteuid() == 0


def option_value(argv: list[str], i: int, eq: str, value: str) -> tuple[str, int]:
    """The value of the option at ``argv[i]`` (``--opt=value`` or ``--opt value``) and the index of its last word."""
    if eq:
        return value, i
    if i + 1 >= len(argv):
        raise invalid_combination()
    return argv[i + 1], i + 1


def installed_version(state: dict[str, str]) -> str:
    """The user-space (nvidia-smi / NVML) version, from the installed package."""
    try:
        with open(st.own_driver_version_path(), encoding="utf-8") as handle:
            version = handle.read().strip()
    except OSError:
        version = ""
    return version or state.get("driver.version", "")


def major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def init_nvml() -> tuple[dict[str, str], str]:
    """Read the state and do what nvmlInit does; raise SmiExit where it fails."""
    try:
        state = st.read_state()
    except OSError:
        raise SmiExit(RC_DRIVER_NOT_LOADED, NOT_LOADED_MSG, "") from None
    if state.get("driver.loaded", "0") != "1" or not state.get("driver.version"):
        raise SmiExit(RC_DRIVER_NOT_LOADED, NOT_LOADED_MSG, "")
    version = installed_version(state)
    if version != state["driver.version"]:
        lib = ".".join(version.split(".")[:2])
        raise SmiExit(
            RC_LIB_RM_VERSION_MISMATCH,
            "Failed to initialize NVML: Driver/library version mismatch",
            f"NVML library version: {lib}",
        )
    if st.gpu_count(state) == 0:
        raise SmiExit(RC_NOT_FOUND, NO_DEVICES)
    return state, version


def timestamp_ctime() -> str:
    return time.ctime()


def timestamp_csv() -> str:
    now = time.time()
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"


class Gpu:
    """Read-only view of one GPU's ``gpu.<i>.*`` keys with typed accessors."""

    def __init__(self, state: dict[str, str], index: int):
        self.state = state
        self.index = index
        self.f = st.gpu(state, index)

    def s(self, key: str, default: str = "") -> str:
        return self.f.get(key, default)

    def i(self, key: str, default: int = 0) -> int:
        value = self.f.get(key, "")
        try:
            return int(value, 0) if value.startswith("0x") else int(value)
        except ValueError:
            return default

    def flag(self, key: str) -> bool:
        return self.f.get(key, "0") == "1"

    def has(self, key: str) -> bool:
        return self.f.get(key, "") != ""

    # identity -----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.s("name")

    @property
    def uuid(self) -> str:
        return self.s("uuid")

    @property
    def bus_id(self) -> str:
        return self.s("pci.bus_id").upper()

    @property
    def bus_id_short(self) -> str:
        """``0000:18:00.0``: the 4-digit-domain form some messages use."""
        bus = self.bus_id
        return bus[4:] if len(bus) == 16 else bus

    @property
    def lost(self) -> bool:
        return self.flag("lost")

    @property
    def geforce(self) -> bool:
        return self.s("brand", "NVIDIA") == "GeForce"

    # state ---------------------------------------------------------------------
    @property
    def mig_on(self) -> bool:
        return self.flag("mig.supported") and self.flag("mig.current")

    @property
    def ecc_on(self) -> bool:
        return self.flag("ecc.supported") and self.flag("ecc.current")

    def procs(self) -> list[dict]:
        """Live compute processes on this GPU (``proc.<pid>``), sorted by pid."""
        found = []
        for key, value in self.f.items():
            if not key.startswith("proc."):
                continue
            pid_text = key[5:]
            if not pid_text.isdigit() or not st.pid_alive(int(pid_text)):
                continue
            parts = value.split(",")
            used = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            gi = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
            ci = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None
            kind = parts[4] if len(parts) > 4 and parts[4] else "C"
            found.append({"pid": int(pid_text), "name": parts[0], "used": used, "gi": gi, "ci": ci, "type": kind})
        return sorted(found, key=lambda p: p["pid"])

    def gis(self) -> dict[int, tuple[int, int, int]]:
        """GPU instances: gi_id -> (profile_id, start, size)."""
        found = {}
        for key, value in self.f.items():
            if key.startswith("mig.gi.") and key[7:].isdigit():
                parts = [int(x) for x in value.split(",")[:3]]
                found[int(key[7:])] = (parts[0], parts[1], parts[2])
        return dict(sorted(found.items()))

    def cis(self) -> dict[tuple[int, int], list[str]]:
        """Compute instances: (gi_id, ci_id) -> [ci_profile_id, slice_count, start?, uuid?]."""
        found = {}
        for key, value in self.f.items():
            if key.startswith("mig.ci."):
                gi_text, _, ci_text = key[7:].partition(".")
                if gi_text.isdigit() and ci_text.isdigit():
                    found[(int(gi_text), int(ci_text))] = value.split(",")
        return dict(sorted(found.items()))

    def gip(self) -> dict[int, dict]:
        """The MIG GPU instance profile table (``mig.gip.<id>``), in the order nvidia-smi lists it."""
        rows = {}
        for key, value in self.f.items():
            if key.startswith("mig.gip.") and key[8:].isdigit():
                rows[int(key[8:])] = parse_gip(int(key[8:]), value)
        return dict(sorted(rows.items(), key=lambda item: (item[1]["order"], item[0])))

    def mig_devices(self) -> list[dict]:
        """MIG devices (one per CI) in nvidia-smi's order (by GI id then CI id), numbered from 0."""
        profiles = self.gip()
        # a compute instance smaller than its GPU instance has its slices' SMs (real H200: 1c.3g 16, 2c.3g 32)
        one_slice_sm = min((p["sm"] for p in profiles.values() if p["compute_slices"] == 1), default=0)
        devices = []
        gis = self.gis()
        for (gi_id, ci_id), parts in self.cis().items():
            if gi_id not in gis:
                continue
            profile_id, start, size = gis[gi_id]
            prof = profiles.get(profile_id)
            if prof is None:
                continue
            ci_slices = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else prof["compute_slices"]
            ci_uuid = parts[3] if len(parts) > 3 and parts[3] else mig_uuid(self.uuid, gi_id, ci_id)
            name = prof["name"]
            if ci_slices != prof["compute_slices"]:
                name = f"{ci_slices}c.{name}"
            devices.append(
                {
                    "index": len(devices),
                    "gi": gi_id,
                    "ci": ci_id,
                    "profile": prof,
                    "name": name,
                    "ci_slices": ci_slices,
                    "sm": prof["sm"] if ci_slices == prof["compute_slices"] else min(one_slice_sm * ci_slices,
                                                                                     prof["sm"]),
                    "uuid": ci_uuid,
                    "start": start,
                    "size": size,
                }
            )
        return devices


def parse_gip(profile_id: int, value: str) -> dict:
    """One ``mig.gip.<id>`` row (see STATE.md) as a dict."""
    p = value.split(",")
    placements = []
    for item in p[14].split(";") if len(p) > 14 and p[14] else []:
        start, _, size = item.partition(":")
        placements.append((int(start), int(size)))
    return {
        "id": profile_id,
        "name": p[0],
        "nvml_enum": int(p[1]),
        "max_instances": int(p[2]),
        "memory_mib": int(p[3]),
        "memory_gib": p[4],
        "compute_slices": int(p[5]),
        "memory_slices": int(p[6]),
        "sm": int(p[7]),
        "ce": int(p[8]),
        "dec": int(p[9]),
        "enc": int(p[10]),
        "jpeg": int(p[11]),
        "ofa": int(p[12]),
        "p2p": p[13] == "1",
        "placements": placements,
        # nvidia-smi lists profiles by NVML profile enum order of slices, i.e. by size then variant
        "order": (int(p[6]) if len(p) > 6 else 0, int(p[5]), _variant_rank(int(p[1]))),
    }


def _variant_rank(nvml_enum: int) -> int:
    # 1g: plain (0x0) < +me (0x7) < double memory (0x9); the rest by enum
    return {0x0: 0, 0x7: 1, 0x9: 2}.get(nvml_enum, nvml_enum)


def mig_uuid(gpu_uuid: str, gi_id: int, ci_id: int) -> str:
    """Deterministic MIG device UUID when the state does not carry one."""
    import uuid  # here, not at the top: it imports platform, ~10 ms of every nvidia-smi call that lists no MIG device

    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{gpu_uuid}/{gi_id}/{ci_id}"))


def all_gpus(state: dict[str, str]) -> list[Gpu]:
    return [Gpu(state, i) for i in range(st.gpu_count(state))]


def _norm_bus(text: str) -> str:
    text = text.strip().upper()
    if text.count(":") == 1:
        text = "00000000:" + text
    domain, _, rest = text.partition(":")
    return domain.zfill(8)[-8:] + ":" + rest


def select(state: dict[str, str], id_arg: str | None) -> list[Gpu]:
    """GPUs named by ``-i`` (index, comma list, UUID or PCI bus id); all when None."""
    gpus = all_gpus(state)
    if id_arg is None:
        return gpus
    chosen: list[Gpu] = []
    for item in [x.strip() for x in id_arg.split(",") if x.strip()]:
        match = None
        if item.isdigit():
            if int(item) < len(gpus):
                match = gpus[int(item)]
        elif item.upper().startswith("GPU-"):
            match = next((g for g in gpus if g.uuid.lower() == item.lower()), None)
        elif ":" in item:
            try:
                wanted = _norm_bus(item)
            except ValueError:
                wanted = ""
            match = next((g for g in gpus if _norm_bus(g.bus_id) == wanted), None)
        if match is None:
            raise SmiExit(RC_NOT_FOUND, NO_DEVICES)
        if match not in chosen:
            chosen.append(match)
    if not chosen:
        raise SmiExit(RC_NOT_FOUND, NO_DEVICES)
    return chosen


def lost_line(gpu: Gpu) -> str:
    return (
        f"Unable to determine the device handle for GPU{gpu.bus_id_short}: "
        "GPU is lost.  Reboot the system to recover this GPU"
    )


def for_each_gpu(gpus: list[Gpu], out: list[str], lines: Callable[[Gpu], list[str]]) -> int:
    """Add ``lines(g)`` to ``out`` for each GPU in turn, the lost line for a lost one (the others go on).

    Returns the exit code: RC_GPU_IS_LOST when a GPU was lost, else 0.
    """
    rc = 0
    for g in gpus:
        if g.lost:
            out.append(lost_line(g))
            rc = RC_GPU_IS_LOST
        else:
            out += lines(g)
    return rc


def persistence_warning(gpu: Gpu, version: str) -> list[str]:
    """The warning setters print when persistence mode is off (wording changed in 580); none when it is on."""
    if gpu.flag("persistence"):
        return []
    if major(version) >= 580:
        return [
            "",
            f"Warning: persistence mode is disabled on device {gpu.bus_id}. See the Known Issues section of the "
            "nvidia-smi(1) man page for more information. Run with [--help | -h] switch to get more information "
            "on how to enable persistence mode.",
        ]
    return [
        "Warning: persistence mode is disabled on this device. This settings will go back to default as soon as "
        "driver unloads (e.g. last application like nvidia-smi or cuda application terminates). Run with "
        "[--help | -h] switch to get more information on how to enable persistence mode."
    ]


def key(gpu: Gpu, field: str) -> str:
    return f"gpu.{gpu.index}.{field}"


def watts(mw: int) -> str:
    return f"{mw / 1000:.2f}"
