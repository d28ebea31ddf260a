"""The SSH channel that holds a host's gpufleet lock (:mod:`gpufleet.operations.lock` says how the lock works).

pyinfra runs each command in an SSH session of its own that ends with the command; the lock must stay held for the
whole run. So the hold script runs on one more channel of the host's own connection, opened here on the SSH
connector's paramiko transport (a connector internal: pyinfra has no API for a session that outlives a command).
The local connector (tests) holds it with a child process instead; pyinfra's ``@fake`` hosts run nothing.
"""

from __future__ import annotations

import shlex

from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.local import LocalConnector

from . import _connector


def runs_nothing(host) -> bool:
    return issubclass(_connector.base_class(host.connector), FakeConnector)


def runs_locally(host) -> bool:
    return issubclass(_connector.base_class(host.connector), LocalConnector)


def connector_name(host) -> str:
    return _connector.base_class(host.connector).__name__


def hold(host, script: str, timeout: float, grace_s: float):
    """``(channel, its output as a file)``: ``script`` run by ``sh`` on a new channel of ``host``'s SSH connection,
    the channel left open (the caller reads the reply, then keeps or closes the channel); None where the host has
    no SSH connection."""
    transport = _connector.ssh_transport(host.connector)
    if transport is None:
        return None
    channel = transport.open_session(timeout=timeout)
    channel.settimeout(timeout + grace_s)
    channel.exec_command(f"sh -c {shlex.quote(script)}")
    return channel, channel.makefile("r")
