"""``gpufleet rollout``: the controller. Validation and preflight of the whole fleet, then the canary and the
waves, each node through drain → converge → verify gate → return, the state file after every phase, a summary,
and the rollout report (JSON + JUnit).

Exit codes: 0 every node done (or already converged); 1 stopped by failures, or a node failed or was skipped
(jobs still running, ``--on-timeout skip``); 2 bad input or usage, or the plan not confirmed (nothing drained or
changed); 130 interrupted (the state file says where; ``--resume`` continues).

The caller that asks before any change (``gpufleet rollout`` without ``-y``) passes ``confirm`` to :func:`main`: the
rollout then always plans every host first (no single-wave shortcut), shows the plan, and goes on only when
``confirm`` says yes; library callers that pass none are not asked.
"""

from __future__ import annotations

import hashlib
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpufleet import interruption, pyinfra_args
from gpufleet._pyinfra import inprocess
from gpufleet.pyinfra_args import PyinfraArgs

from . import converge, report, waves
from .drain import Drainer, DrainError, make_drainer
from .state import (
    ACTIVE,
    CONVERGING,
    DONE,
    DRAINED,
    DRAINING,
    FAILED,
    PENDING,
    RETURNING,
    SKIPPED,
    VERIFYING,
    RolloutState,
    StateError,
)
from .state import load as load_state
from .state import save as save_state

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130  # interrupted: 128 + the signal
ASK_AGAIN_S = 15.0  # after an interruption: how long the rollout may ask the scheduler which nodes it drained
VERIFY_GATES = {"none": None, "quick": "none", "full": "quick"}  # gate -> verify's --bench profile
ON_TIMEOUT = ("fail", "skip", "force")
DEFAULT_DEPLOY = pyinfra_args.DEFAULT_DEPLOY
DEFAULT_OUT = "gpufleet-rollout"


class BadInput(Exception):
    pass


@dataclass
class RolloutOptions:
    inventory: str
    deploy: str = DEFAULT_DEPLOY
    canary: int = 1
    waves: str = "25%"
    max_unavailable: str | None = None
    max_failures: str = "0"
    verify: str = "quick"
    drain: str = "none"
    wait_for_jobs: float | None = None
    on_timeout: str = "fail"
    state: str | None = None
    resume: bool = False
    dry: bool = False
    out: str = DEFAULT_OUT
    poll_s: float = 2.0
    jobs: int = 1  # pyinfra worker processes for the pass and the waves (gpufleet.rollout.workers); 1: this one
    pyinfra: PyinfraArgs = field(default_factory=PyinfraArgs)  # --limit, --data, -v, SSH options

    def state_path(self) -> Path:
        return Path(self.state) if self.state else Path(self.out) / "state.json"

    def recorded(self) -> dict[str, Any]:
        """The options as the state file and reports keep them: a ``command:`` drain hook's command line (it may
        hold a token) only as its kind and a digest (``command:sha256=…``), which says whether it changed."""
        options = {**{k: getattr(self, k) for k in ("canary", "waves", "max_unavailable", "max_failures", "verify",
                                                    "drain", "wait_for_jobs", "on_timeout")},
                   "limit": self.pyinfra.patterns}
        if self.drain.startswith("command:"):
            options["drain"] = "command:sha256=" + hashlib.sha256(self.drain.encode()).hexdigest()[:16]
        return options


@dataclass
class Parsed:
    waves: list[waves.Count]
    max_failures: waves.Count
    max_unavailable: waves.Count | None


def parse_options(opts: RolloutOptions) -> Parsed:
    try:
        parsed = Parsed(waves=waves.parse_waves(opts.waves),
                        max_failures=waves.Count.parse(opts.max_failures, option="--max-failures"),
                        max_unavailable=None if opts.max_unavailable is None else
                        waves.Count.parse(opts.max_unavailable, option="--max-unavailable", allow_zero=False))
    except waves.BadCount as error:
        raise BadInput(str(error)) from None
    if opts.canary < 0:
        raise BadInput(f"--canary {opts.canary}: must be 0 or more hosts")
    if opts.verify not in VERIFY_GATES:
        raise BadInput(f"--verify {opts.verify}: allowed: {', '.join(VERIFY_GATES)}")
    if opts.on_timeout not in ON_TIMEOUT:
        raise BadInput(f"--on-timeout {opts.on_timeout}: allowed: {', '.join(ON_TIMEOUT)}")
    if opts.jobs < 1:
        raise BadInput(f"--jobs {opts.jobs}: must be 1 or more worker processes")
    if opts.wait_for_jobs is not None and opts.wait_for_jobs < 0:
        raise BadInput(f"--wait-for-jobs {opts.wait_for_jobs}: must be 0 seconds or more")
    problem = pyinfra_args.check_deploy(opts.deploy)
    if problem:
        raise BadInput(problem)
    return parsed


@dataclass
class Controller:
    opts: RolloutOptions
    parsed: Parsed
    state: RolloutState
    drainer: Drainer
    progress: TextIO
    engine: Any = None  # runs the passes and waves: inprocess.Session, or converge.Subprocess (the fallback)
    start: float = field(default_factory=time.monotonic)
    validating_wave: bool = False  # the next converge is also the whole-fleet validation (see single_wave)
    gated: bool = False  # a verify gate ran in this process (the rollout waited since its whole-fleet pass)

    # ---------------------------------------------------------------------------------------------- plumbing

    def say(self, text: str) -> None:
        _write(self.progress, f"[{time.monotonic() - self.start:7.1f}s] {text}\n")

    def save(self) -> None:
        save_state(self.state, self.opts.state_path())

    def node(self, name: str):
        return self.state.nodes[name]

    def fail(self, name: str, reason: str) -> None:
        rec = self.node(name)
        was = rec.state
        rec.move(FAILED, reason)
        if not rec.drained_by_rollout and self.opts.drain != "none" and was in (PENDING, DRAINING):
            # failed before its drain ran (or its drain failed): the documented "failed nodes stay drained" does
            # not hold for it, and the record and the summary say so
            rec.not_drained = f"failed while {was}, before this rollout drained it"
        if rec.drained_by_rollout:
            try:
                self.drainer.keep_drained(name, reason)
            except DrainError as error:
                self.say(f"warning: {name}: {error}")

    # ---------------------------------------------------------------------------------------------- phases

    def phase_drain(self, names: list[str]) -> list[str]:
        reason = f"gpufleet rollout {self.state.rollout_id}"
        for n in names:
            self.node(n).move(DRAINING)
        self.save()
        for n in names:
            rec = self.node(n)
            # Also a node recorded as drained by this rollout (before an interruption) is drained again: the drain is
            # idempotent (Slurm: only asked whether it is still ours), and a resume cut off by the interruption may
            # have been applied after the rollout asked (or someone resumed or re-drained the node meanwhile).
            interruption.check()  # nothing starts after a signal
            rec.drain_uncertain = True  # in flight: a signal now leaves it unknown until the drainer is asked again
            try:
                rec.drained_by_rollout = self.drainer.drain(n, reason)
            except DrainError as error:
                rec.drain_uncertain = False
                self.fail(n, f"drain: {error}")
            else:
                rec.drain_uncertain = False
        self.save()
        waiting = [n for n in names if self.node(n).state == DRAINING]
        deadline = time.monotonic() + (self.opts.wait_for_jobs or 0)
        while waiting:
            waiting = [n for n in waiting if not self.drainer.is_drained(n)]
            if not waiting or self.opts.wait_for_jobs is None or time.monotonic() >= deadline:
                break
            self.say(f"waiting for jobs on {len(waiting)} node(s): {', '.join(waiting[:8])}"
                     + (" ..." if len(waiting) > 8 else ""))
            time.sleep(self.opts.poll_s)
        for n in waiting:
            if self.opts.on_timeout == "force":
                continue
            why = ("jobs still running (not waited for: no --wait-for-jobs)" if self.opts.wait_for_jobs is None
                   else f"jobs still running after --wait-for-jobs {self.opts.wait_for_jobs:g} s")
            self._undrain(n)
            if self.opts.on_timeout == "skip":
                self.node(n).move(SKIPPED, why + " (left as it was)")
            else:
                self.fail(n, "drain: " + why)
        ready = []
        for n in names:
            if self.node(n).state == DRAINING:
                self.node(n).move(DRAINED)
                ready.append(n)
        self.save()
        return ready

    def _undrain(self, name: str) -> None:
        rec = self.node(name)
        if rec.drained_by_rollout:
            try:
                self.drainer.resume(name)
                rec.drained_by_rollout = False
            except DrainError as error:
                self.say(f"warning: {name}: {error}")

    def phase_converge(self, names: list[str]) -> list[str]:
        if not names:  # every host of the wave already failed or was skipped (pyinfra without --limit = everyone)
            return []
        for n in names:
            self.node(n).move(CONVERGING)
        self.save()
        # a kept plan (--drain none) is executed on its own reads while the waves follow one another at once, as
        # a pyinfra -y run's operations do; after a verify gate (a wait) the wave's hosts are read again first
        run = self.engine.run(names, plan=False, refresh=self.gated)
        if self.validating_wave:
            self.validating_wave = False
            if not run.executed():
                raise BadInput("validation / preflight failed, nothing was drained or changed:\n"
                               + run.error_text(40))
        outcomes = converge.host_outcomes(run, names)
        ok = []
        for n in names:
            o = outcomes[n]
            self.node(n).changed = o.changed if o.ok else None
            if o.ok:
                ok.append(n)
            else:
                self.fail(n, f"converge: {o.reason}")
        self.save()
        return ok

    def phase_verify(self, names: list[str], wave_index: int) -> tuple[list[str], str | None]:
        for n in names:
            self.node(n).move(VERIFYING)
        self.save()
        bench = VERIFY_GATES[self.opts.verify]
        if bench is None or not names:
            return names, None
        self.gated = True
        from gpufleet.verify import run as verify_run  # (only when a gate runs)

        out = Path(self.opts.out) / f"wave-{wave_index:03d}-verify"
        try:
            result = verify_run.run_verify(self.opts.inventory, limit=names, bench=bench, out=out,
                                           progress=self.progress, override_data=self.opts.pyinfra.override_data())
        except verify_run.VerifyError as error:
            if str(error).startswith("no GPU node to verify"):
                return names, None  # a wave of hosts without gpufleet stages (e.g. monitoring): nothing to gate
            for n in names:
                self.fail(n, f"verify could not run: {error}")
            self.save()
            return [], None
        verdicts = {h.host: h for h in result.fleet.hosts}
        wave = next((w for w in self.state.waves if w["index"] == wave_index), None)
        if wave is not None:  # the gate's verdicts in the rollout report, beside the path of the full report
            summary = result.fleet.summary()
            wave["verify_summary"] = {k: summary[k] for k in ("hosts", "hosts_ok", "hosts_unreachable", "hosts_failed",
                                                              "gpus", "checks", "verdict")}
        ok = []
        for n in names:
            host = verdicts.get(n)
            if host is None:
                ok.append(n)  # not a GPU node (verify skipped it: no gpufleet stages): nothing to gate
            elif host.verdict in ("fail", "unreachable"):
                bad = sorted({c.check for c in host.checks if c.verdict in ("fail", "unreachable")})
                self.fail(n, f"verify: {host.verdict.upper()} ({', '.join(bad)})")
            else:
                ok.append(n)
        self.save()
        return ok, str(result.paths.get("json", out / "report.json"))

    def phase_return(self, names: list[str]) -> None:
        for n in names:
            self.node(n).move(RETURNING)
        self.save()
        for n in names:
            rec = self.node(n)
            if rec.drained_by_rollout:
                try:
                    self.drainer.resume(n)
                    rec.drained_by_rollout = False
                except DrainError as error:
                    self.fail(n, f"return: {error}")
                    continue
            rec.move(DONE)
        self.save()

    def after_interruption(self, signum: int) -> None:
        """Record the interruption: the hosts it caught mid-change, and which nodes are drained by this rollout
        now. A signal from a terminal also reaches the drain or resume command in flight: whether Slurm applied it
        is asked again (bounded: :data:`ASK_AGAIN_S`); a drainer that cannot tell marks the node "may be
        drained". Nothing is drained, resumed or changed here."""
        active = self.state.by_state(*ACTIVE)
        self.state.interruption = {"signal": signal_name(signum), "at": round(time.time(), 3), "mid_change": active}
        if self.opts.drain == "none" or not active:
            return
        import gevent  # (the rollout runs under gevent; a blocked ask ends at the deadline)

        try:
            with gevent.Timeout(ASK_AGAIN_S):
                for n in active:
                    ours = self.drainer.drained_for_rollout(n)
                    if ours is not None:  # else the record stands (a drain cut off in flight: drain_uncertain)
                        self.node(n).drained_by_rollout, self.node(n).drain_uncertain = ours, False
        except gevent.Timeout:
            self.say(f"could not ask {self.drainer.name} within {ASK_AGAIN_S:g} s which nodes it drained")

    # ---------------------------------------------------------------------------------------------- waves

    def run_wave(self, index: int, kind: str, names: list[str]) -> None:
        wave: dict[str, Any] = {"index": index, "kind": kind, "hosts": list(names), "phases": {}, "verify_report": None}
        self.state.waves.append(wave)
        for n in names:
            self.node(n).wave = index
        self.say(f"wave {index} ({kind}): {len(names)} node(s): {', '.join(names[:10])}"
                 + (" ..." if len(names) > 10 else ""))
        current = names
        for phase in ("drain", "converge", "verify", "return"):
            interruption.check()  # nothing starts after a signal (also where a library swallowed its exception)
            t0 = time.monotonic()
            if phase == "drain":
                if self.opts.drain != "none":
                    self.say(f"wave {index}: draining {len(current)} node(s) ({self.opts.drain})")
                current = self.phase_drain(current)
            elif phase == "converge":
                self.say(f"wave {index}: converging {len(current)} node(s) with pyinfra")
                current = self.phase_converge(current)
            elif phase == "verify":
                if self.opts.verify != "none":
                    self.say(f"wave {index}: verify gate ({self.opts.verify}) on {len(current)} node(s)")
                current, wave["verify_report"] = self.phase_verify(current, index)
            else:
                self.phase_return(current)
            seconds = round(time.monotonic() - t0, 3)
            wave["phases"][phase] = seconds
            for n in names:
                self.node(n).phases[phase] = seconds
            self.save()
        failed = [n for n in names if self.node(n).state == FAILED]
        wave["failed"] = failed
        self.save()
        self.say(f"wave {index}: {len(names) - len(failed)} done, {len(failed)} failed"
                 + (f": {', '.join(failed)}" if failed else ""))

    def stop_reason(self, total: int) -> str | None:
        failed = self.state.by_state(FAILED)
        if self.state.options.get("canary_failed"):
            return f"the canary failed ({', '.join(failed)})"
        if failed and waves.too_many_failures(len(failed), total, self.parsed.max_failures):
            return (f"{len(failed)} node(s) failed ({', '.join(failed[:10])}), more than --max-failures "
                    f"{self.parsed.max_failures}")
        return None

    def loop(self, todo: list[str], canary: int) -> str:
        """Run the canary and the waves over ``todo`` (inventory order); returns the final status. Before each
        wave: stop when failures exceed the threshold; cut the wave to what --max-unavailable leaves (nodes that
        failed stay out of service and count)."""
        total = len(self.state.order)
        queue = list(todo)
        rest = len(queue) - min(canary, len(queue))
        nominal = ([("canary", min(canary, len(queue)))] if canary > 0 and queue else [])
        nominal += [("wave", s) for s in waves.wave_sizes(rest, self.parsed.waves)]
        index = len(self.state.waves)
        i = 0
        while queue:
            reason = self.stop_reason(total)
            if reason:
                self.say(f"stopping before the next wave: {reason}")
                return "stopped"
            kind, size = nominal[i] if i < len(nominal) else ("wave", nominal[-1][1])
            i += 1
            room = waves.capacity(self.parsed.max_unavailable, total, len(self.state.drained_now()))
            if room is not None:
                if room == 0:
                    self.say(f"stopping: {len(self.state.drained_now())} node(s) out of service (failed, left "
                             f"drained) reach --max-unavailable {self.parsed.max_unavailable}")
                    return "stopped"
                size = min(size, room)
            names, queue = queue[:size], queue[size:]
            index += 1
            interruption.check()
            self.run_wave(index, kind, names)
            if kind == "canary" and any(self.node(n).state == FAILED for n in names):
                self.state.options["canary_failed"] = True
                self.save()
        return "stopped" if self.stop_reason(total) else "finished"


def single_wave(opts: RolloutOptions, parsed: Parsed, todo: list[str], canary: int, *, asks: bool = False) -> bool:
    """Whether the rollout is one wave over every host still to do, without drain (and not ``--dry``): then that
    wave's own ``pyinfra -y`` is the whole-fleet validation and preflight (the deploy validates every host of the
    run and runs preflight while pyinfra prepares them, and raises before any change), and a separate pass
    would only connect and read the same facts twice. The price: no per-host plan first, so an already
    converged host is in the wave too (pyinfra changes nothing there; reported as already converged). A run that
    stops before executing anything is bad input (exit 2). Never when the rollout ``asks`` to confirm its plan.
    """
    if asks or opts.dry or opts.drain != "none" or canary > 0 or not todo:
        return False
    first = waves.wave_sizes(len(todo), parsed.waves)[0]
    room = waves.capacity(parsed.max_unavailable, len(todo), 0)
    return first >= len(todo) and (room is None or room >= len(todo))


def _preflight(engine, records: list[dict[str, Any]], hosts: list[str] | None, progress: TextIO,
               keep_plan: bool = False) -> dict[str, list[str]]:
    """Validation + preflight of every host still to do (``None``: every host of the inventory), before any
    drain or change: the deploy prepared as by ``pyinfra --dry`` (the deploy validates every host's configuration
    and runs preflight while pyinfra prepares the hosts, before any operation). Returns {host: [operations that
    would change it]}; raises BadInput on any problem. Its time is appended to ``records``. ``keep_plan``: the
    waves execute this plan instead of planning again (in-process, ``--drain none``: see
    :mod:`gpufleet._pyinfra.inprocess`)."""
    run = engine.run(hosts, plan=True, keep_plan=keep_plan)
    record = {"hosts": None if hosts is None else len(hosts), "seconds": round(run.seconds, 3)}
    if run.rc != 0 or run.payload is None:
        raise BadInput("validation / preflight failed, nothing was drained or changed:\n" + run.error_text(40))
    failed = set(run.payload.get("results") and run.payload["results"].get("failed_hosts") or [])
    if failed:
        raise BadInput(f"preflight could not reach {', '.join(sorted(failed))}; nothing was drained or changed")
    records.append(record)
    progress.write(f"preflight: {'every' if hosts is None else len(hosts)} host(s) valid, {run.seconds:.1f} s\n")
    return converge.planned_changes(run)


def open_engine(opts: RolloutOptions, progress: TextIO):
    """``--jobs N`` > 1: pyinfra in N worker processes (:mod:`gpufleet.rollout.workers`); else pyinfra in this
    process where :func:`inprocess.supported` says so (one start-up and one SSH connection per
    host for the whole rollout), else ``pyinfra --json`` as a subprocess per pass and wave. Raises BadInput when the
    inventory cannot be loaded."""
    if opts.jobs > 1 and (reason := inprocess.workers_supported()) is not None:
        progress.write(f"gpufleet rollout: --jobs {opts.jobs}: one process, pyinfra as a subprocess per pass and "
                       f"wave ({reason})\n")
        return converge.Subprocess(opts.inventory, opts.deploy, opts.pyinfra, progress)
    if opts.jobs > 1:  # the workers run the in-process engine each, on a slice of the hosts
        from . import workers

        try:
            return workers.Workers(opts.inventory, opts.deploy, opts.jobs, opts.pyinfra, err=progress)
        except workers.WorkersError as error:
            raise BadInput(str(error)) from None
    reason = inprocess.supported()
    if reason is not None:
        progress.write(f"gpufleet rollout: pyinfra runs as a subprocess per pass and wave ({reason})\n")
        return converge.Subprocess(opts.inventory, opts.deploy, opts.pyinfra, progress)
    try:
        return inprocess.Session(opts.inventory, opts.deploy, args=opts.pyinfra, log=progress)
    except inprocess.InventoryError as error:
        raise BadInput(str(error)) from None


def main(opts: RolloutOptions, *, progress: TextIO | None = None, echo=print, confirm=None) -> int:
    """The rollout; ``confirm(plan_text) -> bool``, where given, is asked before the first drain or change."""
    progress = progress if progress is not None else sys.stderr
    try:
        parsed = parse_options(opts)
        make_drainer(opts.drain, "check")  # the --drain spec, read before anything runs
    except (BadInput, DrainError) as error:
        progress.write(f"gpufleet rollout: {error}\n")
        return EXIT_BAD_INPUT
    path = opts.state_path()
    state = None
    if opts.resume:
        try:
            state = load_state(path)
        except StateError as error:
            progress.write(f"gpufleet rollout: --resume: {error}\n")
            return EXIT_BAD_INPUT
        if (state.inventory, state.deploy) != (opts.inventory, opts.deploy):
            progress.write(f"gpufleet rollout: --resume: {path} is the rollout of {state.inventory} with "
                           f"{state.deploy}, not {opts.inventory} with {opts.deploy}\n")
            return EXIT_BAD_INPUT
        recorded = state.options.get("limit") or []
        if opts.pyinfra.patterns and opts.pyinfra.patterns != recorded:
            progress.write(f"gpufleet rollout: --resume: {path} is the rollout of "
                           + (f"--limit {','.join(recorded)}" if recorded else "every host of the inventory")
                           + f", not --limit {','.join(opts.pyinfra.patterns)} (without --limit, --resume goes on "
                           "with its own hosts)\n")
            return EXIT_BAD_INPUT
    elif path.exists() and not opts.dry:
        progress.write(f"gpufleet rollout: {path} exists (an earlier rollout): --resume to continue it, or "
                       "remove it / give another --state to start a new one\n")
        return EXIT_BAD_INPUT
    try:
        engine = open_engine(opts, progress)
    except BadInput as error:
        progress.write(f"gpufleet rollout: {error}\n")
        return EXIT_BAD_INPUT
    try:
        return _rollout(opts, parsed, state, engine, progress, echo, confirm)
    finally:
        engine.close()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _write(stream: TextIO, text: str) -> None:
    """Write to the terminal, which a SIGHUP may have closed: what matters then is the state file."""
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        pass


def _echo(echo, text: str) -> None:
    try:
        echo(text)
    except OSError:
        pass


def _rollout(opts: RolloutOptions, parsed: Parsed, state: RolloutState | None, engine, progress: TextIO,
             echo, confirm=None) -> int:
    """The rollout of ``state`` (``--resume``) or of a new one (None), its pyinfra runs made by ``engine``."""
    path = opts.state_path()
    if state is None:
        order, error = engine.order()
        if error:
            progress.write(f"gpufleet rollout: {error}\n")
            return EXIT_BAD_INPUT
        if not order:
            progress.write(f"gpufleet rollout: {opts.inventory} has no host\n")
            return EXIT_BAD_INPUT
        state = RolloutState.new(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6],
                                 opts.inventory, opts.deploy, opts.recorded(), order)
    drainer = make_drainer(opts.drain, state.rollout_id)
    ctl = Controller(opts, parsed, state, drainer, progress, engine=engine)
    # Nodes caught mid-phase by an interruption start over (converging again is idempotent); their drain record
    # is kept, so they are resumed in the scheduler once they pass.
    for name in state.by_state(*ACTIVE):
        state.nodes[name].move(PENDING)
    if opts.resume:  # the user fixed what failed (or wants another try): failed and skipped nodes run again
        for name in state.by_state(FAILED, SKIPPED):
            state.nodes[name].retry()
            state.nodes[name].not_drained = None
        state.options.pop("canary_failed", None)
        state.interruption = None
    todo = state.by_state(PENDING)
    ctl.say(f"gpufleet rollout {state.rollout_id}: {len(state.order)} host(s), {len(todo)} to do"
            + (f", {len(state.by_state(DONE))} already done (not touched)" if opts.resume else ""))
    # The canary runs once: not again on --resume once its wave has finished.
    canary_done = any(w["kind"] == "canary" and all(state.nodes[n].state in (DONE, FAILED, SKIPPED)
                                                    for n in w["hosts"]) for w in state.waves)
    canary = 0 if canary_done else opts.canary
    ctl.validating_wave = single_wave(opts, parsed, todo, canary, asks=confirm is not None)
    try:
        if ctl.validating_wave:
            planned = None
            ctl.say("one wave over every host, no drain: its pyinfra run validates and preflights every host "
                    "before any change")
        else:
            # a new rollout: every host of the inventory (the same hosts as todo, without a --limit per host)
            every = not opts.resume and not opts.pyinfra.patterns
            planned = _preflight(engine, state.preflight, None if every else todo, progress,
                                 keep_plan=opts.drain == "none" and not opts.dry) if todo else {}
    except BadInput as error:
        progress.write(f"gpufleet rollout: {error}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as error:  # before any drain or change: nothing to resume but what was there
        status = interruption.status_of(error)
        _write(progress, "gpufleet rollout: interrupted during the whole-fleet validation and preflight: nothing was "
               f"drained or changed ({signal_name(status - 128)}, exit {status})"
               + (f"; {path} is as it was\n" if opts.resume else "\n"))
        return interruption.status_of(error)
    # A node an interruption left drained by this rollout (or maybe drained) goes through its wave again even when it
    # needs no change: its gate has not passed, and only its wave's return gives it back to the scheduler.
    unchanged = [n for n in todo if planned is not None and n not in planned
                 and not (state.nodes[n].drained_by_rollout or state.nodes[n].drain_uncertain)]
    need = [n for n in todo if n not in unchanged]
    if opts.dry:
        echo(report.dry_plan_text(state, need, unchanged, planned, canary, parsed.waves))
        return EXIT_DONE
    if confirm is not None and need:
        as_it_was = f"; {path} is as it was\n" if opts.resume else "\n"
        try:
            confirmed = confirm(report.dry_plan_text(state, need, unchanged, planned, canary, parsed.waves,
                                                     to_confirm=True))
        except KeyboardInterrupt as error:  # a signal at the prompt: nothing was drained or changed, nothing saved
            status = interruption.status_of(error)
            _write(progress, f"\ngpufleet rollout: interrupted at the confirmation by {signal_name(status - 128)}: "
                   f"nothing was drained or changed (exit {status})" + as_it_was)
            return status
        if not confirmed:
            progress.write("gpufleet rollout: not confirmed: nothing was drained or changed" + as_it_was)
            return EXIT_BAD_INPUT
    for n in unchanged:
        state.nodes[n].changed = False
        state.nodes[n].move(DONE)
    state.status = "running"
    ctl.save()
    if unchanged:
        ctl.say(f"{len(unchanged)} host(s) already converged (no change planned, not drained): "
                + ", ".join(unchanged[:10]) + (" ..." if len(unchanged) > 10 else ""))
    try:
        state.status = ctl.loop(need, canary)
    except BadInput as error:  # the single wave's run stopped before executing anything: nothing was changed
        progress.write(f"gpufleet rollout: {error}\n")
        for name in state.waves.pop()["hosts"]:
            if state.nodes[name].state in ACTIVE:
                state.nodes[name].move(PENDING)
                state.nodes[name].wave = None
        if opts.resume:
            ctl.save()
        else:  # nothing happened: no state file to --resume, the corrected command starts afresh
            path.unlink(missing_ok=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as error:
        status = interruption.status_of(error)
        state.status = "interrupted"
        ctl.save()  # first: whatever follows, the state file says where the rollout stopped
        # which hosts the wave's pyinfra run had mid-change: stopped in this process, or its own report as a child
        stopped_run = engine.interruption or getattr(error, "child_report", None)
        if stopped_run:
            _write(progress, stopped_run + "\n")
        ctl.after_interruption(status - 128)
        ctl.save()
        report.write(state, opts)
        _echo(echo, report.summary_text(state, opts))
        return status
    try:
        ctl.save()
        report.write(state, opts)
        echo(report.summary_text(state, opts))
    except KeyboardInterrupt as error:  # after the last wave: the signal cut the last save, report or summary short
        status = interruption.status_of(error)
        ctl.save()  # later signals are only counted: these end
        report.write(state, opts)
        _write(progress, f"\ngpufleet rollout: interrupted by {signal_name(status - 128)} after the last wave, while "
               f"saving or printing: the rollout is {state.status.upper()} (state: {path}, report: "
               f"{Path(opts.out) / 'rollout.html'}; exit {status})\n")
        return status
    if state.status == "stopped" or state.by_state(FAILED, SKIPPED):
        return EXIT_FAILED
    return EXIT_DONE


__all__ = ["EXIT_BAD_INPUT", "EXIT_DONE", "EXIT_FAILED", "EXIT_INTERRUPTED", "RolloutOptions", "main",
           "parse_options"]
