"""One worker of ``gpufleet apply`` (:mod:`gpufleet.apply`, the coordinator): a pyinfra run over one slice of the
inventory's hosts, stopped at the validation barrier until the coordinator says ``go`` (or ``stop``).

    python -m gpufleet._pyinfra.workers JOB   # JOB: JSON, written by gpufleet.apply.Worker

The run is the rollout's in-process pyinfra session (:class:`gpufleet._pyinfra.inprocess.Session`): the inventory,
``config.py`` and ``--limit`` loaded as ``pyinfra`` does, the deploy prepared for the slice's hosts with its plan
kept (``keep_plan``: every host validated and preflighted, the deploy raising before anything executes when one
fails), then, on ``go``, that plan executed. Messages to the coordinator are JSON lines on the pipe ``JOB["fd"]``:
``slice`` (the hosts), ``progress`` (counters, at most ~3 a second), ``prepared`` (ok or not, pyinfra's plan),
``done`` (pyinfra's results document), ``interrupted`` (the hosts mid-change), ``error`` (bad inventory or
``--limit``: exit 2).

**pyinfra internals** (all those the workers use are here): a ``BaseStateCallback`` handler on the run's ``State``
for the progress counters; ``State.check_for_changes`` turned off while preparing with ``-y`` (pyinfra -y skips
change detection; the Session prepares as ``--dry`` otherwise); ``State.failed_hosts``, ``State.is_executing``,
``State.op_meta`` and ``Config.DIFF``; ``pyinfra.api.inventory.get_all_connectors`` looked up once for the
worker's run (:func:`_connectors_found_once`). The Session's ``_connect`` (where the run's ``State`` is first seen) and
``_stop`` (where an interrupted run is stopped) are extended for that.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

PROGRESS_EVERY_S = 0.3


class _Pipe:
    def __init__(self, fd: int) -> None:
        self.stream = os.fdopen(fd, "w", buffering=1)

    def send(self, **message: Any) -> None:
        self.stream.write(json.dumps(message) + "\n")
        self.stream.flush()


def _stage(state, op_hash) -> str:
    """An operation's name without its deploy's (``gpufleet: GPU node | GPU power limits`` -> ``GPU power
    limits``)."""
    names = sorted(state.op_meta[op_hash].names) if op_hash in state.op_meta else []
    return (", ".join(names) or "operation").split(" | ", 1)[-1]


def _counter(pipe: _Pipe, hosts: set[str]):
    from pyinfra.api.state import BaseStateCallback

    class Counter(BaseStateCallback):
        """Hosts connected / unreachable, and per stage (operation) hosts done, changed, failed."""

        def __init__(self) -> None:
            self.connect = [0, 0]
            self.ops: dict[str, list[int]] = {}
            self.last = 0.0

        def counters(self) -> dict:
            return {"connect": self.connect, "ops": self.ops}

        def _tick(self, force: bool = False) -> None:
            if force or time.monotonic() - self.last >= PROGRESS_EVERY_S:
                self.last = time.monotonic()
                pipe.send(type="progress", counters=self.counters())

        def host_connect(self, state, host) -> None:
            self.connect[0] += 1
            self._tick()

        def host_connect_error(self, state, host, error) -> None:
            self.connect[1] += 1
            self._tick()

        def operation_host_success(self, state, host, op_hash, retry_count=0) -> None:
            self.ops.setdefault(_stage(state, op_hash), [0, 0, 0])[0] += 1
            self._tick()

        def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0) -> None:
            counts = self.ops.setdefault(_stage(state, op_hash), [0, 0, 0])
            counts[0] += 1
            counts[2] += 1
            self._tick()

        def operation_end(self, state, op_hash) -> None:
            # whether a host changed is known once its operation completed (after the success callback)
            counts = self.ops.setdefault(_stage(state, op_hash), [0, 0, 0])
            counts[1] = sum(1 for host in state.inventory.iter_activated_hosts()
                            if host.name in hosts and op_hash in state.ops[host]
                            and state.ops[host][op_hash].operation_meta.did_succeed(_raise_if_not_complete=False)
                            and state.ops[host][op_hash].operation_meta.did_change())
            self._tick(force=True)

    return Counter()


def _session_class():
    from pyinfra.api.exceptions import PyinfraError

    from gpufleet._pyinfra._signals import mid_change
    from gpufleet._pyinfra.inprocess import Session

    class SliceSession(Session):
        """The rollout's Session, with the worker's hooks on each run's State."""

        yes = False
        counter = None

        def _connect(self, state, inventory) -> None:
            self.state = state
            self.unreachable = False
            self.mid_change: list = []
            self.executing = False
            if self.yes:
                state.check_for_changes = False  # as pyinfra -y: no change detection while preparing
            if self.counter is not None:
                state.add_callback_handler(self.counter)
            try:
                super()._connect(state, inventory)
            except PyinfraError:  # "No hosts remaining!": none of this slice's hosts could be reached
                self.unreachable = True
                raise

        def _stop(self, state) -> None:
            self.mid_change = mid_change(state)  # before the greenlets are killed
            self.executing = bool(state.is_executing)
            super()._stop(state)

    return SliceSession


def _wait_order() -> str:
    """The coordinator's order on stdin (``go``, ``go-refresh``, ``stop``; end of input: stop), waited for without
    blocking gevent's hub (the kept SSH connections stay served)."""
    from gevent.socket import wait_read

    data = b""
    while not data.endswith(b"\n"):
        wait_read(0)
        chunk = os.read(0, 64)
        if not chunk:
            return "stop"
        data += chunk
    return data.decode().strip()


def _connectors_found_once() -> Callable[[], None]:
    """pyinfra's ``Inventory.make_hosts_and_groups`` (3.10) calls ``get_all_connectors()`` for every ``@connector``
    host, and each call scans every installed package's entry points; the installed connectors do not change while
    the worker runs, so they are looked up once, for this worker's run. Returns what puts pyinfra's own back."""
    import functools

    from pyinfra.api import inventory

    found = getattr(inventory, "get_all_connectors", None)
    if not callable(found):
        return lambda: None
    inventory.get_all_connectors = functools.cache(found)

    def undo() -> None:
        inventory.get_all_connectors = found

    return undo


def _quiet_interruptions() -> None:
    """gevent's hub prints a traceback for a signal's exception raised while it runs, before it hands it to the
    main greenlet (which reports the interruption): not an error, so not printed; every other one still is."""
    import gevent

    hub = gevent.get_hub()
    printed = hub.print_exception

    def print_exception(context, kind, value, traceback) -> None:
        if not (isinstance(kind, type) and issubclass(kind, KeyboardInterrupt)):
            printed(context, kind, value, traceback)

    hub.print_exception = print_exception


def _failed(session) -> list[str]:
    return sorted(h.name for h in session.state.failed_hosts) if getattr(session, "state", None) else []


def _serve(session, pipe: _Pipe) -> int:
    """Session mode (``gpufleet rollout --jobs``, :mod:`gpufleet.rollout.workers`): pyinfra runs of hosts of this
    worker's slice on the coordinator's orders (JSON lines on stdin), one at a time, each answered with what
    ``pyinfra --json`` would print (``ran``: the Session's run), until the end of input. ``drop``: forget a kept
    plan that will not execute (another worker's hosts failed their preparation)."""
    while True:
        order = _wait_order()
        if not order.startswith("{"):
            return 0
        run = json.loads(order)
        if run["do"] == "drop":
            if session._planned is not None:
                session._disconnect(session._planned[0])
                session._planned = None
            pipe.send(type="dropped")
            continue
        hosts, absent = run["hosts"], []
        if not run["plan"] and session._planned is not None:
            # a host the plan could not connect to is not in it: it failed there (its reason is in that run's log)
            planned = {h.name for h in session._planned[0].activated_hosts}
            hosts, absent = [h for h in hosts if h in planned], [h for h in hosts if h not in planned]
        session.yes = run["yes"]
        if hosts:
            done = session.run(hosts, plan=run["plan"], keep_plan=run["keep_plan"], refresh=run["refresh"])
            rc, payload, log, seconds = done.rc, done.payload, done.stderr, done.seconds
        else:
            rc, payload, log, seconds = 1, {"plan": [], "results": None}, "", 0.0
        pipe.send(type="ran", rc=rc, payload=payload, stderr=log, seconds=seconds, absent=absent,
                  unreachable=bool(run["plan"] and payload is None and getattr(session, "unreachable", False)))


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    pipe = _Pipe(job["fd"])
    # before pyinfra (and paramiko) are imported, as pyinfra's CLI does: its hosts then run concurrently
    from gevent import monkey

    monkey.patch_all()
    from gpufleet import apply, interruption, pyinfra_args
    from gpufleet._pyinfra.inprocess import InventoryError

    interruption.catch_signals()
    _quiet_interruptions()
    undo = _connectors_found_once()
    args = job["args"]
    options = pyinfra_args.PyinfraArgs(limit=tuple(args["limit"]), data=tuple(args["data"]),
                                       verbosity=args["verbosity"], ssh_user=args["ssh_user"],
                                       ssh_port=args["ssh_port"], ssh_key=args["ssh_key"])
    session = None
    try:
        try:
            session = _session_class()(job["inventory"], job["deploy"], cwd=job["cwd"], args=options,
                                       log=sys.stderr)
        except InventoryError as error:
            pipe.send(type="error", message=str(error))
            return apply.EXIT_USAGE
        if job["diff"]:
            session.config.DIFF = True  # as pyinfra --diff
        groups = {h.name: [g for g in h.groups] for h in session._spare}
        mine = apply.slice_hosts([(name, groups[name]) for name in session.hosts], job["jobs"])[job["index"]]
        selected = hashlib.sha256("\n".join(session.hosts).encode()).hexdigest()  # the same in every worker
        pipe.send(type="slice", hosts=mine, total=len(session.hosts), selected=selected,
                  order=session.hosts if job["index"] == 0 else None)  # the inventory's order, once
        if job.get("mode") == "session":
            return _serve(session, pipe)
        if not mine:  # more workers than hosts: nothing to do (an empty limit would mean every host to pyinfra)
            pipe.send(type="prepared", ok=True, unreachable=False, plan=[], failed_hosts=[], log="")
            if _wait_order().startswith("go"):
                pipe.send(type="done", rc=0, results=None, failed_hosts=[], log="")
            return 0
        session.yes = job["yes"]
        session.counter = _counter(pipe, set(mine))
        planned = session.run(mine, plan=True, keep_plan=True)
        unreachable = planned.payload is None and getattr(session, "unreachable", False)
        ok = planned.payload is not None or unreachable
        failed = list(mine) if unreachable else _failed(session)
        pipe.send(type="prepared", ok=ok, unreachable=unreachable,
                  plan=planned.payload["plan"] if planned.payload else None, failed_hosts=failed,
                  log=planned.stderr if (failed or not ok) else "", counters=session.counter.counters())
        order = _wait_order()
        if not ok or unreachable or not order.startswith("go"):
            return 0 if ok else 1
        done = session.run(mine, plan=False, refresh=order == "go-refresh")
        results = done.payload["results"] if done.payload else None
        failed = results["failed_hosts"] if results else list(mine)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        pipe.send(type="done", rc=done.rc, results=results, failed_hosts=failed,
                  log=done.stderr if failed or done.rc else "", counters=session.counter.counters(),
                  cpu_s=usage.ru_utime + usage.ru_stime)
        return done.rc
    except KeyboardInterrupt as error:  # interruption.Interrupted
        pipe.send(type="interrupted", signum=getattr(error, "signum", 2),
                  mid_change=getattr(session, "mid_change", []) if session else [],
                  executing=bool(getattr(session, "executing", False)) if session else False)
        sys.stdout.flush()
        sys.stderr.flush()
        # at once, as pyinfra's CLI under gpufleet (gpufleet.interruption.install): the commands in flight are
        # what the user interrupted; the kernel closes the SSH connections
        os._exit(interruption.status_of(error))
    finally:
        if session is not None:
            session.close()
        undo()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
