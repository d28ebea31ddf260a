"""``nvidia-smi mig ...``: GPU/compute instance profiles, placements, create, list, destroy.

GPU instance ids follow the driver's buddy numbering over the memory slices (see STATE.md, "MIG GPU
instance ids"): on an 8-slice GPU the full GPU is 0, halves 1-2, quarters 3-6, eighths 7-14.
"""

from __future__ import annotations

import os

from . import state as st
from .smi_common import (
    IN_USE,
    NO_PERMISSION,
    RC_IN_USE,
    RC_INSUFFICIENT_RESOURCES,
    RC_INVALID_ARGUMENT,
    RC_NO_PERMISSION,
    RC_NOT_FOUND,
    Gpu,
    SmiExit,
    bad_option,
    invalid_combination,
    is_root,
    key,
    major,
    mig_uuid,
    option_value,
    select,
)

TYPE_CHECKING = False  # for annotations only: importing collections.abc slows every simulated program's start
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# CI profile enum (NVML_COMPUTE_INSTANCE_PROFILE_*) by compute slice count
CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
SLICES_BY_CI_PROFILE = {v: k for k, v in CI_PROFILE_BY_SLICES.items()}
# placement preference of the driver on 8-slice GPUs, by placement size (observed order of created GI ids)
PREFERENCE_8 = {1: [6, 4, 5, 0, 1, 2, 3], 2: [4, 0, 2, 6], 4: [4, 0], 8: [0]}

LGIP_NARROW = [
    "+-----------------------------------------------------------------------------+",
    "| GPU instance profiles:                                                      |",
    "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
    "|                              Free/Total   GiB              CE    JPEG  OFA  |",
    "|=============================================================================|",
]
LGIP_WIDE = [
    "+-------------------------------------------------------------------------------+",
    "| GPU instance profiles:                                                        |",
    "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
    "|                                Free/Total   GiB              CE    JPEG  OFA  |",
    "|===============================================================================|",
]
LGI_HEADER = [
    "+-------------------------------------------------------+",
    "| GPU instances:                                        |",
    "| GPU   Name             Profile  Instance   Placement  |",
    "|                          ID       ID       Start:Size |",
    "|=======================================================|",
]
LCI_HEADER = [
    "+--------------------------------------------------------------------+",
    "| Compute instances:                                                 |",
    "| GPU     GPU       Name             Profile   Instance   Placement  |",
    "|       Instance                       ID        ID       Start:Size |",
    "|         ID                                                         |",
    "|====================================================================|",
]


def _order(placements: list[tuple[int, int]], memory_slices: int) -> list[tuple[int, int]]:
    if memory_slices == 8 and placements:
        pref = PREFERENCE_8.get(placements[0][1], [])
        return sorted(placements, key=lambda p: pref.index(p[0]) if p[0] in pref else 100 + p[0])
    return list(placements)


def find_placement(
    gpu_gis: dict[int, tuple[int, int, int]],
    profiles: dict[int, dict],
    prof: dict,
    compute_total: int,
    memory_slices: int,
) -> tuple[int, int] | None:
    """Where the driver puts a new GI of ``prof`` given existing GIs, or None (Insufficient Resources)."""
    if sum(1 for p, _s, _z in gpu_gis.values() if p == prof["id"]) >= prof["max_instances"]:
        return None
    used_compute = sum(profiles[p]["compute_slices"] for p, _s, _z in gpu_gis.values() if p in profiles)
    if used_compute + prof["compute_slices"] > compute_total:
        return None
    taken = [(s, s + z) for _p, s, z in gpu_gis.values()]
    ids = set(gpu_gis)
    for start, size in _order(prof["placements"], memory_slices):
        if any(start < end and other < start + size for other, end in taken):
            continue
        if st.gi_id(start, size, memory_slices) in ids:
            continue
        return start, size
    return None


def free_count(g: Gpu, prof: dict) -> int:
    profiles = g.gip()
    gis = dict(g.gis())
    compute_total = g.i("mig.slices.compute", 7)
    memory_slices = g.i("mig.slices.memory", 8)
    count = 0
    while True:
        where = find_placement(gis, profiles, prof, compute_total, memory_slices)
        if where is None:
            return count
        gis[st.gi_id(where[0], where[1], memory_slices)] = (prof["id"], where[0], where[1])
        count += 1


def _mig_gpus(gpus: list[Gpu], need_enabled: bool) -> list[Gpu]:
    capable = [g for g in gpus if not g.lost and g.flag("mig.supported")]
    if not capable:
        raise SmiExit(RC_NOT_FOUND, "No MIG-supported devices found.")
    enabled = [g for g in capable if g.mig_on]
    if need_enabled and not enabled:
        raise SmiExit(RC_NOT_FOUND, "No MIG-enabled devices found.")
    return enabled if need_enabled else capable


def lgip(gpus: list[Gpu], version: str) -> list[str]:
    wide = major(version) >= 580
    header = LGIP_WIDE if wide else LGIP_NARROW
    border = header[0]
    out = list(header)
    name_w = 19 if wide else 17
    for g in _mig_gpus(gpus, need_enabled=True):
        for prof in g.gip().values():
            total = prof["max_instances"]
            free = free_count(g, prof)
            mem = f"{float(prof['memory_gib']):.2f}"
            p2p = "Yes" if prof["p2p"] else "No"
            out.append(
                f"|{g.index:>4}  {'MIG ' + prof['name']:<{name_w}}{prof['id']:>3}     {f'{free}/{total}':<11}"
                f"{mem:<11}{p2p:<7}{prof['sm']:<7}{prof['dec']:<6}{prof['enc']:<4}|"
            )
            out.append(f"|{'':{name_w + 43}}{prof['ce']:>2}     {prof['jpeg']:<6}{prof['ofa']:<4}|")
            out.append(border)
    return out


def lgipp(gpus: list[Gpu]) -> list[str]:
    out = []
    for g in _mig_gpus(gpus, need_enabled=True):
        for prof in g.gip().values():
            starts = ",".join(str(s) for s, _z in prof["placements"])
            size = prof["placements"][0][1] if prof["placements"] else 0
            label = "Placements:" if len(prof["placements"]) > 1 else "Placement :"
            out.append(f"GPU {g.index:>2} Profile ID {prof['id']:>2} {label} {{{starts}}}:{size}")
    return out


def _resolve_profile(g: Gpu, item: str) -> dict | None:
    profiles = g.gip()
    text = item.strip()
    if text.isdigit():
        return profiles.get(int(text))
    name = text[4:] if text.upper().startswith("MIG ") else text
    return next((p for p in profiles.values() if p["name"] == name), None)


def _next_ci_id(g: Gpu, gi_id: int, cis: dict) -> int:
    used = {ci for (gi, ci) in cis if gi == gi_id}
    return next(i for i in range(64) if i not in used)


def _ci_free_start(gi_slices: int, existing: list[tuple[int, int]], slices: int) -> int | None:
    for start in range(0, gi_slices - slices + 1):
        if all(start + slices <= s or s + z <= start for s, z in existing):
            return start
    return None


def _create_ci(state: dict[str, str], g: Gpu, gi_id: int, ci_profile: int) -> tuple[int, str] | None:
    """Create a CI in GI ``gi_id``; returns (ci_id, profile display name) or None when it does not fit."""
    gis = g.gis()
    prof = g.gip()[gis[gi_id][0]]
    slices = SLICES_BY_CI_PROFILE.get(ci_profile)
    if slices is None or slices > prof["compute_slices"]:
        return None
    cis = g.cis()
    existing = []
    for (gi, _ci), parts in cis.items():
        if gi == gi_id:
            z = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else prof["compute_slices"]
            s = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
            existing.append((s, z))
    start = _ci_free_start(prof["compute_slices"], existing, slices)
    if start is None:
        return None
    ci_id = _next_ci_id(g, gi_id, cis)
    uuid = mig_uuid(g.uuid, gi_id, ci_id)
    state[key(g, f"mig.ci.{gi_id}.{ci_id}")] = f"{ci_profile},{slices},{start},{uuid}"
    name = prof["name"] if slices == prof["compute_slices"] else f"{slices}c.{prof['name']}"
    return ci_id, name


def create_gi(id_arg: str | None, items: list[str], default_ci: bool) -> tuple[list[str], int]:
    out: list[str] = []
    with st.locked() as state:
        gpus = _mig_gpus(select(state, id_arg), need_enabled=True)
        for g0 in gpus:
            for item in items:
                g = Gpu(state, g0.index)
                prof = _resolve_profile(g, item)
                label = item.strip()
                if prof is None:
                    out += [
                        f"Unable to create a GPU instance on GPU {g.index:>2} using profile {label}: Invalid Argument",
                        "Failed to create GPU instances: Invalid Argument",
                    ]
                    return out, RC_INVALID_ARGUMENT
                if not is_root():
                    out += [
                        f"Unable to create a GPU instance on GPU {g.index:>2} using profile {label}: {NO_PERMISSION}",
                        f"Failed to create GPU instances: {NO_PERMISSION}",
                    ]
                    return out, RC_NO_PERMISSION
                memory_slices = g.i("mig.slices.memory", 8)
                where = find_placement(g.gis(), g.gip(), prof, g.i("mig.slices.compute", 7), memory_slices)
                if where is None:
                    out += [
                        f"Unable to create a GPU instance on GPU {g.index:>2} using profile {label}: "
                        "Insufficient Resources",
                        "Failed to create GPU instances: Insufficient Resources",
                    ]
                    return out, RC_INSUFFICIENT_RESOURCES
                gi_id = st.gi_id(where[0], where[1], memory_slices)
                state[key(g, f"mig.gi.{gi_id}")] = f"{prof['id']},{where[0]},{where[1]}"
                out.append(
                    f"Successfully created GPU instance ID {gi_id:>2} on GPU {g.index:>2} "
                    f"using profile MIG {prof['name']} (ID {prof['id']:>2})"
                )
                if default_ci:
                    ci_profile = CI_PROFILE_BY_SLICES[prof["compute_slices"]]
                    made = _create_ci(state, Gpu(state, g.index), gi_id, ci_profile)
                    if made:
                        out.append(
                            f"Successfully created compute instance ID {made[0]:>2} on GPU {g.index:>2} "
                            f"GPU instance ID {gi_id:>2} using profile MIG {made[1]} (ID {ci_profile:>2})"
                        )
    return out, 0


def _ids(text: str | None) -> set[int] | None:
    if text is None:
        return None
    return {int(x) for x in text.split(",") if x.strip().isdigit()}


def create_ci(id_arg: str | None, items: list[str], gi_arg: str | None) -> tuple[list[str], int]:
    out: list[str] = []
    wanted_gis = _ids(gi_arg)
    with st.locked() as state:
        for g0 in _mig_gpus(select(state, id_arg), need_enabled=True):
            g = Gpu(state, g0.index)
            targets = [gi for gi in g.gis() if wanted_gis is None or gi in wanted_gis]
            if not targets:
                out.append("No GPU instances found: Not Found")
                return out, RC_NOT_FOUND
            for gi_id in targets:
                prof = g.gip()[g.gis()[gi_id][0]]
                for item in items or [str(CI_PROFILE_BY_SLICES[prof["compute_slices"]])]:
                    ci_profile = int(item) if item.strip().isdigit() else -1
                    if not is_root():
                        out += [
                            f"Unable to create a compute instance on GPU {g.index:>2} GPU instance ID {gi_id:>2} "
                            f"using profile {item}: {NO_PERMISSION}",
                            f"Failed to create compute instances: {NO_PERMISSION}",
                        ]
                        return out, RC_NO_PERMISSION
                    made = _create_ci(state, Gpu(state, g.index), gi_id, ci_profile)
                    if made is None:
                        out += [
                            f"Unable to create a compute instance on GPU {g.index:>2} GPU instance ID {gi_id:>2} "
                            f"using profile {item}: Insufficient Resources",
                            "Failed to create compute instances: Insufficient Resources",
                        ]
                        return out, RC_INSUFFICIENT_RESOURCES
                    out.append(
                        f"Successfully created compute instance on GPU {g.index:>2} GPU instance ID {gi_id:>2} "
                        f"using profile MIG {made[1]} (ID {ci_profile:>2})"
                    )
    return out, 0


def lgi(gpus: list[Gpu], gi_arg: str | None) -> tuple[list[str], int]:
    wanted = _ids(gi_arg)
    rows = []
    for g in _mig_gpus(gpus, need_enabled=True):
        profiles = g.gip()
        order = list(profiles)
        items = [(gi, v) for gi, v in g.gis().items() if wanted is None or gi in wanted]
        items.sort(key=lambda it: (order.index(it[1][0]) if it[1][0] in order else 99, it[1][1]))
        for gi_id, (profile_id, start, size) in items:
            name = "MIG " + profiles[profile_id]["name"] if profile_id in profiles else "MIG ?"
            rows += [f"|{g.index:>4}  {name:<18}{profile_id:>4}{gi_id:>9}{'':10}{f'{start}:{size}':<8}|", LGI_HEADER[0]]
    if not rows:
        return ["No GPU instances found: Not Found"], RC_NOT_FOUND
    return LGI_HEADER + rows, 0


def lci(gpus: list[Gpu], gi_arg: str | None, ci_arg: str | None) -> tuple[list[str], int]:
    wanted_gi, wanted_ci = _ids(gi_arg), _ids(ci_arg)
    rows = []
    for g in _mig_gpus(gpus, need_enabled=True):
        profiles, gis = g.gip(), g.gis()
        for (gi_id, ci_id), parts in g.cis().items():
            if gi_id not in gis or (wanted_gi is not None and gi_id not in wanted_gi):
                continue
            if wanted_ci is not None and ci_id not in wanted_ci:
                continue
            prof = profiles.get(gis[gi_id][0])
            if prof is None:
                continue
            slices = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else prof["compute_slices"]
            start = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
            name = "MIG " + (prof["name"] if slices == prof["compute_slices"] else f"{slices}c.{prof['name']}")
            rows += [
                f"|{g.index:>4}{gi_id:>7}{'':7}{name:<17}{int(parts[0]):>5}{ci_id:>10}{'':10}{f'{start}:{slices}':<8}|",
                LCI_HEADER[0],
            ]
    if not rows:
        return ["No compute instances found: Not Found"], RC_NOT_FOUND
    return LCI_HEADER + rows, 0


def _ci_busy(g: Gpu, gi_id: int, ci_id: int) -> bool:
    for proc in g.procs():
        if proc["gi"] == gi_id and proc["ci"] == ci_id and proc["pid"] != os.getpid() and st.pid_alive(proc["pid"]):
            return True
    return False


def _destroy(
    id_arg: str | None, noun: str, instances: Callable[[Gpu], Iterator[tuple[str, str, bool]]]
) -> tuple[list[str], int]:
    """-dci / -dgi: ``instances(g)`` yields (description, state field, in use) of each instance to destroy on g;
    ``noun``: what they are ("GPU instances", "compute instances")."""
    out: list[str] = []
    failed = ""
    rc = 0
    found = False
    with st.locked() as state:
        for g in _mig_gpus(select(state, id_arg), need_enabled=True):
            for where, field, busy in instances(g):
                found = True
                if not is_root():
                    out.append(f"Unable to destroy {where}: {NO_PERMISSION}")
                    failed, rc = NO_PERMISSION, RC_NO_PERMISSION
                    break
                if busy:
                    out.append(f"Unable to destroy {where}: {IN_USE}")
                    failed, rc = IN_USE, RC_IN_USE
                    continue
                del state[key(g, field)]
                out.append(f"Successfully destroyed {where}")
    if not found:
        return [f"No {noun} found: Not Found"], RC_NOT_FOUND
    if failed:
        out.append(f"Failed to destroy {noun}: {failed}")
    return out, rc


def destroy_ci(id_arg: str | None, gi_arg: str | None, ci_arg: str | None) -> tuple[list[str], int]:
    wanted_gi, wanted_ci = _ids(gi_arg), _ids(ci_arg)

    def instances(g: Gpu) -> Iterator[tuple[str, str, bool]]:
        for gi_id, ci_id in g.cis():
            if (wanted_gi is not None and gi_id not in wanted_gi) or (wanted_ci is not None and ci_id not in wanted_ci):
                continue
            where = f"compute instance ID {ci_id:>2} from GPU {g.index:>2} GPU instance ID {gi_id:>2}"
            yield where, f"mig.ci.{gi_id}.{ci_id}", _ci_busy(g, gi_id, ci_id)

    return _destroy(id_arg, "compute instances", instances)


def destroy_gi(id_arg: str | None, gi_arg: str | None) -> tuple[list[str], int]:
    wanted = _ids(gi_arg)

    def instances(g: Gpu) -> Iterator[tuple[str, str, bool]]:
        cis = g.cis()
        for gi_id in g.gis():
            if wanted is not None and gi_id not in wanted:
                continue
            where = f"GPU instance ID {gi_id:>2} from GPU {g.index:>2}"
            yield where, f"mig.gi.{gi_id}", any(gi == gi_id for gi, _ci in cis)

    return _destroy(id_arg, "GPU instances", instances)


def destroy_all_instances(state: dict[str, str], g: Gpu) -> None:
    """What a GPU reset / MIG mode change does to the instances."""
    for field in [k for k in g.f if k.startswith(("mig.gi.", "mig.ci."))]:
        state.pop(key(g, field), None)


MIG_FLAGS = {
    "-lgip": "lgip", "--list-gpu-instance-profiles": "lgip",
    "-lgipp": "lgipp", "--list-gpu-instance-possible-placements": "lgipp",
    "-lgi": "lgi", "--list-gpu-instances": "lgi",
    "-lci": "lci", "--list-compute-instances": "lci",
    "-dgi": "dgi", "--destroy-gpu-instance": "dgi",
    "-dci": "dci", "--destroy-compute-instance": "dci",
}  # fmt: skip
MIG_VALUES = {
    "-i": "id", "--id": "id",
    "-gi": "gi", "--gpu-instance-id": "gi",
    "-ci": "ci", "--compute-instance-id": "ci",
    "-cgi": "cgi", "--create-gpu-instance": "cgi",
}  # fmt: skip


def parse_args(argv: list[str]) -> dict:
    opts: dict = {"cmd": None, "C": False}

    def command(cmd: str) -> None:
        if opts["cmd"]:
            raise invalid_combination()
        opts["cmd"] = cmd

    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if arg in MIG_FLAGS:
            command(MIG_FLAGS[arg])
        elif arg in ("-C", "--default-compute-instance"):
            opts["C"] = True
        elif arg in ("-cci", "--create-compute-instance") or name == "--create-compute-instance":
            command("cci")
            if eq:
                opts["cci"] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                opts["cci"] = argv[i + 1]
                i += 1
        elif name in MIG_VALUES:
            value, i = option_value(argv, i, eq, value)
            dest = MIG_VALUES[name]
            if dest == "cgi":
                command("cgi")
            opts[dest] = value
        else:
            raise bad_option(arg)
        i += 1
    if opts["cmd"] is None:
        raise invalid_combination()
    return opts


def run(argv: list[str], state: dict[str, str], version: str) -> tuple[list[str], int]:
    opts = parse_args(argv)
    cmd = opts["cmd"]
    gpus = select(state, opts.get("id"))
    if cmd == "lgip":
        return lgip(gpus, version), 0
    if cmd == "lgipp":
        return lgipp(gpus), 0
    if cmd == "lgi":
        return lgi(gpus, opts.get("gi"))
    if cmd == "lci":
        return lci(gpus, opts.get("gi"), opts.get("ci"))
    if cmd == "cgi":
        return create_gi(opts.get("id"), [x for x in opts["cgi"].split(",") if x.strip()], opts["C"])
    if cmd == "cci":
        items = [x for x in opts.get("cci", "").split(",") if x.strip()]
        return create_ci(opts.get("id"), items, opts.get("gi"))
    if cmd == "dci":
        return destroy_ci(opts.get("id"), opts.get("gi"), opts.get("ci"))
    return destroy_gi(opts.get("id"), opts.get("gi"))
