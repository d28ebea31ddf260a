"""NVIDIA's DCGM packages on a node (the host engine and dcgm-exporter), and the dcgm-exporter release pinned and
held where the inventory names one, as the driver stage pins and holds the driver's branch."""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.facts.apt import noninteractive_apt

from gpufleet.facts.packages import DebSelections
from gpufleet.plan.dcgm_counters import pin_pattern

from . import apt_lists
from .managed_files import put_file, remove_file

# NVIDIA's package names (CUDA repository, DCGM 4): the host engine and the exporter, versions paired by apt's
# dependency of the exporter on the core package; the proprietary package carries the profiling module that
# DCGM_FI_PROF_* need on Ampere and earlier (dcgm-exporter's README).
DCGM_CORE_PACKAGE = "datacenter-gpu-manager-4-core"
DCGM_EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"
DCGM_PACKAGES = (DCGM_CORE_PACKAGE, DCGM_EXPORTER_PACKAGE)
DCGM_PROFILING_PACKAGE = "datacenter-gpu-manager-4-proprietary"
EXPORTER_PIN = "/etc/apt/preferences.d/gpufleet-dcgm-exporter"


def pin_text(version: str) -> str:
    """``/etc/apt/preferences.d`` content admitting only the dcgm-exporter release ``version``."""
    return (f"# Managed by gpufleet: dcgm-exporter {version} only. Set gpufleet_dcgm_exporter_version in the "
            "inventory.\n\n"
            f"Explanation: dcgm-exporter {version}\n"
            f"Package: {DCGM_EXPORTER_PACKAGE}\n"
            f"Pin: version {pin_pattern(version)}\n"
            "Pin-Priority: 1000\n\n"
            "Explanation: no other dcgm-exporter release\n"
            f"Package: {DCGM_EXPORTER_PACKAGE}\n"
            "Pin: version *\n"
            "Pin-Priority: -1\n")


def of_release(installed: str | None, version: str) -> bool:
    """Whether the package version ``installed`` is of the release ``version`` (what the pin admits)."""
    return installed is not None and re.match(pin_pattern(version).strip("/"), installed) is not None


def packages(names: list[str], version: str, pin_state: dict | None) -> tuple[list, bool]:
    """(the commands installing ``names``: the exporter of release ``version`` pinned and held, where set; whether
    they install a package). ``pin_state``: the pin file's ``ManagedState`` entry."""
    commands = list(put_file(pin_state, EXPORTER_PIN, pin_text(version)) if version
                    else remove_file(pin_state, EXPORTER_PIN))
    installed = host.get_fact(DebSelections, packages=tuple(names))
    exporter = installed.get(DCGM_EXPORTER_PACKAGE) or {}
    install = any(name not in installed for name in names) or bool(
        version and not of_release(exporter.get("version"), version))
    if install:
        # a pinned release replaces another one, held or newer
        flags = " --allow-downgrades --allow-change-held-packages" if version else ""
        commands += [*apt_lists.update._inner(),
                     noninteractive_apt(f"install --no-install-recommends{flags} {' '.join(names)}")]
        exporter = {}
    if version and not exporter.get("held"):
        commands.append(f"apt-mark hold {DCGM_EXPORTER_PACKAGE}")
    elif not version and pin_state is not None and exporter.get("held"):
        commands.append(f"apt-mark unhold {DCGM_EXPORTER_PACKAGE}")  # held by gpufleet's pin, now unset
    return commands, install


def exporter_version(names: list[str] | tuple[str, ...] = DCGM_PACKAGES, on=None) -> str | None:
    """The installed dcgm-exporter package's version (read when called: after an install of the same operation),
    read with ``names`` (the read :func:`packages` made: one read where nothing changed); ``on``: the host (default:
    pyinfra's current one)."""
    found = (host if on is None else on).get_fact(DebSelections, packages=tuple(names))
    return (found.get(DCGM_EXPORTER_PACKAGE) or {}).get("version")
