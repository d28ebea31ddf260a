"""Bounded waits on SSH hosts: a host that stops answering fails within about 30 s instead of stalling the fleet.

Why: pyinfra runs an operation on every host and waits for all of them before the next one. Its SSH connector
(paramiko) waits on a dead peer for as long as the kernel keeps retransmitting (~15 minutes): a host whose link or
kernel dies mid-command froze every other host at that operation. paramiko's own keepalive
(``Transport.set_keepalive``) sends a packet that wants no reply, so on its own it never notices a silent peer.

What, per host (``gpufleet_ssh_*`` host data, validated here):

* ``gpufleet_ssh_connect_timeout`` (default 10 s): TCP connect, SSH banner and authentication timeouts of every
  (re)connection made while gpufleet runs (pyinfra's first connection uses its own ``CONNECT_TIMEOUT``, also 10 s).
* ``gpufleet_ssh_keepalive_interval`` (default 5 s): paramiko sends a keepalive packet after this many seconds
  without traffic, so there is always data in flight to a host that is silent, and TCP keepalive probes the
  connection when idle.
* ``gpufleet_ssh_dead_after`` (default 20 s): ``TCP_USER_TIMEOUT``: sent data unacknowledged for this long drops
  the connection; the command running on it fails, pyinfra marks that host failed and the others go on.

A lost host is so declared within ``keepalive_interval + dead_after`` (25 s by default). A command that runs long
while the host answers (a driver install) is not affected: the host acknowledges the keepalives.

This module validates the settings and says what they mean for a socket; applying them to pyinfra's connections
(every host of the converge's and verify's runs, reconnects after a reboot too) is done by
:mod:`gpufleet._pyinfra._connector`.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyinfra.api.exceptions import PyinfraError

from gpufleet.config import ConfigError, ConfigErrors

PREFIX = "gpufleet_ssh_"


@dataclass(frozen=True)
class SshBounds:
    connect_timeout: float = 10.0
    keepalive_interval: int = 5
    dead_after: int = 20

    @property
    def detection_s(self) -> int:
        """Worst case from a host going silent to its connection being dropped."""
        return self.keepalive_interval + self.dead_after


# key -> (field, lowest, highest, allowed text)
SETTINGS: dict[str, tuple[str, float, float, str]] = {
    "gpufleet_ssh_connect_timeout": ("connect_timeout", 1, 600, "seconds, a number from 1 to 600"),
    "gpufleet_ssh_keepalive_interval": ("keepalive_interval", 1, 300, "seconds, an integer from 1 to 300"),
    "gpufleet_ssh_dead_after": ("dead_after", 5, 3600, "seconds, an integer from 5 to 3600"),
}


class SshSettingsError(PyinfraError):
    """Invalid ``gpufleet_ssh_*`` settings: pyinfra prints the message and nothing is changed."""


def load_bounds(host_name: str, data: Mapping[str, Any]) -> tuple[SshBounds, list[ConfigError]]:
    """(bounds, errors) of one host's data; strict: unknown ``gpufleet_ssh_*`` keys are errors."""
    errors: list[ConfigError] = []
    values: dict[str, Any] = {}
    for key in sorted(k for k in data if isinstance(k, str) and k.startswith(PREFIX)):
        if key not in SETTINGS:
            errors.append(ConfigError(host_name, key, data[key], "one of " + ", ".join(SETTINGS),
                                      "unknown gpufleet_ssh setting"))
            continue
        field, low, high, allowed = SETTINGS[key]
        value = data[key]
        integer = field != "connect_timeout"
        valid_type = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not valid_type or not (low <= value <= high) \
                or (not integer and not math.isfinite(value)):
            errors.append(ConfigError(host_name, key, value, allowed))
            continue
        values[field] = value
    return SshBounds(**values), errors


def bounds_of(host) -> SshBounds:
    bounds, errors = load_bounds(host.name, host.data.dict())
    if errors:
        raise SshSettingsError(f"invalid configuration, no host was changed:\n{ConfigErrors(errors)}")
    return bounds


def connect_kwargs(bounds: SshBounds, existing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """paramiko ``connect`` arguments; values the inventory sets in ``ssh_paramiko_connect_kwargs`` win."""
    ours = {"timeout": bounds.connect_timeout, "banner_timeout": bounds.connect_timeout,
            "auth_timeout": bounds.connect_timeout}
    return {**ours, **(existing or {})}


def bound_socket(sock: socket.socket, bounds: SshBounds) -> None:
    """TCP keepalive when idle and TCP_USER_TIMEOUT (Linux) on an SSH connection's socket."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, bounds.keepalive_interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, bounds.keepalive_interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT,
                        max(1, math.ceil(bounds.dead_after / bounds.keepalive_interval)))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, bounds.dead_after * 1000)
