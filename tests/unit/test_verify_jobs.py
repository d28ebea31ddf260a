"""``gpufleet verify --jobs N`` over SSH (gpufleet.verify.run.Sliced, gpufleet.verify.workers): the hosts spread over
worker processes give the report one process gives."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
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
