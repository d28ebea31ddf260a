"""A plain server deploy: a host-specific file and a systemd service."""

from io import StringIO

from pyinfra import host
from pyinfra.operations import files, systemd

files.directory(name="config directory", path="/etc/gpufleet-test")
files.put(name="host-specific file", src=StringIO(f"node={host.name}\n"), dest="/etc/gpufleet-test/node.conf")
unit = files.put(
    name="unit file",
    src=StringIO("[Unit]\nDescription=test agent\n[Service]\nExecStart=/bin/sleep infinity\n"
                 "[Install]\nWantedBy=multi-user.target\n"),
    dest="/etc/systemd/system/gpufleet-test-agent.service",
)
systemd.daemon_reload(name="reload units", _if=unit.did_change)
systemd.service(name="agent enabled and running", service="gpufleet-test-agent.service", running=True,
                enabled=True)
