"""A real Slurm (Debian 12's slurmctld/slurmd 22.05 and munge) on simulated hosts, shared by the end-to-end modules
that need one: the cached packages and slurm.conf's common part (recipe: /work/shared/reference/slurm-on-sim.md).
The packages are fetched once with ``apt-get download`` into /var/cache/gpufleet-test-slurm-debs and installed into
the hosts with dpkg (the hosts have no route to a Debian mirror)."""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ssh

DEBS = Path("/var/cache/gpufleet-test-slurm-debs")
PACKAGES = ["install-info", "libhwloc15", "liblua5.1-0", "libmunge2", "libnuma1", "libyaml-0-2", "munge",
            "slurm-client", "slurm-wlm-basic-plugins", "slurmctld", "slurmd"]
SLURM_CONF_COMMON = """ClusterName=simfleet
SlurmctldHost=node01
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
"""


def fetch_debs() -> list[Path]:
    DEBS.mkdir(parents=True, exist_ok=True)
    missing = [p for p in PACKAGES if not list(DEBS.glob(f"{p}_*.deb"))]
    if missing:
        result = subprocess.run(["apt-get", "download", *missing], cwd=DEBS, capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            pytest.fail(f"apt-get download of the Slurm packages failed: {result.stderr[-2000:]}")
    return sorted(DEBS.glob("*.deb"))


def stage_setup_files(host, debs: list[Path], munge_key: bytes, slurm_conf: str, etc_hosts: str) -> Path:
    """Put what a host's Slurm set-up needs into its /var/tmp/slurm-setup (written from outside, through the host's
    root directory); return that directory."""
    stage = host.dir / "root" / "var" / "tmp" / "slurm-setup"
    stage.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        (stage / deb.name).write_bytes(deb.read_bytes())
    (stage / "munge.key").write_bytes(munge_key)
    (stage / "slurm.conf").write_text(slurm_conf)
    (stage / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    (stage / "hosts").write_text(etc_hosts)
    return stage


def wait_for(what: str, probe, timeout: float = 90, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def fake_gpu_devices(count: int) -> str:
    """systemd-tmpfiles lines for placeholder /dev/nvidiaN character devices (major 195, as the driver's)."""
    return "".join(f"c! /dev/nvidia{i} 0666 root root - 195:{i}\n" for i in range(count))


def install_cluster(fleet, slurm_conf: str, gpus: Mapping[str, int]) -> None:
    """Slurm on every host of ``fleet`` at once: slurmctld on node01, slurmd on the others with ``gpus[name]``
    placeholder GPU device files; one munge key, the hosts' addresses in /etc/hosts, ``slurm_conf`` everywhere."""
    debs = fetch_debs()
    key = secrets.token_bytes(1024)
    etc_hosts = "".join(f"{h.address} {h.name}\n" for h in fleet.hosts)

    def set_up(h) -> None:
        stage = stage_setup_files(h, debs, key, slurm_conf, etc_hosts)
        (stage / "fakegpu.conf").write_text(fake_gpu_devices(gpus.get(h.name, 0)))
        role = ("systemctl enable --now slurmctld && systemctl disable --now slurmd" if h.name == "node01" else
                "cp fakegpu.conf /etc/tmpfiles.d/ && systemd-tmpfiles --create --boot /etc/tmpfiles.d/fakegpu.conf; "
                "systemctl disable --now slurmctld; systemctl enable slurmd && systemctl restart slurmd")
        ssh(fleet, h.name, "set -e; cd /var/tmp/slurm-setup; DEBIAN_FRONTEND=noninteractive dpkg -i *.deb >/dev/null; "
            "sed -i '/^127.0.1.1/d' /etc/hosts; cat hosts >> /etc/hosts; "
            "install -o munge -g munge -m 0400 munge.key /etc/munge/munge.key; systemctl restart munge; "
            "install -m 0644 slurm.conf cgroup.conf /etc/slurm/; " + role, timeout=180)

    with ThreadPoolExecutor(len(fleet.hosts)) as pool:  # dpkg on every host at once
        list(pool.map(set_up, fleet.hosts))
