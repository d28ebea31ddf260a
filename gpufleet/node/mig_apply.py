#!/usr/bin/env python3
"""gpufleet-mig-apply: switch GPUs' MIG mode safely and (re)create the MIG instances of a saved layout.

Installed as ``/usr/local/sbin/gpufleet-mig-apply`` beside ``mig_compare.py``, the comparison it shares with the MIG
operation, the exporter and verify. Python 3.7+ standard library only; safe to run by hand.

    gpufleet-mig-apply apply [LAYOUT]      at boot (gpufleet-mig.service); LAYOUT: /etc/gpufleet/mig-layout.json
    gpufleet-mig-apply mode [--holder UNIT]... INDEX=enabled|disabled...

``mode`` stops the active holder units, switches each GPU no process runs on, resets a GPU whose mode is only
pending and starts the units again whatever happened; a GPU that still needs a reboot is listed in
/run/gpufleet/mig-reboot-required. ``apply`` does the same from the layout file (GPUs found by PCI bus id) and
creates the GPU instances of a MIG GPU that has none; other instances are reported, never destroyed.
docs/converging.md gives the file formats and exit statuses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

if __package__:  # imported from the gpufleet package (tests, tools)
    from gpufleet.node.mig_compare import COMPUTE, instance_differences, mode_differences, mode_of, norm_bus
else:  # the script: the shared comparison beside it (a checkout) or where gpufleet installs it on a node
    sys.path.insert(1, os.environ.get("GPUFLEET_NODE_LIB", "/usr/local/lib/gpufleet"))
    from mig_compare import COMPUTE, instance_differences, mode_differences, mode_of, norm_bus

LAYOUT = "/etc/gpufleet/mig-layout.json"
STATUS = os.environ.get("GPUFLEET_MIG_STATUS", "/run/gpufleet/mig-reboot-required")
SMI = "nvidia-smi"
MODES = ("Enabled", "Disabled")
# Holders started again must stay up this long before the run goes on: a consumer started right after its server
# (dcgm-exporter after nv-hostengine, which is not listening yet) fails once and is back after its RestartSec; a
# run that ended before would leave it down, and the next run would find it so.
SETTLE_S = float(os.environ.get("GPUFLEET_MIG_SETTLE_S", "3"))
SETTLE_TIMEOUT_S = 60.0

# |   0  MIG 1g.10gb         19        7          0:1     |
_GI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+\d+:\d+\s*\|$")
# |   0      7       MIG 1g.10gb          0         0          0:1     |   (Placement column optional)
_CI_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)(?:\s+\d+:\d+)?\s*\|$")
_REASONS = re.compile(r"in use by another client|not supported|insufficient permissions|could not be reset|"
                      r"currently in use|unable to", re.IGNORECASE)


class ApplyError(Exception):
    pass


def log(message: str) -> None:
    print(f"gpufleet-mig-apply: {message}", flush=True)


def run(*argv: str) -> tuple[int, str]:
    """(exit status, stdout+stderr) of a command; 127 when it is not installed. Never raises."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True)
    except OSError as exc:
        return 127, f"{argv[0]}: {exc}"
    return proc.returncode, proc.stdout.strip()


def query_gpus() -> dict[int, dict]:
    rc, out = run(SMI, "--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    if rc != 0:
        raise ApplyError(f"nvidia-smi cannot list the GPUs (exit {rc}): {out}")
    gpus = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 4 and cells[0].isdigit():
            gpus[int(cells[0])] = {"index": int(cells[0]), "bus": norm_bus(cells[1]), "current": cells[2],
                                   "pending": cells[3]}
    return gpus


def compute_apps() -> dict[str, list[str]]:
    """``{PCI bus id: ["pid 1234 (python3)", ...]}`` of the compute processes nvidia-smi lists."""
    rc, out = run(SMI, "--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader")
    apps: dict[str, list[str]] = {}
    if rc != 0:
        return apps
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",", 2)]
        if len(cells) == 3 and cells[1].isdigit():
            apps.setdefault(norm_bus(cells[0]), []).append(f"pid {cells[1]} ({cells[2]})")
    return apps


def list_instances(index: int) -> tuple[dict[int, tuple[int, str]], dict[int, list[str]]]:
    """GPU instances ``{gi_id: (profile_id, profile)}`` and compute instances ``{gi_id: [profile, ...]}``."""
    gis: dict[int, tuple[int, str]] = {}
    cis: dict[int, list[str]] = {}
    _rc, out = run(SMI, "mig", "-i", str(index), "-lgi")
    for line in out.splitlines():
        m = _GI_ROW.match(line.strip())
        if m and int(m.group(1)) == index:
            gis[int(m.group(4))] = (int(m.group(3)), m.group(2))
    _rc, out = run(SMI, "mig", "-i", str(index), "-lci")
    for line in out.splitlines():
        m = _CI_ROW.match(line.strip())
        if m and int(m.group(1)) == index:
            cis.setdefault(int(m.group(2)), []).append(m.group(3))
    return gis, cis


def _modes(gpu: dict) -> tuple:
    """(current, pending) MIG mode of a GPU of :func:`query_gpus` as the comparison takes them."""
    return mode_of(gpu["current"]), mode_of(gpu["pending"])


def mode_word(enabled: bool) -> str:
    return "Enabled" if enabled else "Disabled"


def reason_of(outputs: list[str], gpu: dict) -> str:
    for text in outputs:
        for line in text.splitlines():
            if _REASONS.search(line):
                return line.strip()
    return f"MIG mode is {gpu['current']}, pending {gpu['pending']}"


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def is_active(unit: str) -> bool:
    return run("systemctl", "is-active", "--quiet", unit)[0] == 0


def wait_settled(units: list[str], steady: float = SETTLE_S, timeout: float = SETTLE_TIMEOUT_S,
                 clock=time.monotonic, sleep=time.sleep) -> list[str]:
    """Wait until every unit of ``units`` has been active ``steady`` seconds in a row; the units still not active
    at ``timeout``."""
    deadline = clock() + timeout
    since = None
    while True:
        down = [unit for unit in units if not is_active(unit)]
        now = clock()
        since = None if down else (now if since is None else since)
        if not down and now - since >= steady:
            return []
        if now >= deadline:
            return down
        sleep(0.5)


def _switch_one(index: int, gpu: dict, enable: bool) -> str | None:
    """Set one GPU's MIG mode (holders already stopped); None when it is in effect, else why not."""
    want = mode_word(enable)
    outputs = []
    if not enable and gpu["current"] == "Enabled":
        gis, cis = list_instances(index)
        if cis:
            outputs.append(run(SMI, "mig", "-i", str(index), "-dci")[1])
        if gis:
            outputs.append(run(SMI, "mig", "-i", str(index), "-dgi")[1])
    if gpu["pending"] != want:
        rc, out = run(SMI, "-i", str(index), "-mig", "1" if enable else "0")
        outputs.append(out)
        log(f"GPU {index}: nvidia-smi -i {index} -mig {1 if enable else 0}: exit {rc}: {first_line(out)}")
    now = query_gpus().get(index, gpu)
    if now["current"] != want and now["pending"] == want:
        rc, out = run(SMI, "-r", "-i", str(index))
        outputs.append(out)
        log(f"GPU {index}: nvidia-smi -r -i {index}: exit {rc}: {first_line(out)}")
        now = query_gpus().get(index, now)
    if now["current"] == want:
        log(f"GPU {index}: MIG mode {want}")
        return None
    return f"MIG mode is {now['current']} (pending {now['pending']}): {reason_of(outputs, now)}"


def switch_modes(targets: dict[int, bool], holders: list[str]) -> tuple[dict[int, str], bool]:
    """Put each GPU of ``targets`` ``{index: enabled}`` in that MIG mode.

    Returns ``({index: why a reboot is needed}, holders all running again)``.
    """
    gpus = query_gpus()
    reasons: dict[int, str] = {}
    todo: dict[int, bool] = {}
    for index, enable in sorted(targets.items()):
        gpu = gpus.get(index)
        found = mode_differences(enable, gpu is not None, *(_modes(gpu) if gpu else (None, None)))
        if not found:
            continue
        if gpu is None:
            reasons[index] = "nvidia-smi does not list this GPU"
        elif gpu["current"] not in MODES:
            reasons[index] = f"no MIG support (MIG mode {gpu['current']})"
        else:
            todo[index] = enable
    if not todo:
        return reasons, True
    apps = compute_apps()
    for index in list(todo):
        busy = apps.get(gpus[index]["bus"])
        if busy:
            reasons[index] = "in use by " + ", ".join(busy)
            log(f"GPU {index}: {reasons[index]}: MIG mode not changed")
            del todo[index]
    if not todo:
        return reasons, True
    stopped = []
    restarted = True
    try:
        for unit in holders:
            if is_active(unit):
                rc, out = run("systemctl", "stop", unit)
                if rc == 0:
                    stopped.append(unit)
                    log(f"stopped {unit} (it holds the GPUs)")
                else:
                    log(f"warning: could not stop {unit}: {out}")
        for index, enable in todo.items():
            why = _switch_one(index, gpus[index], enable)
            if why:
                reasons[index] = why
    finally:
        started = []
        for unit in reversed(stopped):
            rc, out = run("systemctl", "start", unit)
            if rc == 0:
                started.append(unit)
                log(f"started {unit} again")
            else:
                restarted = False
                log(f"error: could not start {unit} again: {out}")
        for unit in wait_settled(started):
            restarted = False
            log(f"error: {unit} did not stay up after its start")
    return reasons, restarted


def write_status(reasons: dict[int, str], gpus: dict[int, dict]) -> None:
    if not reasons:
        try:
            os.unlink(STATUS)
        except FileNotFoundError:
            pass
        return
    os.makedirs(os.path.dirname(STATUS), exist_ok=True)
    lines = [f"{index}\t{gpus.get(index, {}).get('bus', '')}\t{' '.join(why.split())}\n"
             for index, why in sorted(reasons.items())]
    with open(STATUS + ".tmp", "w", encoding="utf-8") as handle:
        handle.writelines(lines)
    os.replace(STATUS + ".tmp", STATUS)
    for index, why in sorted(reasons.items()):
        log(f"GPU {index}: reboot required: {why}")


def ensure_instances(index: int, create: list[int]) -> bool:
    """Create the GPU instances of ``create`` on a GPU without any, and a missing default compute instance; True
    when the GPU matches the layout afterwards (the shared comparison, :mod:`mig_compare`)."""
    gis, cis = list_instances(index)
    if not gis:
        if not create:
            return True
        ids = ",".join(str(p) for p in create)
        rc, out = run(SMI, "mig", "-i", str(index), "-cgi", ids, "-C")
        if rc == 0:
            log(f"GPU {index}: created GPU instances of profiles {ids}, each with its default compute instance")
        else:
            log(f"GPU {index}: error: nvidia-smi mig -i {index} -cgi {ids} -C: exit {rc}: {' '.join(out.split())}")
        return rc == 0
    # a GPU instance without compute instance is completed below; any other difference is left alone
    found = instance_differences(create, [(pid, cis.get(gi, [name]) == [name]) for gi, (pid, name) in gis.items()])
    if found:
        have = ", ".join(sorted(name for _pid, name in gis.values()))
        what = ("compute instances that do not span their GPU instance" if found == [COMPUTE]
                else "other MIG instances than the layout")
        log(f"GPU {index}: has {what} ({have}): left alone; run gpufleet's MIG stage to converge it")
        return False
    ok = True
    for gi_id in sorted(gi for gi in gis if not cis.get(gi)):
        rc, out = run(SMI, "mig", "-i", str(index), "-gi", str(gi_id), "-cci")
        log(f"GPU {index}: default compute instance in GPU instance {gi_id}: exit {rc}: {first_line(out)}")
        ok = ok and rc == 0
    if ok:
        log(f"GPU {index}: MIG instances match the layout")
    return ok


def cmd_apply(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as handle:
            layout = json.load(handle)
        entries = list(layout["gpus"])
        holders = [str(u) for u in layout.get("holder_services", [])]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log(f"error: cannot read the layout {path}: {exc}")
        return 1
    gpus = query_gpus()
    by_bus = {gpu["bus"]: gpu for gpu in gpus.values()}
    ok = True
    targets: dict[int, bool] = {}
    create: dict[int, list[int]] = {}
    for entry in entries:
        gpu = by_bus.get(norm_bus(str(entry.get("pci_bus_id", ""))))
        if gpu is None:
            log(f"warning: GPU {entry.get('pci_bus_id')} of the layout is not present: skipped")
            ok = False
            continue
        targets[gpu["index"]] = bool(entry.get("mig_enabled"))
        if entry.get("mig_enabled"):
            create[gpu["index"]] = [int(p) for p in entry.get("create", [])]
    reasons, restarted = switch_modes(targets, holders)
    write_status(reasons, query_gpus() if reasons else gpus)
    ok = ok and restarted and not reasons
    for index, profile_ids in sorted(create.items()):
        if index not in reasons:
            ok = ensure_instances(index, profile_ids) and ok
    return 0 if ok else 1


def cmd_mode(argv: list[str]) -> int:
    holders: list[str] = []
    targets: dict[int, bool] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--holder" and args:
            holders.append(args.pop(0))
            continue
        index, sep, value = arg.partition("=")
        if not (sep and index.isdigit() and value in ("enabled", "disabled")):
            return usage(f"bad argument {arg!r}")
        targets[int(index)] = value == "enabled"
    if not targets:
        return usage("no GPU given")
    reasons, restarted = switch_modes(targets, holders)
    write_status(reasons, query_gpus())
    return 0 if restarted else 1


def usage(error: str) -> int:
    print(f"gpufleet-mig-apply: {error}\nusage: gpufleet-mig-apply apply [LAYOUT]\n"
          "       gpufleet-mig-apply mode [--holder UNIT]... INDEX=enabled|disabled...", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("apply", "mode"):
        return usage("apply or mode?")
    try:
        if argv[0] == "apply":
            return cmd_apply(argv[1] if len(argv) > 1 else LAYOUT)
        return cmd_mode(argv[1:])
    except ApplyError as exc:
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
