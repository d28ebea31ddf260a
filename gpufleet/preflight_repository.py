"""Preflight of the driver repository: before any host is changed, the repository the driver stage would install
from answers (from the node) and offers the configured branch — and, on NVSwitch systems, the fabric manager of
exactly the version the driver would get, and under NVIDIA's naming its branch pinning package
(``nvidia-driver-pinning-<branch>``). So ``pyinfra -y`` never installs a driver on one host and then stops
on another for a repository problem, leaving a driver without its GPU settings.

And of dcgm-exporter (:func:`dcgm_exporter_offer`): whether apt has it for the host, the one answer the exporter
choice (``auto``) and the refusal of an explicit ``dcgm`` share.

Asked only where the driver stage has something to install (the branch's driver package, its pinning package or
the fabric manager is missing): a converged node costs no extra round trip. apt systems only; on dnf systems the
driver operation refuses the host (``refuse()``) if the module stream cannot be installed.
"""

from __future__ import annotations

import re

from pyinfra.facts.server import Arch

from gpufleet import preflight
from gpufleet.config import NodeConfig
from gpufleet.facts.exporters import AptCandidate
from gpufleet.facts.repository import AptRepositoryIndex
from gpufleet.facts.system import Distribution
from gpufleet.operations import _packaging as pkg
from gpufleet.operations import dcgm_package
from gpufleet.plan import DriverPlan, driver_on_branch


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", pkg.upstream_version(version) or ""))


def branch_versions(offered: dict[str, list[str]], package: str, branch: str) -> list[str]:
    """The versions of ``package`` of driver ``branch`` in the index, highest (apt's candidate) first."""
    versions = [v for v in offered.get(package, []) if (pkg.upstream_version(v) or "").startswith(f"{branch}.")]
    return sorted(versions, key=_version_key, reverse=True)


def _installed(facts: preflight.HostFacts, name: str) -> str | None:
    entry = ((facts.packages or {}).get("packages") or {}).get(name) or {}
    return entry.get("version") if entry.get("installed") else None


def driver_plan(config: NodeConfig, facts: preflight.HostFacts, distro: dict) -> DriverPlan:
    """What the driver stage installs on this host (the plan's decision: flavour by GPU, package naming by the OS
    the ``Distribution`` fact names, as the driver operation reads it)."""
    return DriverPlan.resolve(config, preflight.host_gpus(facts), (distro.get("release_meta") or {}).get("ID"),
                              nvswitch=bool((facts.pci or {}).get("nvswitch_present")))


def check_driver_repository(host, config: NodeConfig, facts: preflight.HostFacts) -> list[preflight.PreflightError]:
    """The repository errors of this host (``host``: the pyinfra host, whose facts are read when needed)."""
    if not config.stage_enabled("driver"):
        return []
    distro = host.get_fact(Distribution)
    if pkg.family(distro) != pkg.APT:
        return []
    plan = driver_plan(config, facts, distro)
    branch, nvswitch = plan.branch, plan.nvswitch
    driver = pkg.driver_package(branch, plan.flavour, plan.packages_style)
    fabricmanager = pkg.fabricmanager_package(branch, plan.packages_style)
    pinning = pkg.pinning_package(branch, plan.packages_style)
    driver_installed = _installed(facts, driver)
    if not driver_on_branch(pkg.upstream_version(driver_installed), branch):
        driver_installed = None  # NVIDIA's names carry no branch: another branch's is not the wanted driver
    fm_installed = _installed(facts, fabricmanager)
    pinning_missing = pinning is not None and not _installed(facts, pinning)
    if driver_installed and not pinning_missing and (not nvswitch or (
            fm_installed and pkg.upstream_version(fm_installed) == pkg.upstream_version(driver_installed))):
        return []  # nothing to install: the repository is not needed by this run

    url = config.driver.repo_url or pkg.nvidia_repo_url(distro, host.get_fact(Arch))
    if url is None:
        return []  # no default repository for this OS: the OS check of preflight reports it
    key = "gpufleet_driver_repo_url" if config.driver.repo_url else "gpufleet_driver_branch"
    value = url if config.driver.repo_url else branch
    index = host.get_fact(AptRepositoryIndex, url=url)
    if index.get("error"):
        return [preflight.PreflightError(
            host.name, key, value, "a repository this node can download from (NVIDIA's or a mirror)",
            f"the driver repository {url} does not answer from the node: {index['error']}")]
    offered = index.get("packages") or {}
    errors = []
    driver_versions = [driver_installed] if driver_installed else branch_versions(offered, driver, branch)
    if not driver_versions:
        errors.append(preflight.PreflightError(
            host.name, "gpufleet_driver_branch", branch,
            f"a branch the repository offers ({', '.join(_offered_branches(offered, driver, branch)) or 'none'})",
            f"the driver repository {url} offers no {driver} of branch {branch}"))
    elif pinning_missing and not offered.get(pinning):
        errors.append(preflight.PreflightError(
            host.name, "gpufleet_driver_branch", branch,
            f"a repository with NVIDIA's pinning package {pinning} (or gpufleet_driver_packages_style: ubuntu)",
            f"the driver repository {url} offers {driver} but not {pinning}, which tracks the branch"))
    elif nvswitch and not (fm_installed and pkg.upstream_version(fm_installed)
                           == pkg.upstream_version(driver_versions[0])):
        want = pkg.upstream_version(driver_versions[0])
        if not any(pkg.upstream_version(v) == want for v in offered.get(fabricmanager, [])):
            errors.append(preflight.PreflightError(
                host.name, "gpufleet_driver_branch", branch,
                f"a repository with {fabricmanager} {want} (the fabric manager must be exactly the driver's version)",
                f"the driver repository {url} offers {driver} {want} but no {fabricmanager} of that version "
                "(NVSwitch system)"))
    return errors


def _offered_branches(offered: dict[str, list[str]], driver: str, branch: str) -> list[str]:
    """Branches offered under the same package naming: by version for NVIDIA's names (``nvidia-open``
    570.172.08), by name for Ubuntu's (``nvidia-driver-570-server-open`` for ``nvidia-driver-580-server-open``)."""
    if branch not in driver:
        return sorted({(pkg.upstream_version(v) or "").split(".")[0] for v in offered.get(driver, [])} - {""})
    stem = driver.replace(branch, "{}", 1)
    pattern = re.compile("^" + re.escape(stem).replace(r"\{\}", "([0-9]+)") + "$")
    return sorted({m.group(1) for name in offered if (m := pattern.match(name)) and offered[name]})


_PINNED = object()


def dcgm_exporter_offer(host, config: NodeConfig, wanted: str | None | object = _PINNED) -> tuple[str | None, str]:
    """(the dcgm-exporter version apt has for this host, or None; why none): the installed one of the ``wanted``
    release (default: the pinned one; None: any), apt's candidate, else what the NVIDIA repository the exporters
    stage configures offers for the host's OS (asked from the node: read-only, before anything is configured)."""
    if wanted is _PINNED:
        wanted = config.exporters.dcgm_exporter_version
    assert wanted is None or isinstance(wanted, str)
    package = dcgm_package.DCGM_EXPORTER_PACKAGE
    installed = dcgm_package.exporter_version(on=host)  # the read the exporters stage makes too
    if installed and (not wanted or dcgm_package.of_release(installed, wanted)):
        return installed, ""
    candidate = host.get_fact(AptCandidate, package=package)
    if candidate and (not wanted or dcgm_package.of_release(candidate, wanted)):
        return candidate, ""
    distro = host.get_fact(Distribution)
    if pkg.family(distro) != pkg.APT:
        return None, "not a Debian/Ubuntu host"
    url = config.driver.repo_url or pkg.nvidia_repo_url(distro, host.get_fact(Arch))
    if url is None:
        return None, f"no NVIDIA repository for {distro.get('name')} {distro.get('major')}"
    index = host.get_fact(AptRepositoryIndex, url=url)
    if index.get("error"):
        return None, f"the NVIDIA repository {url} does not answer from the node: {index['error']}"
    offered = (index.get("packages") or {}).get(package) or []
    if not offered:
        return None, f"the NVIDIA repository {url} has no {package}"
    matching = [v for v in offered if not wanted or dcgm_package.of_release(v, wanted)]
    if not matching:
        return None, f"the NVIDIA repository {url} has {package} {', '.join(offered)}, not release {wanted}"
    return matching[0], ""


def check_dcgm_exporter(host, config: NodeConfig) -> list[preflight.PreflightError]:
    """dcgm-exporter requested (``dcgm``, or a pinned release) where apt has none for the host."""
    exporters = config.exporters
    if not config.stage_enabled("exporters") or not (exporters.gpu == "dcgm" or (
            exporters.gpu == "auto" and exporters.dcgm_exporter_version)):
        return []
    version, why = dcgm_exporter_offer(host, config)
    if version is not None:
        return []
    if exporters.gpu == "dcgm":
        return [preflight.PreflightError(
            host.name, "gpufleet_exporters_gpu", "dcgm", "auto or nvml (gpufleet's NVML exporter) where apt has no "
            "dcgm-exporter for the host", f"no dcgm-exporter for this host: {why}")]
    if dcgm_exporter_offer(host, config, None)[0] is None:
        return []  # auto without any dcgm-exporter: the NVML exporter, and the plan says why
    return [preflight.PreflightError(
        host.name, "gpufleet_dcgm_exporter_version", exporters.dcgm_exporter_version,
        "a release the repository offers, or unset", f"no dcgm-exporter of that release for this host: {why}")]
