"""Honest interruption: SIGINT, SIGTERM and SIGHUP (a closed terminal) exit 130, 143 and 129 and say which hosts
were mid-change, in which stage; under the pyinfra CLI (the converge deploy: :mod:`gpufleet._pyinfra._signals`) and
in gpufleet's own commands (:func:`catch_signals`: rollout, verify, drift). docs/interruption.md says what each command
does with each signal.

Why: pyinfra's CLI answers SIGINT with "Exiting upon user request!" and exit status 0 — a converge stopped in the
middle of a MIG mode change looked like a success to a script or CI job — and SIGTERM kills it without a word.

What: under the pyinfra CLI, the converge deploy replaces pyinfra's handlers for its run
(:func:`gpufleet._pyinfra.install_signal_report`): on the first signal it prints every host that was executing an
operation and the operation's name (the stage), then exits 128 + signal number at once. gpufleet's own commands
raise :class:`Interrupted` (below) and name the hosts themselves.

What is left on a host: commands already sent keep running there until they end (SSH gives them no signal);
the host lock (``gpufleet.operations.lock``) stays held until they have, so a rerun cannot overlap them. Every
stage converges from whatever state a stopped run left, so the rerun repairs it.
"""

from __future__ import annotations

import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[int] = []  # the signals gpufleet's own commands received (catch_signals), first first


def exit_status(signum: int) -> int:
    return 128 + signum


def stop_report(signum: int, executing: bool, mid_change: list[tuple[str, str]]) -> list[str]:
    """The lines saying where a run stopped by ``signum`` left the hosts: nothing changed (not yet executing), or
    the hosts mid-change with their stage, or none (stopped between stages)."""
    name, status = signal.Signals(signum).name, exit_status(signum)
    if not executing:
        return [f"gpufleet: interrupted by {name} before executing anything: no host was changed (exit {status})"]
    lines = [f"gpufleet: interrupted by {name} while executing (exit {status})."]
    if mid_change:
        lines.append("Hosts mid-change (stage):")
        lines += [f"  {host}: {stage}" for host, stage in mid_change]
        lines.append("Commands already sent run to their end on those hosts (their gpufleet lock is held until "
                     "then); run the same command again to converge them.")
    else:
        lines.append("No host was mid-change (stopped between stages); run the same command again to finish.")
    return lines


# --------------------------------------------------------------------------------- gpufleet's own commands
# A terminal sends SIGINT to its whole foreground process group: the command's children (ssh, sinfo, scontrol, srun,
# a pyinfra process) die of it at the same moment as the command gets it. Their death (an exit status, 255 from
# ssh "Killed by signal 2.", or ProcessLookupError when subprocess kills a child already gone) is then no failure of
# a host or node: it is the interruption. The first signal raises Interrupted in the main greenlet (gevent's hub
# hands it there, as KeyboardInterrupt); whoever runs a child asks :func:`check` when the child failed.


class Interrupted(KeyboardInterrupt):
    """The command received ``signum`` (SIGINT, SIGTERM or SIGHUP): stop, start nothing more, say where it stopped,
    exit ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def catch_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (the first one; later ones are only counted, so that
    the command's bounded clean-up, e.g. asking Slurm which nodes it drained, is not cut short). Also where the
    caller started the command with SIGINT ignored, as a shell does for a background job of a script."""
    _received.clear()
    main = _greenlet()  # the command's own flow

    def handle(signum: int, _frame) -> None:
        _received.append(signum)
        if len(_received) == 1:
            if main is not None and threading.current_thread() is not threading.main_thread():
                # A thread under gevent (a greenlet once patched), e.g. paramiko's transport negotiating keys: the
                # exception would only be printed by threading, and kill that SSH connection (the host failed with
                # "SSH error (No existing session)", exit 2). The command's own flow gets it, at its next wait.
                from gevent import get_hub  # (only threads under gevent get here)

                get_hub().loop.run_callback(main.throw, Interrupted(signum))
                return
            raise Interrupted(signum)

    for signum in SIGNALS:
        signal.signal(signum, handle)


def _greenlet():
    """The greenlet running now, or None without greenlet (gevent's dependency)."""
    try:
        from greenlet import getcurrent
    except ImportError:
        return None
    return getcurrent()


def received() -> int | None:
    """The first signal the command received (:func:`catch_signals`), or None."""
    return _received[0] if _received else None


def check() -> None:
    """Raise :class:`Interrupted` when the command received a signal: called where a child process failed (it died
    of the same signal: not a failure of its host or node) and before anything new starts."""
    if _received:
        raise Interrupted(_received[0])


def status_of(error: KeyboardInterrupt) -> int:
    """The exit status of an interruption: 128 + its signal (130 for a plain KeyboardInterrupt)."""
    return exit_status(getattr(error, "signum", None) or received() or signal.SIGINT)
