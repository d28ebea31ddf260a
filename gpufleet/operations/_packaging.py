"""How NVIDIA's driver is packaged on each distribution: package names, repositories, pins. Pure data and
functions (no host access), shared by the driver operations and their tests.

Naming styles on apt systems (``packages_style``):

- ``ubuntu``: ``nvidia-driver-<branch>-server-open`` (open kernel modules) / ``nvidia-driver-<branch>-server``
  (proprietary) -- Ubuntu's archive and NVIDIA's Ubuntu repositories.
- ``nvidia``: ``nvidia-open`` / ``cuda-drivers`` with ``nvidia-driver-pinning-<branch>`` -- NVIDIA's CUDA
  repositories, as NVIDIA's Driver Installation Guide installs them: the same names on every branch (from 590 on
  Ubuntu's branch-named ones are gone), the branch tracked by NVIDIA's pinning package
  (tests/reference/upstream/nvidia-driver-guide/facts.json ``apt_driver_install``).

The fabric manager: ``nvidia-fabricmanager-<branch>`` in Ubuntu's archive and in NVIDIA's CUDA repositories up to
branch 575; plain ``nvidia-fabricmanager`` in NVIDIA's CUDA repositories from branch 580 on
(tests/reference/upstream/nvidia-packaging/facts.json ``fabricmanager_package_by_branch``).

RHEL-family (dnf): the ``nvidia-driver`` module stream ``<branch>-open`` or ``<branch>-dkms``.
"""

from __future__ import annotations

import re

from gpufleet.plan import packages_style_for

APT = "apt"
DNF = "dnf"
FLAVOURS = ("open", "proprietary")
STYLES = ("ubuntu", "nvidia")

BRANCH_RE = re.compile(r"^[1-9][0-9]{2,3}$")

# NVIDIA's CUDA repositories (the driver lives there too); one directory per distro release and arch.
NVIDIA_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"
# Keys NVIDIA signs those repositories with (ASCII armored), published in every repository directory.
NVIDIA_APT_KEY = "3bf863cc.pub"
NVIDIA_RPM_KEY = "D42D0685.pub"
# Repositories of newer releases are signed with a key of their own ("Kitmaker (Debian 13 Trixie)
# <kitmaker@nvidia.com>", fingerprint 02182E60104FCDC26EAE1B8597A5D4CB8793F200): repos/debian13/<arch>/8793F200.pub.
NVIDIA_APT_KEY_BY_REPO = {"debian13": "8793F200.pub"}
_NVIDIA_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}

_APT_IDS = {"debian", "ubuntu"}
_DNF_IDS = {"rhel", "centos", "rocky", "almalinux", "fedora", "ol"}

# Driver metapackages that select a branch/flavour: any installed one that is not the wanted one is removed
# when the branch, flavour or naming style changes (the libraries they pulled conflict with the new branch's
# and go with them).
_APT_DRIVER_META_RE = re.compile(
    r"^(nvidia-driver-[0-9]+(-server)?(-open)?|nvidia-headless-[0-9]+(-server)?(-open)?"
    r"|nvidia-open(-[0-9]+)?|cuda-drivers(-[0-9]+)?)$"
)
_APT_PINNING_RE = re.compile(r"^nvidia-driver-pinning-[0-9.]+$")
_APT_FABRICMANAGER_RE = re.compile(r"^nvidia-fabricmanager(-[0-9]+)?$")
# NVIDIA's CUDA repositories drop the branch from the fabric manager's name from this branch on
FABRICMANAGER_UNSUFFIXED_FROM = 580
# Packages of a driver release (their version is the driver's): held with the metapackage, because a metapackage
# that depends on ``>=`` versions would otherwise let ``apt upgrade`` move them to a newer point release.
_APT_COMPONENT_RE = re.compile(r"^((lib)?nvidia-|cuda-drivers|xserver-xorg-video-nvidia|libcuda1|firmware-nvidia)")
_APT_NOT_DRIVER_RE = re.compile(r"^((lib)?nvidia-container|nvidia-docker)")

# Branch-agnostic names (metapackages and NVIDIA's/Debian's unversioned packages) whose version is a driver
# version: through them a newer branch would come in (``cuda`` -> ``cuda-drivers`` -> latest driver), so the apt
# pin admits only the wanted branch's versions of them. Exact names, no globs: apt matches a glob or regex
# ``Package:`` against every package in the cache on every run (about 20 ms per glob, seconds per regex);
# branch-named packages of other branches (``nvidia-driver-590-open``) are kept out by the holds instead.
APT_PIN_PACKAGES = (
    "cuda-drivers",
    "nvidia-open",
    "nvidia-driver",
    "nvidia-driver-open",
    "nvidia-driver-cuda",
    "nvidia-driver-libs",
    "nvidia-kernel-dkms",
    "nvidia-kernel-open-dkms",
    "nvidia-kernel-common",
    "nvidia-kernel-source",
    "nvidia-dkms",
    "nvidia-dkms-open",
    "nvidia-utils",
    "nvidia-compute-utils",
    "nvidia-headless",
    "nvidia-headless-no-dkms",
    "nvidia-firmware",
    "nvidia-fabricmanager",
    "nvidia-fabricmanager-dev",
    "nvidia-imex",
    "libnvidia-nscq",
    "libnvidia-cfg1",
    "libnvidia-common",
    "libnvidia-compute",
    "libnvidia-decode",
    "libnvidia-encode",
    "libnvidia-extra",
    "libnvidia-fbc1",
    "libnvidia-gl",
    "libnvidia-gpucomp",
    "xserver-xorg-video-nvidia",
)

# dnf: the packages ``dnf versionlock`` holds at the installed version (globs as dnf takes them).
DNF_DRIVER_MODULE = "nvidia-driver"
DNF_DRIVER_PACKAGE = "nvidia-driver"
DNF_FABRICMANAGER = "nvidia-fabric-manager"
DNF_VERSIONLOCK_PLUGIN = "python3-dnf-plugin-versionlock"
DNF_LOCK_PATTERNS = ("nvidia-driver", "nvidia-driver-*", "kmod-nvidia-*")


def distro_ids(distro: dict) -> set[str]:
    """ID and ID_LIKE of a ``LinuxDistribution`` fact, lower case."""
    meta = distro.get("release_meta") or {}
    ids = {str(meta.get("ID", "")).strip('"').lower()}
    ids.update(str(meta.get("ID_LIKE", "")).strip('"').lower().split())
    name = (distro.get("name") or "").lower()
    if name:
        ids.add({"redhat": "rhel"}.get(name, name.split()[0]))
    ids.discard("")
    return ids


def family(distro: dict) -> str | None:
    """``apt`` (Debian, Ubuntu), ``dnf`` (RHEL, Rocky, Alma, CentOS Stream) or None."""
    ids = distro_ids(distro)
    if ids & _APT_IDS:
        return APT
    if ids & _DNF_IDS:
        return DNF
    return None


def default_style(distro: dict) -> str:
    """The naming style of this distro when none is set: the driver plan's (:func:`gpufleet.plan.packages_style_for`:
    Ubuntu's names on Ubuntu, NVIDIA's elsewhere)."""
    meta = distro.get("release_meta") or {}
    return packages_style_for(str(meta.get("ID", "")))


def nvidia_repo_name(distro: dict) -> str | None:
    """The directory NVIDIA names its repository for this distro release by (``ubuntu2404``, ``debian13``,
    ``rhel9``), or None."""
    meta = distro.get("release_meta") or {}
    version = str(meta.get("VERSION_ID", "")).strip('"')
    if not version:
        return None
    if "ubuntu" in distro_ids(distro) and str(meta.get("ID", "")).lower() == "ubuntu":
        return "ubuntu" + version.replace(".", "")
    if str(meta.get("ID", "")).lower() == "debian":
        return "debian" + version.split(".")[0]
    if family(distro) == DNF and distro.get("major"):
        return f"rhel{distro['major']}"
    return None


def nvidia_repo_url(distro: dict, arch: str) -> str | None:
    """NVIDIA's repository for this distro release and CPU (``…/repos/ubuntu2404/x86_64/``), or None."""
    name = nvidia_repo_name(distro)
    nv_arch = _NVIDIA_ARCH.get(arch)
    if not nv_arch or not name:
        return None
    return f"{NVIDIA_REPO_BASE}/{name}/{nv_arch}/"


def default_keyring_url(repo_url: str, fam: str, distro: dict | None = None) -> str:
    """The signing key NVIDIA publishes inside the release's repository directory (mirrors carry it along):
    ``8793F200.pub`` in Debian 13's, ``3bf863cc.pub`` in the other apt ones, ``D42D0685.pub`` in the dnf ones."""
    if fam != APT:
        return repo_url.rstrip("/") + "/" + NVIDIA_RPM_KEY
    key = NVIDIA_APT_KEY_BY_REPO.get(nvidia_repo_name(distro or {}) or "", NVIDIA_APT_KEY)
    return repo_url.rstrip("/") + "/" + key


def driver_package(branch: str, flavour: str, style: str) -> str:
    """The apt metapackage that installs driver ``branch`` with ``flavour`` kernel modules (NVIDIA's names carry
    no branch: :func:`pinning_package` and the version select it)."""
    if style == "ubuntu":
        return f"nvidia-driver-{branch}-server-open" if flavour == "open" else f"nvidia-driver-{branch}-server"
    return "nvidia-open" if flavour == "open" else "cuda-drivers"


def pinning_package(branch: str, style: str) -> str | None:
    """NVIDIA's package that makes apt track driver ``branch`` (``nvidia-driver-pinning-580``), installed with the
    driver under NVIDIA's naming; None under Ubuntu's (the branch is in the names)."""
    return f"nvidia-driver-pinning-{branch}" if style == "nvidia" else None


def is_apt_pinning(name: str) -> bool:
    """One of NVIDIA's driver pinning packages (any branch or version)."""
    return bool(_APT_PINNING_RE.match(name))


def fabricmanager_package(branch: str, style: str) -> str:
    """The fabric manager package of driver ``branch`` under a naming style: NVIDIA's CUDA repositories name it
    ``nvidia-fabricmanager`` from branch 580 on (which branch is then the version's business: the apt pin admits only
    the branch's versions of it), ``nvidia-fabricmanager-<branch>`` before; Ubuntu's archive always with the branch."""
    if style == "nvidia" and int(branch) >= FABRICMANAGER_UNSUFFIXED_FROM:
        return "nvidia-fabricmanager"
    return f"nvidia-fabricmanager-{branch}"


def is_apt_driver_selector(name: str) -> bool:
    """A branch/flavour-selecting driver metapackage (``nvidia-driver-580-server-open``, ``nvidia-open``, and the
    branch-named ``nvidia-open-570`` / ``cuda-drivers-570`` of hosts converged before NVIDIA's names)."""
    return bool(_APT_DRIVER_META_RE.match(name))


def selector_flavour(name: str) -> str:
    """Kernel module flavour a driver metapackage installs (``…-open``, ``nvidia-open[-<branch>]``: open)."""
    return "open" if name.endswith("-open") or name.startswith("nvidia-open") else "proprietary"


def is_apt_fabricmanager(name: str) -> bool:
    """A fabric manager package of any branch and naming (``nvidia-fabricmanager-570``, ``nvidia-fabricmanager``)."""
    return bool(_APT_FABRICMANAGER_RE.match(name))


def is_apt_driver_component(name: str) -> bool:
    """A package that may belong to a driver release (hold it when its version is the driver's)."""
    return bool(_APT_COMPONENT_RE.match(name)) and not _APT_NOT_DRIVER_RE.match(name)


def dnf_stream(branch: str, flavour: str) -> str:
    """``nvidia-driver`` module stream: ``580-open`` (open, DKMS) or ``580-dkms`` (proprietary, DKMS)."""
    return f"{branch}-open" if flavour == "open" else f"{branch}-dkms"


def upstream_version(version: str | None) -> str | None:
    """``580.95.05`` from ``580.95.05-0ubuntu1``, ``1:580.95.05-1`` or ``580.95.05-1.el9``."""
    if not version:
        return None
    text = version.split(":", 1)[1] if re.match(r"^[0-9]+:", version) else version
    return text.rsplit("-", 1)[0] if "-" in text else text


def apt_pin(branch: str) -> str:
    """``/etc/apt/preferences.d`` content admitting only driver ``branch`` for the driver's packages: the second
    guard beside NVIDIA's pinning package (:func:`pinning_package`), on every naming style.

    The branch's own metapackages (``nvidia-driver-580-server-open``, ``nvidia-driver-580-server``…) and the
    branch-agnostic ``APT_PIN_PACKAGES``: apt takes the first record that matches a version, so the branch's
    versions get 1000 and any other -1 (never installed, not even as a dependency of something else).
    """
    packages = [driver_package(branch, flavour, style) for style in STYLES for flavour in FLAVOURS]
    # the branch's own fabric manager (NVIDIA's unsuffixed ``nvidia-fabricmanager`` is one of APT_PIN_PACKAGES)
    packages.append(fabricmanager_package(branch, "ubuntu"))
    names = " ".join(dict.fromkeys([*packages, *APT_PIN_PACKAGES]))
    return (
        f"# Managed by gpufleet: NVIDIA driver branch {branch} only. Set the branch in the inventory.\n"
        "\n"
        f"Explanation: NVIDIA driver branch {branch}\n"
        f"Package: {names}\n"
        f"Pin: version /^([0-9]+:)?{branch}\\./\n"
        "Pin-Priority: 1000\n"
        "\n"
        "Explanation: no other NVIDIA driver branch\n"
        f"Package: {names}\n"
        "Pin: version *\n"
        "Pin-Priority: -1\n"
    )
