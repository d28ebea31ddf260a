"""``gpufleet sim``: the simulated GPU fleet."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from . import faults, hardware, hosts, image
from .hosts import SimError


def _fail(message: str) -> None:
    click.echo(f"gpufleet sim: {message}", err=True)
    sys.exit(2)


def _fleet() -> hosts.Fleet:
    fleet = hosts.Fleet.load()
    if fleet is None:
        _fail("no simulated fleet is up (gpufleet sim up)")
    return fleet


@click.group()
def sim() -> None:
    """A simulated GPU fleet: real SSH, systemd and filesystems, simulated NVIDIA GPUs.

    GPUFLEET_SIM_DIR (state, default /var/lib/gpufleet-sim) and GPUFLEET_SIM_NET (bridge network, default
    10.77.0) keep fleets apart. Exit code: each command's own (see COMMAND -h); 2 bad usage.
    """


@sim.command()
@click.option("--hosts", "count", type=int, default=2, show_default=True, help="number of hosts")
@click.option("--profile", "profiles", multiple=True, default=["h100-sxm-8"], show_default=True,
              help="hardware profile, optionally @OS (h100-sxm-8@debian13); repeat to mix (assigned round-robin). "
                   "Known: " + ", ".join(hardware.PROFILES))
@click.option("--os", "os_name", type=click.Choice(list(image.RELEASES)), default=image.DEFAULT_OS, show_default=True,
              help="Debian release of the hosts whose --profile names none: " + ", ".join(
                  f"{r.name} ({r.suite})" for r in image.RELEASES.values()))
@click.option("--driver", default="none", show_default=True,
              help="none (a bare server) or preinstalled[:BRANCH] (driver baked into the image)")
@click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path),
              help="write a pyinfra inventory of the fleet to this file")
@click.option("--force", is_flag=True, help="tear down a fleet that is already up first")
def up(count, profiles, os_name, driver, inventory, force):
    """Bring up a simulated fleet.

    Exit code: 0 the fleet is up, 2 it could not be brought up (the reason printed) or bad usage.
    """
    try:
        fleet = hosts.up(count, list(profiles), driver=driver, inventory=inventory, force=force, os_name=os_name,
                         log=lambda m: click.echo(m, err=True))
    except (SimError, ValueError) as error:
        _fail(str(error))
    for host in fleet.hosts:
        click.echo(f"{host.name}\t{host.address}\t{host.profile}\t{host.os}")
    if inventory:
        click.echo(f"inventory: {inventory}")


@sim.command()
def down():
    """Stop every host and remove everything the fleet created.

    Exit code: 0 nothing left behind, 2 something was left behind (named).
    """
    problems = hosts.down(log=lambda m: click.echo(m, err=True))
    if problems:
        _fail("left behind: " + ", ".join(problems))


@sim.command()
@click.option("--json", "as_json", is_flag=True)
def status(as_json):
    """Show the hosts and their state.

    Exit code: 0 (also when no fleet is up).
    """
    rows = hosts.status()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no simulated fleet is up")
        return
    click.echo(f"{'HOST':8} {'ADDRESS':12} {'PROFILE':12} {'OS':8} {'STATE':12} {'GPUS':>4} DRIVER")
    for r in rows:
        click.echo(f"{r['name']:8} {r['address']:12} {r['profile']:12} {r['os']:8} {r['state']:12} {r['gpus']:>4} "
                   f"{r['driver'] or '-'}")


@sim.command()
@click.argument("host")
@click.option("--no-wait", is_flag=True, help="return without waiting for the host to be up again")
def reboot(host, no_wait):
    """Power-cycle a host (GPU settings reset as on real hardware).

    Exit code: 0 the host is up again (or --no-wait), 2 no fleet, no such host, or it did not come back.
    """
    try:
        hosts.reboot(host, wait=not no_wait)
    except SimError as error:
        _fail(str(error))


@sim.command(context_settings={"ignore_unknown_options": True})
@click.argument("host")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(host, command):
    """Open a shell on HOST, or run COMMAND there (gpufleet sim ssh node01 -- nvidia-smi).

    Exit code: the shell's or COMMAND's (255: ssh could not connect), 2 no fleet or no such host.
    """
    try:
        target = _fleet().host(host)
    except SimError as error:
        _fail(str(error))
    # like ssh itself: the words of COMMAND are joined and run by the host's shell
    args = hosts.ssh_command(target, " ".join(command) or None, tty=not command and sys.stdin.isatty())
    os.execvp(args[0], args)


@sim.command()
@click.argument("host")
@click.argument("kind", type=click.Choice(faults.KINDS))
@click.option("--gpu", type=int, default=0, show_default=True)
@click.option("--code", type=int, default=faults.DEFAULT_XID, show_default=True, help="the Xid of `xid`")
def fault(host, kind, gpu, code):
    """Inject a fault into HOST (or clear its faults).

    Exit code: 0 injected (or cleared), 2 no fleet, no such host or GPU, or bad usage.
    """
    try:
        click.echo(faults.inject(_fleet(), host, kind, gpu, code))
    except SimError as error:
        _fail(str(error))
