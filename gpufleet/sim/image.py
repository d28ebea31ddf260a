"""The base root filesystems the simulated hosts boot from: one debootstrapped Debian release each (Debian 12
"bookworm", Debian 13 "trixie"), cached as a tar per release and recipe.

A host names its release (``debian12``, ``debian13``); every host of that release shares one read-only lower layer.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .paths import cache_dir


@dataclass(frozen=True)
class Release:
    """A Debian release the simulator can boot: the name users give (``debian13``) and how its image is made."""

    name: str
    suite: str
    deb822: bool  # apt sources as /etc/apt/sources.list.d/debian.sources (deb822), as the release's own images ship

    @property
    def title(self) -> str:
        return f"Debian {self.name.removeprefix('debian')} ({self.suite})"


RELEASES = {release.name: release for release in (
    Release("debian12", "bookworm", deb822=False),
    Release("debian13", "trixie", deb822=True),
)}
DEFAULT_OS = "debian12"

PACKAGES = (
    "openssh-server", "systemd", "systemd-sysv", "dbus", "iproute2", "python3", "sudo", "procps",
    "ca-certificates", "kmod", "pciutils", "gnupg", "curl",
)
# Bump when the customisation below changes: it is part of the cache key.
RECIPE_VERSION = "3"
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
# Debian's archive keyring as the deb822 sources name it (debian-archive-keyring 2025.1, Debian 13, renamed its keyrings
# to .pgp and keeps .gpg as a link)
ARCHIVE_KEYRING = "/usr/share/keyrings/debian-archive-keyring.pgp"

SSHD_CONFIG = """\
# gpufleet sim: one fast host key, root login by key only
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
"""


class UnknownRelease(ValueError):
    def __init__(self, name: str):
        super().__init__(f"unknown OS {name!r}; allowed: {', '.join(RELEASES)}")


def release(name: str) -> Release:
    """The release called ``name`` (``debian12``, ``debian13``); ValueError naming the allowed ones."""
    try:
        return RELEASES[name]
    except KeyError:
        raise UnknownRelease(name) from None


def debian_mirror() -> str:
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return "http://deb.debian.org/debian"


def cache_key(os_name: str = DEFAULT_OS) -> str:
    suite = release(os_name).suite
    digest = hashlib.sha256("\n".join((suite, *PACKAGES, RECIPE_VERSION, debian_mirror())).encode())
    return digest.hexdigest()[:12]


def base_tar(os_name: str = DEFAULT_OS) -> Path:
    return cache_dir() / f"base-{release(os_name).suite}-{cache_key(os_name)}.tar"


def deb_cache_dir(os_name: str) -> Path:
    """Where the Debian .debs a release's hosts downloaded may be kept between fleets (the end-to-end tests do):
    one directory per release, a bookworm .deb being no trixie .deb."""
    return cache_dir() / f"debs-{release(os_name).suite}"


def debootstrap_script(suite: str, scripts: Path = DEBOOTSTRAP_SCRIPTS) -> list[str]:
    """The SCRIPT argument debootstrap needs for ``suite``: none when it knows the suite, else its ``sid`` script.

    Every Debian release since etch is bootstrapped by the same script (debootstrap ships ``trixie``, ``forky``… as
    symlinks to ``sid``), so a debootstrap older than a release still builds it when handed ``sid`` explicitly
    (``debootstrap SUITE TARGET MIRROR SCRIPT``) - without touching the control machine's debootstrap."""
    if (scripts / suite).exists():
        return []
    if (scripts / "sid").exists():
        return [str(scripts / "sid")]
    raise FileNotFoundError(f"debootstrap has no script for {suite!r} (nor {scripts / 'sid'}): upgrade debootstrap")


def apt_sources(rel: Release, mirror: str) -> dict[str, str | None]:
    """{path below the root: content, or None to remove} of the release's apt sources: the suite, -updates and
    -security, main only; deb822 ``debian.sources`` where the release's images use it (Debian 13), else the
    one-line ``sources.list``."""
    security = mirror.replace("/debian", "/debian-security") if mirror.endswith("/debian") else mirror
    suite = rel.suite
    if not rel.deb822:
        return {"etc/apt/sources.list": (f"deb {mirror} {suite} main\n"
                                         f"deb {mirror} {suite}-updates main\n"
                                         f"deb {security} {suite}-security main\n")}
    stanza = "Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: main\nSigned-By: " + ARCHIVE_KEYRING + "\n"
    return {
        "etc/apt/sources.list": None,
        "etc/apt/sources.list.d/debian.sources": (stanza.format(uri=mirror, suites=f"{suite} {suite}-updates") + "\n"
                                                  + stanza.format(uri=security, suites=f"{suite}-security")),
    }


def _customise(root: Path, rel: Release, mirror: str) -> None:
    for path, content in apt_sources(rel, mirror).items():
        if content is None:
            (root / path).unlink(missing_ok=True)
        else:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
    (root / "etc/ssh/sshd_config.d/gpufleet-sim.conf").write_text(SSHD_CONFIG)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "getty@tty1.service", "e2scrub_reap.service"):
        subprocess.run(["chroot", str(root), "systemctl", "mask", unit], check=False, capture_output=True)
    subprocess.run(["chroot", str(root), "apt-get", "clean"], check=True)
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)


def build(os_name: str = DEFAULT_OS, log=print) -> Path:
    """Debootstrap the release's base and store it as a tar in the cache; return the tar path.

    One build per release at a time: a second fleet coming up meanwhile (make test's parallel workers) waits for
    the first one's tar instead of debootstrapping the same release again on the same cores."""
    rel = release(os_name)
    target = base_tar(os_name)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _debootstrap(rel, target, log)
    return target


def _debootstrap(rel: Release, target: Path, log) -> None:
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        root = Path(tmp) / "root"
        log(f"building the simulated hosts' {rel.title} base image from {mirror} (a minute or two, cached "
            "afterwards)")
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), rel.suite, str(root), mirror,
             *debootstrap_script(rel.suite)],
            check=True, stdout=subprocess.DEVNULL,
        )
        _customise(root, rel, mirror)
        partial = target.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(target)


def extract(os_name: str, dest: Path) -> None:
    """Unpack the release's cached base into ``dest`` (the shared read-only lower layer of its hosts)."""
    tar = build(os_name)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-C", str(dest), "-xf", str(tar)], check=True)
