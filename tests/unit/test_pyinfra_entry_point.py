"""gpufleet's ``pyinfra.connectors`` entry point: found by pyinfra, and a Ctrl-C while the hosts connect exits 130."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from pyinfra.api.connectors import get_all_connectors
from pyinfra.connectors.ssh import SSHConnector

from gpufleet._pyinfra.plugin import GpufleetSSHConnector

REPO = Path(__file__).resolve().parents[2]


def test_pyinfra_finds_gpufleets_connector_through_its_entry_point():
    found = get_all_connectors()["gpufleet"]
    assert found is GpufleetSSHConnector and issubclass(found, SSHConnector)


def _silent_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A TCP listener that accepts and never answers (SSH waits for the banner: the run stays connecting), and the
    connections it accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return listener, accepted


def _interrupt_while_connecting(tmp_path: Path, argv: list[str]) -> tuple[int, str]:
    listener, accepted = _silent_listener()
    port = listener.getsockname()[1]
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"hosts = [(f'h{{i}}', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, "
                         "'ssh_user': 'root'}) for i in range(4)]\n")
    log = tmp_path / "log"
    with log.open("w") as out:
        process = subprocess.Popen([*argv, str(inventory), str(REPO / "deploys/gpu_node.py")], cwd=tmp_path,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "HOME": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while not accepted:  # the run is connecting to the hosts
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        listener.close()
        for connection in accepted:
            connection.close()
    return process.returncode, log.read_text()


def test_ctrl_c_while_pyinfra_connects_exits_130(tmp_path):
    status, output = _interrupt_while_connecting(
        tmp_path, [sys.executable, "-m", "pyinfra", "-y"])
    assert status == 130, output  # pyinfra's own handler: "Exiting upon user request!", exit 0
    assert "interrupted by SIGINT before executing anything: no host was changed" in output
    assert "Exiting upon user request" not in output


def test_ctrl_c_while_gpufleet_apply_connects_exits_130(tmp_path):
    status, output = _interrupt_while_connecting(
        tmp_path, [sys.executable, "-m", "gpufleet", "apply", "-y", "--jobs", "2"])
    assert status == 130, output
