"""What gpufleet's operations read of a host, in as few remote commands as possible: the files and units an
operation manages (the :class:`~gpufleet.facts.files.ManagedState` and :class:`~gpufleet.facts.systemd.UnitStates`
facts), with everything every operation module declared it reads (:func:`read_together`)."""

from __future__ import annotations

from collections.abc import Iterable

from pyinfra import host

from gpufleet.facts.files import ManagedState, check_path
from gpufleet.facts.systemd import UnitStates, check_unit, unknown_unit

# The units, files and file contents gpufleet's operation modules read (declared by each module,
# :func:`read_together`). Every read of units asks systemd for all of them, every read of files (:func:`get_state`)
# stats all of them: a run costs one ``systemctl show`` and one ``ManagedState`` per host, and one more of each
# after a change, instead of one per operation. A unit a host does not have answers "not-found", a file "absent".
_UNITS_READ_TOGETHER: set[str] = set()
_FILES_READ_TOGETHER: set[str] = set()
_CONTENTS_READ_TOGETHER: set[str] = set()


def read_together(*units: str, files: Iterable[str] = (), contents: Iterable[str] = ()) -> None:
    """Declare the units, files (stat, sha1) and file contents an operation module reads, so that every read of
    units (:func:`unit_states`) and of files (:func:`get_state`) asks for them too."""
    _UNITS_READ_TOGETHER.update(check_unit(unit) for unit in units)
    _FILES_READ_TOGETHER.update(check_path(path) for path in files)
    _CONTENTS_READ_TOGETHER.update(check_path(path) for path in contents)


def unit_states(units) -> dict[str, dict]:
    """``{unit: state}`` of ``units`` (``unknown_unit()`` where systemd does not answer), read in one
    ``UnitStates`` with every unit declared by :func:`read_together`."""
    units = tuple(units)
    if not units:
        return {}
    known = host.get_fact(UnitStates, units=tuple(sorted(_UNITS_READ_TOGETHER.union(units)))) or {}
    return {u: known.get(u) or unknown_unit() for u in units}


def get_state(paths=(), read=(), units=()) -> dict:
    """``ManagedState`` of these paths (with these contents) and :func:`unit_states` of these units, with every
    asked-for key present (absent files -> None); the files are read in one ``ManagedState`` with every file and
    content declared by :func:`read_together`."""
    paths, read = tuple(paths), tuple(read)
    state = host.get_fact(ManagedState, paths=tuple(sorted(_FILES_READ_TOGETHER.union(paths))),
                          read=tuple(sorted(_CONTENTS_READ_TOGETHER.union(read)))) if paths or read else {}
    files = (state or {}).get("files", {})
    contents = (state or {}).get("contents", {})
    return {
        "files": {p: files.get(p) for p in paths},
        "contents": {p: contents.get(p) for p in read},
        "units": unit_states(units),
    }
