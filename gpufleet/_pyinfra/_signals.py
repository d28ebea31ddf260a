"""The converge's signal handling under the pyinfra CLI, and the report of the hosts a stopped run had mid-change
(gpufleet's own commands: :mod:`gpufleet.interruption`; docs/interruption.md).

Why: pyinfra's CLI answers SIGINT with "Exiting upon user request!" and exit status 0 (``pyinfra_cli.main``'s own
handler) - a converge stopped in the middle of a MIG mode change looked like a success to a script or CI job - and
SIGTERM kills it without a word.

What: :func:`guard_cli_start` (run when pyinfra loads gpufleet's connector entry point, before it connects) and
:func:`install` (the converge deploy, once per run) replace those handlers, only under the pyinfra CLI. On the first
signal the handler prints every host executing an operation and the operation's name (the stage), then exits
128 + signal number at once.
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


def _exit(signum: int, text: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
    # Exit now: SystemExit would wait for the commands in flight (the hub keeps their greenlets), which is what the
    # user interrupted; the kernel closes the SSH connections, the hosts see them end.
    os._exit(exit_status(signum))


def _tick() -> None:
    # Python runs a signal handler when the main thread next executes Python code; under gevent, while every greenlet
    # waits on the network, that is only when one of them returns. A ticking greenlet makes it within a quarter second.
    while True:
        gevent.sleep(0.25)


def _handle_all(handle) -> None:
    for signum in SIGNALS:
        signal.signal(signum, lambda signum, _frame: handle(signum))


def guard_cli_start() -> bool:
    """Under pyinfra's CLI, from the moment it loads its connectors (before it connects): SIGINT, SIGTERM and SIGHUP
    exit 128 + signal number, not 0 as pyinfra_cli's own SIGINT handler does; False where that handler is not set
    (a program using pyinfra's API keeps its own signal handling)."""
    handler = signal.getsignal(signal.SIGINT)
    if getattr(handler, "__module__", None) != "pyinfra_cli.main":
        return False
    _handle_all(lambda signum: _exit(signum, "\n".join(stop_report(signum, False, []))))
    return True


def install(state) -> bool:
    """Register the handlers for ``state``'s run (once); False (nothing done) outside the pyinfra CLI."""
    if not getattr(pyinfra, "is_cli", False) or state in _installed:
        return False
    ref = weakref.ref(state)

    def handle(signum: int) -> None:
        current = ref()
        _exit(signum, report(current, signum) if current is not None else f"gpufleet: interrupted by signal {signum}")

    _handle_all(handle)
    _installed[state] = gevent.spawn(_tick)
    return True


def leave_to_caller(state) -> None:
    """For a program that runs pyinfra in its own process and handles SIGINT itself (``gpufleet rollout``, see
    :mod:`gpufleet._pyinfra.inprocess`): :func:`install` leaves ``state``'s run alone, and the caller names the
    hosts mid-change with :func:`report` before it saves what it must."""
    _installed[state] = None
