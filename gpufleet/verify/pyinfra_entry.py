"""The pyinfra entry of verify: ``pyinfra -y INVENTORY verify/gpu_node.py`` (see that file).

The same settings, probe bundle, remote command, checks and report as ``gpufleet verify``
(:mod:`gpufleet.verify.run`), run as pyinfra operations; pyinfra's CLI has already patched the standard library for
gevent.
"""

from __future__ import annotations

import os
import time
import weakref
from pathlib import Path
from typing import Any

from gpufleet import _pyinfra
from gpufleet.config import ConfigErrors, validate_pyinfra_inventory
from gpufleet.report import render_prometheus, write_reports
from gpufleet.results import FleetResult

from . import FAIL, UNREACHABLE
from .bundle import probe_bundle
from .checks import build_fleet_result, evaluate_host, probe_failed_host, unreachable_host
from .expected import expected_state
from .exporter_checks import exporter_endpoints
from .remote import ProbeFailed, connector_kwargs, run_probe, write_node_textfile
from .run import HostRun, VerifyRun, fleet_meta, summary_text
from .settings import VerifySettings, validate_verify_inventory


class DeployVerify:
    """The state of ``pyinfra INVENTORY verify/gpu_node.py`` (one per pyinfra State, see :func:`deploy_verify`).

    The deploy file installs the probe with ``files.put`` (pyinfra compares checksums) and adds two ``python.call``
    operations per GPU node: :meth:`probe_host` (probe, checks; the host whose probe finishes LAST — every other
    active GPU node has a result — builds the fleet result and writes the reports, adding the hosts pyinfra could
    not connect to as unreachable and those that failed an earlier operation as probe failed), then
    :meth:`textfile_host` (the node's textfile; the operation fails for a host whose verify failed, so pyinfra's
    exit code says it too).
    """

    def __init__(self, state: Any, inventory: Any):
        from gpufleet.config import InputError  # pyinfra-entry only

        try:
            self.configs = validate_pyinfra_inventory(inventory)
            self.settings = validate_verify_inventory((h.name, h.data.dict()) for h in inventory)
        except ConfigErrors as error:
            raise InputError(f"invalid configuration, no host was changed:\n{error}") from None
        hosts = [h for h in inventory if state.is_host_in_limit(h)]
        for key, attr in (("gpufleet_verify_out", "out"), ("gpufleet_verify_bench", "bench")):
            values = {getattr(self.settings[h.name], attr) for h in hosts}
            if len(values) > 1:
                shown = ", ".join(f"{h.name}={getattr(self.settings[h.name], attr)!r}" for h in hosts)
                raise InputError(f"{key} differs between hosts ({shown}); allowed: one value for the whole run")
        first = self.settings[hosts[0].name] if hosts else VerifySettings()
        self.out = Path(first.out) if os.path.isabs(first.out) else Path(state.cwd or os.getcwd()) / first.out
        self.bench = first.bench
        self.bundle = probe_bundle()
        self.runs: dict[str, HostRun] = {}
        self.fleet: FleetResult | None = None
        self.paths: dict[str, Path] = {}
        self.started = time.monotonic()

    def is_gpu_node(self, name: str) -> bool:
        return bool(self.configs[name].stages)

    def probe_host(self, state: Any, host: Any) -> bool:
        start = time.monotonic()
        run = HostRun(name=host.name, result=unreachable_host(host.name, "not probed"), connected=True)
        settings = self.settings[host.name]
        try:
            probe, pci, _ = run_probe(host, self.bundle, python=settings.python, bench=self.bench,
                                      kwargs=connector_kwargs(host), check_bundle=False,
                                      exporters=exporter_endpoints(self.configs[host.name]))
            run.result = evaluate_host(host.name, probe, expected_state(self.configs[host.name], probe, pci=pci))
        except ProbeFailed as exc:
            run.result = probe_failed_host(host.name, str(exc))
        except Exception as exc:  # recorded in the report; the other hosts go on
            run.result = probe_failed_host(host.name, f"{type(exc).__name__}: {exc}")
        run.seconds = time.monotonic() - start
        self.runs[host.name] = run
        pending = {h.name for h in _pyinfra.running_hosts(state) if self.is_gpu_node(h.name)} - set(self.runs)
        if not pending and self.fleet is None:
            self.finish(state)
        return True

    def finish(self, state: Any) -> None:
        from pyinfra import logger

        results = []
        for h in state.inventory:
            if not state.is_host_in_limit(h) or not self.is_gpu_node(h.name):
                continue
            if h.name in self.runs:
                results.append(self.runs[h.name].result)
            elif h not in _pyinfra.connected_hosts(state):
                results.append(unreachable_host(h.name, "pyinfra could not connect (see its output above)"))
            else:
                results.append(probe_failed_host(h.name, "an earlier operation failed on this host (installing "
                                                         "the probe; see pyinfra's output above)"))
        in_limit = [h.name for h in state.inventory if state.is_host_in_limit(h)]
        limit = in_limit if len(in_limit) < len(state.inventory) else []  # --limit, as host names
        skipped = {h.name: "no gpufleet stages (gpufleet_stages is empty): not a GPU node" for h in state.inventory
                   if state.is_host_in_limit(h) and not self.is_gpu_node(h.name)}
        meta = fleet_meta("pyinfra verify/gpu_node.py", inventory_arg=None, limit=limit, skipped=skipped,
                          bundle=self.bundle, runs=self.runs.values(), started=self.started)
        self.fleet = build_fleet_result(results, bench_profile=self.bench, meta=meta)
        self.paths = write_reports(self.fleet, self.out)
        run = VerifyRun(fleet=self.fleet, hosts=list(self.runs.values()), paths=self.paths, skipped={},
                        seconds=time.monotonic() - self.started)
        for line in summary_text(run, self.out).splitlines():
            logger.info(line)

    def textfile_host(self, state: Any, host: Any) -> bool:
        from pyinfra import logger

        if self.fleet is None:
            host.log_styled("gpufleet verify: no fleet result (the probe operation did not finish)", fg="red",
                            log_func=logger.error)
            return False
        result = next((h for h in self.fleet.hosts if h.host == host.name), None)
        directory = self.settings[host.name].textfile_dir
        if directory is not None:
            try:
                write_node_textfile(host, render_prometheus(self.fleet.to_dict(), host=host.name), directory,
                                    connector_kwargs(host))
            except Exception as exc:
                host.log_styled(f"gpufleet verify: node textfile not written: {exc}", fg="yellow",
                                log_func=logger.warning)
        if result is None or result.verdict in (FAIL, UNREACHABLE):
            failed = [c for c in (result.checks if result else []) if c.verdict in (FAIL, UNREACHABLE)]
            shown = "; ".join(f"{c.check}" + (f" gpu{c.gpu_index}" if c.gpu_index is not None else "")
                              for c in failed[:6]) + (" ..." if len(failed) > 6 else "")
            host.log_styled(f"gpufleet verify failed: {len(failed)} check(s): {shown}", fg="red",
                            log_func=logger.error)
            return False
        return True


_runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pyinfra State -> its DeployVerify


def deploy_verify(state: Any, inventory: Any) -> DeployVerify:
    """The run's :class:`DeployVerify`, created (and every host validated) when the first host is prepared."""
    found = _runs.get(state)
    if found is None:
        _pyinfra.bound_ssh(state)  # bounded waits: a host dying during the probe fails within ~30 s
        found = _runs[state] = DeployVerify(state, inventory)
    return found
