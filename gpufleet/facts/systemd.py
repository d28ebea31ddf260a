"""systemd unit state from ``systemctl show``: parse, never decide.

:class:`UnitStates` reads any number of units in one command; gpufleet's operations read all the units they manage in
one such read per host (``gpufleet.operations.reads.unit_states``).
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase, OperationValueError

UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.(service|target|socket|timer|path|mount)$")
PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "NeedDaemonReload")
_MARK = "units"


def check_unit(unit: str) -> str:
    if not isinstance(unit, str) or not UNIT_RE.match(unit):
        raise OperationValueError(f"not a systemd unit name: {unit!r}")
    return unit


def unknown_unit() -> dict:
    """The state of a unit systemd was not asked about or does not answer for."""
    return {"load_state": None, "active_state": None, "sub_state": None, "unit_file_state": None,
            "need_daemon_reload": False}


def show_command(units: tuple[str, ...]) -> str:
    """Prints ``units`` then ``systemctl show`` of ``units`` (nothing without systemctl); always exits 0."""
    props = " ".join(f"-p {p}" for p in PROPERTIES)
    quoted = " ".join(shlex.quote(check_unit(u)) for u in units)
    return (f"if command -v systemctl >/dev/null 2>&1; then echo {_MARK}; "
            f"systemctl show --no-pager {props} -- {quoted} 2>/dev/null; fi; true")


def parse_units(lines) -> dict[str, dict]:
    """``systemctl show -p Id -p ...`` of several units -> {unit: state} (keys as :func:`unknown_unit`)."""
    units: dict[str, dict] = {}
    unit: dict | None = None
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "Id":
            unit = units[value] = unknown_unit()
        elif unit is not None and key == "NeedDaemonReload":
            unit["need_daemon_reload"] = value == "yes"
        elif unit is not None and key in PROPERTIES:
            unit[re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()] = value or None
    return units


def after_mark(output) -> list[str]:
    """The lines after :func:`show_command`'s mark (none without systemctl)."""
    lines = list(output)
    return lines[lines.index(_MARK) + 1:] if _MARK in lines else []


class UnitStates(FactBase):
    """
    The state of systemd units, in ONE ``systemctl show``.

    + units: unit names (``"nvidia-fabricmanager.service"``)

    .. code:: python

        host.get_fact(UnitStates, units=("nvidia-persistenced.service",))
        {"nvidia-persistenced.service": {"load_state": "loaded", "active_state": "active", "sub_state": "running",
                                         "unit_file_state": "static", "need_daemon_reload": False}}

    A unit systemd does not know has ``load_state`` ``"not-found"``; without systemctl the result is ``{}``.
    """

    default = dict

    def command(self, units: tuple[str, ...]):
        return show_command(tuple(units))

    def process(self, output):
        return parse_units(after_mark(output))
