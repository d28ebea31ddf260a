"""One cgroup per simulated host.

nspawn with ``--keep-unit --register=no`` leaves the container in its caller's cgroup; several hosts in one
cgroup would share (and fight over) the same ``system.slice/*`` cgroups, failing units at random with
``status=219/CGROUP``. Each host's supervisor therefore moves itself into its own cgroup first.
"""

from __future__ import annotations

import os
from pathlib import Path


def _hierarchies() -> list[Path]:
    """The cgroup2 mount and, on hybrid hosts, the name=systemd v1 hierarchy."""
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _dev, mountpoint, fstype, options = line.split()[:4]
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
            found.append(Path(mountpoint))
    return found


def fleet_cgroups(tag: str) -> list[Path]:
    return [h / f"gpufleet-sim-{tag}" for h in _hierarchies()]


def host_cgroups(tag: str, host: str) -> list[Path]:
    return [c / host for c in fleet_cgroups(tag)]


def remove(tag: str) -> list[str]:
    """Remove the fleet's cgroups bottom-up; return those that are still in use."""
    busy = []
    for top in fleet_cgroups(tag):
        if not top.exists():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda entry: -entry[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                busy.append(dirpath)
    return busy
