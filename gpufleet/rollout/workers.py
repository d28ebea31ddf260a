"""``gpufleet rollout --jobs N``: the rollout's pyinfra runs (the whole-fleet pass, each wave) spread over N worker
processes, as ``gpufleet apply`` spreads its deploy (:class:`gpufleet.apply.Pool`: the same workers, slices and
plumbing). The state file, the drains, the verify gates and the summary stay in the rollout's process; this engine
has the interface of the in-process one (:class:`gpufleet._pyinfra.inprocess.Session`: ``order``, ``run``,
``close``, ``interruption``), so the controller is the same code with 1 or N workers.

Each worker keeps a Session over its slice for the whole rollout (one inventory load, one SSH connection per host,
the pass's plan kept with ``--drain none``), and runs what it is told, one run at a time
(:func:`gpufleet._pyinfra.workers._serve`). A run over some hosts goes to the workers whose slices hold them; their
answers (pyinfra's ``--json`` document and log) are merged into the one document one process would have given.

**Barrier per wave.** A wave that executes a plan made in the pass (``--drain none``) was validated and preflighted
on every host there. A wave that plans when it runs (after its drain; or the single wave that is its own
validation) is first prepared in every worker it touches (validation, preflight; as ``pyinfra -y`` prepares), and
only when every one of them prepared without error are they told to execute: a bad setting on one host of the wave
leaves every host of the wave untouched, as in one process.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Sequence
from typing import TextIO

from gpufleet import apply
from gpufleet.pyinfra_args import PyinfraArgs

from .converge import PyinfraRun


class WorkersError(Exception):
    """The workers could not load the inventory (or ``--limit``), or did not start."""


class Workers(apply.Pool):
    name = "workers"
    mode = "session"

    def __init__(self, inventory: str, deploy: str, jobs: int, args: PyinfraArgs | None = None, *,
                 err: TextIO, worker_command: Sequence[str] | None = None) -> None:
        opts = apply.ApplyOptions(inventory=inventory, deploy=deploy, jobs=jobs, yes=True,
                                  pyinfra=args or PyinfraArgs())
        super().__init__(opts, err=err, worker_command=worker_command)
        self.view.live = False  # the rollout's progress lines are the view
        self.interruption: str | None = None
        self.kept = False  # the pass's plan is kept: the waves execute it
        self.hosts: list[str] = []
        try:
            self._start()
            self._wait(lambda w: any(m["type"] == "slice" for m in w.messages) or w.finished is not None)
        except KeyboardInterrupt as error:
            self._stopped(error)
            self._reap()
            raise
        problems = sorted({m.get("message") or f"worker {w.index} ended without its slice (its error is above)"
                           for w in self.workers if (m := w.finished) is not None})
        problems += [p for p in [self._check_slices()] if p]
        if problems:
            self._reap()
            raise WorkersError("\n".join(problems))
        self.hosts = next(m["order"] for w in self.workers for m in w.messages
                          if m["type"] == "slice" and m.get("order") is not None)

    def order(self) -> tuple[list[str], str | None]:
        return list(self.hosts), None

    def run(self, hosts: list[str] | None, *, plan: bool, keep_plan: bool = False, refresh: bool = True
            ) -> PyinfraRun:
        """As :meth:`gpufleet._pyinfra.inprocess.Session.run`, over the workers holding ``hosts``."""
        start = time.monotonic()
        wanted = set(self.hosts if hosts is None else hosts)
        parts = {w: [h for h in self.progress.slices[w.index] if h in wanted] for w in self.workers}
        parts = {w: part for w, part in parts.items() if part}
        try:
            if plan:
                answers = self._ask(parts, plan=True, keep_plan=keep_plan, yes=False)
                self.kept = keep_plan
                return self._merged(answers, parts, start, plan=True)
            if self.kept:
                return self._merged(self._ask(parts, plan=False, refresh=refresh), parts, start)
            prepared = self._ask(parts, plan=True, keep_plan=True, yes=True)
            bad = [w for w, a in prepared.items() if a["payload"] is None and not a["unreachable"]]
            if bad:  # the barrier: no worker executes
                self._ask({w: [] for w, a in prepared.items() if a["payload"] is not None}, do="drop")
                log = "".join(prepared[w]["stderr"] for w in bad)
                return PyinfraRun(rc=1, payload=None, stderr=log, seconds=time.monotonic() - start)
            ready = {w: part for w, part in parts.items() if not prepared[w]["unreachable"]}
            done = self._ask(ready, plan=False, refresh=False)
            # one log per worker, preparation then execution, as one run's: a host that could not be connected to
            # while preparing has its reason there
            done = {w: {**a, "stderr": prepared[w]["stderr"] + a["stderr"]} for w, a in done.items()}
            unreachable = {w: prepared[w] for w in parts if w not in ready}
            return self._merged({**unreachable, **done}, parts, start)
        except KeyboardInterrupt as error:
            self._stopped(error)
            raise

    def close(self) -> None:
        self._reap()

    # ------------------------------------------------------------------------------------------------ internals

    def _ask(self, parts: dict[apply.Worker, list[str]], *, do: str = "run", plan: bool = False,
             keep_plan: bool = False, yes: bool = True, refresh: bool = False) -> dict[apply.Worker, dict]:
        """Each worker of ``parts`` told to run over its hosts; their answers (a worker that ended: a failed run)."""
        for worker in self.workers:
            worker.went = False  # told to execute: in this run (the interruption's report reads it)
        for worker, part in parts.items():
            worker.answer = None
            worker.went = do == "run" and not plan
            if worker.finished is None:
                worker.order(json.dumps({"do": do, "hosts": part, "plan": plan, "keep_plan": keep_plan, "yes": yes,
                                         "refresh": refresh}))
        self._wait(lambda w: w not in parts or w.answer is not None or w.finished is not None)
        answers = {}
        for worker, part in parts.items():
            answers[worker] = worker.answer or {
                "rc": 1, "payload": None, "unreachable": True, "absent": part,
                "stderr": "".join(f"[{h}] Error: worker {worker.index} ended without its results (exit "
                                  f"{worker.process.poll()}; its error is above)\n" for h in part)}
        return answers

    def _merged(self, answers: dict[apply.Worker, dict], parts: dict, start: float, *, plan: bool = False
                ) -> PyinfraRun:
        """The workers' answers as the one run one process would have made."""
        log = "".join(a["stderr"] for a in answers.values())
        rc = max((a["rc"] for a in answers.values()), default=0)
        lost = [h for w, a in answers.items() for h in (parts[w] if a["unreachable"] else a.get("absent") or [])]
        payloads = [a["payload"] for a in answers.values() if not a["unreachable"]]
        if plan:
            if any(p is None for p in payloads) or not payloads:
                return PyinfraRun(rc=rc or 1, payload=None, stderr=log, seconds=time.monotonic() - start)
            return PyinfraRun(rc=max(rc, 1 if lost else 0), stderr=log, seconds=time.monotonic() - start,
                              payload={"plan": apply.merge_plan([p["plan"] for p in payloads]), "results": None})
        results = apply.merge_results([p["results"] for p in payloads if p], failed_elsewhere=lost)
        return PyinfraRun(rc=1 if results["failed_hosts"] else 0, payload={"plan": [], "results": results},
                          stderr=log, seconds=time.monotonic() - start)

    def _stopped(self, error: BaseException) -> None:
        """Interrupted: every worker stopped, the hosts they had mid-change named (:attr:`interruption`)."""
        _, self.interruption = self._stop_report(getattr(error, "signum", signal.SIGINT))
