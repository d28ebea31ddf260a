"""gpufleet.interruption for gpufleet's own commands: the signals raise Interrupted with their exit status; verify and
drift turn it into 128 + signal and say what was not finished; an interrupted pyinfra child's report is kept."""

from __future__ import annotations

import io
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet import drift, interruption
from gpufleet.rollout import converge
from gpufleet.verify import run as verify_run

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in interruption.SIGNALS}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    interruption._received.clear()


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_each_signal_raises_interrupted_once_with_its_status(handlers, signum, status):
    interruption.catch_signals()
    with pytest.raises(interruption.Interrupted) as caught:
        os.kill(os.getpid(), signum)
        time.sleep(1)
    assert interruption.status_of(caught.value) == status and interruption.received() == signum
    os.kill(os.getpid(), signal.SIGINT)  # a second signal during the clean-up is counted, not raised
    time.sleep(0.05)
    assert interruption.received() == signum
    with pytest.raises(interruption.Interrupted):
        interruption.check()


def test_verify_interrupted_names_the_hosts_not_finished(monkeypatch):
    def stopped(*_a, **_k):
        error = interruption.Interrupted(signal.SIGTERM)
        error.in_flight = ["node03"]
        raise error

    monkeypatch.setattr(verify_run, "run_verify", stopped)
    progress = io.StringIO()
    assert verify_run.main("inv.py", progress=progress, echo=lambda _: None) == 143
    assert progress.getvalue().startswith("gpufleet verify: interrupted by SIGTERM (exit 143); probe not finished "
                                          "on: node03; no report was written")


def test_drift_interrupted_exits_with_the_signal_and_passes_pyinfras_report_on(monkeypatch, capsys):
    def stopped(*_a, **_k):
        error = interruption.Interrupted(signal.SIGINT)
        error.child_report = "gpufleet: interrupted by SIGINT before executing anything: no host was changed"
        raise error

    monkeypatch.setattr(drift, "run_drift", stopped)
    assert drift.main("inv.py", echo=lambda _: None) == 130
    err = capsys.readouterr().err
    assert "gpufleet drift: interrupted by SIGINT (exit 130); nothing was changed" in err
    assert "no host was changed" in err


def test_an_interrupted_pyinfra_child_is_stopped_and_its_report_kept(monkeypatch, handlers, tmp_path):
    """The child (a stand-in printing what pyinfra with gpufleet's deploy prints) gets the signal passed on when
    only gpufleet received it (kill PID), exits, and its report of the hosts mid-change is attached."""
    child = tmp_path / "pyinfra"
    child.write_text("import signal, sys, time\n"
                     "def stop(s, f):\n"
                     "    sys.stderr.write('gpufleet: interrupted by SIGTERM while executing (exit 143).\\n"
                     "Hosts mid-change (stage):\\n  node03: gpufleet: GPU node | GPU power limits\\n')\n"
                     "    sys.exit(143)\n"
                     "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\n"
                     f"open({str(tmp_path / 'ready')!r}, 'w').close()\ntime.sleep(60)\n")
    monkeypatch.setattr(converge, "pyinfra_command", lambda *a, **k: [sys.executable, str(child)])
    interruption.catch_signals()
    pid = os.getpid()
    # the signal once the child has its handler (a loaded machine may take longer than a fixed sleep to start it)
    ready = shlex.quote(str(tmp_path / "ready"))
    killer = subprocess.Popen(["sh", "-c", f"while [ ! -e {ready} ]; do sleep 0.05; done; kill -TERM {pid}"])
    with pytest.raises(interruption.Interrupted) as caught:
        converge.run_pyinfra("inv.py", "deploy.py", None, dry=True)
    killer.wait()
    assert caught.value.child_report == ("gpufleet: interrupted by SIGTERM while executing (exit 143).\n"
                                         "Hosts mid-change (stage):\n  node03: gpufleet: GPU node | GPU power limits")


def test_a_pyinfra_child_stopped_while_preparing_names_the_hosts_still_being_read(tmp_path):
    """drift (a pyinfra --dry child) stopped while it reads facts: pyinfra's own report says only that nothing was
    changed; the hosts it had connected but not prepared ("Ready:") are the ones in flight, and are named."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write("
                              "'--> Connecting to hosts...\\n    [node01] Connected\\n    [node03] Connected\\n"
                              "    [node02] Connected\\n    [node01] Ready: deploys/gpu_node.py\\n"
                              "gpufleet: interrupted by SIGINT before executing anything: no host was changed "
                              "(exit 130)\\n'); sys.exit(130)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child.wait(30)
    assert converge._stop_child(child, signal.SIGINT) == (
        "gpufleet: interrupted by SIGINT before executing anything: no host was changed (exit 130)\n"
        "Hosts still being read (facts; nothing is changed before execution): node03, node02")


def test_a_signal_handled_in_a_thread_under_gevent_interrupts_the_command_not_the_thread():
    """Under gevent a thread is a greenlet, and the handler runs in whichever is current: in paramiko's transport
    thread the exception was printed by threading and killed the SSH connection, and the rollout's preflight failed
    the host ("SSH error (No existing session)", exit 2) instead of exiting 130. The command's own flow gets it."""
    script = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import signal, threading, gevent\n"
        "from gpufleet import interruption\n"
        "interruption.catch_signals()\n"
        "handler = signal.getsignal(signal.SIGINT)\n"
        "went_on = []\n"
        "def transport():\n"
        "    handler(signal.SIGINT, None)  # the signal arrives while this thread runs\n"
        "    went_on.append(True)\n"
        "thread = threading.Thread(target=transport); thread.start()\n"
        "try:\n"
        "    gevent.sleep(10)  # the command waits (on a host, a child)\n"
        "    print('not interrupted')\n"
        "except interruption.Interrupted as error:\n"
        "    thread.join(5)\n"
        "    print('interrupted', error.signum, went_on)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "interrupted 2 [True]", result.stdout + result.stderr
    assert "Exception in thread" not in result.stderr, result.stderr


@pytest.mark.parametrize("command", [
    ["pyinfra", "-y", "--data", "ssh_port={port}", "127.0.0.1", "deploys/gpu_node.py"],
    ["gpufleet", "apply", "-y", "--jobs", "2", "{inventory}", "--data", "ssh_port={port}"],
], ids=["pyinfra", "gpufleet-apply-jobs-2"])
def test_sigint_while_connecting_exits_130(tmp_path, command):
    """Ctrl-C to the process group at "Connecting to hosts" (an SSH server that never answers: the hosts are still
    connecting) is no success: exit 130, no host changed. The pyinfra CLI gets the hook from gpufleet's connector
    entry point, before any deploy is loaded."""
    silent = socket.create_server(("127.0.0.1", 0))
    inventory = tmp_path / "inventory.py"
    inventory.write_text('nodes = ["127.0.0.1", "localhost"]\n')
    args = [a.format(port=silent.getsockname()[1], inventory=inventory) for a in command]
    run = subprocess.Popen([str(BIN / args[0]), *args[1:]], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = ""
    try:
        while "Connecting to hosts" not in seen:
            line = run.stdout.readline()
            assert line, seen
            seen += line
        time.sleep(2)
        assert run.poll() is None, seen
        os.killpg(run.pid, signal.SIGINT)
        out = seen + run.communicate(timeout=60)[0]
    finally:
        silent.close()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, out
    assert "interrupted by SIGINT before executing anything: no host was changed (exit 130)" in out
    assert "Traceback" not in out, out
