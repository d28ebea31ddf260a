"""Unit-test hygiene shared by every module."""

from __future__ import annotations

import signal

import pytest

from gpufleet.interruption import SIGNALS


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Each test leaves SIGINT, SIGTERM and SIGHUP as it found them: a command run in-process (``gpufleet.cli``'s
    commands call ``interruption.catch_signals``) otherwise leaves its handlers to the tests after it, and a later
    test that sends itself a real signal (``test_rollout_logic``'s state-write test) met the handler of a command
    long finished (on main after the signals merge: ``test_cli`` then ``test_rollout_logic`` stopped the whole run
    with ``Interrupted: SIGINT``)."""
    saved = {signum: signal.getsignal(signum) for signum in SIGNALS}
    yield
    for signum, handler in saved.items():
        if handler is not None:
            signal.signal(signum, handler)
