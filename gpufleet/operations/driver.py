"""
Install NVIDIA's datacenter driver: repository, branch pin and hold, kernel module flavour, nouveau out of the
way, kernel headers, fabric manager on NVSwitch systems, reboot when (and only when) allowed.

Supported: Debian 12/13 and Ubuntu 22.04/24.04 (apt), RHEL/Rocky/Alma 9 (dnf module streams + versionlock).
Package naming per distribution is in ``gpufleet.operations._packaging``.
"""

from __future__ import annotations

import re
import shlex
from urllib.parse import urlparse

from pyinfra import host, logger
from pyinfra.api import FactBase, OperationValueError, operation
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.dnf import DnfEnabledModules
from pyinfra.facts.rpm import RpmPackages
from pyinfra.facts.server import Arch, KernelVersion, RebootRequired, Which
from pyinfra.operations import files, server

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages, PackageHolds
from gpufleet.facts.repository import KeyFingerprints
from gpufleet.facts.system import Distribution
from gpufleet.plan import driver_on_branch

from . import _packaging as pkg
from . import _repo_keys, apt_lists
from .errors import refuse, report
from .managed_files import put_file
from .reads import get_state, read_together, unit_states

KEYRING_DIR = "/etc/apt/keyrings"
KEYRING_NAME = "gpufleet-nvidia"
APT_SOURCE = "/etc/apt/sources.list.d/gpufleet-nvidia.list"
APT_PIN = "/etc/apt/preferences.d/gpufleet-nvidia-driver"
DNF_REPO = "/etc/yum.repos.d/gpufleet-nvidia.repo"
DNF_REPO_ID = "gpufleet-nvidia"
DNF_KEY = "/etc/pki/rpm-gpg/gpufleet-nvidia.asc"  # the checked key, when a fingerprint is given
FINGERPRINT_SETTING = "gpufleet_driver_repo_key_fingerprint"
NOUVEAU_CONF = "/etc/modprobe.d/blacklist-nouveau.conf"
# The files the driver operations write, read together whenever one is written (one ManagedState read): the same
# read in the run that creates them as in every later run, which then finds it among the reads it does ahead
# (files.put reads a file's hash only once the file exists: the first run after the one that created it missed it).
MANAGED_FILES = (APT_SOURCE, APT_PIN, NOUVEAU_CONF, DNF_REPO)
NOUVEAU_BLACKLIST = (
    "# Managed by gpufleet: keep nouveau away from NVIDIA GPUs (the NVIDIA driver needs them).\n"
    "blacklist nouveau\n"
    "options nouveau modeset=0\n"
)
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"
read_together(FABRICMANAGER_UNIT, files=MANAGED_FILES)
REBOOT_REQUIRED = "/var/run/reboot-required"
# Initramfs tools in order of preference: (command that must exist, rebuild command).
INITRAMFS_TOOLS = (("update-initramfs", "update-initramfs -u"), ("dracut", "dracut -f"))


# ----------------------------------------------------------------------------------------- facts
# Private facts: they should move to gpufleet/facts (next to NvidiaPackages) once that module settles.


class _AptCachePolicy(FactBase):
    """
    ``apt-cache policy`` for some packages, pins applied (should move to gpufleet/facts):

    .. code:: python

        {
            "nvidia-fabricmanager-580": {
                "installed": None,
                "candidate": "580.95.05-1",
                "versions": [{"version": "580.95.05-1", "priority": 1000}],
            },
        }

    Packages no repository knows are absent from the dict.
    """

    default = dict

    def requires_command(self, packages) -> str:
        return "apt-cache"

    def command(self, packages) -> str:
        # apt-cache takes a name it does not know that holds a regex character (a kernel version's dots) for a
        # regex and matches it against every package name: ~150 ms per read, on every run of a host whose
        # kernel headers no repository offers. Such a name is asked for only where `apt-cache pkgnames` (a
        # prefix walk, ~30 ms) lists it exactly; one it does not list has no candidate either way.
        args = []
        for name in packages:
            quoted = shlex.quote(name)
            if any(char in _APT_REGEX_CHARS for char in name):
                args.append(f"if apt-cache pkgnames {quoted} | grep -qxF -e {quoted}; then set -- \"$@\" {quoted}; fi")
            else:
                args.append(f"set -- \"$@\" {quoted}")
        return "; ".join(["set --", *args, 'if [ $# -gt 0 ]; then LC_ALL=C apt-cache policy "$@"; fi'])

    def process(self, output):
        return parse_apt_cache_policy(output)


_APT_REGEX_CHARS = ".?+*|[^$"  # apt-pkg's cacheset: a name with one of these may be a regex
_POLICY_VERSION_RE = re.compile(r"^(?:\*\*\*\s+)?(\S+)\s+(-?[0-9]+)$")


def parse_apt_cache_policy(lines) -> dict[str, dict]:
    packages: dict[str, dict] = {}
    current: dict | None = None
    in_table = False
    for raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        if not line[0].isspace() and line.endswith(":"):
            current = packages.setdefault(line[:-1], {"installed": None, "candidate": None, "versions": []})
            in_table = False
            continue
        if current is None:
            continue
        text = line.strip()
        key, _, value = text.partition(":")
        if key in ("Installed", "Candidate") and not in_table:
            value = value.strip()
            current[key.lower()] = None if value in ("(none)", "") else value
        elif text == "Version table:":
            in_table = True
        elif in_table:
            match = _POLICY_VERSION_RE.match(text)
            if match:
                current["versions"].append({"version": match.group(1), "priority": int(match.group(2))})
    return packages


class _DnfAvailable(FactBase):
    """Whether a dnf repository offers a package (should move to gpufleet/facts)."""

    @staticmethod
    def default():
        return False

    def requires_command(self, package) -> str:
        return "dnf"

    def command(self, package) -> str:
        return f"dnf -q list --available {shlex.quote(package)} 2>/dev/null || true"

    def process(self, output):
        return any(line.split() and "." in line.split()[0] and not line.startswith("Available") for line in output)


class _PathExists(FactBase):
    """Whether a path exists, following symlinks (``test -e``) (should move to gpufleet/facts)."""

    @staticmethod
    def default():
        return False

    def command(self, path) -> str:
        return f"if test -e {shlex.quote(path)}; then echo yes; else echo no; fi"

    def process(self, output):
        return any(line.strip() == "yes" for line in output)


# --------------------------------------------------------------------------------------- helpers


def _quote_all(names) -> str:
    return " ".join(shlex.quote(name) for name in names)


def _one(versions) -> str | None:
    """The installed version from a package fact's version set (the highest if several are listed)."""
    if not versions:
        return None
    return sorted(versions)[-1]


def _check_url(what: str, url: str) -> None:
    parsed = urlparse(url)
    if (
        parsed.scheme not in ("http", "https", "file")
        or (parsed.scheme != "file" and not parsed.netloc)
        or re.search(r"\s", url)
        or any(ord(char) < 32 for char in url)
    ):
        raise OperationValueError(
            f"{what} {url!r}: expected an http://, https:// or file:// URL without whitespace "
            "(it is written into an apt/dnf source; percent-encode spaces)"
        )


def _put(dest: str, content: str):
    """``put_file`` of a managed text file (mode 0644, root:root); returns whether it changed."""
    commands = list(put_file(get_state(paths=MANAGED_FILES)["files"][dest], dest, content))
    yield from commands
    return bool(commands)


class _HostProblem(Exception):
    """A host-state problem found while planning: the operation ``refuse()``s the host with its message."""


def _resolve_repository(repo_url: str | None, keyring_url: str | None, distro: dict, fam: str):
    if repo_url is None:
        repo_url = pkg.nvidia_repo_url(distro, host.get_fact(Arch))
        if repo_url is None:
            raise _HostProblem(
                f"no NVIDIA repository is known for {distro.get('name')} {distro.get('major')}: set repo_url"
            )
    _check_url("repo_url", repo_url)
    if keyring_url is None:
        keyring_url = pkg.default_keyring_url(repo_url, fam, distro)
    _check_url("keyring_url", keyring_url)
    return repo_url, keyring_url


def _family(distro: dict) -> str:
    fam = pkg.family(distro)
    if fam is None:
        raise _HostProblem(
            f"unsupported distribution {distro.get('name')!r}: the NVIDIA driver operations support "
            "Debian/Ubuntu (apt) and RHEL-family 9 (dnf)"
        )
    return fam


# ------------------------------------------------------------------------------------ repository


def _apt_keyring_path(keyring_url: str) -> str:
    # apt reads armored keys only from *.asc files, binary keyrings from *.gpg
    armored = urlparse(keyring_url).path.lower().endswith((".asc", ".pub"))
    return f"{KEYRING_DIR}/{KEYRING_NAME}{'.asc' if armored else '.gpg'}"


def apt_source(keyring: str, repo_url: str) -> str:
    """The one-line apt source of the flat repository (``URL/ /``, like NVIDIA's CUDA repositories)."""
    return ("# Managed by gpufleet: NVIDIA driver repository (flat, like NVIDIA's CUDA repositories).\n"
            f"deb [signed-by={keyring}] {repo_url.rstrip('/')}/ /\n")


def _checked_key(keyring_url: str, dest: str, fingerprint: str) -> list:
    """The key fetched and checked against ``fingerprint`` (:mod:`._repo_keys`), unless ``dest`` holds it."""
    if _repo_keys.key_is_trusted(host.get_fact(KeyFingerprints, path=dest), fingerprint):
        return []
    return [_repo_keys.fetch_checked_key(keyring_url, dest, fingerprint, "644", FINGERPRINT_SETTING)]


def _apt_repository(repo_url: str, keyring_url: str, keyring_sha256: str | None,
                    keyring_fingerprint: str | None = None):
    keyring = _apt_keyring_path(keyring_url)
    download = _checked_key(keyring_url, keyring, keyring_fingerprint) if keyring_fingerprint else list(
        files.download._inner(src=keyring_url, dest=keyring, mode="644", sha256sum=keyring_sha256))
    if download:
        yield f"mkdir -p {KEYRING_DIR}"  # not there before apt 2.4 (Ubuntu 22.04, Debian 12 have it)
    yield from download
    source_changed = yield from _put(APT_SOURCE, apt_source(keyring, repo_url))
    return bool(download) or source_changed


def _dnf_repository(repo_url: str, keyring_url: str, keyring_fingerprint: str | None = None):
    if keyring_fingerprint:  # dnf cannot pin a fingerprint: it gets the checked key as a local file
        yield from _checked_key(keyring_url, DNF_KEY, keyring_fingerprint)
        keyring_url = f"file://{DNF_KEY}"
    content = (
        "# Managed by gpufleet: NVIDIA driver repository.\n"
        f"[{DNF_REPO_ID}]\n"
        "name=NVIDIA driver repository (gpufleet)\n"
        f"baseurl={repo_url}\n"
        "enabled=1\n"
        "gpgcheck=1\n"
        f"gpgkey={keyring_url}\n"
    )
    changed = yield from _put(DNF_REPO, content)
    return changed


@operation()
def nvidia_repository(repo_url: str | None = None, keyring_url: str | None = None, keyring_sha256: str | None = None,
                      keyring_fingerprint: str | None = None):
    """
    Configure NVIDIA's package repository (or a mirror of it) with its signing key.

    + repo_url: repository URL; default NVIDIA's CUDA repository for the host's release and CPU
      (``https://developer.download.nvidia.com/compute/cuda/repos/<ubuntu2404|debian13|rhel9>/<x86_64|sbsa>/``).
      Point it at a mirror for air-gapped sites.
    + keyring_url: the repository's OpenPGP signing key; default ``<repo_url>/3bf863cc.pub`` (apt;
      ``8793F200.pub`` on Debian 13) or ``<repo_url>/D42D0685.pub`` (dnf), the keys NVIDIA publishes in each
      repository directory. A URL ending in ``.asc``/``.pub`` is an armored key, anything else a binary keyring.
    + keyring_sha256: optional SHA-256 of the key file: the key is re-downloaded when it differs, and a
      download that does not match fails (without it an existing key file is kept as is).
    + keyring_fingerprint: optional full fingerprint of the signing key (NVIDIA's apt key: ``EB69 3B30 35CD 5710
      E231 E123 A4B4 6996 3BF8 63CC``): a key without it is never installed (needs ``gpg`` on the node)

    apt: the key goes to ``/etc/apt/keyrings/gpufleet-nvidia.{asc,gpg}`` and the flat repository to
    ``/etc/apt/sources.list.d/gpufleet-nvidia.list`` as ``deb [signed-by=KEY] URL/ /``; ``apt-get update`` runs
    when either changed. dnf: ``/etc/yum.repos.d/gpufleet-nvidia.repo`` with ``gpgcheck=1`` and ``gpgkey``.

    **Example:**

    .. code:: python

        from gpufleet.operations import driver

        driver.nvidia_repository(
            name="NVIDIA repository (site mirror)",
            repo_url="https://mirror.example.internal/nvidia/ubuntu2404/x86_64/",
        )
    """
    distro = host.get_fact(Distribution)
    try:
        fam = _family(distro)
        repo_url, keyring_url = _resolve_repository(repo_url, keyring_url, distro, fam)
    except _HostProblem as problem:
        yield from refuse(str(problem))
        return
    if fam == pkg.APT:
        if (yield from _apt_repository(repo_url, keyring_url, keyring_sha256, keyring_fingerprint)):
            yield from apt_lists.update._inner()
    else:
        yield from _dnf_repository(repo_url, keyring_url, keyring_fingerprint)


# --------------------------------------------------------------------------------------- nouveau


def _nouveau_blacklist():
    if not (yield from _put(NOUVEAU_CONF, NOUVEAU_BLACKLIST)):
        return
    for tool, rebuild in INITRAMFS_TOOLS:
        if host.get_fact(Which, command=tool):
            # A failed rebuild takes the file away again, so that the next run retries instead of seeing no change.
            yield f"{rebuild} || {{ rm -f {NOUVEAU_CONF}; exit 1; }}"
            return
    report(
        f"nouveau blacklisted in {NOUVEAU_CONF}; this host has neither update-initramfs nor dracut, "
        "so there is no initramfs to rebuild"
    )


@operation()
def nouveau_blacklist():
    """
    Keep the nouveau driver off NVIDIA GPUs: ``/etc/modprobe.d/blacklist-nouveau.conf`` with
    ``blacklist nouveau`` and ``options nouveau modeset=0``, and the initramfs rebuilt (``update-initramfs -u``
    or ``dracut -f``) when, and only when, that file changed.

    A host without either tool has no initramfs to rebuild: the operation says so instead of failing. If the
    rebuild fails the file is removed again, so that the next run retries. A nouveau module loaded right now
    stays loaded until the next boot.

    **Example:**

    .. code:: python

        from gpufleet.operations import driver

        driver.nouveau_blacklist(name="Blacklist nouveau")
    """
    yield from _nouveau_blacklist()


# ------------------------------------------------------------------------------------ headers


def _dkms_may_build(installed_version: str | None) -> bool:
    """Whether this run may need DKMS to build NVIDIA modules for the running kernel, the only time kernel headers
    matter: the wanted driver is not installed (``installed_version`` None), or the loaded module is not the
    installed driver (not loaded, not built for this kernel, another version). A host running the driver it has
    installed needs no build, so a converged host does not ask the package manager for headers on every run (nor
    warn on every run that a custom kernel has none)."""
    want = pkg.upstream_version(installed_version)
    gpus = host.get_fact(GpuInventory)
    return not (want and gpus.get("status") == "ok" and gpus.get("driver_version") == want)


def _headers_present(kernel: str) -> bool:
    # What DKMS needs: the running kernel's build tree (a package, or installed by hand for a custom kernel).
    return host.get_fact(_PathExists, path=f"/lib/modules/{kernel}/build")


def _apt_headers(lists_updated: bool):
    """Returns whether the package lists are fresh (updated in this run) afterwards."""
    kernel = host.get_fact(KernelVersion)
    if _headers_present(kernel):
        return lists_updated
    name = f"linux-headers-{kernel}"
    policy = host.get_fact(_AptCachePolicy, packages=(name,))
    if not (policy.get(name) or {}).get("candidate"):
        report(
            f"kernel headers: {name} is not installed and no configured repository offers it: DKMS cannot "
            f"build NVIDIA modules for the running kernel {kernel} (prebuilt module packages need no headers)"
        )
        return lists_updated
    if not lists_updated:
        yield from apt_lists.update._inner()
    yield noninteractive_apt(f"install {shlex.quote(name)}")
    return True


def _dnf_headers():
    kernel = host.get_fact(KernelVersion)
    if _headers_present(kernel):
        return
    name = f"kernel-devel-{kernel}"
    if not host.get_fact(_DnfAvailable, package=name):
        report(
            f"kernel headers: {name} is not installed and no configured repository offers it: DKMS cannot "
            f"build NVIDIA modules for the running kernel {kernel}"
        )
        return
    yield f"dnf install -y {shlex.quote(name)}"


# ------------------------------------------------------------------------------------ packages


def _apt_packages(branch: str, flavour: str, style: str, nvswitch: bool, repo_url: str, lists_updated: bool):
    """Driver (and fabric manager) of the branch installed and held; returns (driver version, fm changed), or
    None when the host was refused (nothing installable)."""
    driver = pkg.driver_package(branch, flavour, style)
    fabricmanager = pkg.fabricmanager_package(branch, style)
    pinning = pkg.pinning_package(branch, style)
    installed, holds = _apt_installed()
    driver_version = _apt_installed_driver(branch, flavour, style)
    fm_version = _one(installed.get(fabricmanager)) if nvswitch else None
    obsolete = sorted(
        name
        for name in installed
        if name not in (driver, pinning)
        and (pkg.is_apt_driver_selector(name) or pkg.is_apt_pinning(name)
             or (pkg.is_apt_fabricmanager(name) and name != fabricmanager))
    )
    need_driver = driver_version is None
    need_pinning = pinning is not None and pinning not in installed
    need_fm = nvswitch and (
        fm_version is None or pkg.upstream_version(fm_version) != pkg.upstream_version(driver_version)
    )
    wanted = [driver] + ([pinning] if pinning else []) + ([fabricmanager] if nvswitch else [])

    if not (need_driver or need_pinning or need_fm or obsolete):
        unheld = [name for name in _hold_list(wanted, installed, driver_version) if name not in holds]
        if unheld:
            yield f"apt-mark hold {_quote_all(unheld)}"
        else:
            host.noop(f"{', '.join(wanted)} installed ({driver_version}) and held")
        return driver_version, False

    if not lists_updated:
        yield from apt_lists.update._inner()
    # Read after the update (operations run lazily in pyinfra 3): candidates with the branch pin applied.
    policy = host.get_fact(_AptCachePolicy, packages=tuple(wanted))
    specs = []
    if need_pinning:
        # NVIDIA's pinning package first, in the driver's transaction: gpufleet's own pin already admits only the
        # branch, and the driver is installed at the exact version read above
        if not (policy.get(pinning) or {}).get("candidate"):
            yield from refuse(
                f"{pinning}: NVIDIA's branch pinning package is not offered by the configured repositories "
                f"(repository {repo_url}); check that the repository or mirror carries it"
            )
            return None
        specs.append(pinning)
    if need_driver:
        driver_version = (policy.get(driver) or {}).get("candidate")
        if not driver_version:
            yield from refuse(
                f"{driver}: no installable version of driver branch {branch} in the configured repositories "
                f"(repository {repo_url}); check that the repository or mirror carries branch {branch}"
            )
            return None
        specs.append(f"{driver}={driver_version}")
    # the fabric manager in place stays when it already is the version the driver gets (a renamed metapackage)
    need_fm = need_fm and pkg.upstream_version(fm_version) != pkg.upstream_version(driver_version)
    if need_fm:
        want = pkg.upstream_version(driver_version)
        matching = [
            entry["version"]
            for entry in (policy.get(fabricmanager) or {}).get("versions", [])
            if entry["priority"] >= 0 and pkg.upstream_version(entry["version"]) == want
        ]
        if not matching:
            yield from refuse(
                f"{fabricmanager}: the configured repositories have no version {want}; the fabric manager "
                f"must be exactly the driver's version (repository {repo_url})"
            )
            return None
        specs.append(f"{fabricmanager}={matching[0]}")
    specs += [f"{name}-" for name in obsolete]  # apt-get install's "remove this" suffix: one transaction
    yield noninteractive_apt(f"install --allow-downgrades --allow-change-held-packages {_quote_all(specs)}")
    if any(pkg.is_apt_driver_selector(name) and pkg.selector_flavour(name) != flavour for name in obsolete):
        # Same version, other kernel modules: nvidia-smi cannot tell the loaded flavour, so flag the reboot the way
        # Debian/Ubuntu packages do (later runs and the distribution's tools see it too, until the reboot).
        flag = f"echo '*** System restart required ***' > {REBOOT_REQUIRED}"
        yield f"{flag} && echo {shlex.quote(driver)} >> {REBOOT_REQUIRED}.pkgs"
    # Read after the install (lazily, like the policy above): the release's packages the metapackage pulled in.
    installed, _ = _apt_installed()
    yield f"apt-mark hold {_quote_all(_hold_list(wanted, installed, driver_version))}"
    return driver_version, need_fm


def _apt_installed() -> tuple[dict[str, set[str]], set[str]]:
    """``({name: {version}}, held names)`` of the installed NVIDIA packages: one narrow read (``NvidiaPackages``,
    which preflight reads too) instead of every package of the host (``dpkg -l``) and ``apt-mark showhold``."""
    found = host.get_fact(NvidiaPackages)
    installed = {name: {entry["version"]} for name, entry in found["packages"].items()
                 if entry["installed"] and entry["version"]}
    return installed, set(found["held"])


def _apt_installed_driver(branch: str, flavour: str, style: str) -> str | None:
    """The installed version of the wanted driver metapackage (branch, flavour, naming style) when it is of the
    branch (NVIDIA's names carry none), else None."""
    version = _one(_apt_installed()[0].get(pkg.driver_package(branch, flavour, style)))
    return version if driver_on_branch(pkg.upstream_version(version), branch) else None


def _hold_list(wanted: list[str], installed: dict, driver_version: str | None) -> list[str]:
    """The metapackages, then every installed package of the same driver release (same upstream version)."""
    release = pkg.upstream_version(driver_version)
    components = sorted(
        name
        for name, versions in installed.items()
        if name not in wanted
        and pkg.is_apt_driver_component(name)
        and not (pkg.is_apt_driver_selector(name) or pkg.is_apt_fabricmanager(name)
                 or pkg.is_apt_pinning(name))  # only the wanted ones
        and any(pkg.upstream_version(version) == release for version in versions)
    )
    return wanted + components


def _dnf_installed_driver(branch: str, flavour: str) -> str | None:
    """The installed driver's version when it is the wanted one (the branch's module stream of this flavour),
    else None."""
    driver_version = _one(host.get_fact(RpmPackages).get(pkg.DNF_DRIVER_PACKAGE))
    if host.get_fact(DnfEnabledModules).get(pkg.DNF_DRIVER_MODULE) != pkg.dnf_stream(branch, flavour):
        return None
    return driver_version if (pkg.upstream_version(driver_version) or "").startswith(f"{branch}.") else None


def _dnf_packages(branch: str, flavour: str, nvswitch: bool):
    """Module stream, fabric manager and versionlock; returns (driver version or None, fm changed)."""
    stream = pkg.dnf_stream(branch, flavour)
    module = pkg.DNF_DRIVER_MODULE
    fabricmanager = pkg.DNF_FABRICMANAGER
    rpms = host.get_fact(RpmPackages)
    modules = host.get_fact(DnfEnabledModules)
    driver_version = _one(rpms.get(pkg.DNF_DRIVER_PACKAGE))
    fm_version = _one(rpms.get(fabricmanager)) if nvswitch else None
    need_driver = _dnf_installed_driver(branch, flavour) is None
    need_fm = nvswitch and (
        need_driver or fm_version is None or pkg.upstream_version(fm_version) != pkg.upstream_version(driver_version)
    )
    locks = host.get_fact(PackageHolds)
    wanted_locks = {pkg.DNF_DRIVER_PACKAGE} | ({fabricmanager} if nvswitch else set())

    if need_driver or need_fm:
        held = sorted(
            name for name in locks if name == fabricmanager or name.startswith(("nvidia-driver", "kmod-nvidia"))
        )
        if held:
            yield f"dnf versionlock delete {_quote_all(held)}"
    if need_driver:
        current = modules.get(module)
        if current and current != stream:
            yield f"dnf module reset -y {module}"
        yield f"dnf module install -y --allowerasing {shlex.quote(f'{module}:{stream}')}"
        driver_version = None  # known once installed
    if need_fm:
        if fm_version is not None:
            yield f"dnf remove -y {fabricmanager}"
        # exactly the installed driver's version, resolved on the host after the driver is in place
        yield f"dnf install -y \"{fabricmanager}-$(rpm -q --qf '%{{VERSION}}' {pkg.DNF_DRIVER_PACKAGE})\""
    if pkg.DNF_VERSIONLOCK_PLUGIN not in rpms:
        yield f"dnf install -y {pkg.DNF_VERSIONLOCK_PLUGIN}"
    if need_driver or need_fm or not wanted_locks <= locks:
        patterns = list(pkg.DNF_LOCK_PATTERNS) + ([fabricmanager] if nvswitch else [])
        yield f"dnf versionlock add {_quote_all(patterns)}"
    elif pkg.DNF_VERSIONLOCK_PLUGIN in rpms:
        host.noop(f"{module}:{stream} installed ({driver_version}) and version-locked")
    if driver_version is None:
        # installed just now: read it back (facts are read when the operation runs, after the commands above)
        driver_version = _one(host.get_fact(RpmPackages).get(pkg.DNF_DRIVER_PACKAGE))
    return driver_version, need_fm


# ----------------------------------------------------------------------------- reboot / services


def _reboot_reasons(driver_version: str | None) -> list[str]:
    reasons = []
    want = pkg.upstream_version(driver_version)
    gpus = host.get_fact(GpuInventory)
    status, loaded = gpus.get("status"), gpus.get("driver_version")
    installed = f" {want}" if want else ""
    if status == "ok" and want and loaded and loaded != want:
        reasons.append(f"NVIDIA driver {loaded} is loaded, {want} is installed")
    elif status == "version_mismatch":
        reasons.append(
            f"the loaded NVIDIA kernel module is not the installed driver{installed} "
            f"(nvidia-smi: {gpus.get('error') or 'driver/library version mismatch'})"
        )
    elif status == "driver_not_loaded":
        reasons.append(f"NVIDIA driver{installed} is installed but its kernel module is not loaded")
    if host.get_fact(RebootRequired):
        reasons.append("the system flags a pending reboot (/var/run/reboot-required)")
    return reasons


def _fabricmanager_service(reboot_pending: bool, reinstalled: bool):
    unit = FABRICMANAGER_UNIT
    status = unit_states((unit,))[unit]
    active = status["active_state"] == "active"
    enabled = status["unit_file_state"] == "enabled"
    if reinstalled:
        yield "systemctl daemon-reload"
    if not enabled:
        yield f"systemctl enable {unit}"
    if reboot_pending:
        if not active or reinstalled:
            report(f"{unit} starts after the reboot (it only runs with the driver of its own version loaded)")
        return
    if not active:
        yield f"systemctl start {unit}"
    elif reinstalled:
        yield f"systemctl restart {unit}"
    elif enabled:
        host.noop(f"{unit} is enabled and running")


# ------------------------------------------------------------------------------------ operation


@operation()
def nvidia_driver(
    branch: str | int,
    flavour: str = "open",
    repo_url: str | None = None,
    keyring_url: str | None = None,
    keyring_sha256: str | None = None,
    keyring_fingerprint: str | None = None,
    nvswitch: bool = False,
    packages_style: str | None = None,
    kernel_headers: bool = True,
    allow_reboot: bool = False,
    reboot_timeout: int = 900,
):
    """
    Install NVIDIA's driver of one branch, pinned and held, with the fabric manager on NVSwitch systems.

    + branch: driver branch, e.g. ``"580"``; only this branch's packages can be installed (apt pin,
      dnf module stream) and the installed ones are held (``apt-mark hold`` / ``dnf versionlock``)
    + flavour: kernel modules, ``"open"`` (required on Blackwell and Grace, recommended from Turing on) or
      ``"proprietary"``; choosing by GPU architecture is the caller's job
    + repo_url: NVIDIA's repository or a mirror of it (see ``nvidia_repository``); default NVIDIA's CUDA
      repository for the host's release and CPU
    + keyring_url: the repository's signing key; default the key NVIDIA publishes in the repository directory
    + keyring_sha256: optional SHA-256 the key file must have
    + keyring_fingerprint: optional full fingerprint the signing key must have (see ``nvidia_repository``)
    + nvswitch: install the fabric manager of exactly the driver's version and keep it enabled and running
      (HGX/DGX boards with NVSwitch)
    + packages_style: apt package naming, ``"ubuntu"`` (``nvidia-driver-580-server-open`` /
      ``nvidia-driver-580-server``) or ``"nvidia"`` (``nvidia-open`` / ``cuda-drivers`` with NVIDIA's
      ``nvidia-driver-pinning-580``); default
      ``ubuntu`` on Ubuntu, ``nvidia`` on Debian; ignored on dnf systems (module stream ``580-open`` /
      ``580-dkms``)
    + kernel_headers: install the running kernel's headers (``linux-headers-$(uname -r)`` /
      ``kernel-devel-$(uname -r)``) for DKMS-built modules, when not present already and DKMS may build (step 4)
    + allow_reboot: reboot (``server.reboot``) when a reboot is needed to load the installed driver;
      otherwise the operation reports that a reboot is pending and changes nothing more
    + reboot_timeout: seconds to wait for the host to come back after a reboot

    What it converges, in order (each step only when it differs):

    1. the repository and its key (``nvidia_repository``); ``apt-get update`` when they changed;
    2. the branch pin ``/etc/apt/preferences.d/gpufleet-nvidia-driver``: the branch's metapackages and the
       branch-agnostic driver packages (``cuda-drivers``, ``nvidia-open``, ``libnvidia-compute``…) at priority
       1000 for this branch's versions and -1 for any other (never installed, not even as a dependency); exact
       names, no globs, which would cost every apt run on the host ~20 ms each;
    3. nouveau blacklisted, initramfs rebuilt when that changed (``nouveau_blacklist``);
    4. kernel headers for the running kernel, when DKMS may have to build: the wanted driver is not installed,
       or the loaded module is not the installed driver (a host running the driver it has installed is left
       alone); skipped when ``/lib/modules/$(uname -r)/build`` exists; when no repository offers them (custom or
       foreign kernel) the operation reports it and goes on - it does not fail, since prebuilt module packages
       do not need them and a DKMS build that does fails loudly itself;
    5. the driver metapackage (and the fabric manager at the version whose upstream part equals the driver's:
       ``nvidia-fabricmanager-<branch>``, or ``nvidia-fabricmanager`` in NVIDIA's naming from branch 580 on;
       in NVIDIA's naming, its pinning package ``nvidia-driver-pinning-<branch>`` first) installed in one apt
       transaction that also removes other branches', flavours' and styles' metapackages, pinning packages and
       fabric managers (a host converged with the older ``nvidia-open-<branch>`` / ``cuda-drivers-<branch>``
       names moves to NVIDIA's in that transaction, at the same version: no reboot); then held, with every
       installed package of the same driver release (``apt upgrade`` cannot move part of it to another point
       release). A flavour change at the same version writes
       ``/var/run/reboot-required``: nvidia-smi cannot show which modules are loaded. dnf: module stream
       ``nvidia-driver:<branch>-open|-dkms``, ``nvidia-fabric-manager-<driver version>``, ``dnf versionlock``;
    6. the fabric manager unit enabled, and started unless a reboot is pending (it refuses a driver of another
       version, so after a branch change it starts at the next boot);
    7. reboot detection: the loaded driver (``nvidia-smi``) differs from the installed one, is not loaded, or
       ``/var/run/reboot-required`` exists -> ``server.reboot`` when ``allow_reboot``, else a warning.

    A second run on a converged host changes nothing. Arguments reach the shell quoted; URLs must be plain
    http(s)/file URLs without whitespace.

    **Example:**

    .. code:: python

        from gpufleet.operations import driver

        driver.nvidia_driver(
            name="NVIDIA driver 580 (open modules) + fabric manager",
            branch="580",
            flavour="open",
            repo_url="https://mirror.example.internal/nvidia/ubuntu2404/x86_64/",
            nvswitch=True,
            allow_reboot=False,
        )
    """
    branch = str(branch)
    if not pkg.BRANCH_RE.match(branch):
        raise OperationValueError(f"branch {branch!r}: expected a driver branch number such as '580'")
    if flavour not in pkg.FLAVOURS:
        raise OperationValueError(f"flavour {flavour!r}: expected one of {', '.join(pkg.FLAVOURS)}")
    if packages_style is not None and packages_style not in pkg.STYLES:
        raise OperationValueError(f"packages_style {packages_style!r}: expected one of {', '.join(pkg.STYLES)}")

    distro = host.get_fact(Distribution)
    try:
        fam = _family(distro)
        repo_url, keyring_url = _resolve_repository(repo_url, keyring_url, distro, fam)
    except _HostProblem as problem:
        yield from refuse(str(problem))
        return

    if fam == pkg.APT:
        repo_changed = yield from _apt_repository(repo_url, keyring_url, keyring_sha256, keyring_fingerprint)
        yield from _put(APT_PIN, pkg.apt_pin(branch))
        if repo_changed:
            yield from apt_lists.update._inner()
        yield from _nouveau_blacklist()
        lists_updated = repo_changed
        style = packages_style or pkg.default_style(distro)
        if kernel_headers and _dkms_may_build(_apt_installed_driver(branch, flavour, style)):
            lists_updated = yield from _apt_headers(lists_updated)
        packages = yield from _apt_packages(branch, flavour, style, nvswitch, repo_url, lists_updated=lists_updated)
        if packages is None:
            return
        driver_version, fm_changed = packages
    else:
        yield from _dnf_repository(repo_url, keyring_url, keyring_fingerprint)
        yield from _nouveau_blacklist()
        if kernel_headers and _dkms_may_build(_dnf_installed_driver(branch, flavour)):
            yield from _dnf_headers()
        driver_version, fm_changed = yield from _dnf_packages(branch, flavour, nvswitch)

    reasons = _reboot_reasons(driver_version)
    if nvswitch:
        yield from _fabricmanager_service(reboot_pending=bool(reasons), reinstalled=fm_changed)
    if not reasons:
        return
    if allow_reboot:
        logger.warning(f"{getattr(host, 'print_prefix', f'[{host.name}] ')}rebooting: {'; '.join(reasons)}")
        yield from server.reboot._inner(reboot_timeout=reboot_timeout)
    else:
        report(f"reboot pending: {'; '.join(reasons)}; reboot the host (or allow reboots) to load the driver")
