"""
GPU persistence mode through the nvidia-persistenced daemon (never the legacy ``nvidia-smi -pm``).
"""

from __future__ import annotations

from pyinfra import host, state
from pyinfra.api import operation

from gpufleet.facts.nvidia import GpuInventory

from .errors import fail
from .managed_files import put_file, render
from .reads import get_state, read_together
from .units import systemctl

UNIT = "nvidia-persistenced.service"
DROP_IN = "/etc/systemd/system/nvidia-persistenced.service.d/gpufleet.conf"
WANTS_TARGET = "multi-user.target"
WANTS_LINK = f"/etc/systemd/system/{WANTS_TARGET}.wants/{UNIT}"
read_together(UNIT, files=(DROP_IN, WANTS_LINK))
BINARY = "/usr/bin/nvidia-persistenced"
DAEMON_USER = "nvidia-persistenced"


def drop_in_text(persistence_mode: bool) -> str:
    flag = "--persistence-mode" if persistence_mode else "--no-persistence-mode"
    return render("systemd/nvidia-persistenced-gpufleet.conf.j2", binary=BINARY, user=DAEMON_USER, flag=flag)


@operation()
def nvidia_persistenced(persistence_mode: bool = True):
    """
    Run nvidia-persistenced at boot and now, with GPU persistence mode on.

    + persistence_mode: run the daemon with ``--persistence-mode`` (``False``: ``--no-persistence-mode``)

    The packaged unit (Ubuntu's, Debian's) runs ``nvidia-persistenced --user nvidia-persistenced
    --no-persistence-mode --verbose`` and is *static* (no ``[Install]`` section). This operation:

    - writes the drop-in ``/etc/systemd/system/nvidia-persistenced.service.d/gpufleet.conf`` that clears
      ``ExecStart`` and sets it again with ``--persistence-mode`` (same user, ``--verbose``), and reloads
      systemd only when the drop-in changed (or systemd says a reload is pending);
    - makes the static unit start at boot with ``systemctl add-wants multi-user.target
      nvidia-persistenced.service`` (checked through the ``multi-user.target.wants`` link);
    - starts the daemon when it is not running, and restarts it when the drop-in changed or when a GPU's
      persistence mode (read from the GPU through ``nvidia-smi``, not from the unit state) is ``Disabled``
      while it should be ``Enabled``.

    When the driver is not loaded yet (installed, reboot pending) the unit is configured and the daemon is
    not started: it starts at boot. With ``persistence_mode=False`` the GPUs' mode is not checked (a mode set
    by hand with the legacy ``nvidia-smi -pm 1`` is left alone).

    **Example:**

    .. code:: python

        from gpufleet.operations import persistence

        persistence.nvidia_persistenced(
            name="nvidia-persistenced with persistence mode on",
            persistence_mode=True,
        )
    """
    inventory = host.get_fact(GpuInventory)
    managed = get_state(paths=(DROP_IN, WANTS_LINK), units=(UNIT,))
    unit = managed["units"][UNIT]
    if unit["load_state"] == "not-found" and state.is_executing:
        # this host fails, the others go on (while planning, the driver stage of the run may still install it)
        yield fail(f"{UNIT} is not installed on {host.name}: install the NVIDIA driver first "
                   "(its nvidia-persistenced package)")
        return
    commands = []

    drop_in = list(put_file(managed["files"][DROP_IN], DROP_IN, drop_in_text(persistence_mode)))
    commands += drop_in
    if drop_in or unit["need_daemon_reload"]:
        commands.append(systemctl("daemon-reload"))
    if managed["files"][WANTS_LINK] is None:
        commands.append(systemctl("add-wants", WANTS_TARGET, UNIT))

    gpus = inventory["gpus"]
    disabled = [g["uuid"] for g in gpus if persistence_mode and g.get("persistence_mode") == "Disabled"]
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
