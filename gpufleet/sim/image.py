"""The base root filesystem every simulated host boots from (debootstrapped Debian 12, cached as a tar)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from .paths import cache_dir

SUITE = "bookworm"
PACKAGES = (
    "openssh-server", "systemd", "systemd-sysv", "dbus", "iproute2", "python3", "sudo", "procps",
    "ca-certificates", "kmod", "pciutils", "gnupg", "curl",
)
# Bump when the customisation below changes: it is part of the cache key.
RECIPE_VERSION = "3"

SSHD_CONFIG = """\
# gpufleet sim: one fast host key, root login by key only
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
"""


def debian_mirror() -> str:
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return "http://deb.debian.org/debian"


def cache_key() -> str:
    digest = hashlib.sha256("\n".join((SUITE, *PACKAGES, RECIPE_VERSION, debian_mirror())).encode())
    return digest.hexdigest()[:12]


def base_tar() -> Path:
    return cache_dir() / f"base-{SUITE}-{cache_key()}.tar"


def _customise(root: Path, mirror: str) -> None:
    security = mirror.replace("/debian", "/debian-security") if mirror.endswith("/debian") else mirror
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} {SUITE} main\n"
        f"deb {mirror} {SUITE}-updates main\n"
        f"deb {security} {SUITE}-security main\n"
    )
    (root / "etc/ssh/sshd_config.d/gpufleet-sim.conf").write_text(SSHD_CONFIG)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "getty@tty1.service", "e2scrub_reap.service"):
        subprocess.run(["chroot", str(root), "systemctl", "mask", unit], check=False, capture_output=True)
    subprocess.run(["chroot", str(root), "apt-get", "clean"], check=True)
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)


def build(log=print) -> Path:
    """Debootstrap the base and store it as a tar in the cache; return the tar path."""
    target = base_tar()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        root = Path(tmp) / "root"
        log(f"building the simulated hosts' base image from {mirror} (about a minute, cached afterwards)")
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(root), mirror],
            check=True, stdout=subprocess.DEVNULL,
        )
        _customise(root, mirror)
        partial = target.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(target)
    return target


def extract(dest: Path) -> None:
    """Unpack the cached base into ``dest`` (the shared read-only lower layer of every host)."""
    tar = build()
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-C", str(dest), "-xf", str(tar)], check=True)
