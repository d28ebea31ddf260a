"""The ``gpufleet`` command (also ``python -m gpufleet``).

Its commands take pyinfra's host selection and connection options with pyinfra's meaning
(:mod:`gpufleet.pyinfra_args`), ``-h`` as well as ``--help``, and say their exit codes in their help.
"""

from __future__ import annotations

import os
import sys

import click

from .pyinfra_args import DEFAULT_DEPLOY, PyinfraArgs, pyinfra_options
from .sim.cli import sim

CONTEXT_SETTINGS = dict(help_option_names=["-h", "--help"])  # as pyinfra's CLI; inherited by every subcommand


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="gpufleet")
def main() -> None:
    """gpufleet: make NVIDIA GPU nodes right, keep them right, and prove it.

    Converge with pyinfra (pyinfra INVENTORY gpufleet.deploys.gpu_node.gpu_node), then verify, roll out and
    watch drift with the commands below. Exit code: each command's own (see COMMAND -h); 2 bad usage.
    """


main.add_command(sim)


def _patch_for_gevent() -> None:
    """Patch the standard library for gevent before pyinfra (and paramiko, whose transport is a thread) is imported,
    as pyinfra's own CLI does. Only ``gpufleet verify`` and ``gpufleet rollout`` call it: an import never patches
    anything."""
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()


@main.command()
@click.argument("inventory")
@pyinfra_options(verbose=False)
@click.option("--bench", type=click.Choice(["none", "quick", "full"]), default="none", show_default=True,
              help="benchmarks to run on each node after the probe (quick: <= 60 s per node on a real GPU)")
@click.option("--out", type=click.Path(file_okay=False), default="gpufleet-verify", show_default=True,
              help="directory for report.html/.md/.json, junit.xml and the Prometheus textfiles")
@click.option("--via", default="ssh", show_default=True, metavar="ssh|slurm|slurm:PREFIX",
              help="how the probe reaches the nodes: SSH from here, or one Slurm job (srun) run here or through "
                   "PREFIX (e.g. slurm:ssh root@slurm-ctl)")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="over SSH: worker processes the hosts are spread over (connections and checks on N cores)")
def verify(inventory: str, pyinfra_args: PyinfraArgs, bench: str, out: str, via: str, jobs: int) -> None:
    """Probe every GPU node of INVENTORY (a pyinfra inventory) in parallel, check it against its configuration and
    write the fleet report.

    Exit code: 0 nothing failed, 1 a check failed or a host was unreachable, 2 verify could not run (bad inventory
    or configuration, no host reachable, bad usage), 130/143/129 interrupted (no report written); the same with
    any --jobs (the same report as one process).
    """
    _patch_for_gevent()
    from . import interruption
    from .verify import run

    interruption.catch_signals()  # SIGINT/SIGTERM/SIGHUP: exit 130/143/129 naming the hosts not finished
    sys.exit(run.main(inventory, limit=list(pyinfra_args.limit), bench=bench, out=out, echo=click.echo, via=via,
                      override_data=pyinfra_args.override_data(), jobs=jobs))


@main.command()
@click.argument("inventory")
@click.argument("deploy", required=False, default=DEFAULT_DEPLOY)
@pyinfra_options()
@click.option("-y", "--yes", is_flag=True,
              help="roll out without showing the plan and asking first (as pyinfra -y); needed without a terminal")
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
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="pyinfra worker processes for the whole-fleet pass and the waves (1: the rollout's own)")
def rollout(inventory: str, deploy: str, pyinfra_args: PyinfraArgs, yes: bool, canary: int, waves: str | None,
            batch: str | None, max_unavailable: str | None, max_failures: str, verify_gate: str, drain: str,
            wait_for_jobs: float | None, on_timeout: str, state_file: str | None, resume: bool, dry: bool,
            out: str, jobs: int) -> None:
    """Roll DEPLOY out over INVENTORY: validation and preflight of every host, then the canary and the waves in
    inventory order, each host drained, converged, verified and returned.

    DEPLOY: a deploy file (FILE.py) or a deploy function (package.module.function), as pyinfra takes it; default
    gpufleet.deploys.gpu_node.gpu_node. Without -y the plan (waves, what changes on which host) is shown and
    Enter asked for before the first drain or change, as pyinfra does; without a terminal, -y is required.
    --jobs N runs the whole-fleet pass and the waves in N pyinfra worker processes; the state file, drains, gates
    and summary stay in this process.

    Exit code (the same with any --jobs): 0 every host done, 1 stopped by failures or a host failed, 2 bad input or
    usage, or the plan not confirmed (nothing drained or changed), 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP
    (continue with --resume).
    """
    if waves and batch:
        raise click.UsageError("--waves and --batch: give one of them")
    confirm = None
    if not yes and not dry:
        if not _interactive():
            click.echo("gpufleet rollout: no terminal to confirm the plan on (stdin is not a terminal): give -y to "
                       "roll out without asking, or --dry to see the plan; nothing was drained or changed", err=True)
            sys.exit(2)
        confirm = _confirm
    # Ctrl-C (SIGINT, also to the whole process group as a terminal sends it), SIGTERM and SIGHUP stop a rollout
    # (state saved, exit 130/143/129, --resume goes on), even where the caller started it with SIGINT ignored, as a
    # shell does for a background job of a script or CI job.
    from . import interruption

    interruption.catch_signals()
    # Patched for gevent: the rollout runs pyinfra in this process (gpufleet._pyinfra.inprocess), and the verify gate
    # probes a wave's hosts in parallel. gevent's loop checks for signals while it waits, so Ctrl-C still raises
    # KeyboardInterrupt at once while the rollout waits on a drain hook, a host or a subprocess.
    _patch_for_gevent()
    from .rollout import run

    opts = run.RolloutOptions(inventory=inventory, deploy=deploy, canary=canary, waves=waves or batch or "25%",
                              max_unavailable=max_unavailable, max_failures=max_failures, verify=verify_gate,
                              drain=drain, wait_for_jobs=wait_for_jobs, on_timeout=on_timeout, state=state_file,
                              resume=resume, dry=dry, out=out, jobs=jobs, pyinfra=pyinfra_args)
    sys.exit(run.main(opts, echo=click.echo, confirm=confirm))


def _interactive() -> bool:
    """Whether someone can answer a question: stdin is a terminal."""
    return sys.stdin.isatty()


def _confirm(plan: str) -> bool:
    """pyinfra's confirmation: the plan, then Enter to go on; any other answer or end of input: no. A signal at the
    prompt (Ctrl-C, SIGTERM, a closed terminal) is an interruption: it propagates, and the rollout exits 130, 143 or
    129 with nothing drained or changed."""
    click.echo(plan)
    click.echo("\n    Detected changes displayed above, skip this step with -y", err=True)
    click.echo("    Press enter to roll out...", err=True, nl=False)
    try:
        answer = input()
    except EOFError:
        click.echo(err=True)
        return False
    if answer:
        click.echo(f"    Unexpected user input: {answer}", err=True)
        return False
    return True


@main.command()
@click.argument("inventory")
@click.argument("deploy", required=False, default=DEFAULT_DEPLOY)
@pyinfra_options()
@click.option("--json", "as_json", is_flag=True, help="print the drift as JSON")
@click.option("-j", "--jobs", type=click.IntRange(1), default=1, show_default=True, metavar="N",
              help="worker processes, each planning a slice of the hosts (as gpufleet apply --dry)")
def drift(inventory: str, deploy: str, pyinfra_args: PyinfraArgs, as_json: bool, jobs: int) -> None:
    """What DEPLOY would change on every host of INVENTORY, per setting and host: the deploy run with pyinfra
    --dry (same validation, preflight, facts and operations; nothing is changed).

    DEPLOY: a deploy file (FILE.py) or a deploy function (package.module.function), as pyinfra takes it; default
    gpufleet.deploys.gpu_node.gpu_node.

    Exit code: 0 no drift, 1 drift, 2 could not tell (bad input or usage, a host unreachable).
    """
    from . import interruption
    from .drift import main as drift_main

    interruption.catch_signals()  # SIGINT/SIGTERM/SIGHUP: exit 130/143/129, nothing was changed
    sys.exit(drift_main(inventory, deploy, as_json=as_json, echo=click.echo, args=pyinfra_args, jobs=jobs))


@main.command()
@click.argument("inventory")
@click.argument("deploy", required=False, default=DEFAULT_DEPLOY)
@pyinfra_options()
@click.option("-y", "--yes", is_flag=True, help="execute without showing the changes and asking first (as pyinfra -y)")
@click.option("-j", "--jobs", type=click.IntRange(1), default=None, metavar="N",
              help="worker processes, each on a slice of the hosts (default: this machine's cores)")
@click.option("--dry", is_flag=True, help="validate, preflight and show what would change; change nothing")
@click.option("--diff", is_flag=True, help="show the differences when changing text files (as pyinfra --diff)")
@click.option("--json", "as_json", is_flag=True,
              help="print pyinfra's --json document (plan and results) of the whole run on stdout")
def apply(inventory: str, deploy: str, pyinfra_args: PyinfraArgs, yes: bool, jobs: int | None, dry: bool,
          diff: bool, as_json: bool) -> None:
    """Run DEPLOY over INVENTORY as ``pyinfra INVENTORY DEPLOY`` does, in N worker processes each on a slice of
    the hosts (a mix of the fleet's groups), behind one validation barrier: no worker changes anything until
    every host of every slice is validated and preflighted.

    DEPLOY: a deploy file (FILE.py) or a deploy function (package.module.function), as pyinfra takes it; default
    gpufleet.deploys.gpu_node.gpu_node. Without -y the changes are shown and Enter asked for (a terminal needed;
    with --json the plan is printed and nothing changed, as pyinfra does).

    Exit code: 0 every host succeeded, 1 a host failed, or validation or preflight failed on any host (then
    nothing was changed on any host), 2 bad usage or inventory (nothing changed), 130/143/129 interrupted by
    SIGINT/SIGTERM/SIGHUP (the hosts in flight are named; run it again to converge them).
    """
    from . import apply as fleet  # no pyinfra in this process: the workers run it

    if deploy.endswith(".py") and not os.path.isfile(deploy):  # a module path is the workers' to import
        click.echo(f"gpufleet apply: deploy {deploy}: no such file; nothing was changed", err=True)
        sys.exit(2)
    confirm = None
    if not yes and not dry and not as_json:
        if not _interactive():
            click.echo("gpufleet apply: no terminal to confirm the changes on (stdin is not a terminal): give -y to "
                       "apply without asking, or --dry to see them; nothing was changed", err=True)
            sys.exit(2)
        confirm = _confirm_apply
    fleet.catch_signals()  # SIGINT/SIGTERM/SIGHUP: every worker stopped, exit 130/143/129 naming hosts in flight
    opts = fleet.ApplyOptions(inventory=inventory, deploy=deploy, jobs=jobs or fleet.default_jobs(), yes=yes,
                              dry=dry, diff=diff, as_json=as_json, pyinfra=pyinfra_args)
    sys.exit(fleet.main(opts, echo=click.echo, confirm=confirm))


def _confirm_apply(plan: str) -> bool:
    """pyinfra's confirmation after its change detection: Enter to go on; anything else, end of input: no."""
    click.echo(plan, err=True)
    click.echo("\n    Detected changes displayed above, skip this step with -y", err=True)
    click.echo("    Press enter to execute...", err=True, nl=False)
    try:
        answer = input()
    except (EOFError, KeyboardInterrupt):
        click.echo(err=True)
        return False
    return not answer


@main.group()
def catalog() -> None:
    """The GPU catalog: gpufleet's models and the user's own (gpufleet_catalog/ beside the inventory, or the
    directory gpufleet_catalog_dir names). Exit code: 0 done, 2 bad input (a model file, a key, a host)."""


_DIR_OPTION = click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
                           help="the user's model directory (default: gpufleet_catalog/ beside --inventory)")
_INVENTORY_OPTION = click.option("-i", "--inventory", default=None, help="an inventory, for its gpufleet_catalog/")


@catalog.command("list")
@_INVENTORY_OPTION
@_DIR_OPTION
def catalog_list(inventory: str | None, directory: str | None) -> None:
    """Every model: key, name, architecture, MIG, power limits per board variant, packaged or the user's.

    Exit code: 0 listed, 2 a user's model file the loader refuses."""
    from . import catalog_command as cc

    try:
        lines = cc.list_lines(cc.catalog_with(cc.user_directory(inventory, directory)))
    except cc.CommandError as err:
        click.echo(f"gpufleet catalog list: {err}", err=True)
        sys.exit(2)
    click.echo("\n".join(lines))


@catalog.command("show")
@click.argument("key")
@_INVENTORY_OPTION
@_DIR_OPTION
def catalog_show(key: str, inventory: str | None, directory: str | None) -> None:
    """One model (KEY: a catalog key or the name nvidia-smi prints): every value and its source.

    Exit code: 0 shown, 2 no such model (the known ones are listed) or a model file the loader refuses."""
    from . import catalog_command as cc
    from .catalog import UnknownGpuModel

    try:
        cat = cc.catalog_with(cc.user_directory(inventory, directory))
        model = cat.get(key) if key in cat else cat.by_name(key)
    except (cc.CommandError, UnknownGpuModel) as err:
        click.echo(f"gpufleet catalog show: {err}", err=True)
        sys.exit(2)
    click.echo(cc.show_text(model))


@catalog.command("learn")
@click.argument("inventory")
@click.argument("host")
@pyinfra_options(verbose=False)
@_DIR_OPTION
@click.option("--force", is_flag=True, help="replace a model file of the same key")
def catalog_learn(inventory: str, host: str, pyinfra_args: PyinfraArgs, directory: str | None, force: bool) -> None:
    """Read HOST of INVENTORY over SSH (nvidia-smi -q, compute_cap, nvlink -s, mig -lgip/-lgipp; nothing is
    changed) and write its GPU's model to gpufleet_catalog/KEY.json beside INVENTORY (or --dir), tagged real with
    the host and date. The driver must answer; MIG profiles are read while MIG is enabled (else the catalogued
    model's are kept). Exit code: 0 written, 2 not (the message says why)."""
    from .catalog_command import learn_command

    sys.exit(learn_command(inventory, host, directory, force, pyinfra_args, click.echo))


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script of gpufleet for SHELL (click's), e.g.

    \b
      gpufleet completion bash > /etc/bash_completion.d/gpufleet
      eval "$(gpufleet completion zsh)"     # in ~/.zshrc
      gpufleet completion fish > ~/.config/fish/completions/gpufleet.fish

    Exit code: 0 printed, 2 bad usage (a shell other than bash, zsh, fish).
    """
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)(main, {}, "gpufleet", "_GPUFLEET_COMPLETE")
    click.echo(complete.source())
