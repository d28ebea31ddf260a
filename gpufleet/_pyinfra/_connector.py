"""gpufleet's runs on a subclass of each host's own connector class: the SSH options (TCP_NODELAY, keepalive,
dead-peer detection, connect timeouts), what must happen when a host connects anew, and the fact memo's view of
every command, upload and download.

pyinfra picks a host's connector class when it builds the inventory, so :func:`adopt` turns one state's connector
objects into ``Gpufleet<Their class>`` (methods only, no state); each override looks up its state's :func:`hooks`
and otherwise behaves as the class. ``@gpufleet/HOST`` names the SSH one directly (the entry point).
"""

from __future__ import annotations

import socket
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyinfra.connectors import ssh as _ssh

from gpufleet.config import ConfigError, ConfigErrors
from gpufleet.connection import SshBounds, SshSettingsError, bound_socket, connect_kwargs, load_bounds

from . import _signals


@dataclass(eq=False)
class Hooks:
    """What gpufleet does around one state's connectors."""

    bounds: dict[Any, SshBounds] = field(default_factory=dict)  # host -> SSH bounds (install)
    nodelay: bool = False  # TCP_NODELAY on every connection (the fact memo's runs)
    io: Any = None  # the fact memo: sees every command, upload, download, connect and disconnect
    after_connect: dict[Any, list[Callable[[Any], None]]] = field(default_factory=dict)  # host -> callbacks


_hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # State -> Hooks
_subclasses: dict[type, type] = {}


def hooks(state) -> Hooks:
    found = _hooks.get(state)
    if found is None:
        found = _hooks[state] = Hooks()
    return found


def _hooks_of(connector) -> Hooks | None:
    state = getattr(connector, "state", None)
    return _hooks.get(state) if state is not None else None


def _base(connector) -> type:
    return type(connector)._gpufleet_base


# The methods a ``Gpufleet<Class>`` connector has in front of its class's own (see the module docstring); each calls
# the class's own method.


def _connect(self, *args, **kwargs):
    found = _hooks_of(self)
    io = found.io if found is not None else None

    def base():
        return _base(self).connect(self, *args, **kwargs)

    result = io.connect(self.host, base) if io is not None else base()
    if found is not None:
        if found.nodelay:
            set_nodelay(self)
        bounds = found.bounds.get(self.host)
        if bounds is not None:
            bound_connection(self, bounds)
        for callback in list(found.after_connect.get(self.host, ())):
            callback(self.host)
    return result


def _disconnect(self, *args, **kwargs):
    io = getattr(_hooks_of(self), "io", None)

    def base():
        return _base(self).disconnect(self, *args, **kwargs)

    return io.touch(self.host, base) if io is not None else base()


def _run_shell_command(self, *args, **kwargs):
    io = getattr(_hooks_of(self), "io", None)
    if io is None:
        return _base(self).run_shell_command(self, *args, **kwargs)
    return io.command(self.host, lambda *a, **k: _base(self).run_shell_command(self, *a, **k), *args, **kwargs)


def _changing(name: str, change: bool):
    def method(self, *args, **kwargs):
        io = getattr(_hooks_of(self), "io", None)

        def base():
            return getattr(_base(self), name)(self, *args, **kwargs)

        if io is None:
            return base()
        return io.change(self.host, base) if change else io.touch(self.host, base)

    method.__name__ = name
    return method


_METHODS = {"connect": _connect, "disconnect": _disconnect, "run_shell_command": _run_shell_command,
            "put_file": _changing("put_file", True), "rsync": _changing("rsync", True),
            "get_file": _changing("get_file", False)}


def gpufleet_class(cls: type) -> type:
    """``Gpufleet<cls>``: ``cls`` with the methods above in front (one per connector class; only those ``cls``
    has). Methods only, no new attributes: the object layout stays the class's, so a connector object can be
    turned into one in place."""
    if hasattr(cls, "_gpufleet_base"):
        return cls
    found = _subclasses.get(cls)
    if found is None:
        methods = {name: method for name, method in _METHODS.items() if callable(getattr(cls, name, None))}
        found = _subclasses[cls] = type(f"Gpufleet{cls.__name__}", (cls,),
                                        {**methods, "_gpufleet_base": cls, "__module__": __name__})
    return found


def adopt(state) -> Hooks:
    """The connectors of ``state``'s hosts as gpufleet's subclasses of their classes (see the module docstring)."""
    for host in state.inventory:
        connector = getattr(host, "connector", None)
        if connector is not None and not hasattr(type(connector), "_gpufleet_base"):
            # a patch: pyinfra chose and created the connector (Inventory/State.init) before any deploy code ran,
            # and offers no way to choose the class of a plain host name's connector
            connector.__class__ = gpufleet_class(type(connector))
    return hooks(state)


def base_class(connector) -> type:
    """The connector's own pyinfra class (under gpufleet's subclass, if adopted)."""
    return getattr(type(connector), "_gpufleet_base", type(connector))


def ssh_transport(connector):
    """The paramiko transport of an SSH connector's live connection, or None (other connectors, not connected)."""
    client = getattr(connector, "client", None)
    try:
        return client.get_transport() if client is not None else None
    except Exception:  # a client that is closed or broken has no usable transport
        return None


def set_nodelay(connector) -> None:
    """Send each SSH packet at once (TCP_NODELAY) instead of holding small ones back for the peer's delayed ACK,
    which costs ~40 ms per remote command: pyinfra's SSH connector leaves Nagle's algorithm on. No-op for
    connectors other than SSH over TCP."""
    transport = ssh_transport(connector)
    try:
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (AttributeError, OSError):
        pass


def bound_connection(connector, bounds: SshBounds) -> bool:
    """Apply the bounds to the connector's live SSH connection (paramiko's keepalive, which on its own never notices
    a silent peer, plus TCP keepalive and TCP_USER_TIMEOUT); False for connectors that have none."""
    transport = ssh_transport(connector)
    sock = getattr(transport, "sock", None)
    if transport is None or not isinstance(sock, socket.socket):
        return False
    transport.set_keepalive(bounds.keepalive_interval)
    try:
        bound_socket(sock, bounds)
    except OSError:
        return False
    return True


def _set_connect_kwargs(host, bounds: SshBounds) -> None:
    # pyinfra's SSH connector copies the host data into its own ``data`` when created and reads
    # ``ssh_paramiko_connect_kwargs`` from there on each connect: the timeouts go there (the inventory's own win)
    data = getattr(host.connector, "data", None)
    if isinstance(data, dict) and "ssh_paramiko_connect_kwargs" in data:
        data["ssh_paramiko_connect_kwargs"] = connect_kwargs(bounds, data.get("ssh_paramiko_connect_kwargs"))


def install(state) -> None:
    """Bound every host of ``state`` (once per state): settings validated for every host first (raises
    :class:`SshSettingsError` with all errors), live connections bounded now, reconnects when they happen."""
    found = hooks(state)
    if found.bounds:
        return
    errors: list[ConfigError] = []
    per_host = {}
    for host in state.inventory:
        per_host[host], host_errors = load_bounds(host.name, host.data.dict())
        errors += host_errors
    if errors:
        raise SshSettingsError(f"invalid configuration, no host was changed:\n{ConfigErrors(errors)}")
    adopt(state)
    found.bounds.update(per_host)
    for host, bounds in per_host.items():
        _set_connect_kwargs(host, bounds)
        if host.connected:
            bound_connection(host.connector, bounds)


def connect(host, bounds: SshBounds | None = None, **kwargs):
    """``host.connect(**kwargs)`` with the connect timeout, then keepalive and dead-peer detection (one host: the
    verify command's)."""
    if bounds is None:
        bounds, errors = load_bounds(host.name, host.data.dict())
        if errors:
            raise SshSettingsError(f"invalid configuration, no host was changed:\n{ConfigErrors(errors)}")
    _set_connect_kwargs(host, bounds)
    result = host.connect(**kwargs)
    if host.connected:
        bound_connection(host.connector, bounds)
    return result


def close(host) -> None:
    """Disconnect ``host`` and close its SSH client (a connection of a finished run), whatever state it is in."""
    try:
        host.disconnect()
        client = getattr(host.connector, "client", None)
        if client is not None:
            client.close()
    except Exception:  # closing a connection of a finished run; nothing to do about it
        pass


def after_connect(host, callback: Callable[[Any], None]) -> None:
    """Call ``callback(host)`` each time ``host`` (of its state) connects anew, once connected, before anything else
    runs there; what it raises fails the connect."""
    adopt(host.state)
    hooks(host.state).after_connect.setdefault(host, []).append(callback)


class SSHConnector(gpufleet_class(_ssh.SSHConnector)):
    """pyinfra's SSH connector with gpufleet's hooks, for hosts named ``@gpufleet/HOSTNAME``; registered through the
    ``pyinfra.connectors`` entry point, which pyinfra's CLI loads before it connects (:func:`guard_cli_start`)."""

    @staticmethod
    def make_names_data(name):
        yield f"@gpufleet/{name}", {"ssh_hostname": name}, []


_signals.guard_cli_start()
