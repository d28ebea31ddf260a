"""Who holds the host's gpufleet lock (``/run/gpufleet/host.lock``, see ``gpufleet.operations.lock``).

Read without touching the lock: whether it is held comes from ``/proc/locks`` (a lock on the file's inode), the
holder from the file's ``key=value`` lines (controller, pid, started, command, remote_pid).
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from .sections import join, parse_sections, print_file, section

LOCK_DIR = "/run/gpufleet"
LOCK_FILE = f"{LOCK_DIR}/host.lock"
HOLDER_KEYS = ("controller", "pid", "started", "command", "remote_pid", "generation", "boot_id")
# sh printing the ``boot_id=`` line both the lock read and the lock taker report (a shell builtin reads it)
PRINT_BOOT_ID = "boot_id=''; read -r boot_id 2>/dev/null < /proc/sys/kernel/random/boot_id; echo \"boot_id=$boot_id\""


def lock_script(lock_file: str = LOCK_FILE) -> str:
    """sh printing ``held``/``free`` and the lock file's lines; never takes the lock. The files are read with
    shell builtins: this is the first read of every run on every host, before the others start."""
    path = shlex.quote(lock_file)
    return (
        f"if [ -e {path} ]; then ino=$(stat -c %i {path}); "
        "if awk -v ino=\":$ino\" 'substr($6, length($6) - length(ino) + 1) == ino {f = 1} END {exit !f}' "
        "/proc/locks; then echo held; else echo free; fi; "
        f"{print_file(path)}; else echo free; fi; {PRINT_BOOT_ID}"
    )


def parse_holder(lines: list[str]) -> dict[str, str]:
    """``key=value`` lines of the lock file -> {key: value} (known keys only)."""
    holder = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key in HOLDER_KEYS:
            holder[key] = value
    return holder


def describe_holder(holder: dict) -> str:
    """``controller ctl1 pid 4242, started 2026-12-03T16:50:01Z, command: pyinfra inv.py deploys/gpu_node.py``."""
    if not any(holder.get(key) for key in ("controller", "pid", "command")):
        return "holder unknown"
    parts = [f"controller {holder.get('controller', '?')} pid {holder.get('pid', '?')}"]
    if holder.get("started"):
        parts.append(f"started {holder['started']}")
    if holder.get("command"):
        parts.append(f"command: {holder['command']}")
    return ", ".join(parts)


class HostLock(FactBase):
    """
    The host's gpufleet lock:

    .. code:: python

        {"held": True, "controller": "ctl1", "pid": "4242", "started": "2026-12-03T16:50:01Z",
         "command": "pyinfra inventories/sim.py deploys/gpu_node.py", "remote_pid": "812"}
        {"held": False, "seen": ("3f1c…", 7)}  # free; "seen": (boot id, generation: takers since boot)
        # a file naming a holder that is gone: "held": False, "stale": True and the holder's keys
    """

    @staticmethod
    def default():
        return {"held": False, "seen": ("", 0)}

    def command(self) -> str:
        return join(section("lock", lock_script()))

    def process(self, output):
        lock = parse_sections(output).get("lock")
        if lock is None or not lock.ok or not lock.lines:
            return self.default()
        held = lock.lines[0].strip() == "held"
        found = parse_holder(lock.lines[1:])
        generation, boot_id = int(found.pop("generation", "0") or 0), found.pop("boot_id", "")
        holder = {key: value for key, value in found.items() if key in HOLDER_KEYS}
        stale = bool(holder) and not held
        return {"held": held, **({"stale": True} if stale else {}), **holder, "seen": (boot_id, generation)}
