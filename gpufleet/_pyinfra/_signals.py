"""The converge's signal handling under the pyinfra CLI, and the report of the hosts a stopped run had mid-change
(gpufleet's own commands: :mod:`gpufleet.interruption`; docs/interruption.md).

Why: pyinfra's CLI answers SIGINT with "Exiting upon user request!" and exit status 0 (``pyinfra_cli.main``'s own
handler) - a converge stopped in the middle of a MIG mode change looked like a success to a script or CI job - and
SIGTERM kills it without a word.

What: :func:`install` (called by the converge deploy when the first host is prepared, only under the pyinfra CLI:
a program using pyinfra's API keeps its own signal handling) replaces those handlers, the one patch here, made for
the run of the state it is given. On the first signal it prints, to stderr, every host that was executing an
operation and the operation's name (the stage; a nested operation is shown after its parent: pyinfra's
``Host.executing_op_hash`` / ``nested_executing_op_hash`` and ``State.get_op_meta``), then exits 128 + signal number
at once.
"""

from __future__ import annotations

import os
import signal
import sys
import weakref

import gevent
import pyinfra

from gpufleet.interruption import SIGNALS, exit_status, stop_report

_installed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mid_change(state) -> list[tuple[str, str]]:
    """(host, stage) for every host executing an operation now; the stage is the operation's name."""
    hosts = []
    for host in state.inventory:
        hashes = [h for h in (host.executing_op_hash, getattr(host, "nested_executing_op_hash", None)) if h]
        if hashes:
            names = [", ".join(sorted(state.get_op_meta(h).names)) or "operation" for h in hashes]
            hosts.append((host.name, " > ".join(names)))
    return hosts


def report(state, signum: int) -> str:
    return "\n".join(stop_report(signum, bool(state.is_executing), mid_change(state) if state.is_executing else []))


def _stop(signum: int, state) -> None:
    """Print the stop report of ``state``'s run (None: not built yet) and exit 128 + ``signum`` at once."""
    text = report(state, signum) if state is not None else "\n".join(stop_report(signum, False, []))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    # Exit now: SystemExit would wait for the commands in flight (the hub keeps their greenlets), which is what the
    # user interrupted; the kernel closes the SSH connections, the hosts see them end.
    os._exit(exit_status(signum))


def install(state) -> bool:
    """Register the handlers for ``state``'s run (once); False (nothing done) outside the pyinfra CLI."""
    if not getattr(pyinfra, "is_cli", False) or state in _installed:
        return False
    ref = weakref.ref(state)

    def tick() -> None:
        # Python runs a signal handler when the main thread next executes Python code; under gevent, while every
        # greenlet waits on a remote command, that is only when one of them returns. A ticking greenlet makes it
        # within a quarter second. (gevent.signal_handler cannot take over SIGINT: pyinfra's CLI has set its own.)
        while True:
            gevent.sleep(0.25)

    for signum in SIGNALS:
        # pyinfra_cli.main's own SIGINT handler exits 0 ("Exiting upon user request!"); SIGTERM/SIGHUP have none
        signal.signal(signum, lambda signum, _frame: _stop(signum, ref()))
    _installed[state] = gevent.spawn(tick)
    return True


def _pyinfra_cli_handler(handler) -> bool:
    return getattr(handler, "__module__", "") == "pyinfra_cli.main" and getattr(
        handler, "__qualname__", "").endswith("_handle_interrupt")


def install_early() -> bool:
    """Under the pyinfra CLI, before it connects: SIGINT exits 130 instead of pyinfra's 0 ("Exiting upon user
    request!"). Only pyinfra_cli's own handler is replaced; a program with its own keeps it."""
    if not getattr(pyinfra, "is_cli", False) or not _pyinfra_cli_handler(signal.getsignal(signal.SIGINT)):
        return False
    from pyinfra.context import ctx_state  # noqa: PLC0415

    signal.signal(signal.SIGINT, lambda signum, _frame: _stop(signum, ctx_state.get()))
    return True


def leave_to_caller(state) -> None:
    """For a program that runs pyinfra in its own process and handles SIGINT itself (``gpufleet rollout``, see
    :mod:`gpufleet._pyinfra.inprocess`): :func:`install` leaves ``state``'s run alone, and the caller names the
    hosts mid-change with :func:`report` before it saves what it must."""
    _installed[state] = None
