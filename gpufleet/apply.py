"""``gpufleet apply INVENTORY [DEPLOY] [--jobs N]``: the deploy over the inventory in N pyinfra worker processes, each
on a slice of the hosts, behind ONE validation barrier.

Why: pyinfra runs one process on one core. A no-op converge costs ~22 ms of controller CPU per host (and a real SSH
connection ~90 ms more), so a 10,000-node fleet is minutes of one core before any work; the other cores idle.

How (this module is the coordinator; it never imports pyinfra, the workers are :mod:`gpufleet._pyinfra.workers`):

1. N workers start at once. Each loads the inventory (and ``--limit``) as ``pyinfra`` would, and takes its slice of
   the selected hosts (:func:`slice_hosts`: round robin over the hosts sorted by their groups, so every worker gets
   a mix of the fleet's kinds of node, not all HGX nodes in one).
2. **Barrier.** Each worker connects, validates and preflights its hosts and prepares the deploy (as ``pyinfra``
   does before it executes anything), reports the result, and waits. Only when EVERY worker has prepared without
   error does the coordinator tell them to execute; if any failed (a bad setting on the last host of the last
   slice), every worker is told to stop and no host is changed — as with one ``pyinfra`` process, where the
   deploy raises before any host executes. Without ``-y`` the merged plan is shown and Enter asked at this point,
   as pyinfra asks after its change detection; ``--dry`` stops here.
3. Each worker executes its slice's plan; its results come back in pyinfra's ``--json`` format and are merged
   (:func:`merge_results`): one results table, one ``--json`` document, one exit code with pyinfra's meaning.

A host's lock, fact memo and read-ahead cache are per host, so they work in whichever worker the host is: each
worker's pyinfra run installs them on its own hosts, and saves the read cache of its hosts at exit.

Exit code: 0 every host succeeded (or nothing to confirm), 1 a host failed or the deploy's validation or preflight
failed on any host (nothing changed), 2 bad usage or inventory (nothing changed), 130/143/129 interrupted by
SIGINT/SIGTERM/SIGHUP (the hosts in flight are named).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

# slice_hosts: how the workers cut the hosts, in pyinfra_args since gpufleet verify (a lower layer) cuts them too
from gpufleet.interruption import SIGNALS, exit_status, stop_report
from gpufleet.pyinfra_args import DEFAULT_DEPLOY, PyinfraArgs, slice_hosts  # noqa: F401

WORKER_MODULE = "gpufleet._pyinfra.workers"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STOP_GRACE_S = 15  # how long interrupted workers get to name their hosts mid-change before they are killed
class Interrupted(KeyboardInterrupt):
    """The coordinator received ``signum`` (its workers are stopped, not the coordinator's own children as
    :class:`gpufleet.interruption.Interrupted` expects)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def catch_signals() -> None:
    """SIGINT, SIGTERM, SIGHUP raise :class:`Interrupted` (the first one; later ones are ignored while the workers
    stop), also where the caller started the command with SIGINT ignored."""
    received: list[int] = []

    def handle(signum: int, _frame) -> None:
        received.append(signum)
        if len(received) == 1:
            raise Interrupted(signum)

    for signum in SIGNALS:
        signal.signal(signum, handle)


def default_jobs() -> int:
    """The machine's cores (those this process may run on)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ------------------------------------------------------------------------------------------------ slicing


# ------------------------------------------------------------------------------------------------ merging


def _merge_order(lists: Sequence[Sequence[dict]]) -> list[str]:
    """One operation order (op hashes) from each worker's: every worker's own order kept; an operation only some
    workers have goes right after the operation it followed there."""
    order: list[str] = []
    for ops in lists:
        previous = None
        for op in ops:
            key = op["op_hash"]
            if key not in order:
                order.insert(order.index(previous) + 1 if previous is not None else 0, key)
            previous = key
    return order


def merge_plan(plans: Sequence[Sequence[dict] | None]) -> list[dict]:
    """The workers' ``plan`` lists (pyinfra's ``build_plan_json``) as one: per operation, the hosts of all."""
    plans = [p for p in plans if p]
    merged: dict[str, dict] = {}
    for plan in plans:
        for op in plan:
            into = merged.setdefault(op["op_hash"], {**op, "hosts_with_change": [],
                                                     "hosts_with_conditional_change": []})
            into["hosts_with_change"] += op["hosts_with_change"]
            into["hosts_with_conditional_change"] += op["hosts_with_conditional_change"]
    out = []
    for key in _merge_order(plans):
        op = merged[key]
        out.append({**op, "hosts_with_change": sorted(op["hosts_with_change"]),
                    "hosts_with_conditional_change": sorted(op["hosts_with_conditional_change"])})
    return out


def merge_results(results: Sequence[dict | None], failed_elsewhere: Iterable[str] = ()) -> dict:
    """The workers' ``results`` (pyinfra's ``build_results_json``) as one document of the same format.
    ``failed_elsewhere``: hosts that failed outside any operation (a slice whose hosts could not be reached)."""
    results = [r for r in results if r]
    merged: dict[str, dict] = {}
    for result in results:
        for op in result["operations"]:
            into = merged.setdefault(op["op_hash"], {**op, "hosts": 0, "success": [], "error": [], "no_change": []})
            into["hosts"] += op["hosts"]
            for key in ("success", "error", "no_change"):
                into[key] += op[key]
    operations = []
    totals = {"hosts": 0, "success": 0, "error": 0, "no_change": 0}
    for key in _merge_order([r["operations"] for r in results]):
        op = merged[key]
        op.update({k: sorted(op[k]) for k in ("success", "error", "no_change")})
        operations.append(op)
        totals["hosts"] += op["hosts"]
        for k in ("success", "error", "no_change"):
            totals[k] += len(op[k])
    failed = sorted({h for r in results for h in r["failed_hosts"]} | set(failed_elsewhere))
    return {"operations": operations, "totals": totals, "failed_hosts": failed}


def results_table(results: dict) -> list[str]:
    """pyinfra's results table (``pyinfra_cli.prints.print_results``: Operation, Hosts, Success, Error, No Change;
    ``-`` for none; the Grand total row) of a results document."""
    rows = [["Operation", "Hosts", "Success", "Error", "No Change"]]
    for op in results["operations"]:
        rows.append([op["name"], str(op["hosts"])] + [str(len(op[k])) if op[k] else "-"
                                                      for k in ("success", "error", "no_change")])
    rows.append(["Grand total"] + [str(v) if v else "-" for v in results["totals"].values()])
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return ["    " + "    ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def plan_lines(plan: list[dict], limit: int = 8) -> list[str]:
    """What would change, per operation: how many hosts and (the first ``limit``) which."""
    lines = []
    for op in plan:
        for label, hosts in (("", op["hosts_with_change"]), (" (conditional)", op["hosts_with_conditional_change"])):
            if hosts:
                shown = ", ".join(hosts[:limit]) + (f", ... ({len(hosts) - limit} more)" if len(hosts) > limit else "")
                lines.append(f"    {op['name']}{label}: {len(hosts)} host(s): {shown}")
    return lines or ["    no changes"]


# ------------------------------------------------------------------------------------------------ progress


@dataclass
class Progress:
    """The merged live view: per worker its latest counters, summed per stage (operation)."""

    jobs: int
    slices: dict[int, list[str]] = field(default_factory=dict)
    prepared: dict[int, bool] = field(default_factory=dict)
    counters: dict[int, dict] = field(default_factory=dict)  # worker -> {"connect": [ok, failed], "ops": {...}}

    def lines(self) -> list[str]:
        hosts = sum(len(s) for s in self.slices.values())
        connected = [sum(c.get("connect", [0, 0])[i] for c in self.counters.values()) for i in (0, 1)]
        lines = [f"hosts: {hosts} in {len(self.slices)}/{self.jobs} slices; connected {connected[0]}"
                 + (f", unreachable {connected[1]}" if connected[1] else ""),
                 f"validated and preflighted: {sum(self.prepared.values())}/{self.jobs} slices"
                 + (f", FAILED: {sum(not ok for ok in self.prepared.values())}"
                    if not all(self.prepared.values()) else "")]
        stages: dict[str, list[int]] = {}
        for counter in self.counters.values():
            for name, (done, changed, failed) in counter.get("ops", {}).items():
                into = stages.setdefault(name, [0, 0, 0])
                into[0], into[1], into[2] = into[0] + done, into[1] + changed, into[2] + failed
        for name, (done, changed, failed) in stages.items():
            lines.append(f"  {name}: {done} done, {changed} changed, {failed} failed")
        return lines


class _View:
    """The live view on a terminal (redrawn in place, at most 4 times a second); elsewhere nothing until the end
    but the milestones."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.shown = 0
        self.last = 0.0

    def draw(self, progress: Progress, *, force: bool = False) -> None:
        if not self.live or (not force and time.monotonic() - self.last < 0.25):
            return
        self.last = time.monotonic()
        lines = progress.lines()
        text = (f"\x1b[{self.shown}F" if self.shown else "") + "".join(f"\x1b[2K{line}\n" for line in lines)
        self.stream.write(text)
        self.stream.flush()
        self.shown = len(lines)

    def say(self, text: str) -> None:
        self.shown = 0  # a message scrolls the view up: draw it afresh below
        self.stream.write(text + "\n")
        self.stream.flush()


# ------------------------------------------------------------------------------------------------ workers


@dataclass
class ApplyOptions:
    inventory: str
    deploy: str = DEFAULT_DEPLOY
    jobs: int = 1
    yes: bool = False
    dry: bool = False
    diff: bool = False
    as_json: bool = False
    pyinfra: PyinfraArgs = field(default_factory=PyinfraArgs)


class Worker:
    """One worker process: its job on the command line, its messages (JSON lines) on a pipe of its own, its
    orders (``go`` / ``stop``) on its standard input."""

    def __init__(self, index: int, opts: ApplyOptions, cwd: str, command: Sequence[str] | None = None,
                 mode: str = "apply") -> None:
        """``mode``: ``apply`` (prepare, wait at the barrier, execute once) or ``session`` (the rollout's: runs on
        order, one at a time, until the end of input; see :mod:`gpufleet._pyinfra.workers`)."""
        self.index = index
        self.messages: list[dict] = []
        self.finished: dict | None = None  # the last message: prepared(failed)/done/interrupted/error
        self.prepared: dict | None = None
        self.answer: dict | None = None  # session mode: the answer to the latest order (ran, dropped)
        read, write = os.pipe()
        spec = {"inventory": opts.inventory, "deploy": opts.deploy, "index": index, "jobs": opts.jobs,
                "yes": opts.yes, "diff": opts.diff, "cwd": cwd, "fd": write, "mode": mode,
                "args": {"limit": list(opts.pyinfra.limit), "data": list(opts.pyinfra.data),
                         "verbosity": opts.pyinfra.verbosity, "ssh_user": opts.pyinfra.ssh_user,
                         "ssh_port": opts.pyinfra.ssh_port, "ssh_key": opts.pyinfra.ssh_key}}
        env = {**os.environ, "PYINFRA_PROGRESS": "off"}  # one view: the coordinator's; no spinner per worker
        self.process = subprocess.Popen(
            [*(command or [sys.executable, "-m", WORKER_MODULE]), json.dumps(spec)], cwd=cwd, env=env,
            stdin=subprocess.PIPE, stdout=sys.stderr.fileno(), pass_fds=(write,), start_new_session=True)
        os.close(write)
        self.pipe = os.fdopen(read, "rb")
        self.buffer = b""
        self.closed = False
        self.went = False  # told to execute

    def feed(self, chunk: bytes) -> list[dict]:
        """Messages complete in what was read (``b""``: the worker closed its pipe)."""
        if not chunk:
            self.closed = True
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def order(self, word: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            self.process.stdin.write(word.encode() + b"\n")
            self.process.stdin.flush()

    def signal(self, signum: int) -> None:
        """Pass ``signum`` on (a worker is in a session of its own: a terminal's signals reach the coordinator
        only); a worker that has not said a word yet is still starting, has connected nowhere, and is killed."""
        with contextlib.suppress(ProcessLookupError):
            if self.process.poll() is None:
                self.process.send_signal(signum if self.messages else signal.SIGKILL)


@dataclass
class Outcome:
    """What the run came to: the exit code and what to print."""

    exit_code: int
    payload: dict | None = None  # pyinfra's --json document
    errors: list[str] = field(default_factory=list)
    interrupted: str | None = None


class Pool:
    """``opts.jobs`` worker processes, each on its slice of the hosts, and the plumbing to talk to them: their
    messages read as they come (:meth:`_wait`), orders, the check that their slices hold each host once, the
    report of an interruption, their end. Used by ``gpufleet apply`` (:class:`Coordinator`: one barrier, one
    execution) and by ``gpufleet rollout --jobs`` (:mod:`gpufleet.rollout.workers`: a barrier per wave)."""

    mode = "apply"

    def __init__(self, opts: ApplyOptions, *, err: TextIO, worker_command: Sequence[str] | None = None) -> None:
        self.opts = opts
        self.err = err
        self.worker_command = worker_command
        self.workers: list[Worker] = []
        self.progress = Progress(opts.jobs)
        self.view = _View(err)
        self.selector = selectors.DefaultSelector()

    def _start(self) -> None:
        cwd = os.getcwd()
        for index in range(self.opts.jobs):
            worker = Worker(index, self.opts, cwd, self.worker_command, mode=self.mode)
            self.workers.append(worker)
            self.selector.register(worker.pipe, selectors.EVENT_READ, worker)

    def _check_slices(self) -> str | None:
        """Why the workers' slices cannot be trusted, or None. Each worker loaded the inventory itself and cut the
        same host list: an inventory that loads differently each time (random, time-dependent) would give
        overlapping slices."""
        seen: dict[str, int] = {}
        selected = {m["selected"] for w in self.workers for m in w.messages if m["type"] == "slice"}
        for index, hosts in self.progress.slices.items():
            for host in hosts:
                if host in seen:
                    return (f"host {host} is in the slices of workers {seen[host]} and {index}: the inventory did "
                            "not load the same way in every worker; nothing was changed")
                seen[host] = index
        if len(selected) > 1:
            return ("the workers loaded different hosts from the inventory: it did not load the same way in every "
                    "worker; nothing was changed")
        return None

    def _stop_report(self, signum: int) -> tuple[int, str]:
        """Stop every worker (each names its hosts mid-change); the exit status and where the run stopped."""
        for worker in self.workers:
            worker.signal(signum)  # also when the signal came to this process only (kill PID)
        deadline = time.monotonic() + STOP_GRACE_S
        with contextlib.suppress(KeyboardInterrupt):
            self._wait(lambda w: w.finished is not None, deadline=deadline)
        reports = [w.finished for w in self.workers if w.finished and w.finished["type"] == "interrupted"]
        mid = sorted((h, s) for m in reports for h, s in m["mid_change"])
        # a worker that was told to execute and did not answer may have been mid-change
        executing = any(m["executing"] for m in reports) or any(
            w.went and (w.finished is None or w.finished["type"] != "interrupted") for w in self.workers)
        lines = stop_report(signum, executing, mid)
        silent = [w.index for w in self.workers if w.finished is None or w.finished["type"] != "interrupted"]
        if executing and silent:
            lines.append(f"Workers that did not answer in {STOP_GRACE_S} s (killed): {silent}")
        return exit_status(signum), "\n".join(lines)

    # ---------------------------------------------------------------------------------------- plumbing

    def _order_all(self, word: str) -> None:
        for worker in self.workers:
            if worker.finished is None:
                worker.went = word.startswith("go")
                worker.order(word)

    def _wait(self, ready: Callable[[Worker], bool], deadline: float | None = None) -> None:
        """Read the workers' messages until ``ready`` holds for every worker (a worker that ended counts as
        finished)."""
        while not all(ready(w) for w in self.workers):
            timeout = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                return
            for key, _ in self.selector.select(timeout):
                worker: Worker = key.data
                chunk = os.read(worker.pipe.fileno(), 1 << 16)
                for message in worker.feed(chunk):
                    self._take(worker, message)
                if worker.closed:
                    self.selector.unregister(worker.pipe)
                    worker.process.wait()
                    if worker.finished is None:  # ended without its last word (killed, crashed)
                        worker.finished = {"type": "lost", "log": ""}
            self.view.draw(self.progress)

    def _take(self, worker: Worker, message: dict) -> None:
        worker.messages.append(message)
        kind = message["type"]
        if kind == "slice":
            self.progress.slices[worker.index] = message["hosts"]
        elif kind == "progress":
            self.progress.counters[worker.index] = message["counters"]
        elif kind == "prepared":
            worker.prepared = message
            self.progress.prepared[worker.index] = message["ok"]
            if not message["ok"]:
                worker.finished = message
        elif kind in ("ran", "dropped"):
            worker.answer = message
        elif kind in ("done", "interrupted", "error"):
            worker.finished = message
            if "counters" in message:
                self.progress.counters[worker.index] = message["counters"]

    def _reap(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(OSError, ValueError):
                worker.process.stdin.close()
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(worker.pipe)
            worker.pipe.close()
        self.selector.close()


class Coordinator(Pool):
    """Runs the workers through the barrier (see the module docstring)."""

    def __init__(self, opts: ApplyOptions, *, err: TextIO, confirm: Callable[[str], bool] | None = None,
                 worker_command: Sequence[str] | None = None) -> None:
        super().__init__(opts, err=err, worker_command=worker_command)
        self.confirm = confirm

    def run(self) -> Outcome:
        try:
            return self._run()
        except KeyboardInterrupt as error:  # interruption.Interrupted: SIGINT/SIGTERM/SIGHUP
            return self._interrupted(getattr(error, "signum", signal.SIGINT))
        finally:
            self._reap()

    # ---------------------------------------------------------------------------------------- phases

    def _run(self) -> Outcome:
        self._start()
        if not self.view.live:
            self.view.say("--> Connecting to hosts...")
        # Phase 1: every worker validated, preflighted and prepared its slice (or failed to)
        self._wait(lambda w: w.prepared is not None or w.finished is not None)
        usage = [w.finished for w in self.workers if w.finished and w.finished["type"] == "error"]
        if usage:
            self._order_all("stop")
            return Outcome(EXIT_USAGE, errors=sorted({m["message"] for m in usage}))
        mismatch = self._check_slices()
        if mismatch:
            self._order_all("stop")
            return Outcome(EXIT_FAILED, errors=[mismatch])
        failed = [w for w in self.workers if w.finished is not None or not w.prepared["ok"]]
        if failed:
            self._order_all("stop")
            errors = []
            for worker in failed:
                message = worker.prepared or worker.finished or {}
                errors += [line for line in _error_lines(message.get("log", "")) if line not in errors]
                if message.get("type") == "lost":
                    errors.append(f"worker {worker.index} ended without a result (exit {worker.process.poll()}; "
                                  "its error is above)")
            self.view.draw(self.progress, force=True)
            return Outcome(EXIT_FAILED, errors=errors or ["a worker failed to prepare its hosts"])
        plan = merge_plan([w.prepared["plan"] for w in self.workers])
        unreachable = sorted(h for w in self.workers for h in w.prepared["failed_hosts"])
        if all(w.prepared["unreachable"] for w in self.workers if self.progress.slices[w.index]):
            self._order_all("stop")
            return Outcome(EXIT_FAILED, errors=["--> pyinfra error: No hosts remaining!"])
        self.view.draw(self.progress, force=True)
        if self.opts.dry or (not self.opts.yes and self.opts.as_json):
            self._order_all("stop")  # as pyinfra --dry (and --json without -y): the plan, nothing changed
            self._wait(lambda w: w.finished is not None)
            return Outcome(EXIT_FAILED if unreachable else EXIT_OK, payload={"plan": plan, "results": None},
                           errors=_failed_host_lines(self.workers))
        if not self.opts.yes and self.confirm is not None:
            text = "--> Detected changes:\n" + "\n".join(plan_lines(plan))
            if not self.confirm(text):
                self._order_all("stop")
                return Outcome(EXIT_OK, payload={"plan": plan, "results": None})
            self._order_all("go-refresh")  # the hosts may have changed while the user read the plan
        else:
            self._order_all("go")
        if not self.view.live:
            self.view.say(f"--> every slice validated and preflighted: executing on {len(self.workers)} worker(s)")
        # Phase 2: execution
        self._wait(lambda w: w.finished is not None)
        done = [w.finished for w in self.workers]
        missing = [w.index for w in self.workers if w.finished.get("type") != "done"]
        unreachable_slices = [h for w in self.workers if w.prepared["unreachable"]
                              for h in self.progress.slices[w.index]]
        results = merge_results([m.get("results") for m in done], failed_elsewhere=unreachable_slices)
        self.view.draw(self.progress, force=True)
        errors = _failed_host_lines(self.workers)
        errors += [f"worker {i} ended without its results" for i in missing]
        rc = EXIT_FAILED if missing or results["failed_hosts"] or any(m.get("rc") for m in done) else EXIT_OK
        return Outcome(rc, payload={"plan": plan, "results": results}, errors=errors)

    def _interrupted(self, signum: int) -> Outcome:
        status, text = self._stop_report(signum)
        return Outcome(status, interrupted=text)


def _error_lines(log: str) -> list[str]:
    """The lines of a worker's pyinfra log that say what failed (pyinfra's error lines and what follows them)."""
    lines = log.splitlines()
    out = []
    for i, line in enumerate(lines):
        if "pyinfra error" in line:
            out += lines[i:]
            break
        if "rror" in line:
            out.append(line)
    return out


def _failed_host_lines(workers: Sequence[Worker]) -> list[str]:
    """Why hosts failed: each worker's error lines, when it had failed hosts."""
    out: list[str] = []
    for worker in workers:
        for message in (worker.prepared, worker.finished):
            if message and message.get("failed_hosts"):
                out += [line for line in _error_lines(message.get("log", "")) if line not in out]
    return out


@dataclass
class Planned:
    """A ``--dry`` run over workers, for a command that reads the plan (``gpufleet drift``): as one ``pyinfra --dry
    --json`` process would give it."""

    exit_code: int  # 0, 1 (a host failed or the deploy could not plan), 2 (bad usage or inventory), 128 + signal
    payload: dict | None  # pyinfra's --json document (plan; results None)
    log: str  # the workers' pyinfra log where something failed, then the coordinator's errors
    hosts: list[str]  # the hosts --limit selects, in the inventory's order
    interrupted: str | None = None


def plan(inventory: str, deploy: str, jobs: int, args: PyinfraArgs | None = None, *,
         err: TextIO | None = None, worker_command: Sequence[str] | None = None) -> Planned:
    """Validate, preflight and plan ``deploy`` on every host of ``inventory`` in ``jobs`` workers (as ``gpufleet
    apply --dry --json``); nothing is changed."""
    opts = ApplyOptions(inventory=inventory, deploy=deploy, jobs=jobs, dry=True, as_json=True,
                        pyinfra=args or PyinfraArgs())
    coordinator = Coordinator(opts, err=err or sys.stderr, worker_command=worker_command)
    outcome = coordinator.run()
    order = next((m["order"] for w in coordinator.workers for m in w.messages
                  if m["type"] == "slice" and m.get("order") is not None), None)
    logs = [m.get("log") or "" for w in coordinator.workers for m in (w.prepared, w.finished) if m]
    return Planned(outcome.exit_code, outcome.payload, "\n".join([*(log for log in logs if log), *outcome.errors]),
                   list(order or []), outcome.interrupted)


def main(opts: ApplyOptions, *, echo: Callable[..., None] = print, confirm: Callable[[str], bool] | None = None,
         worker_command: Sequence[str] | None = None) -> int:
    """The run; prints the results table (or the ``--json`` document) on stdout, errors and progress on stderr."""
    start = time.monotonic()
    coordinator = Coordinator(opts, err=sys.stderr, confirm=confirm, worker_command=worker_command)
    outcome = coordinator.run()
    for line in outcome.errors:
        echo(line, err=True)
    if outcome.interrupted:
        echo(outcome.interrupted, err=True)
        return outcome.exit_code
    if opts.as_json and outcome.payload is not None:
        echo(json.dumps(outcome.payload))
    elif outcome.payload is not None and outcome.payload.get("results") is not None:
        echo("--> Results:", err=True)
        for line in results_table(outcome.payload["results"]):
            echo(line)
        failed = outcome.payload["results"]["failed_hosts"]
        if failed:
            echo(f"--> Failed hosts ({len(failed)}): {', '.join(failed)}", err=True)
    elif outcome.payload is not None:
        echo("--> Detected changes (nothing was changed):", err=True)
        for line in plan_lines(outcome.payload["plan"]):
            echo(line)
    if outcome.exit_code == EXIT_FAILED and outcome.payload is None:
        echo("--> nothing was changed on any host", err=True)
    hosts = sum(len(s) for s in coordinator.progress.slices.values())
    cpu = [w.finished["cpu_s"] for w in coordinator.workers if w.finished and "cpu_s" in w.finished]
    balance = f", worker CPU {max(cpu):.1f} s at most, {sum(cpu):.1f} s in all" if cpu else ""
    echo(f"--> gpufleet apply: {hosts} host(s), {opts.jobs} worker(s), {time.monotonic() - start:.1f} s{balance}, "
         f"exit {outcome.exit_code}", err=True)
    return outcome.exit_code
