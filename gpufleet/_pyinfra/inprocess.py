"""The rollout's pyinfra runs inside the gpufleet process: one start-up, one inventory load and one SSH connection per
host for the whole rollout, instead of a ``pyinfra`` process per pass and per wave.

:class:`Session` drives pyinfra's API as ``pyinfra_cli`` does; each run that plans is its own ``State``, and a
host's connection carries over between them. With ``--drain none`` the waves execute the whole-fleet pass's plan.
:func:`supported` checks the pyinfra names it relies on; otherwise the rollout runs ``pyinfra --json`` as a
subprocess per pass and wave. Plan freshness, results and signals: docs/design.md, "The in-process rollout".
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from gpufleet import pyinfra_args
from gpufleet.rollout.converge import PyinfraRun

from . import _connector, _memo, _signals
from ._guard import ROLLOUT_INPROCESS, plain_path, pyinfra_version

SWITCH = ROLLOUT_INPROCESS


class InventoryError(Exception):
    """The inventory (or ``config.py``) could not be loaded."""


def supported(version: str | None = None) -> str | None:
    """Why the rollout cannot run pyinfra in its own process here (``version``: the installed pyinfra's), or None."""
    reason = plain_path(SWITCH, version)
    if reason is not None:
        return reason
    version = version or pyinfra_version()
    try:
        from gevent import monkey
        from pyinfra.api import operations, state
        from pyinfra.connectors import base
        from pyinfra_cli import inventory, prints, util
    except ImportError as error:
        return f"pyinfra {version}: {error}"
    needed = {"pyinfra_cli.inventory.make_inventory": hasattr(inventory, "make_inventory"),
              "pyinfra_cli.util.load_deploy_file": hasattr(util, "load_deploy_file"),
              "pyinfra_cli.util.load_func": hasattr(util, "load_func"),
              "pyinfra_cli.util.exec_file": hasattr(util, "exec_file"),
              "pyinfra_cli.prints.build_plan_json": hasattr(prints, "build_plan_json"),
              "pyinfra_cli.prints.build_results_json": hasattr(prints, "build_results_json"),
              "pyinfra.api.operations.run_ops": hasattr(operations, "run_ops"),
              "State.activate_host": hasattr(state.State, "activate_host"),
              "State.fail_hosts": hasattr(state.State, "fail_hosts"),
              "BaseConnector(state, host)": list(inspect.signature(base.BaseConnector.__init__).parameters)[1:3]
              == ["state", "host"]}
    missing = [name for name, present in needed.items() if not present]
    if missing:
        return f"pyinfra {version} lacks {', '.join(missing)}"
    if not monkey.is_module_patched("socket"):
        return "the standard library is not patched for gevent (pyinfra's hosts would run one after another)"
    return None


def workers_supported(version: str | None = None) -> str | None:
    """Why ``gpufleet rollout --jobs N`` cannot run this Session in worker processes here, or None. The workers
    patch their own standard library for gevent (:mod:`gpufleet._pyinfra.workers`); what remains is the switch and
    the pyinfra version (the names :func:`supported` checks are read by the workers' Session as by this one)."""
    return plain_path(SWITCH, version)


class _Log(logging.Handler):
    """pyinfra's log of the run in progress, as the lines its CLI prints on stderr (without colours); also written
    to ``echo`` as it comes (``-v``)."""

    def __init__(self, echo: TextIO | None = None) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        try:
            lines = record.getMessage().splitlines() or [""]
            self.lines.extend(lines)
            if self.echo is not None:
                self.echo.write("".join(line + "\n" for line in lines))
                self.echo.flush()
        except Exception:  # a message that cannot be formatted is not worth failing a wave for
            self.handleError(record)

    def take(self) -> str:
        text, self.lines = "\n".join(self.lines), []
        return text + "\n" if text else ""


def _set_verbosity(state, verbosity: int) -> None:
    """pyinfra's ``-v``/``-vv``/``-vvv`` on a run's State, as its CLI sets them (``pyinfra_cli.cli._set_verbosity``,
    3.10): facts and no-op operations, then the commands, then their output."""
    if verbosity > 0:
        state.print_fact_info = state.print_noop_info = True
    if verbosity > 1:
        state.print_input = state.print_fact_input = True
    if verbosity > 2:
        state.print_output = state.print_fact_output = True


def describe(error: BaseException) -> str:
    """A pyinfra error's message; an exception raised in the deploy, inventory or config code, with where."""
    from pyinfra.api.exceptions import PyinfraError

    inner = getattr(error, "exception", None)  # pyinfra_cli wraps an exception of the user's files
    if isinstance(inner, BaseException):
        where = getattr(error, "filename", None)
        return f"{type(inner).__name__}: {inner}" + (f" (in {where})" if where else "")
    if isinstance(error, PyinfraError) and str(error):
        return str(error)
    return f"{type(error).__name__}: {error}".rstrip(": ")


def _alive(connector, timeout: float) -> bool:
    """Whether an adopted connection still answers: an SSH channel opened and closed (one round trip, nothing run
    on the host) within ``timeout`` seconds. A host that went down since the connection was made (its drain, a
    power cut) then connects again, and fails as it would in a new pyinfra run, instead of failing its wave's
    preparation halfway. Connectors without a connection of their own (local, fake) have nothing to lose."""
    if not hasattr(connector, "client"):
        return True
    transport = _connector.ssh_transport(connector)
    if transport is None or not transport.is_active():
        return False
    try:
        transport.open_session(timeout=timeout).close()
    except Exception:  # any failure (timeout, EOF, refused) means: not usable
        return False
    return True


def _probe(state, connectors: dict) -> dict:
    """{host: whether its connection answers} for ``connectors`` ({host: connector}), checked in parallel."""
    import gevent

    checks = {h: state.pool.spawn(_alive, connector, _connect_timeout(h)) for h, connector in connectors.items()}
    gevent.joinall(list(checks.values()))
    return {h: check.get() for h, check in checks.items()}


def _only(results: dict, names: set) -> dict:
    """pyinfra's results document cut to the hosts ``names`` (a kept plan's State holds every host of the plan)."""
    operations = []
    totals = {"hosts": 0, "success": 0, "error": 0, "no_change": 0}
    for op in results["operations"]:
        op = dict(op, **{k: [h for h in op[k] if h in names] for k in ("success", "error", "no_change")})
        op["hosts"] = len(op["success"]) + len(op["error"]) + len(op["no_change"])
        if op["hosts"]:
            operations.append(op)
            for key in totals:
                totals[key] += op[key] if key == "hosts" else len(op[key])
    return {"operations": operations, "totals": totals,
            "failed_hosts": [h for h in results["failed_hosts"] if h in names]}


def _connect_timeout(host) -> float:
    """The host's ``gpufleet_ssh_connect_timeout`` (validated by the deploy in the whole-fleet pass)."""
    from gpufleet import connection

    return connection.load_bounds(host.name, host.data.dict())[0].connect_timeout


def _close(connector) -> None:
    try:
        connector.host.disconnect()
    except Exception:  # closing a connection that is gone or idle: nothing left to do about it
        pass


class Session:
    """pyinfra in this process for the runs of one rollout (see the module docstring); :meth:`close` at the end."""

    def __init__(self, inventory: str, deploy: str, *, cwd: str | None = None,
                 args: pyinfra_args.PyinfraArgs | None = None, log: TextIO | None = None) -> None:
        """``args``: the user's ``--limit``, ``--data``, ``-v`` and SSH options, as ``pyinfra`` applies them;
        ``log``: where pyinfra's log goes as it comes with ``-v`` (else it is only read)."""
        import pyinfra
        from pyinfra.api import Config

        self.inventory_arg, self.deploy = inventory, deploy
        self.args = args or pyinfra_args.PyinfraArgs()
        self.cwd = cwd or os.getcwd()
        self.interruption: str | None = None  # the hosts mid-change when a run was interrupted
        self._connections: dict[str, Any] = {}  # host name -> connector kept connected for the host's wave
        self._planned: tuple[Any, Any, Any] | None = None  # (State, Inventory, Config) of a plan kept for the waves
        # Every State and Inventory of the session stays referenced until close(): per-run caches are keyed by
        # them (the host lock's by id(state)); a later run getting a freed one's id would share its entries.
        self._runs: list[tuple[Any, Any]] = []
        self._was_cli = pyinfra.is_cli
        pyinfra.is_cli = True
        if self.cwd not in sys.path:
            sys.path.append(self.cwd)  # as pyinfra's CLI: deploys and inventories import modules beside them
        self._log = _Log(log if self.args.verbosity else None)
        self._logger = logging.getLogger("pyinfra")
        self._logger_was = (self._logger.level, self._logger.propagate)
        self._logger.addHandler(self._log)
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False  # the log is the runs' result, read by the rollout: not for the terminal
        self.config = Config()
        try:
            self._load_config()
            self._spare = self._load_inventory()  # for the first run: the inventory is loaded once up front
        except Exception:
            self.close()
            raise
        chosen = list(self._spare)
        if self.args.patterns:
            chosen, unmatched = pyinfra_args.match_limit(self._spare, self.args.patterns)
            if unmatched:
                self.close()
                raise InventoryError(pyinfra_args.unmatched_error(unmatched, inventory, self._spare))
        self.hosts = [host.name for host in self._spare if host in chosen]  # pyinfra's order

    # ------------------------------------------------------------------------------------------------- public

    name = "in-process"

    def order(self) -> tuple[list[str], str | None]:
        """The inventory's hosts in pyinfra's order (as ``pyinfra INVENTORY debug-inventory`` lists them), those
        ``--limit`` selects."""
        return list(self.hosts), None

    def run(self, hosts: list[str] | None, *, plan: bool, keep_plan: bool = False, refresh: bool = True
            ) -> PyinfraRun:
        """One pyinfra run over ``hosts`` (None: every host of the inventory): ``plan``: connect and prepare (as
        ``pyinfra --dry``: the deploy validates and preflights every host, the operations say what they would
        change), the connections kept for a later run; else prepare and execute (as ``pyinfra -y``), then
        disconnect. Returns what ``pyinfra --json`` would have printed, and its log. ``KeyboardInterrupt`` stops the
        run at once (see the module docstring) and is raised again.

        ``keep_plan`` (with ``plan``): the later runs do not prepare again, they execute this plan for their hosts
        (``--drain none`` only: see the module docstring); ``refresh`` (executing such a plan): read the hosts'
        facts again first (the caller waited since the plan was made), else the plan's reads stand."""
        if not plan and self._planned is not None:
            return self._execute_planned(list(hosts or ()), refresh)
        from pyinfra.api import State
        from pyinfra.api.operations import run_ops
        from pyinfra.api.state import StateStage
        from pyinfra.context import ctx_config, ctx_inventory, ctx_state
        from pyinfra_cli.prints import build_plan_json, build_results_json
        from pyinfra_cli.util import load_deploy_file, load_func

        start = time.monotonic()
        self._log.take()
        inventory, self._spare = (self._spare or self._load_inventory()), None
        state = State(check_for_changes=plan)
        state.cwd = self.cwd
        _set_verbosity(state, self.args.verbosity)
        config = self.config.copy()
        self._runs.append((state, inventory))
        wanted = None if hosts is None else set(hosts)
        limit = None if wanted is None else [h for h in inventory if h.name in wanted]
        payload: dict[str, Any] | None = None
        with ctx_state.use(state), ctx_inventory.use(inventory), ctx_config.use(config):
            state.init(inventory, config, initial_limit=limit)
            _signals.leave_to_caller(state)
            failed_in = None  # the stage a pyinfra error stopped the run in
            try:
                state.set_stage(StateStage.Connect)
                self._connect(state, inventory)
                state.set_stage(StateStage.Prepare)
                config.lock_current_state()
                if pyinfra_args.is_deploy_file(self.deploy):
                    load_deploy_file(state, self.deploy)
                else:  # a deploy function (package.module.function), as pyinfra INVENTORY package.module.function
                    load_func(state, pyinfra_args.deploy_function(self.deploy))
                config.reset_locked_state()
                if not plan:
                    self._logger.info("--> Beginning operation run...")
                    state.set_stage(StateStage.Execute)
                    run_ops(state)
            except KeyboardInterrupt:
                self._stop(state)
                raise
            except Exception as error:  # a pyinfra error, or one of the deploy's code: the run stops
                failed_in = state.current_stage
                self._log_error(error)
            # What pyinfra's CLI would print: nothing when it stopped before executing (the deploy's validation
            # or preflight raised: nothing changed); the results so far when hosts failed while connecting or
            # executing (e.g. "No hosts remaining!"), each failed host then with its own reason in the log.
            if failed_in is None or (not plan and failed_in in (StateStage.Connect, StateStage.Execute)):
                payload = {"plan": build_plan_json(state), "results": None if plan else build_results_json(state)}
        rc = 0 if payload is not None and not state.failed_hosts else 1
        if plan and payload is not None and keep_plan:
            state.check_for_changes = False  # from here it executes, as pyinfra -y: no second change detection
            self._planned = (state, inventory, config)
        elif plan and payload is not None:
            self._keep(state)
        else:
            self._disconnect(state)
        return PyinfraRun(rc=rc, payload=payload, stderr=self._log.take(), seconds=time.monotonic() - start)

    def close(self) -> None:
        """Disconnect the connections still kept, and put pyinfra's mode and logger back as they were."""
        import pyinfra

        for connector in self._connections.values():
            _close(connector)
        self._connections.clear()
        if self._planned is not None:
            self._disconnect(self._planned[0])
            self._planned = None
        pyinfra.is_cli = self._was_cli
        self._logger.removeHandler(self._log)
        self._logger.setLevel(self._logger_was[0])
        self._logger.propagate = self._logger_was[1]

    # ------------------------------------------------------------------------------------------------ internals

    def _stop(self, state) -> None:
        """The run of ``state`` was interrupted: name the hosts it had mid-change, and send nothing more (its
        greenlets are killed, as when the CLI exits)."""
        from gpufleet import interruption

        self.interruption = _signals.report(state, interruption.received() or signal.SIGINT)
        state.pool.kill(block=True, timeout=5)

    def _log_error(self, error: BaseException) -> None:
        """As the CLI prints a pyinfra error (``--> pyinfra error: ...``, then the message's other lines)."""
        lines = describe(error).splitlines() or [type(error).__name__]
        self._logger.error(f"--> pyinfra error: {lines[0]}")
        for line in lines[1:]:
            self._logger.error(line)

    def _load_config(self) -> None:
        from pyinfra.api import State
        from pyinfra.context import ctx_config, ctx_state
        from pyinfra_cli.util import exec_file

        path = Path(self.cwd) / "config.py"  # pyinfra's optional config file (SUDO, PARALLEL, ...)
        if not path.exists():
            return
        state = State(check_for_changes=False)
        state.cwd = self.cwd
        try:
            with ctx_state.use(state), ctx_config.use(self.config):
                exec_file(str(path))
        except Exception as error:  # any error in the user's config.py
            raise InventoryError(f"{path} could not be loaded: {describe(error)}") from None
        self.config.lock_current_state()

    def _load_inventory(self):
        from pyinfra.api import State
        from pyinfra.context import ctx_config, ctx_state
        from pyinfra_cli.inventory import make_inventory

        state = State(check_for_changes=False)
        state.cwd = self.cwd
        try:
            with ctx_state.use(state), ctx_config.use(self.config):
                return make_inventory(self.inventory_arg, cwd=self.cwd, override_data=self.args.override_data())
        except Exception as error:  # any error in the user's inventory or group_data files
            raise InventoryError(f"cannot load the inventory {self.inventory_arg}: {describe(error)}") from None

    def _connect(self, state, inventory) -> None:
        """Activate the run's hosts: adopt the connection an earlier run left (see the module docstring), else
        connect, as ``connect_all`` does (a host that cannot be reached fails; none left raises)."""
        import gevent

        hosts = [h for h in inventory if state.is_host_in_limit(h)]
        kept = {h: self._connections.pop(h.name) for h in hosts if h.name in self._connections}
        alive = _probe(state, kept)
        fresh = []
        for host in hosts:
            connector = kept.get(host)
            if connector is not None and alive[host]:
                connector.state, connector.host = state, host
                host.connector = connector
                host.connected = True
                state.activate_host(host)
                continue
            if connector is not None:
                self._logger.info(f"{host.print_prefix}connection lost since the last run: connecting again")
                _close(connector)
            fresh.append(host)
        greenlets = {state.pool.spawn(host.connect): host for host in fresh}
        gevent.joinall(list(greenlets))
        failed = set()
        for greenlet, host in greenlets.items():
            greenlet.get()
            if host.connected:
                state.activate_host(host)
            else:
                failed.add(host)
        state.fail_hosts(failed, activated_count=len(hosts))

    def _execute_planned(self, hosts: list[str], refresh: bool) -> PyinfraRun:
        """Execute the kept plan for ``hosts`` (hosts of the plan): their operations only (with ``refresh``, each
        deciding on facts read now: the plan's reads of these hosts are forgotten and read again first), over the
        plan's connections (one that no longer answers is made again; a host that cannot be reached fails); then
        disconnect them."""
        from pyinfra.api.operations import run_ops
        from pyinfra.api.state import StateStage
        from pyinfra.context import ctx_config, ctx_inventory, ctx_state
        from pyinfra_cli.prints import build_results_json

        start = time.monotonic()
        self._log.take()
        state, inventory, config = self._planned
        planned = {h.name: h for h in state.activated_hosts}
        if not hosts or any(name not in planned for name in hosts):
            raise ValueError(f"not hosts of the plan: {', '.join(n for n in hosts if n not in planned) or 'none'}")
        wave = [planned[name] for name in hosts]
        with ctx_state.use(state), ctx_inventory.use(inventory), ctx_config.use(config):
            state.active_hosts = {h for h in wave if h not in state.failed_hosts}  # the wave's hosts, no other
            try:
                self._revive(state, wave)
                if state.current_stage < StateStage.Execute:
                    state.set_stage(StateStage.Execute)
                if refresh:  # the operations decide on what their hosts say now, not when the plan was made
                    _memo.refresh(state, [h for h in wave if h in state.active_hosts])
                self._logger.info("--> Beginning operation run...")
                run_ops(state)
            except KeyboardInterrupt:
                self._stop(state)
                raise
            except Exception as error:  # e.g. "No hosts remaining!": the results say who failed
                self._log_error(error)
            results = _only(build_results_json(state), set(hosts))
        failed = set(results["failed_hosts"])
        self._disconnect(state, wave)
        return PyinfraRun(rc=1 if failed else 0, payload={"plan": [], "results": results}, stderr=self._log.take(),
                          seconds=time.monotonic() - start)

    def _revive(self, state, wave: list) -> None:
        """Connect again the hosts of ``wave`` whose connection no longer answers; fail those that cannot be."""
        import gevent

        alive = _probe(state, {h: h.connector for h in wave if h.connected})
        dead = [h for h in wave if h not in state.failed_hosts and not alive.get(h)]
        for host in dead:
            if host.connected:
                self._logger.info(f"{host.print_prefix}connection lost since the plan: connecting again")
                try:
                    host.disconnect()
                except Exception:  # a connection that is gone: connecting again is what matters
                    pass
        gevent.joinall([state.pool.spawn(host.connect) for host in dead])
        state.fail_hosts({h for h in dead if not h.connected}, activated_count=len(wave))

    def _keep(self, state) -> None:
        for host in state.activated_hosts:
            if host.connected:
                self._connections[host.name] = host.connector

    def _disconnect(self, state, hosts: list | None = None) -> None:
        import gevent

        hosts = [h for h in (state.activated_hosts if hosts is None else hosts) if h.connected]
        if hosts:
            gevent.joinall([state.pool.spawn(host.disconnect) for host in hosts])
