"""``gpufleet verify --jobs N`` over SSH (gpufleet.verify.run.Sliced, gpufleet.verify.workers): the hosts spread over
worker processes give the report one process gives."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _verify(cwd: Path, jobs: int) -> tuple[subprocess.CompletedProcess, dict]:
    out = cwd / f"out{jobs}"
    result = subprocess.run([sys.executable, "-m", "gpufleet", "verify", "inventory.py", "--jobs", str(jobs), "--out",
                             str(out)], cwd=cwd, capture_output=True, text=True, timeout=120)
    report = json.loads((out / "report.json").read_text())
    for key in ("generated_at",):
        report.pop(key)
    for key in ("host_seconds", "duration_s"):  # timings
        report["meta"].pop(key)
    return result, report


def test_verify_over_two_workers_writes_the_report_of_one_process(tmp_path):
    """Hosts whose probe fails (pyinfra's @fake hosts answer nothing), unreachable ones and a host that is no GPU
    node, sliced over 2 workers: the same report.json (but its timings), exit code and summary."""
    port = _closed_port()
    (tmp_path / "inventory.py").write_text(
        "gpu_nodes = [(f'@fake/gpu{i}', {}) for i in range(4)]\n"
        f"down = [(f'gpu-down{{i}}', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}}) for i in range(2)]\n"
        "monitoring = [('@fake/mon', {'gpufleet_stages': []})]\n")
    (one, one_report), (two, two_report) = _verify(tmp_path, 1), _verify(tmp_path, 2)
    assert one.returncode == two.returncode == 2, one.stderr + two.stderr  # no host verified: could not run
    assert two_report == one_report
    assert [h["status"] for h in two_report["hosts"]] == ["error"] * 4 + ["unreachable"] * 2
    assert "gpufleet verify: 6 host(s), bench none, 2 worker(s)" in two.stderr
    assert sorted(line.split()[1] for line in two.stderr.splitlines() if line.startswith("[")) == sorted(
        [f"@fake/gpu{i}" for i in range(4)] + ["gpu-down0", "gpu-down1"])
    # the summary (its first line has the time; its paths, the run's own --out)
    assert two.stdout.replace("/out2", "/out1").splitlines()[1:] == one.stdout.splitlines()[1:]


def test_ctrl_c_stops_every_worker_exit_130_naming_the_hosts_without_a_result(tmp_path):
    """Hosts that accept the connection and never answer (a socket nobody serves): Ctrl-C while the workers wait on
    them; exit 130, every host named, no report."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    accepted: list[socket.socket] = []
    try:
        port = server.getsockname()[1]
        (tmp_path / "inventory.py").write_text(
            f"gpu_nodes = [(f'hang{{i}}', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}}) for i in range(4)]\n")
        process = subprocess.Popen([sys.executable, "-m", "gpufleet", "verify", "inventory.py", "--jobs", "2"],
                                   cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        deadline = time.monotonic() + 30
        while len(accepted) < 4:  # every host's connection is waiting for its answer (never given)
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        _, err = process.communicate(timeout=60)
    finally:
        for connection in [server, *accepted]:
            connection.close()
    assert process.returncode == 130, err
    assert "probe not finished on: hang0, hang1, hang2, hang3; no report was written" in err
    assert "Traceback" not in err
    assert not (tmp_path / "gpufleet-verify").exists()
