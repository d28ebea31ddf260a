"""One cgroup per simulated host.

nspawn with ``--keep-unit --register=no`` leaves the container in its caller's cgroup; several hosts in one
cgroup would share (and fight over) the same ``system.slice/*`` cgroups, failing units at random with
``status=219/CGROUP``. Each host's supervisor therefore moves itself into its own cgroup first.
"""

from __future__ import annotations

import os
import signal
import time
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


def _remove_once(tag: str) -> list[str]:
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


def _kill_members(cgroup: str) -> None:
    try:
        pids = Path(cgroup, "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove(tag: str, timeout: float = 10) -> list[str]:
    """Remove the fleet's cgroups bottom-up, killing stragglers of stopped hosts; return those still in use."""
    deadline = time.monotonic() + timeout
    while True:
        busy = _remove_once(tag)
        if not busy or time.monotonic() > deadline:
            return busy
        for cgroup in busy:
            _kill_members(cgroup)
        time.sleep(0.1)
