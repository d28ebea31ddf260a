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


@main.command()
@click.argument("inventory")
@click.option("--limit", multiple=True, metavar="NAME,...",
              help="only these hosts: host names, group names or glob patterns, comma-separated (repeatable)")
@click.option("--bench", type=click.Choice(["none", "quick", "full"]), default="none", show_default=True,
              help="benchmarks to run on each node after the probe (quick: <= 60 s per node on a real GPU)")
@click.option("--out", type=click.Path(file_okay=False), default="gpufleet-verify", show_default=True,
              help="directory for report.html/.md/.json, junit.xml and the Prometheus textfiles")
def verify(inventory: str, limit: tuple[str, ...], bench: str, out: str) -> None:
    """Probe every GPU node of INVENTORY (a pyinfra inventory) in parallel, check it against its configuration and
    write the fleet report.

    Exit code: 0 nothing failed, 1 a check failed or a host was unreachable, 2 verify could not run (bad inventory
    or configuration, no host reachable).
    """
    # pyinfra's connectors run on gevent: patch the standard library before pyinfra (and paramiko, whose transport
    # is a thread) is imported, as pyinfra's own CLI does; only verify needs it, so only this command does it.
    from gevent import monkey  # noqa: PLC0415

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    from .verify import run  # noqa: PLC0415

    sys.exit(run.main(inventory, limit=list(limit), bench=bench, out=out, echo=click.echo))
