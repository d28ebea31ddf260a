"""systemd units as gpufleet's operations drive them: ``systemctl`` commands and what a unit's state means."""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand

UNIT_DIR = "/etc/systemd/system"


def is_running(status: dict) -> bool:
    """Whether systemd runs the unit or is bringing it up (``activating``: its start, or a restart after it
    exited, e.g. an exporter that found no DCGM host engine yet). Starting such a unit again changes nothing."""
    return status["active_state"] in ("active", "activating", "reloading")


def systemctl(*args: str) -> StringCommand:
    return StringCommand("systemctl", *(shlex.quote(a) for a in args))
