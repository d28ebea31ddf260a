"""The host lock: the hold script run for real (flock, processes) on this machine, the fact reading it, and the
operation's planning (no lock taken, never a change)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
from pyinfra_harness import run_operation, wrap

from gpufleet.facts.lock import HostLock, describe_holder, lock_script, parse_holder
from gpufleet.operations import lock

INFO_A = "controller=ctl1\npid=111\nstarted=2026-12-03T16:50:01Z\ncommand=pyinfra inv.py deploys/gpu_node.py"
INFO_B = "controller=ctl2\npid=222\nstarted=2026-12-03T16:51:00Z\ncommand=pyinfra inv.py deploys/gpu_node.py"
NO_SSH = {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"}
BOOT_ID = open("/proc/sys/kernel/random/boot_id").read().strip()


@pytest.fixture
def lock_file(tmp_path):
    return str(tmp_path / "run" / "host.lock")


def fact(lock_file: str) -> dict:
    out = subprocess.run(["sh", "-c", lock_script(lock_file)], capture_output=True, text=True, check=True).stdout
    return HostLock().process(wrap("lock", out))


def release(acquired: lock.Acquired, timeout: float = 30) -> None:
    acquired.keeper.stdin.close()
    acquired.keeper.wait(timeout)


def test_second_run_is_refused_naming_the_holder_until_the_first_ends(lock_file):
    first = lock.acquire_local(lock.hold_script(INFO_A, lock_file, wait_s=0), NO_SSH)
    assert first.held and first.holder == {} and first.seen == (BOOT_ID, 0)
    assert fact(lock_file) == {"held": True, **parse_holder(INFO_A.splitlines()),
                               "remote_pid": str(first.keeper.pid), "seen": (BOOT_ID, 1)}
    second = lock.acquire_local(lock.hold_script(INFO_B, lock_file, wait_s=0), NO_SSH)
    assert not second.held
    assert describe_holder(second.holder) == ("controller ctl1 pid 111, started 2026-12-03T16:50:01Z, command: "
                                              "pyinfra inv.py deploys/gpu_node.py")
    release(first)
    assert fact(lock_file) == {"held": False, "seen": (BOOT_ID, 1)}  # released and cleared: not stale
    third = lock.acquire_local(lock.hold_script(INFO_B, lock_file, wait_s=0), NO_SSH)
    assert third.held and third.holder == {} and third.seen == (BOOT_ID, 1)  # one run came after the read
    release(third)
    assert fact(lock_file)["seen"] == (BOOT_ID, 2)


def test_a_run_started_as_the_holder_releases_waits_for_it_instead_of_being_refused(lock_file):
    first = lock.acquire_local(lock.hold_script(INFO_A, lock_file, wait_s=0), NO_SSH)
    waiting: list[lock.Acquired] = []
    second = threading.Thread(target=lambda: waiting.append(
        lock.acquire_local(lock.hold_script(INFO_B, lock_file, wait_s=30), NO_SSH)))
    second.start()
    inode = f":{os.stat(lock_file).st_ino}"
    deadline = time.monotonic() + 30
    while not any(f[1] == "->" and f[6].endswith(inode) for f in map(str.split, open("/proc/locks"))):
        assert time.monotonic() < deadline, "the second run never waited on the lock"
        time.sleep(0.01)  # polling for the event: the second holder blocked in flock
    release(first)
    second.join(30)
    assert waiting and waiting[0].held and waiting[0].holder == {}
    release(waiting[0])


def test_lock_of_a_holder_that_is_gone_is_taken_over_and_named(lock_file):
    os.makedirs(os.path.dirname(lock_file))
    with open(lock_file, "w") as stale:  # a holder killed before it could clear the file; nobody holds flock
        stale.write(INFO_A + "\nremote_pid=99999\n")
    assert fact(lock_file) == {"held": False, "stale": True, **parse_holder(INFO_A.splitlines()),
                               "remote_pid": "99999", "seen": (BOOT_ID, 0)}
    taken = lock.acquire_local(lock.hold_script(INFO_B, lock_file, wait_s=0), NO_SSH)
    assert taken.held
    assert taken.holder == {**parse_holder(INFO_A.splitlines()), "remote_pid": "99999"}
    release(taken)


def test_commands_of_a_killed_run_keep_the_lock_until_they_end(lock_file):
    # the controller is gone (stdin closed) but a command it started on the same SSH connection still runs
    env = {**NO_SSH, "SSH_CONNECTION": f"10.0.0.1 {os.getpid()} 10.0.0.2 22"}
    held = lock.acquire_local(lock.hold_script(INFO_A, lock_file, wait_s=0), env)
    sibling = subprocess.Popen(["sh", "-c", "read line"], stdin=subprocess.PIPE, env=env)
    held.keeper.stdin.close()
    with pytest.raises(subprocess.TimeoutExpired):
        held.keeper.wait(2.5)  # the holder sees the sibling on its next scans and keeps waiting
    assert fact(lock_file)["held"]
    sibling.communicate(b"done\n", timeout=10)
    held.keeper.wait(10)
    assert fact(lock_file) == {"held": False, "seen": (BOOT_ID, 1)}


def test_planning_reads_the_lock_and_changes_nothing():
    held = {"held": True, **parse_holder(INFO_A.splitlines())}
    commands, noops = run_operation(lock.host_lock, facts={HostLock: held})
    assert commands == []
    assert noops == ["locked now by another run (controller ctl1 pid 111, started 2026-12-03T16:50:01Z, command: "
                     "pyinfra inv.py deploys/gpu_node.py); this run is refused here unless that run ends first"]
    assert run_operation(lock.host_lock, facts={HostLock: {"held": False}}) == (
        [], ["gpufleet lock free (taken when the run executes)"])


def test_node_lock_command_runs_the_command_under_the_lock_naming_itself(lock_file, tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "LOCK_FILE", lock_file)
    monkeypatch.setattr(lock, "LOCK_DIR", os.path.dirname(lock_file))
    seen = tmp_path / "seen"
    argv = lock.node_lock_command(["sh", "-c", f"cat {lock_file} > {seen}"], "gpufleet-mig-apply (boot)", wait_s=5)
    subprocess.run(argv, check=True, timeout=30)
    holder = parse_holder(seen.read_text().splitlines())
    assert holder["command"] == "gpufleet-mig-apply (boot)" and holder["pid"].isdigit()
    assert fact(lock_file) == {"held": False, "seen": (BOOT_ID, 1)}  # counted: a run that read 0 re-reads facts


def test_a_drain_hook_command_line_never_reaches_the_lock_file():
    from gpufleet.operations.lock import shown_argv

    argv = ["gpufleet", "rollout", "inv.py", "--drain", "command:/opt/hook --token s3cr3t", "--waves", "25%"]
    assert shown_argv(argv) == ["gpufleet", "rollout", "inv.py", "--drain", "command:…", "--waves", "25%"]
    assert shown_argv(["gpufleet", "--drain=command:hook s3cr3t", "--drain", "slurm"]) == [
        "gpufleet", "--drain=command:…", "--drain", "slurm"]
    assert shown_argv(["pyinfra", "https://u:s3cr3t@h/inv.py"]) == ["pyinfra", "https://***@h/inv.py"]
