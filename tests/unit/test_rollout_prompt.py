"""``gpufleet rollout`` without ``-y`` at its confirmation prompt, as an operator meets it: the real command on a
pseudo-terminal (stdin a terminal, so it asks), rolling a one-operation deploy out over pyinfra's ``@local`` host
(a file in the test's directory; no fleet needed). Enter rolls out; any other answer changes nothing (exit 2, as
pyinfra's own prompt); a signal at the prompt, sent to the process group as a terminal sends it, is an
interruption: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP, the terminal closed), nothing changed, no state file."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

GPUFLEET = Path(sys.executable).parent / "gpufleet"
PROMPT = "Press enter to roll out..."


@pytest.fixture
def local_rollout(tmp_path):
    (tmp_path / "inventory.py").write_text('hosts = ["@local"]\n')
    marker = tmp_path / "marker"
    (tmp_path / "deploy.py").write_text("from pyinfra.operations import files\n\n"
                                        f"files.file(name='the marker', path={str(marker)!r}, present=True)\n")
    return tmp_path, marker


def at_the_prompt(tmp_path: Path) -> tuple[subprocess.Popen, int, list[str]]:
    """The rollout started on a pseudo-terminal, in its own process group, once it shows the prompt."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(GPUFLEET), "rollout", "inventory.py", "deploy.py", "--verify", "none", "--out", "out"],
                            cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = [""]
    deadline = time.monotonic() + 60
    while PROMPT not in seen[0]:
        assert proc.poll() is None and time.monotonic() < deadline, f"no prompt: {seen[0]}"
        seen[0] += read(master, 1)
    return proc, master, seen


def read(master: int, wait: float) -> str:
    text = ""
    while select.select([master], [], [], wait)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other side is closed: everything was read
            break
        if not chunk:
            break
        text += chunk.decode(errors="replace")
        wait = 0.2
    return text


def finish(proc: subprocess.Popen, master: int, seen: list[str]) -> str:
    try:
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    seen[0] += read(master, 0.5)
    os.close(master)
    return seen[0]


def test_enter_at_the_prompt_rolls_out(local_rollout):
    tmp_path, marker = local_rollout
    proc, master, seen = at_the_prompt(tmp_path)
    assert not marker.exists()  # asked before any change
    os.write(master, b"\n")
    text = finish(proc, master, seen)
    assert proc.returncode == 0, text
    assert "the plan to confirm" in text and "FINISHED" in text
    assert marker.exists()


@pytest.mark.parametrize("answer", ["n", "y"])
def test_any_other_answer_changes_nothing_and_exits_2(local_rollout, answer):
    # as pyinfra's prompt: only Enter goes on ("y" too is "Unexpected user input")
    tmp_path, marker = local_rollout
    proc, master, seen = at_the_prompt(tmp_path)
    os.write(master, answer.encode() + b"\n")
    text = finish(proc, master, seen)
    assert proc.returncode == 2, text
    assert f"Unexpected user input: {answer}" in text and "not confirmed: nothing was drained or changed" in text
    assert not marker.exists() and not (tmp_path / "out" / "state.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_at_the_prompt_is_an_interruption_with_nothing_changed(local_rollout, signum):
    tmp_path, marker = local_rollout
    proc, master, seen = at_the_prompt(tmp_path)
    os.killpg(proc.pid, signum)  # as a terminal sends it: to the whole process group
    text = finish(proc, master, seen)
    assert proc.returncode == 128 + signum, text
    assert f"interrupted at the confirmation by {signum.name}: nothing was drained or changed" in text
    assert not marker.exists()
    # no state that claims a rollout ran: no state file, no report
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
