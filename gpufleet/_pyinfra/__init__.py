"""gpufleet's one door to pyinfra beyond its documented API: the fact memo (:mod:`._memo`), the rollout's
in-process runs (:mod:`.inprocess`), the connector subclass (:mod:`._connector`), signal handling (:mod:`._signals`),
the lock channel (:mod:`._lock`), and here the version guard and the CLI helpers gpufleet's commands share.

The rest of gpufleet calls the functions below, never pyinfra's internals (tests/unit/test_layers.py checks it). The
fast paths run only on the pyinfra versions CI ran, else gpufleet takes the plain path and says so in one line
(:func:`plain_path`). What each module works around: docs/design.md, "pyinfra internals".
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ._guard import (  # noqa: F401 - the version guard is part of this interface
    FACT_MEMO,
    ROLLOUT_INPROCESS,
    TESTED_PYINFRA,
    plain_path,
    pyinfra_version,
    say_plain_path,
    switched_off,
    version_tested,
)

# ----------------------------------------------------------------------------------- the converge deploy's run


def prepare_deploy_run(state, read_ahead: Iterable[type] = (), cache_dir: Path | None = None) -> None:
    """What the converge deploy sets up on its run's ``state`` (once; the real ``State``, e.g. ``host.state``): the
    SSH bounds of every host (raises :class:`gpufleet.connection.SshSettingsError` on bad settings), the fact memo
    with ``read_ahead`` read on every host in one round trip (where :func:`plain_path` allows; ``cache_dir``:
    :func:`default_cache_dir`), and the signal handling of the pyinfra CLI."""
    from . import _connector, _memo, _signals

    _memo.install(state, tuple(read_ahead), cache_dir)
    _connector.install(state)
    _signals.install(state)


def install_fact_memo(state, read_ahead: Iterable[type] = (), cache_dir: Path | None = None) -> bool:
    """The fact memo alone (tests, benchmarks); False where the plain path is taken."""
    from . import _memo

    return _memo.install(state, tuple(read_ahead), cache_dir) is not None


def forget_reads(state, host) -> None:
    """Forget ``host``'s memoised fact reads (``host`` may be pyinfra's context host): its facts are read again."""
    from . import _memo

    _memo.invalidate(state, host)


def default_cache_dir() -> Path:
    from . import _memo

    return _memo.default_cache_dir()


def install_signal_report(state) -> bool:
    """Under the pyinfra CLI: SIGINT/SIGTERM/SIGHUP exit 130/143/129 naming the hosts mid-change (once per state)."""
    from . import _signals

    return _signals.install(state)


def interruption_report(state, signum: int) -> str:
    from . import _signals

    return _signals.report(state, signum)


# ------------------------------------------------------------------------------------------- SSH connections


def bound_ssh(state) -> None:
    """The SSH bounds of every host of ``state`` (once): see :mod:`gpufleet._pyinfra._connector`."""
    from . import _connector

    _connector.install(state)


def connect_bounded(host, bounds=None, **kwargs):
    """``host.connect(**kwargs)`` with the connect timeout, then keepalive and dead-peer detection."""
    from . import _connector

    return _connector.connect(host, bounds, **kwargs)


def close_connection(host) -> None:
    """Disconnect ``host`` and close its SSH client, whatever state it is in."""
    from . import _connector

    _connector.close(host)


def connector_arguments(host) -> dict[str, Any]:
    """The connector arguments (``_sudo``, ``_su_user``, ``_env``, ...) of ``host``'s data, as pyinfra gives them to a
    command it runs for an operation."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

    arguments, _ = pop_global_arguments(host.state, host, {})
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS}


# ------------------------------------------------------------------------------------------------- host lock


def hold_lock(host, script: str, timeout: float, grace_s: float):
    """Run the lock's hold ``script`` on ``host`` for as long as the returned keeper lives (see
    :mod:`gpufleet._pyinfra._lock`); ``(keeper, reply lines)``, or None where the connector cannot hold it."""
    from . import _lock

    return _lock.hold(host, script, timeout, grace_s)


def runs_nothing(host) -> bool:
    """Whether ``host`` is one of pyinfra's ``@fake`` hosts (nothing runs there)."""
    from . import _lock

    return _lock.runs_nothing(host)


def runs_locally(host) -> bool:
    """Whether ``host`` runs its commands on this machine (pyinfra's ``@local``)."""
    from . import _lock

    return _lock.runs_locally(host)


def inventory_host(state, host):
    """The inventory's ``Host`` object behind pyinfra's context ``host``."""
    return state.inventory.get_host(host.name)


def after_reconnect(host, callback: Callable[[Any], None]) -> None:
    """Call ``callback(host)`` each time ``host`` is connected anew within the run (after a reboot), before
    anything else runs there; an exception it raises fails the host."""
    from . import _connector

    _connector.after_connect(host, callback)


# ----------------------------------------------------------------------------------- gpufleet's own pyinfra runs


def load_config_and_inventory(inventory_arg: str, cwd: str, override_data: dict, config, config_file: Path | None):
    """``config_file`` (pyinfra's ``config.py``, optional) executed into ``config``, then the inventory loaded with
    pyinfra's own loader, as ``pyinfra INVENTORY ...`` does; exceptions of the user's files as they raise."""
    from pyinfra.api import State
    from pyinfra.context import ctx_config, ctx_state
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import exec_file

    state = State(check_for_changes=False)
    state.cwd = cwd
    with ctx_state.use(state), ctx_config.use(config):
        if config_file is not None:
            exec_file(str(config_file))
        return make_inventory(inventory_arg, cwd=cwd, override_data=dict(override_data or {}))


def host_pool(state):
    """The gevent pool pyinfra runs ``state``'s hosts on (its ``PARALLEL`` bound)."""
    return state.pool


def running_hosts(state) -> set:
    """The hosts of ``state``'s run still going (not failed)."""
    return set(state.active_hosts)


def connected_hosts(state) -> set:
    """The hosts of ``state``'s run that connected."""
    return set(state.activated_hosts)


def parse_cli_arg(value: str) -> Any:
    """A ``--data KEY=VALUE`` value parsed as pyinfra's CLI parses it (``true``/``false``, numbers, JSON)."""
    from pyinfra_cli.util import parse_cli_arg as parse

    return parse(value)


def import_function(spec: str) -> Callable[..., Any]:
    """The function ``package.module.function`` (or ``package.module:function``) names, imported as pyinfra's CLI
    imports a deploy function (from the working directory too: pyinfra's ``main.py`` puts it on ``sys.path``)."""
    from pyinfra_cli.util import try_import_module_attribute

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    return try_import_module_attribute(spec)


def connector_name(host) -> str:
    """The name of ``host``'s pyinfra connector class (for messages)."""
    from . import _lock

    return _lock.connector_name(host)
