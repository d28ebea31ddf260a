"""The fleet runner of ``gpufleet verify INVENTORY [--limit ...] [--bench ...] [--out DIR]``.

1. The inventory is loaded with pyinfra's own loader (``pyinfra_cli.inventory.make_inventory``: the same inventory
   files, ``group_data/`` directories and ``ssh_*`` host data as ``pyinfra INVENTORY deploy.py``) into a pyinfra
   ``State``; ``--limit`` takes host names, group names or glob patterns, like pyinfra's.
2. Every host's ``gpufleet_*`` configuration is validated (the same :func:`gpufleet.config.validate_pyinfra_inventory`
   the converge deploy runs) and so are the ``gpufleet_verify_*`` keys (:data:`VERIFY_KEYS`) before any host is
   contacted. Hosts whose ``gpufleet_stages`` is empty (a monitoring host) are not GPU nodes and are left out.
3. All hosts in parallel on pyinfra's gevent pool: connect (an unreachable host becomes an ``unreachable`` result,
   the others go on); ONE remote command reads the NVIDIA PCI devices (the ``NvidiaPciDevices`` fact's command:
   NVSwitches, GPU count), compares the probe installed under ``/opt/gpufleet/probe/`` with the control machine's
   copy by SHA-256 and, when it matches, runs it with the node's ``python3``. Otherwise only the files that differ
   are uploaded and the probe is run in a second command. The probe bundle is ``gpufleet/probe/`` plus
   ``pynvml.py``, the single-file module of the control machine's nvidia-ml-py: the node needs Python 3.9+ and
   the NVIDIA driver, no pip, no internet. A probe that cannot run or prints no document is ``probe_failed``.
4. Checks against the expected state built from the host's NodeConfig (:mod:`gpufleet.verify.expected`), fleet
   outliers, every report written into ``--out`` (compared with the previous report there), and each node's own
   Prometheus textfile written, atomically, into its node_exporter textfile directory
   (``gpufleet_verify_textfile_dir``, default :data:`DEFAULT_TEXTFILE_DIR`).

Exit codes: 0 nothing failed (warnings allowed), 1 a check failed or a host was unreachable, 2 verify could not
run (bad inventory, bad configuration, no host reachable).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import gevent
from pyinfra.api import Config, State
from pyinfra.api.exceptions import ConnectError
from pyinfra.context import ctx_config, ctx_inventory, ctx_state

from gpufleet import _pyinfra, interruption
from gpufleet.config import ConfigErrors, NodeConfig, validate_pyinfra_inventory
from gpufleet.pyinfra_args import match_limit, split_limit, unmatched_error
from gpufleet.report import REPORT_FILES, render_prometheus, write_reports
from gpufleet.results import FleetResult, HostResult, exit_code
from gpufleet.slurm import bounded_runner

from . import EXIT_COULD_NOT_RUN, FAIL, UNREACHABLE, WARN
from .bundle import PROBE_REMOTE_DIR, BundleFile, ProbeBundle, VerifyError, nvml_module_path, probe_bundle
from .checks import build_fleet_result, evaluate_host, probe_failed_host, unreachable_host
from .expected import expected_state
from .exporter_checks import exporter_endpoints
from .remote import (
    PROBE_TIMEOUT_S,
    TEXTFILE_NAME,
    ProbeFailed,
    ScriptOutput,
    _disconnect,
    connector_kwargs,
    install_probe,
    parse_script_output,
    probe_command,
    probe_document,
    probe_script,
    run_probe,
    write_node_textfile,
)
from .settings import (
    BENCH_PROFILES,
    DEFAULT_OUT,
    DEFAULT_TEXTFILE_DIR,
    VERIFY_KEYS,
    VerifySettings,
    load_verify_settings,
    validate_verify_inventory,
)
from .slurm import SlurmVerify, parse_via
from .slurm import host_result as slurm_host_result

# ------------------------------------------------------------------------------------------ inventory


def _describe(exc: BaseException) -> str:
    """``SyntaxError: ... (in group_data/a100.py)`` for an exception raised by the user's inventory files."""
    inner = getattr(exc, "exception", None)  # pyinfra_cli's UnexpectedExternalError wraps the user's exception
    where = getattr(exc, "filename", None) if inner is not None else None
    error = inner if isinstance(inner, BaseException) else exc
    text = f"{type(error).__name__}: {error}".rstrip(": ")
    return f"{text} (in {where})" if where and str(where) not in text else text


def load_inventory(inventory_arg: str, limit: Iterable[str] | str | None = None, *, cwd: str | None = None,
                   override_data: Mapping[str, Any] | None = None) -> tuple[Any, list[Any]]:
    """(pyinfra State with the inventory, hosts to verify). Raises VerifyError (exit 2) on a bad inventory.
    ``override_data``: host data for every host, as pyinfra's ``--data`` and SSH options give it."""
    cwd = cwd or os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # as pyinfra's CLI: inventories and group_data may import modules beside them
    looks_like_file = inventory_arg.endswith(".py") or os.sep in inventory_arg
    if looks_like_file and not Path(inventory_arg).exists():
        raise VerifyError(f"inventory {inventory_arg}: no such file")
    state = State(check_for_changes=False)
    state.cwd = cwd
    config = Config()
    config_file = Path(cwd) / "config.py"  # pyinfra's optional config file (SUDO, PARALLEL, ...)
    try:
        inventory = _pyinfra.load_config_and_inventory(inventory_arg, cwd, dict(override_data or {}), config,
                                                       config_file if config_file.exists() else None)
    except Exception as exc:  # any error in the user's inventory or group_data files
        raise VerifyError(f"inventory {inventory_arg} could not be loaded: {_describe(exc)}") from None
    patterns = split_limit(limit)
    chosen = None
    if patterns:
        chosen, unmatched = match_limit(inventory, patterns)
        if unmatched:
            raise VerifyError(unmatched_error(unmatched, inventory_arg, inventory))
    state.init(inventory, config, initial_limit=chosen)
    hosts = [h for h in inventory if state.is_host_in_limit(h)]
    if not hosts:
        raise VerifyError(f"inventory {inventory_arg} has no hosts")
    return state, hosts


# ------------------------------------------------------------------------------------------ the run


@dataclass
class HostRun:
    """One host's part of the run."""

    name: str
    result: HostResult
    seconds: float = 0.0
    uploaded: list[str] = field(default_factory=list)
    textfile: str | None = None  # where the node's textfile was written
    textfile_error: str | None = None
    connected: bool = False


@dataclass
class VerifyRun:
    fleet: FleetResult
    hosts: list[HostRun]
    paths: dict[str, Path]
    skipped: dict[str, str]
    seconds: float

    @property
    def exit_code(self) -> int:
        return exit_code(self.fleet)


def verify_host(host: Any, config: NodeConfig, settings: VerifySettings, bundle: ProbeBundle, bench: str
                ) -> HostRun:
    """Connect, run the probe (installing it where needed) and evaluate the checks of one host. Never raises: an
    unreachable host or a failed probe is a result like any other."""
    start = time.monotonic()
    run = HostRun(name=host.name, result=unreachable_host(host.name, "not contacted"))
    try:
        _pyinfra.connect_bounded(host, show_errors=False, raise_exceptions=True)  # bounded: a dying host fails in ~30 s
    except ConnectError as exc:
        run.result = unreachable_host(host.name, str(exc.args[0] if exc.args else exc))
        run.seconds = time.monotonic() - start
        return run
    except Exception as exc:  # a connector failing in any other way is still "cannot reach"
        run.result = unreachable_host(host.name, f"{type(exc).__name__}: {exc}")
        run.seconds = time.monotonic() - start
        return run
    run.connected = True
    try:
        kwargs = connector_kwargs(host)
        probe, pci, run.uploaded = run_probe(host, bundle, python=settings.python, bench=bench, kwargs=kwargs,
                                             exporters=exporter_endpoints(config))
        run.result = evaluate_host(host.name, probe, expected_state(config, probe, pci=pci))
    except ProbeFailed as exc:
        run.result = probe_failed_host(host.name, str(exc))
    except (OSError, EOFError, TimeoutError) as exc:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            text = f"no answer within {PROBE_TIMEOUT_S[bench]} s"
        run.result = probe_failed_host(host.name, f"connection or command failed during the probe: {text}")
    except Exception as exc:  # one host's surprise must not stop the fleet's verify
        run.result = probe_failed_host(host.name, f"{type(exc).__name__}: {exc}")
    run.seconds = time.monotonic() - start
    return run


def _write_textfiles(state: Any, runs: list[HostRun], settings: Mapping[str, VerifySettings], fleet: FleetResult,
                     hosts: Mapping[str, Any]) -> None:
    data = fleet.to_dict()

    def one(run: HostRun) -> None:
        directory = settings[run.name].textfile_dir
        if directory is None:
            return
        try:
            host = hosts[run.name]
            write_node_textfile(host, render_prometheus(data, host=run.name), directory, connector_kwargs(host))
            run.textfile = f"{directory}/{TEXTFILE_NAME}"
        except Exception as exc:  # the report is written anyway; say what went wrong
            run.textfile_error = str(exc) or type(exc).__name__

    greenlets = [_pyinfra.host_pool(state).spawn(one, run) for run in runs if run.connected]
    gevent.joinall(greenlets)


def _write_textfiles_slurm(engine: SlurmVerify, runs: list[HostRun], settings: Mapping[str, VerifySettings],
                           fleet: FleetResult) -> None:
    """``--via slurm``: the node textfiles by a second Slurm job, on the nodes whose probe answered."""
    dirs = {r.name: settings[r.name].textfile_dir for r in runs
            if r.result.status != "unreachable" and settings[r.name].textfile_dir is not None}
    data = fleet.to_dict()
    errors = engine.write_textfiles({node: (directory, render_prometheus(data, host=node))
                                     for node, directory in dirs.items()})
    for run in runs:
        if run.name in dirs:
            if run.name in errors:
                run.textfile_error = errors[run.name]
            else:
                run.textfile = f"{dirs[run.name]}/{TEXTFILE_NAME}"


def _progress_line(run: HostRun, done: int, total: int) -> str:
    r = run.result
    width = len(str(total))
    head = f"[{done:>{width}}/{total}] {run.name}"
    if r.status == "unreachable":
        return f"{head}  UNREACHABLE  {r.error}"
    if r.status == "error":
        return f"{head}  PROBE FAILED  {r.error}"
    counts = Counter(c.verdict for c in r.checks)
    parts = [f"{len(r.gpus)} GPU(s)", f"{counts.get('pass', 0)} pass"]
    parts += [f"{counts[v]} {v}" for v in ("warn", "fail", "skip") if counts.get(v)]
    extra = f", probe updated ({len(run.uploaded)} file(s))" if run.uploaded else ""
    return f"{head}  {r.verdict.upper()}  {', '.join(parts)}, {run.seconds:.1f} s{extra}"


def run_verify(inventory_arg: str, *, limit: Iterable[str] | str | None = None, bench: str = "none",
               out: str | Path = DEFAULT_OUT, progress: TextIO | None = None, cwd: str | None = None,
               write_textfiles: bool = True, via: str = "ssh", override_data: Mapping[str, Any] | None = None,
               jobs: int = 1) -> VerifyRun:
    """The whole ``gpufleet verify``; raises VerifyError when it cannot run (exit 2). ``via``: ``ssh``, or
    ``slurm`` / ``slurm:PREFIX`` (:mod:`gpufleet.verify.slurm`: the probe as one Slurm job); ``override_data``: see
    :func:`load_inventory`; ``jobs`` > 1 (over SSH): the hosts spread over that many worker processes
    (:mod:`gpufleet.verify.workers`), the same report."""
    start = time.monotonic()
    if bench not in BENCH_PROFILES:
        raise VerifyError(f"--bench {bench}: allowed: {', '.join(BENCH_PROFILES)}")
    slurm_engine = _slurm_engine(via)
    progress = progress if progress is not None else sys.stderr
    state, hosts = load_inventory(inventory_arg, limit, cwd=cwd, override_data=override_data)
    sliced = None
    if jobs > 1 and slurm_engine is None:
        sliced = Sliced({"inventory": inventory_arg, "limit": split_limit(limit), "cwd": cwd or os.getcwd(),
                         "override_data": dict(override_data or {}), "bench": bench, "jobs": jobs})
    with ctx_state.use(state), ctx_config.use(state.config), ctx_inventory.use(state.inventory):
        return _run_verify(state, hosts, inventory_arg, limit=limit, bench=bench, out=out, progress=progress,
                           write_textfiles=write_textfiles, start=start, slurm_engine=slurm_engine, sliced=sliced)


class Sliced:
    """``gpufleet verify --jobs N`` over SSH: the hosts spread over N worker processes (``python -m
    gpufleet.verify.workers``), each connecting to and probing its slice of the hosts (an SSH connection and a
    host's checks cost the controller's CPU: ~90 ms a host on one core), their results merged into the one report.
    Each worker keeps its hosts' connections until the report is written, then writes their node textfiles
    (:meth:`finish`). A host whose worker ended without its result is a failed probe that says so."""

    WORKER_MODULE = "gpufleet.verify.workers"
    STOP_GRACE_S = 15

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.procs: list[subprocess.Popen] = []
        self.messages: Any = None
        self.ended: set[int] = set()  # workers whose output ended

    def verify(self, names: list[str], progress: TextIO) -> list[HostRun]:
        import queue
        import threading

        # a reader per worker: greenlets where the CLI patched the standard library for gevent, else threads
        self.messages = queue.Queue()
        progress.write(f"gpufleet verify: {len(names)} host(s), bench {self.job['bench']}, {self.job['jobs']} "
                       "worker(s)\n")
        progress.flush()
        runs: dict[str, HostRun] = {}
        verified: set[int] = set()
        try:
            for index in range(self.job["jobs"]):
                proc = subprocess.Popen([sys.executable, "-m", self.WORKER_MODULE, json.dumps({**self.job,
                                                                                          "index": index})],
                                        cwd=self.job["cwd"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self.procs.append(proc)
                threading.Thread(target=self._read, args=(index, proc), daemon=True).start()
            while len(verified | self.ended) < len(self.procs):
                index, message = self.messages.get()
                if message is None:
                    self.ended.add(index)
                elif message["type"] == "verified":
                    verified.add(index)
                elif message["type"] == "host":
                    run = HostRun(name=message["name"], result=HostResult.from_dict(message["result"]),
                                  seconds=message["seconds"], uploaded=message["uploaded"],
                                  connected=message["connected"])
                    runs[run.name] = run
                    progress.write(_progress_line(run, len(runs), len(names)) + "\n")
                    progress.flush()
        except KeyboardInterrupt as error:  # a signal: every worker stopped, the hosts without a result named
            error.in_flight = [n for n in names if n not in runs]
            self._stop(getattr(error, "signum", signal.SIGINT))
            raise
        for name in names:
            if name not in runs:
                runs[name] = HostRun(name=name, result=probe_failed_host(
                    name, "its verify worker ended without its result (its error is above)"))
        return [runs[name] for name in names]

    def finish(self, runs: list[HostRun], fleet: FleetResult | None) -> None:
        """The workers write their hosts' textfiles from the fleet's report (None: none), then end."""
        line = (json.dumps(fleet.to_dict()) + "\n").encode() if fleet is not None else b""
        for index, proc in enumerate(self.procs):
            with contextlib.suppress(OSError, ValueError):
                if index not in self.ended:
                    proc.stdin.write(line)
                proc.stdin.close()
        by_name = {run.name: run for run in runs}
        try:
            while len(self.ended) < len(self.procs):
                index, message = self.messages.get()
                if message is None:
                    self.ended.add(index)
                elif message["type"] == "textfile" and message["name"] in by_name:
                    by_name[message["name"]].textfile = message["textfile"]
                    by_name[message["name"]].textfile_error = message["error"]
        finally:
            self._stop(None)

    def _read(self, index: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.strip():
                self.messages.put((index, json.loads(line)))
        self.messages.put((index, None))

    def _stop(self, signum: int | None) -> None:
        """Every worker ended: passed ``signum`` (a terminal sent it to them already; a ``kill`` to this process
        did not), given :data:`STOP_GRACE_S`, killed after."""
        for proc in self.procs:
            if signum is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
        deadline = time.monotonic() + self.STOP_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _slurm_engine(via: str) -> SlurmVerify | None:
    """None for ``--via ssh``; the Slurm engine for ``slurm`` / ``slurm:PREFIX`` (VerifyError on a bad value)."""
    prefix = parse_via(via)
    return None if prefix is None else SlurmVerify(bounded_runner(prefix))


def _run_verify(state: Any, hosts: list[Any], inventory_arg: str, *, limit: Iterable[str] | str | None, bench: str,
                out: str | Path, progress: TextIO, write_textfiles: bool, start: float,
                slurm_engine: SlurmVerify | None = None, sliced: Sliced | None = None) -> VerifyRun:
    configs, settings, skipped, targets = _targets(state, hosts)
    bundle = probe_bundle()
    if sliced is not None:
        runs = sliced.verify([h.name for h in targets], progress)
    elif slurm_engine is None:
        runs = _verify_all(state, targets, configs, settings, bundle, bench, progress)
    else:
        runs = _verify_all_slurm(targets, configs, settings, bundle, bench, progress, slurm_engine)
    by_name = {run.name: run for run in runs}
    runs = [by_name[h.name] for h in targets]
    meta = fleet_meta("gpufleet verify", inventory_arg=inventory_arg, limit=split_limit(limit), skipped=skipped,
                      bundle=bundle, runs=runs, started=start)
    if slurm_engine is not None:
        meta["via"] = "slurm"
        meta["slurm_job"] = slurm_engine.job_name
    fleet = build_fleet_result([r.result for r in runs], bench_profile=bench, meta=meta)
    paths = write_reports(fleet, out)
    if sliced is not None:
        sliced.finish(runs, fleet if write_textfiles else None)
    elif write_textfiles and slurm_engine is None:
        _write_textfiles(state, runs, settings, fleet, {h.name: h for h in targets})
    elif write_textfiles:
        _write_textfiles_slurm(slurm_engine, runs, settings, fleet)
    for run in runs:
        if run.textfile_error:
            progress.write(f"warning: {run.name}: node textfile not written: {run.textfile_error}\n")
    for host in targets:
        _disconnect(host)
    progress.flush()
    return VerifyRun(fleet=fleet, hosts=runs, paths=paths, skipped=skipped, seconds=time.monotonic() - start)


def _targets(state: Any, hosts: list[Any]) -> tuple[dict, dict, dict[str, str], list[Any]]:
    """(configs, verify settings, {skipped host: why}, hosts to verify) of the validated inventory; VerifyError when
    it is invalid (no host contacted) or has no GPU node."""
    try:
        configs = validate_pyinfra_inventory(state.inventory)
        settings = validate_verify_inventory((h.name, h.data.dict()) for h in state.inventory)
    except ConfigErrors as error:
        raise VerifyError(f"invalid configuration, no host was contacted:\n{error}") from None
    skipped = {h.name: "no gpufleet stages (gpufleet_stages is empty): not a GPU node" for h in hosts
               if not configs[h.name].stages}
    targets = [h for h in hosts if h.name not in skipped]
    if not targets:
        raise VerifyError(f"no GPU node to verify among {', '.join(h.name for h in hosts)} (every host has an "
                          "empty gpufleet_stages)")
    return configs, settings, skipped, targets


def _verify_all(state: Any, hosts: list[Any], configs: Mapping[str, NodeConfig],
                settings: Mapping[str, VerifySettings], bundle: ProbeBundle, bench: str, progress: TextIO,
                done: Callable[[HostRun], None] | None = None) -> list[HostRun]:
    """Every host verified in parallel (greenlets); ``done``: called with each host's run as it ends (a worker of
    :mod:`gpufleet.verify.workers` sends it on)."""
    progress.write(f"gpufleet verify: {len(hosts)} host(s), bench {bench}\n")
    progress.flush()
    greenlets = {_pyinfra.host_pool(state).spawn(verify_host, h, configs[h.name], settings[h.name], bundle, bench): h
                 for h in hosts}
    runs = []
    try:
        for count, greenlet in enumerate(gevent.iwait(list(greenlets)), start=1):
            run = greenlet.get()
            runs.append(run)
            if done is not None:
                done(run)
            progress.write(_progress_line(run, count, len(hosts)) + "\n")
            progress.flush()
    except KeyboardInterrupt as error:  # a signal (gpufleet.interruption): no probe starts or goes on from here
        error.in_flight = [h.name for g, h in greenlets.items() if not g.ready()]
        _pyinfra.host_pool(state).kill(block=True, timeout=5)
        raise
    return runs


def _verify_all_slurm(hosts: list[Any], configs: Mapping[str, NodeConfig], settings: Mapping[str, VerifySettings],
                      bundle: ProbeBundle, bench: str, progress: TextIO, slurm: SlurmVerify) -> list[HostRun]:
    """``--via slurm``: the hosts' ``HostRun`` list, as :func:`_verify_all` returns it over SSH."""
    names = [h.name for h in hosts]
    progress.write(f"gpufleet verify: {len(names)} host(s), bench {bench}, via Slurm (job {slurm.job_name})\n")
    progress.flush()
    # the exporters' endpoints and credentials of each node, as verify_host gives them over SSH; a node whose endpoints
    # cannot be had (the credentials directory is not private) fails its probe with the reason, as over SSH
    endpoints: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for name in names:
        try:
            endpoints[name] = exporter_endpoints(configs[name])
        except Exception as exc:  # one host's surprise must not stop the fleet's verify
            refused[name] = f"{type(exc).__name__}: {exc}"
    job = [n for n in names if n not in refused]
    try:
        results = slurm.probe(job, bundle, {n: settings[n].python for n in job}, bench, exporters=endpoints) \
            if job else {}
    except KeyboardInterrupt as error:
        error.in_flight = job  # one job probes them all
        # its srun was ended here; through a prefix (ssh) the remote srun may not know yet: the job is cancelled
        # by its name (bounded by the runner's timeout), so that nothing of this verify goes on in the cluster
        with contextlib.suppress(Exception):
            slurm.cancel()
        raise
    runs = []
    for done, name in enumerate(names, start=1):
        if name in refused:
            run = HostRun(name=name, result=probe_failed_host(name, refused[name]))
        else:
            run = HostRun(name=name, result=slurm_host_result(results[name], configs[name]),
                          seconds=0.0 if results[name].unreachable and name not in slurm.states else slurm.job_seconds)
        runs.append(run)
        progress.write(_progress_line(run, done, len(names)) + "\n")
    progress.flush()
    return runs


def fleet_meta(entry: str, *, inventory_arg: str | None, limit: list[str], skipped: Mapping[str, str],
               bundle: ProbeBundle, runs: Iterable[HostRun], started: float) -> dict[str, Any]:
    """The report's ``meta``, the same keys from both entry points (``gpufleet verify``, pyinfra's)."""
    meta: dict[str, Any] = {
        "entry": entry, "inventory": inventory_arg, "limit": list(limit), "skipped_hosts": dict(skipped),
        "probe_bundle": {"files": {f.name: f.sha256 for f in bundle.files}, "nvidia_ml_py": bundle.nvml_py_version},
        "host_seconds": {r.name: round(r.seconds, 3) for r in runs}, "gpufleet_version": None,
    }
    try:
        meta["gpufleet_version"] = metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        pass
    meta["duration_s"] = round(time.monotonic() - started, 3)
    return meta


# ------------------------------------------------------------------------------------------ summary


def summary_text(run: VerifyRun, out: str | Path) -> str:
    """The short summary printed at the end: counts per verdict, each failure with host / GPU / hint, reports."""
    fleet = run.fleet
    s = fleet.summary()
    counts = s["checks"]
    lines = [f"gpufleet verify: {s['hosts']} host(s) ({s['hosts_ok']} verified, {s['hosts_unreachable']} unreachable, "
             f"{s['hosts_error']} probe failed), {s['gpus']} GPU(s), bench {fleet.bench_profile}, "
             f"{run.seconds:.1f} s",
             "checks: " + ", ".join(f"{counts[v]} {v}" for v in ("pass", "warn", "fail", "skip", "unreachable"))]
    if run.skipped:
        lines.append("not verified: " + "; ".join(f"{h} ({why})" for h, why in sorted(run.skipped.items())))
    problems = [c for c in fleet.checks if c.verdict in (FAIL, UNREACHABLE)]
    warnings = [c for c in fleet.checks if c.verdict == WARN]
    if problems:
        lines.append("failures:")
        for c in sorted(problems, key=lambda c: (c.host, -1 if c.gpu_index is None else c.gpu_index, c.check)):
            where = c.host + (f" gpu{c.gpu_index}" if c.gpu_index is not None else "")
            lines.append(f"  {where}  {c.check}: {c.message}")
            if c.remediation:
                lines.append(f"      -> {c.remediation}")
    if warnings:
        lines.append(f"warnings: {len(warnings)} (see the report)")
    if fleet.regressions:
        lines.append(f"regressions since the previous report: {len(fleet.regressions)} (see the report)")
    html = Path(run.paths.get("html", Path(out) / REPORT_FILES["html"])).resolve()
    lines.append(f"report: {html}")
    lines.append(f"        (also {', '.join(REPORT_FILES[k] for k in ('markdown', 'json', 'junit', 'prometheus'))} "
                 f"in {html.parent})")
    written = [r for r in run.hosts if r.textfile]
    if written:
        lines.append(f"node textfiles: {written[0].textfile} on {len(written)} host(s)")
    verdict = {0: "PASS", 1: "FAIL"}.get(run.exit_code, "COULD NOT RUN")
    lines.append(f"result: {verdict} (exit code {run.exit_code})")
    return "\n".join(lines)


def main(inventory_arg: str, *, limit: Iterable[str] | str | None = None, bench: str = "none",
         out: str | Path = DEFAULT_OUT, echo: Callable[[str], Any] = print, progress: TextIO | None = None,
         via: str = "ssh", override_data: Mapping[str, Any] | None = None, jobs: int = 1) -> int:
    """``gpufleet verify``: run, print the summary, return the exit code (0, 1 or 2)."""
    progress = progress if progress is not None else sys.stderr
    try:
        run = run_verify(inventory_arg, limit=limit, bench=bench, out=out, progress=progress, via=via,
                         override_data=override_data, jobs=jobs)
    except VerifyError as error:
        progress.write(f"gpufleet verify: {error}\n")
        progress.flush()
        return EXIT_COULD_NOT_RUN
    except KeyboardInterrupt as error:  # SIGINT, SIGTERM, SIGHUP (gpufleet.interruption.catch_signals)
        status = interruption.status_of(error)
        in_flight = getattr(error, "in_flight", None)
        with contextlib.suppress(OSError):  # a closed terminal (SIGHUP)
            progress.write(f"gpufleet verify: interrupted by {signal.Signals(status - 128).name} (exit {status}); "
                           + (f"probe not finished on: {', '.join(in_flight)}; " if in_flight else "")
                           + "no report was written; verify changes nothing: run it again\n")
            progress.flush()
        return status
    echo(summary_text(run, out))
    return run.exit_code


__all__ = [
    "BENCH_PROFILES", "DEFAULT_OUT", "DEFAULT_TEXTFILE_DIR", "PROBE_REMOTE_DIR", "PROBE_TIMEOUT_S", "TEXTFILE_NAME",
    "VERIFY_KEYS", "BundleFile", "HostRun", "ProbeBundle", "ProbeFailed", "ScriptOutput", "VerifyError", "VerifyRun",
    "VerifySettings", "connector_kwargs", "fleet_meta", "install_probe", "load_inventory", "load_verify_settings",
    "main", "match_limit", "nvml_module_path", "parse_script_output", "probe_bundle", "probe_command",
    "probe_document", "probe_script", "run_probe", "run_verify", "split_limit", "summary_text",
    "validate_verify_inventory", "verify_host", "write_node_textfile",
]
