"""How gpufleet's operations stop on a host-state problem: :func:`refuse` (before any change: the whole run stops;
while executing: only this host fails) and :func:`fail` (a command that fails this host); and how they say what
the operator must know without stopping (:func:`report`)."""

from __future__ import annotations

import shlex

from pyinfra import host, logger, state
from pyinfra.api import OperationError, StringCommand


def fail(message: str) -> StringCommand:
    """A command that fails this host with ``message`` (a host-state problem found while executing: unlike an
    exception, which stops the whole run, the other hosts go on)."""
    return StringCommand("echo", shlex.quote(f"gpufleet: error: {message}"), ">&2;", "exit", "1")


def refuse(message: str):
    """Stop on a host-state problem: while planning (change detection, ``--dry``) raise ``OperationError``
    (pyinfra stops before any change on any host); while executing, fail only this host with ``message``
    (an exception then would stop the run with other hosts half done). Use as ``yield from refuse(...)``
    followed by ``return``."""
    if not state.is_executing:
        raise OperationError(message)
    yield fail(message)


def report(message: str) -> None:
    """Something the operator must know (visible without -v) that is not a change: noop + warning."""
    host.noop(message)
    if not getattr(state, "print_noop_info", False):
        logger.warning(f"{getattr(host, 'print_prefix', f'[{host.name}] ')}{message}")
