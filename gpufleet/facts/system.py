"""Host facts the driver stage needs: OS release and running kernel, Secure Boot state. Parse, never decide."""

from __future__ import annotations

import copy
import functools
import shlex

from pyinfra.api import FactBase
from pyinfra.facts.server import LinuxDistribution

from .sections import first_line, join, parse_sections, print_file, section

EFI_SECUREBOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
DEBIAN_IDS = ("debian", "ubuntu")
RHEL_IDS = ("rhel", "rocky", "almalinux", "centos", "ol", "fedora")


def parse_os_release(lines: list[str]) -> dict[str, str]:
    """``/etc/os-release`` (shell-style KEY=value, values optionally quoted) -> dict."""
    values: dict[str, str] = {}
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#") or "=" not in text:
            continue
        key, _, raw = text.partition("=")
        try:
            parts = shlex.split(raw, posix=True)
        except ValueError:
            parts = [raw.strip("\"'")]
        values[key.strip()] = parts[0] if parts else ""
    return values


def os_family(os_id: str | None, id_like: list[str]) -> str | None:
    ids = {os_id or "", *id_like}
    if ids & set(DEBIAN_IDS):
        return "debian"
    if ids & set(RHEL_IDS):
        return "rhel"
    return None


class OsInfo(FactBase):
    """
    OS release, running kernel, machine architecture and the host's addresses, one command.

    .. code:: python

        {"id": "ubuntu", "version_id": "22.04", "version_codename": "jammy", "id_like": ["debian"],
         "pretty_name": "Ubuntu 22.04.5 LTS", "family": "debian",   # debian | rhel | None
         "kernel": "5.15.0-185-generic", "arch": "x86_64", "error": None,
         "addresses": ["10.0.0.5", "fd00::5"]}   # hostname -I (no loopback, no link-local); [] where unknown
    """

    @staticmethod
    def default():
        return {"id": None, "version_id": None, "version_codename": None, "id_like": [], "pretty_name": None,
                "family": None, "kernel": None, "arch": None, "error": None, "addresses": []}

    def command(self) -> str:
        return join(
            section("os-release", "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release"),
            section("kernel", "uname -r"),
            section("arch", "uname -m"),
            # the addresses a listener may bind to (the monitoring plane's listen settings are checked against them)
            section("addresses", "hostname -I"),
        )

    def process(self, output):
        sections = parse_sections(output)
        result = self.default()
        release = sections.get("os-release")
        if release is not None and release.ok:
            values = parse_os_release(release.lines)
            id_like = values.get("ID_LIKE", "").split()
            result.update(
                id=values.get("ID") or None,
                version_id=values.get("VERSION_ID") or None,
                version_codename=values.get("VERSION_CODENAME") or None,
                id_like=id_like,
                pretty_name=values.get("PRETTY_NAME") or None,
                family=os_family(values.get("ID"), id_like),
            )
        else:
            result["error"] = "no /etc/os-release" if release is None else (release.text or "no /etc/os-release")
        for name in ("kernel", "arch"):
            sec = sections.get(name)
            if sec is not None and sec.ok:
                result[name] = first_line(sec.lines) or None
        sec = sections.get("addresses")
        if sec is not None and sec.ok:
            result["addresses"] = sorted({word for line in sec.lines for word in line.split()})
        return result


def parse_mokutil(lines: list[str]) -> tuple[str, bool | None]:
    """``mokutil --sb-state`` -> (state, setup_mode)."""
    text = "\n".join(lines).lower()
    setup_mode = "setup mode" in text or None
    if "secureboot enabled" in text:
        return "enabled", setup_mode
    if "secureboot disabled" in text:
        return "disabled", setup_mode
    if "doesn't support secure boot" in text or "efi variables are not supported" in text:
        return "unsupported", setup_mode
    return "unknown", setup_mode


def parse_efivar(lines: list[str]) -> str:
    """``od -An -t u1`` of the SecureBoot EFI variable: 4 attribute bytes, then the value byte."""
    numbers = [int(tok) for line in lines for tok in line.split() if tok.isdigit()]
    if len(numbers) >= 5:
        return "enabled" if numbers[4] == 1 else "disabled"
    return "unknown"


class SecureBoot(FactBase):
    """
    Secure Boot state.

    .. code:: python

        {"state": "enabled",      # enabled | disabled | unsupported (legacy BIOS boot) | unknown
         "source": "mokutil",     # mokutil | efivars | firmware | None
         "setup_mode": None,      # True when mokutil says the platform is in Setup Mode
         "mokutil": True,         # whether mokutil is installed (needed to enrol a MOK signing key)
         "raw": "SecureBoot enabled"}

    ``mokutil --sb-state`` first; without mokutil the EFI variable is read; without ``/sys/firmware/efi``
    the machine booted without UEFI, so Secure Boot cannot be on (``unsupported``). Otherwise ``unknown``.
    """

    @staticmethod
    def default():
        return {"state": "unknown", "source": None, "setup_mode": None, "mokutil": False, "raw": ""}

    def command(self) -> str:
        return join(
            section("mokutil", "mokutil --sb-state", requires="mokutil"),
            section("efi", "if [ -d /sys/firmware/efi ]; then echo uefi; else echo bios; fi"),
            section("efivar", f"od -An -t u1 {EFI_SECUREBOOT_VAR}", requires="od"),
        )

    def process(self, output):
        sections = parse_sections(output)
        result = self.default()
        mok = sections.get("mokutil")
        if mok is not None and mok.present:
            result["mokutil"] = True
            result["raw"] = mok.text
            state, setup = parse_mokutil(mok.lines)
            result["setup_mode"] = setup
            if state != "unknown":
                result.update(state=state, source="mokutil")
                return result
        efivar = sections.get("efivar")
        if efivar is not None and efivar.ok:
            state = parse_efivar(efivar.lines)
            if state != "unknown":
                result.update(state=state, source="efivars")
                return result
        efi = sections.get("efi")
        if efi is not None and efi.ok and first_line(efi.lines) == "bios":
            result.update(state="unsupported", source="firmware")
        return result


class Distribution(LinuxDistribution):
    """
    pyinfra's ``LinuxDistribution`` (the same output and dict), parsed once per distinct output: pyinfra's parser
    writes the release files into a temporary directory for the ``distro`` package to read back (~3 ms per read),
    gpufleet's operations read the fact up to three times per host, and a fleet's hosts mostly print the same
    files. Each read gets its own copy. The files are listed and printed with shell builtins where pyinfra runs
    ``ls``, ``grep`` and ``cat`` (the same files, each as ``cat`` prints it; in the shell's order, which the
    parser does not use).
    """

    def command(self) -> str:
        release = '"/etc/${file}"'
        return (f'cd /etc/ && for file in *-release; do [ -f "$file" ] || continue; echo {release}; '
                f"{print_file(release)}; echo ---; done")

    def process(self, output):
        return copy.deepcopy(_parsed_distribution(tuple(output)))


@functools.lru_cache(maxsize=64)
def _parsed_distribution(output: tuple[str, ...]) -> dict:
    return LinuxDistribution().process(list(output))
