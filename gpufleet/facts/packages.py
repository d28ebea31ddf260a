"""Installed NVIDIA driver / fabric manager packages, their versions and holds: parse, never decide.

Debian/Ubuntu: ``dpkg-query -W`` (status, name, version) for the NVIDIA package name patterns plus
``apt-mark showhold``. RHEL-family: ``rpm -qa`` for the same patterns plus ``dnf versionlock list``.
One remote command; whichever package manager exists answers.
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from .sections import join, parse_sections, section

# Package name patterns (dpkg-query / rpm globs) that make up an NVIDIA driver installation: every name the driver
# operation's naming rules (operations/_packaging.py: selectors, fabric manager, release components) can match.
DEB_PATTERNS = (
    "nvidia-*",
    "libnvidia-*",
    "cuda-drivers*",
    "libcuda1*",
    "linux-modules-nvidia-*",
    "linux-objects-nvidia-*",
    "linux-signatures-nvidia-*",
    "xserver-xorg-video-nvidia*",
    "firmware-nvidia*",
)
RPM_PATTERNS = ("nvidia-*", "kmod-nvidia*", "libnvidia-*", "cuda-drivers*", "dnf-plugin-nvidia*")

_DPKG_FORMAT = r"${db:Status-Abbrev}\t${Package}\t${Version}\n"
_RPM_FORMAT = r"%{NAME}\t%{EPOCH}\t%{VERSION}\t%{RELEASE}\n"
# dnf4: "nvidia-driver-3:580.95.05-1.el9.*"   dnf5: "Package name: nvidia-driver"
_VERSIONLOCK_RE = re.compile(r"^(?:!)?(?P<name>[A-Za-z0-9_.+-]+?)-(?:\d+:)?[^-\s:]+-[^-\s]+$")
_DNF5_LOCK_RE = re.compile(r"^Package name:\s*(?P<name>\S+)\s*$")


def _quoted(patterns: tuple[str, ...]) -> str:
    return " ".join(f"'{p}'" for p in patterns)


def upstream_version(version: str | None) -> str | None:
    """``580.95.05`` from a package version such as ``1:580.95.05-0ubuntu1`` or ``3:580.95.05-1.el9``."""
    if not version:
        return None
    text = version.split(":", 1)[1] if re.match(r"^\d+:", version) else version
    return text.rsplit("-", 1)[0] if "-" in text else text


def parse_dpkg(lines: list[str]) -> dict[str, dict]:
    packages: dict[str, dict] = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        status, name, version = parts[0], parts[1].strip(), parts[2].strip()
        status = status.strip()
        if not name or len(status) < 2:
            continue
        # db:Status-Abbrev: desired (u/i/h/r/p), status (n/c/H/U/F/W/t/i), error flag
        installed = status[1] in ("i", "W", "t")
        packages[name] = {
            "version": version or None,
            "status": status,
            "installed": installed,
            "held": status[0] == "h",
        }
    return {name: pkg for name, pkg in packages.items() if pkg["installed"] or pkg["status"][1] in ("U", "F", "H")}


def parse_rpm(lines: list[str]) -> dict[str, dict]:
    packages: dict[str, dict] = {}
    for line in lines:
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        name, epoch, version, release = (p.strip() for p in parts)
        if not name:
            continue
        full = f"{version}-{release}"
        if epoch and epoch != "(none)":
            full = f"{epoch}:{full}"
        packages[name] = {"version": full, "status": "installed", "installed": True, "held": False}
    return packages


def parse_holds(lines: list[str]) -> list[str]:
    """``apt-mark showhold``: one package name per line (possibly ``name:arch``)."""
    names = [line.strip() for line in lines]
    return sorted({name.split(":", 1)[0] for name in names if re.match(r"^[a-z0-9][a-z0-9+.:-]*$", name)})


def parse_versionlock(lines: list[str]) -> list[str]:
    names = set()
    for line in lines:
        text = line.strip()
        if text.endswith(".*"):
            text = text[:-2]
        m = _DNF5_LOCK_RE.match(text) or _VERSIONLOCK_RE.match(text)
        if m:
            names.add(m["name"])
    return sorted(names)


class PackageHolds(FactBase):
    """
    Names of the packages the package manager holds: ``apt-mark showhold`` (Debian/Ubuntu) or ``dnf versionlock
    list`` (RHEL family; dnf4's ``name-epoch:version-release.*`` and dnf5's ``Package name: name`` lines).

    .. code:: python

        host.get_fact(PackageHolds)
        {"nvidia-driver-580-server-open", "nvidia-fabricmanager-580"}
    """

    default = set

    def command(self) -> str:
        return join(
            section("apt-holds", "apt-mark showhold", requires="apt-mark"),
            section("versionlock", "dnf -q versionlock list 2>/dev/null", requires="dnf"),
        )

    def process(self, output):
        sections = parse_sections(output)
        holds, locks = sections.get("apt-holds"), sections.get("versionlock")
        names = set(parse_holds(holds.lines)) if holds is not None and holds.ok else set()
        return names | (set(parse_versionlock(locks.lines)) if locks is not None and locks.ok else set())


class NvidiaPackages(FactBase):
    """
    NVIDIA driver packages installed on the host, with versions and holds.

    .. code:: python

        {
            "manager": "dpkg",            # dpkg | rpm | None (neither found)
            "packages": {
                "nvidia-driver-580-server-open": {"version": "580.95.05-0ubuntu1", "status": "hi ",
                                                  "installed": True, "held": True},
                "nvidia-fabricmanager-580": {"version": "580.95.05-1", ...},
            },
            "held": ["nvidia-driver-580-server-open"],   # dpkg's hold selection (apt-mark hold) / dnf versionlock
            "error": None,
        }

    ``status`` is dpkg's ``db:Status-Abbrev`` (``ii``, ``hi``, ``iU``…; ``installed`` for rpm). Packages
    dpkg only remembers (removed, config files left) are not listed. ``upstream_version()`` strips epoch and
    revision (``580.95.05``).
    """

    @staticmethod
    def default():
        return {"manager": None, "packages": {}, "held": [], "error": None}

    def command(self) -> str:
        # holds: dpkg's selection state, the first letter of db:Status-Abbrev (``h``), which is what ``apt-mark
        # hold`` sets and ``apt-mark showhold`` lists; asking apt-mark too would load apt's whole cache (~25 ms)
        dpkg = section("dpkg", f"dpkg-query -W -f='{_DPKG_FORMAT}' {_quoted(DEB_PATTERNS)} 2>/dev/null")
        rpm = join(
            section("rpm", f"rpm -qa --qf '{_RPM_FORMAT}' {_quoted(RPM_PATTERNS)}", requires="rpm"),
            section("versionlock", "dnf -q versionlock list 2>/dev/null", requires="dnf"),
        )
        return f"if command -v dpkg-query >/dev/null 2>&1; then {dpkg}; else {rpm}; fi"

    def process(self, output):
        sections = parse_sections(output)
        result = self.default()
        if "dpkg" in sections and sections["dpkg"].present:
            sec = sections["dpkg"]
            result["manager"] = "dpkg"
            # dpkg-query exits 1 when a pattern matched nothing: not an error
            if sec.rc not in (0, 1):
                result["error"] = sec.text or f"dpkg-query exited {sec.rc}"
            packages = parse_dpkg(sec.lines)
            held = set()  # dpkg marks them in the status itself (``hi``): parse_dpkg
        elif "rpm" in sections and sections["rpm"].present:
            sec = sections["rpm"]
            result["manager"] = "rpm"
            if sec.rc not in (0, 1):
                result["error"] = sec.text or f"rpm exited {sec.rc}"
            packages = parse_rpm(sec.lines)
            lock = sections.get("versionlock")
            held = set(parse_versionlock(lock.lines)) if lock is not None and lock.ok else set()
        else:
            result["error"] = "neither dpkg-query nor rpm found"
            return result
        for name, pkg in packages.items():
            pkg["held"] = pkg["held"] or name in held
        result["packages"] = dict(sorted(packages.items()))
        result["held"] = sorted(name for name, pkg in packages.items() if pkg["held"])
        return result


class DebInstalled(FactBase):
    """
    Which of the given Debian packages dpkg has installed, with their versions (``dpkg-query``: a few lines,
    where pyinfra's ``DebPackages`` lists every package of the host).

    + packages: package names

    .. code:: python

        host.get_fact(DebInstalled, packages=("prometheus-node-exporter", "datacenter-gpu-manager-4-core"))
        {"prometheus-node-exporter": "1.5.0-1+b6"}   # the other one is not installed
    """

    default = dict

    def command(self, packages: tuple[str, ...]) -> str:
        names = " ".join(shlex.quote(name) for name in packages)
        return f"dpkg-query -W -f='{_DPKG_FORMAT}' {names} 2>/dev/null; true"

    def requires_command(self, packages: tuple[str, ...]) -> str:
        return "dpkg-query"

    def process(self, output):
        return {name: pkg["version"] for name, pkg in parse_dpkg(output).items() if pkg["installed"]}


class DebSelections(DebInstalled):
    """
    Which of the given Debian packages dpkg has installed, with their versions and whether they are held
    (dpkg's selection ``hold``, which ``apt-mark hold`` sets).

    + packages: package names

    .. code:: python

        host.get_fact(DebSelections, packages=("datacenter-gpu-manager-exporter",))
        {"datacenter-gpu-manager-exporter": {"version": "1:4.2.3-4.1.3-1", "held": True}}
    """

    def process(self, output):
        return {name: {"version": pkg["version"], "held": pkg["held"]}
                for name, pkg in parse_dpkg(output).items() if pkg["installed"]}
