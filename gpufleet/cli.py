"""The ``gpufleet`` command."""

from __future__ import annotations

import sys

import click

from .sim.cli import sim


@click.group()
@click.version_option(package_name="gpufleet")
def main() -> None:
    """gpufleet: make NVIDIA GPU nodes right, keep them right, and prove it."""


main.add_command(sim)


def _patch_for_gevent() -> None:
    """Patch the standard library for gevent before pyinfra (and paramiko, whose transport is a thread) is imported,
    as pyinfra's own CLI does. Only ``gpufleet verify`` and ``gpufleet rollout`` call it: an import never patches
    anything."""
    from gevent import monkey  # noqa: PLC0415

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()


@main.command()
@click.argument("inventory")
@click.option("--limit", multiple=True, metavar="NAME,...",
              help="only these hosts: host names, group names or glob patterns, comma-separated (repeatable)")
@click.option("--bench", type=click.Choice(["none", "quick", "full"]), default="none", show_default=True,
              help="benchmarks to run on each node after the probe (quick: <= 60 s per node on a real GPU)")
@click.option("--out", type=click.Path(file_okay=False), default="gpufleet-verify", show_default=True,
              help="directory for report.html/.md/.json, junit.xml and the Prometheus textfiles")
@click.option("--via", default="ssh", show_default=True, metavar="ssh|slurm|slurm:PREFIX",
              help="how the probe reaches the nodes: SSH from here, or one Slurm job (srun) run here or through "
                   "PREFIX (e.g. slurm:ssh root@slurm-ctl)")
def verify(inventory: str, limit: tuple[str, ...], bench: str, out: str, via: str) -> None:
    """Probe every GPU node of INVENTORY (a pyinfra inventory) in parallel, check it against its configuration and
    write the fleet report.

    Exit code: 0 nothing failed, 1 a check failed or a host was unreachable, 2 verify could not run (bad inventory
    or configuration, no host reachable).
    """
    _patch_for_gevent()
    from . import interruption  # noqa: PLC0415
    from .verify import run  # noqa: PLC0415

    interruption.catch_signals()  # SIGINT/SIGTERM/SIGHUP: exit 130/143/129 naming the hosts not finished
    sys.exit(run.main(inventory, limit=list(limit), bench=bench, out=out, echo=click.echo, via=via))


@main.command()
@click.argument("inventory")
@click.argument("deploy", required=False, default="deploys/gpu_node.py")
@click.option("--canary", type=int, default=1, show_default=True, help="hosts in the first wave (0: no canary)")
@click.option("--waves", default=None, metavar="N,N,P%",
              help="sizes of the waves after the canary, the last repeated (default 25%)")
@click.option("--batch", default=None, metavar="N|P%", help="one size for every wave (same as --waves N)")
@click.option("--max-unavailable", default=None, metavar="K|P%",
              help="at most this many hosts out of service at once (failed hosts left drained count)")
@click.option("--max-failures", default="0", show_default=True, metavar="K|P%",
              help="stop before the next wave when more hosts than this have failed")
@click.option("--verify", "verify_gate", type=click.Choice(["none", "quick", "full"]), default="quick",
              show_default=True, help="gate after each wave: quick = probe and checks, full = with quick benchmarks")
@click.option("--drain", default="none", show_default=True, metavar="none|slurm|command:CMD",
              help="take each wave's hosts out of service first (command: CMD drain|drained|resume NODE)")
@click.option("--wait-for-jobs", type=float, default=None, metavar="SECONDS",
              help="wait this long for running jobs to finish after the drain")
@click.option("--on-timeout", type=click.Choice(["fail", "skip", "force"]), default="fail", show_default=True,
              help="jobs still running after --wait-for-jobs: fail the host, skip it, or change it anyway")
@click.option("--state", "state_file", default=None, type=click.Path(dir_okay=False),
              help="state file (default OUT/state.json)")
@click.option("--resume", is_flag=True, help="continue the rollout of the state file (done hosts are not touched)")
@click.option("--dry", is_flag=True, help="validate, preflight and print the waves; drain and change nothing")
@click.option("--out", type=click.Path(file_okay=False), default="gpufleet-rollout", show_default=True,
              help="directory for rollout.json, rollout-junit.xml, the state file and each wave's verify report")
def rollout(inventory: str, deploy: str, canary: int, waves: str | None, batch: str | None,
            max_unavailable: str | None, max_failures: str, verify_gate: str, drain: str,
            wait_for_jobs: float | None, on_timeout: str, state_file: str | None, resume: bool, dry: bool,
            out: str) -> None:
    """Roll DEPLOY (default deploys/gpu_node.py) out over INVENTORY: validation and preflight of every host,
    then the canary and the waves in inventory order, each host drained, converged, verified and returned.

    Exit code: 0 every host done, 1 stopped by failures or a host failed, 2 bad input or usage (nothing drained
    or changed), 130 interrupted (continue with --resume).
    """
    if waves and batch:
        raise click.UsageError("--waves and --batch: give one of them")
    # Ctrl-C (SIGINT, also to the whole process group as a terminal sends it), SIGTERM and SIGHUP stop a rollout
    # (state saved, exit 130/143/129, --resume goes on), even where the caller started it with SIGINT ignored, as a
    # shell does for a background job of a script or CI job.
    from . import interruption  # noqa: PLC0415

    interruption.catch_signals()
    # Patched for gevent: the rollout runs pyinfra in this process (gpufleet.rollout.inprocess), and the verify gate
    # probes a wave's hosts in parallel. gevent's loop checks for signals while it waits, so Ctrl-C still raises
    # KeyboardInterrupt at once while the rollout waits on a drain hook, a host or a subprocess.
    _patch_for_gevent()
    from .rollout import run  # noqa: PLC0415

    opts = run.RolloutOptions(inventory=inventory, deploy=deploy, canary=canary, waves=waves or batch or "25%",
                              max_unavailable=max_unavailable, max_failures=max_failures, verify=verify_gate,
                              drain=drain, wait_for_jobs=wait_for_jobs, on_timeout=on_timeout, state=state_file,
                              resume=resume, dry=dry, out=out)
    sys.exit(run.main(opts, echo=click.echo))


@main.command()
@click.argument("inventory")
@click.argument("deploy", required=False, default="deploys/gpu_node.py")
@click.option("--json", "as_json", is_flag=True, help="print the drift as JSON")
def drift(inventory: str, deploy: str, as_json: bool) -> None:
    """What DEPLOY (default deploys/gpu_node.py) would change on every host of INVENTORY, per setting and host:
    the deploy run with pyinfra --dry (same validation, preflight, facts and operations; nothing is changed).

    Exit code: 0 no drift, 1 drift, 2 could not tell (bad input, a host unreachable).
    """
    from . import interruption  # noqa: PLC0415
    from .drift import main as drift_main  # noqa: PLC0415

    interruption.catch_signals()  # SIGINT/SIGTERM/SIGHUP: exit 130/143/129, nothing was changed
    sys.exit(drift_main(inventory, deploy, as_json=as_json, echo=click.echo))
