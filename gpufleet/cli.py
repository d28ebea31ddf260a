"""The ``gpufleet`` command."""

from __future__ import annotations

import click

from .sim.cli import sim


@click.group()
@click.version_option(package_name="gpufleet")
def main() -> None:
    """gpufleet: make NVIDIA GPU nodes right, keep them right, and prove it."""


main.add_command(sim)
