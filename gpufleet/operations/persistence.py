"""
GPU persistence mode through the nvidia-persistenced daemon (never the legacy ``nvidia-smi -pm``).
"""

from __future__ import annotations

import shlex

from pyinfra import host, state
from pyinfra.api import operation

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.plan import Gpu, PersistencePlan

from .errors import fail
from .managed_files import put_file, render
from .reads import get_state, read_together
from .units import systemctl

UNIT = "nvidia-persistenced.service"
DROP_IN = "/etc/systemd/system/nvidia-persistenced.service.d/gpufleet.conf"
WANTS_TARGET = "multi-user.target"
WANTS_LINK = f"/etc/systemd/system/{WANTS_TARGET}.wants/{UNIT}"
# Where a package (or an administrator) puts the unit, in the order systemd prefers them: the first one present is the
# unit systemd loads. Debian 12 installs it under /lib, Debian 13 and NVIDIA's packaging under /usr/lib (the same
# directory on a merged-/usr system). Their text is read with the other files: no round trip of its own.
PACKAGED_UNITS = tuple(f"{directory}/{UNIT}" for directory in
                       ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"))
read_together(UNIT, files=(DROP_IN, WANTS_LINK), contents=PACKAGED_UNITS)
BINARY = "/usr/bin/nvidia-persistenced"
PERSISTENCE_FLAGS = ("--persistence-mode", "--no-persistence-mode")


def packaged_exec_start(unit_text: str) -> list[str] | None:
    """The command line (words) the unit's ``[Service]`` runs: its last ``ExecStart=`` (an empty one resets), or
    None when it has none."""
    command: list[str] | None = None
    section = None
    logical = ""
    for raw in unit_text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = (logical + line).strip(), ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and line.partition("=")[0].strip() == "ExecStart":
            value = line.partition("=")[2].strip()
            command = shlex.split(value) if value else None
    return command


def daemon_command(unit_text: str | None) -> list[str]:
    """The packaged command without its persistence-mode flag: the packaged unit's own user (Debian's ``--user nvpd``,
    NVIDIA's template ``--user nvidia-persistenced``, none in NVIDIA's Ubuntu packaging: root) and options, which
    gpufleet keeps. Without a packaged unit (while planning a run whose driver stage installs it): the binary."""
    command = packaged_exec_start(unit_text) if unit_text else None
    return [word for word in command or [BINARY] if word not in PERSISTENCE_FLAGS]


def drop_in_text(unit_text: str | None, persistence_mode: bool) -> str:
    """The drop-in: the packaged unit's ``ExecStart`` (``unit_text``) with ``--persistence-mode`` or
    ``--no-persistence-mode`` in place of its own flag."""
    flag = "--persistence-mode" if persistence_mode else "--no-persistence-mode"
    command = " ".join(shlex.quote(word) for word in [*daemon_command(unit_text), flag])
    return render("systemd/nvidia-persistenced-gpufleet.conf.j2", command=command, flag=flag)


def packaged_unit(contents: dict[str, str | None]) -> str | None:
    """The text of the unit systemd loads (the first of ``PACKAGED_UNITS`` present), or None."""
    return next((contents[path] for path in PACKAGED_UNITS if contents.get(path) is not None), None)


@operation()
def nvidia_persistenced(persistence_mode: bool = True):
    """
    Run nvidia-persistenced at boot and now, with GPU persistence mode on.

    + persistence_mode: run the daemon with ``--persistence-mode`` (``False``: ``--no-persistence-mode``)

    A systemd drop-in runs the packaged unit's own command (its ``--user`` differs by packaging, so it is read from
    the installed unit, never assumed) with the persistence flag replaced; the unit is made to start at boot
    (``systemctl add-wants``, which works on a static unit too). The daemon is started when it is not running and
    restarted when the drop-in changed or a GPU reports persistence mode ``Disabled`` while it should be on. With
    the driver not loaded yet the unit is only configured: it starts at boot.

    **Example:**

    .. code:: python

        from gpufleet.operations import persistence

        persistence.nvidia_persistenced(
            name="nvidia-persistenced with persistence mode on",
            persistence_mode=True,
        )
    """
    inventory = host.get_fact(GpuInventory)
    managed = get_state(paths=(DROP_IN, WANTS_LINK), read=PACKAGED_UNITS, units=(UNIT,))
    unit = managed["units"][UNIT]
    if unit["load_state"] == "not-found" and state.is_executing:
        # this host fails, the others go on (while planning, the driver stage of the run may still install it)
        yield fail(f"{UNIT} is not installed on {host.name}: install the NVIDIA driver first "
                   "(its nvidia-persistenced package)")
        return
    commands = []

    unit_text = packaged_unit(managed["contents"])
    if unit_text is None and unit["load_state"] == "loaded" and state.is_executing:
        # a unit elsewhere (/run, /usr/local): its user is unknown, and a drop-in without it could run the daemon
        # as another user than the package set up
        yield fail(f"{UNIT} on {host.name} is not in any of {', '.join(PACKAGED_UNITS)}: gpufleet reads the "
                   "packaged unit's command there (its --user) to keep it in its drop-in")
        return
    drop_in = list(put_file(managed["files"][DROP_IN], DROP_IN, drop_in_text(unit_text, persistence_mode)))
    commands += drop_in
    if drop_in or unit["need_daemon_reload"]:
        commands.append(systemctl("daemon-reload"))
    if managed["files"][WANTS_LINK] is None:
        commands.append(systemctl("add-wants", WANTS_TARGET, UNIT))

    gpus = inventory["gpus"]
    disabled = PersistencePlan(persistence_mode).diff(map(Gpu.from_fact, gpus))
    if not gpus:
        # no GPU the daemon could open (driver installed, not loaded yet): it would fail to start; boot starts it
        host.noop(f"no GPU reachable ({inventory['status']}): nvidia-persistenced starts at the next boot")
    elif unit["active_state"] != "active":
        commands.append(systemctl("start", UNIT))
    elif drop_in or disabled:
        # a GPU not in persistence mode while the daemon runs: it runs with the arguments it was started with
        # (before the drop-in) or the mode was switched off by hand; the restarted daemon sets it again
        commands.append(systemctl("restart", UNIT))

    if not commands and gpus:
        mode = "on" if persistence_mode else "not enforced (--no-persistence-mode)"
        host.noop(f"nvidia-persistenced enabled and running, persistence mode {mode} ({len(gpus)} GPU(s))")
    yield from commands
