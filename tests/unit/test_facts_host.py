"""Host facts: packages, systemd units, PCI devices, OS, Secure Boot (fixtures: tests/fixtures/facts)."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import subprocess
from pathlib import Path

import pytest
from pyinfra.facts.server import LinuxDistribution
from pyinfra_harness import fixture, wrap

from gpufleet.facts import (
    ManagedState,
    NvidiaPackages,
    NvidiaPciDevices,
    OsInfo,
    PackageHolds,
    SecureBoot,
    UnitStates,
    upstream_version,
)
from gpufleet.facts.packages import DebInstalled, DebSelections, parse_versionlock
from gpufleet.facts.pci import PCI_IDS
from gpufleet.facts.sections import print_file
from gpufleet.facts.system import Distribution

# ------------------------------------------------------------------------------------------------ packages


def test_packages_dpkg_with_holds():
    """Holds are dpkg's hold selection (``hi``), which ``apt-mark hold`` sets: the packages apt-mark lists."""
    fact = NvidiaPackages().process(wrap("dpkg", fixture("dpkg_query_ubuntu_580.txt"), 0))
    assert fact["manager"] == "dpkg" and fact["error"] is None
    assert fact["packages"] == {
        "libnvidia-compute-580-server": {"version": "580.95.05-0ubuntu1", "status": "ii", "installed": True,
                                         "held": False},
        "nvidia-driver-580-server-open": {"version": "580.95.05-0ubuntu1", "status": "hi", "installed": True,
                                          "held": True},
        "nvidia-fabricmanager-580": {"version": "580.95.05-1", "status": "hi", "installed": True, "held": True},
    }
    assert fact["held"] == ["nvidia-driver-580-server-open", "nvidia-fabricmanager-580"]
    assert fact["held"] == sorted(PackageHolds().process(wrap("apt-holds", fixture("apt_mark_showhold.txt"))
                                                         + wrap("versionlock", None)))


def test_packages_dpkg_nothing_installed():
    fact = NvidiaPackages().process(wrap("dpkg", "", 1))
    assert fact == {"manager": "dpkg", "packages": {}, "held": [], "error": None}


def test_packages_dpkg_failure_reported():
    fact = NvidiaPackages().process(wrap("dpkg", "dpkg-query: error: parsing file '/var/lib/dpkg/status'", 2))
    assert fact["error"] == "dpkg-query: error: parsing file '/var/lib/dpkg/status'"


def test_packages_rpm_with_versionlock():
    rpm = ("nvidia-driver\t3\t580.95.05\t1.el9\nkmod-nvidia-open-dkms\t3\t580.95.05\t1.el9\n"
           "nvidia-fabric-manager\t(none)\t580.95.05\t1\n")
    lock = ("Last metadata expiration check: 0:01:02 ago.\nnvidia-driver-3:580.95.05-1.el9.*\n"
            "kmod-nvidia-open-dkms-3:580.95.05-1.el9.*\n")
    fact = NvidiaPackages().process(wrap("rpm", rpm) + wrap("versionlock", lock))
    assert fact["manager"] == "rpm"
    assert fact["packages"]["nvidia-driver"]["version"] == "3:580.95.05-1.el9"
    assert fact["packages"]["nvidia-fabric-manager"]["version"] == "580.95.05-1"
    assert fact["held"] == ["kmod-nvidia-open-dkms", "nvidia-driver"]


def test_versionlock_dnf5_format():
    assert parse_versionlock(["# Added by 'versionlock add' command", "Package name: nvidia-driver",
                              "evr = 3:580.95.05-1.el9"]) == ["nvidia-driver"]


def test_packages_no_manager():
    assert NvidiaPackages().process(wrap("rpm", None) + wrap("versionlock", None))["error"] == \
        "neither dpkg-query nor rpm found"


def test_deb_installed_lists_only_installed_packages_run_here():
    """dpkg-query's own output on this Debian machine: dpkg is installed, a removed or unknown name is not."""
    command = DebInstalled().command(packages=("dpkg", "no-such-package-gpufleet", "a'b"))
    assert "'a'\"'\"'b'" in command
    run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=True)
    installed = DebInstalled().process(run.stdout.splitlines())
    assert list(installed) == ["dpkg"] and installed["dpkg"]
    assert DebInstalled().process(["rc \tgone\t1.0-1", "ii \tkept\t2.0-1", "hi \theld\t3.0"]) == {
        "kept": "2.0-1", "held": "3.0"}


def test_deb_selections_say_which_installed_packages_are_held():
    assert DebSelections().process(["rc \tgone\t1.0-1", "ii \tkept\t2.0-1", "hi \theld\t1:3.0-1"]) == {
        "kept": {"version": "2.0-1", "held": False}, "held": {"version": "1:3.0-1", "held": True}}


def test_upstream_version():
    assert upstream_version("580.95.05-0ubuntu1") == "580.95.05"
    assert upstream_version("3:580.95.05-1.el9") == "580.95.05"
    assert upstream_version("580.95.05") == "580.95.05"
    assert upstream_version(None) is None


def test_packages_command_shape():
    command = NvidiaPackages().command()
    assert "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 'nvidia-*'" in command
    assert "apt-mark" not in command and "rpm -qa" in command and "dnf -q versionlock list" in command


# ------------------------------------------------------------------------------------------------ systemd


def show(*captures: tuple[str, str]) -> list[str]:
    """UnitStates output: the mark, then ``systemctl show`` of each (unit, captured properties), Id first."""
    lines = ["units"]
    for unit, capture in captures:
        lines += [f"Id={unit}", *fixture(capture).splitlines(), ""]
    return lines


def test_unit_states_of_the_packaged_persistenced_and_a_unit_systemd_does_not_know():
    fact = UnitStates().process(show(("nvidia-persistenced.service", "systemctl_show_persistenced_packaged.txt"),
                                     ("nvidia-fabricmanager.service", "systemctl_show_not_found.txt")))
    assert fact == {
        "nvidia-persistenced.service": {"load_state": "loaded", "active_state": "active", "sub_state": "running",
                                        "unit_file_state": "enabled", "need_daemon_reload": False},
        "nvidia-fabricmanager.service": {"load_state": "not-found", "active_state": "inactive", "sub_state": "dead",
                                         "unit_file_state": None, "need_daemon_reload": False},
    }


def test_unit_states_without_systemctl_is_empty():
    assert UnitStates().process([]) == {}


def test_unit_states_command_quotes_and_checks_units():
    command = UnitStates().command(units=("nvidia-fabricmanager.service", "nvidia-persistenced.service"))
    assert command == ("if command -v systemctl >/dev/null 2>&1; then echo units; systemctl show --no-pager -p Id "
                       "-p LoadState -p ActiveState -p SubState -p UnitFileState -p NeedDaemonReload -- "
                       "nvidia-fabricmanager.service nvidia-persistenced.service 2>/dev/null; fi; true")
    with pytest.raises(ValueError):
        UnitStates().command(units=("x; rm -rf /",))


# ---------------------------------------------------------------------------------------------------- PCI


def test_pci_hgx_h100():
    fact = NvidiaPciDevices().process(wrap("lspci", fixture("lspci_hgx_h100.txt")))
    assert fact["source"] == "lspci" and fact["error"] is None
    assert len(fact["gpus"]) == 8 and len(fact["nvswitches"]) == 4 and fact["nvswitch_present"] is True
    assert fact["gpus"][0] == {"address": "0000:18:00.0", "class": "0302", "vendor": "10de", "device": "2330",
                               "pci_device_id": "0x233010DE", "revision": "a1", "kind": "gpu", "pci_name": None}
    assert [d["address"] for d in fact["devices"]][:2] == ["0000:05:00.0", "0000:06:00.0"]  # address order


def test_pci_workstation_without_nvswitch():
    fact = NvidiaPciDevices().process(wrap("lspci", fixture("lspci_rtx4090_workstation.txt")))
    assert [d["kind"] for d in fact["devices"]] == ["gpu", "audio"]
    assert fact["gpus"][0]["pci_device_id"] == "0x268410DE" and fact["nvswitch_present"] is False


def test_pci_ignores_other_vendors_and_short_addresses():
    fact = NvidiaPciDevices().process(wrap("lspci", "00:02.0 0300: 8086:3e92\n3b:00.0 0302: 10de:2335 (rev a1)\n"))
    assert [d["address"] for d in fact["devices"]] == ["0000:3b:00.0"]


def test_pci_no_devices_and_sysfs_source():
    assert NvidiaPciDevices().process(wrap("sysfs", ""))["source"] == "sysfs"
    assert NvidiaPciDevices().process(wrap("sysfs", ""))["gpus"] == []


def test_pci_sysfs_fallback_prints_lspci_format(tmp_path):
    device = tmp_path / "sys/bus/pci/devices/0000:18:00.0"
    device.mkdir(parents=True)
    for name, value in {"vendor": "0x10de", "device": "0x2330", "class": "0x030200", "revision": "0xa1"}.items():
        (device / name).write_text(value + "\n")
    command = NvidiaPciDevices().command().replace("/sys/bus/pci/devices", str(tmp_path / "sys/bus/pci/devices"))
    command = command.replace("if command -v lspci", "if false")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    fact = NvidiaPciDevices().process(out.stdout.splitlines())
    assert fact["gpus"] == [{"address": "0000:18:00.0", "class": "0302", "vendor": "10de", "device": "2330",
                             "pci_device_id": "0x233010DE", "revision": "a1", "kind": "gpu",
                             "pci_name": pci_ids_name("2330")}]


def pci_ids_name(device: str) -> str | None:
    """The name Debian's pci.ids on this machine gives an NVIDIA device id, read here without gpufleet's awk."""
    if not Path(PCI_IDS).is_file():
        pytest.skip(f"Debian's pci.ids is not installed ({PCI_IDS})")
    vendor = False
    for line in Path(PCI_IDS).read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("10de "):
            vendor = True
        elif vendor and line[:1] not in ("\t", "#", ""):
            return None
        elif vendor and line.startswith(f"\t{device} "):
            return line[1:].split(None, 1)[1].strip()
    return None


def test_pci_names_from_the_pci_id_database_in_the_same_command():
    """One command: the lspci lines, then the pci.ids lines of exactly those NVIDIA device ids (Debian's database:
    a V100 is 'GV100GL [...]'); a device id the database lacks has no name; no database, no names (and no error)."""
    lspci = "0000:18:00.0 0302: 10de:1db1 (rev a1)\n0000:3b:00.0 0300: 10de:1180 (rev a1)\n"
    command = NvidiaPciDevices().command().replace("command -v lspci", "true").replace(
        "lspci -n -D -d 10de:", f"printf {lspci!r}").replace("lspci -n -d 10de:", f"printf {lspci!r}")
    fact = NvidiaPciDevices().process(subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                                     check=True).stdout.splitlines())
    assert [(g["device"], g["pci_name"]) for g in fact["gpus"]] == [("1db1", pci_ids_name("1db1")),
                                                                    ("1180", pci_ids_name("1180"))]
    assert fact["gpus"][0]["pci_name"].startswith("GV100") and fact["gpus"][1]["pci_name"].startswith("GK104")
    missing = NvidiaPciDevices().process(subprocess.run(
        ["sh", "-c", command.replace(PCI_IDS, "/nonexistent/pci.ids")], capture_output=True, text=True,
        check=True).stdout.splitlines())
    assert [g["pci_name"] for g in missing["gpus"]] == [None, None] and missing["error"] is None


# ----------------------------------------------------------------------------------------------------- OS


def os_fact(release: str) -> dict:
    return OsInfo().process(wrap("os-release", release) + wrap("kernel", "5.15.0-185-generic\n")
                            + wrap("arch", "x86_64\n"))


def test_os_ubuntu():
    fact = os_fact(fixture("os_release_ubuntu_2204.txt"))
    assert fact == {"id": "ubuntu", "version_id": "22.04", "version_codename": "jammy", "id_like": ["debian"],
                    "pretty_name": "Ubuntu 22.04.5 LTS", "family": "debian", "kernel": "5.15.0-185-generic",
                    "arch": "x86_64", "error": None, "addresses": []}


def test_os_addresses_are_hostname_i():
    fact = OsInfo().process(wrap("os-release", fixture("os_release_ubuntu_2204.txt"))
                            + wrap("addresses", "10.0.0.5 192.168.1.4 fd00::5 \n"))
    assert fact["addresses"] == ["10.0.0.5", "192.168.1.4", "fd00::5"]


def test_os_rocky():
    fact = os_fact(fixture("os_release_rocky_9.txt"))
    assert (fact["id"], fact["version_id"], fact["family"]) == ("rocky", "9.4", "rhel")
    assert fact["id_like"] == ["rhel", "centos", "fedora"]


def test_os_missing_release():
    fact = OsInfo().process(wrap("os-release", "cat: /usr/lib/os-release: No such file or directory", 1))
    assert fact["id"] is None and fact["error"] == "cat: /usr/lib/os-release: No such file or directory"


def test_os_command_runs_here():
    out = subprocess.run(["sh", "-c", OsInfo().command()], capture_output=True, text=True, check=True)
    fact = OsInfo().process(out.stdout.splitlines())
    assert fact["kernel"] and fact["arch"]


# ------------------------------------------------------------------------------------------- Secure Boot


def sb(mokutil: str | None, rc: int = 0, efi: str = "uefi", efivar: str | None = None) -> dict:
    lines = wrap("mokutil", mokutil, rc) + wrap("efi", efi)
    lines += wrap("efivar", efivar) if efivar is not None else wrap("efivar", "od: no such file", 1)
    return SecureBoot().process(lines)


@pytest.mark.parametrize(("text", "rc", "state"), [
    ("SecureBoot enabled", 0, "enabled"),
    ("SecureBoot disabled", 0, "disabled"),
    ("SecureBoot disabled\nPlatform is in Setup Mode", 0, "disabled"),
    ("This system doesn't support Secure Boot", 255, "unsupported"),
    ("EFI variables are not supported on this system", 1, "unsupported"),
])
def test_secure_boot_mokutil(text, rc, state):
    fact = sb(text, rc)
    assert (fact["state"], fact["source"], fact["mokutil"]) == (state, "mokutil", True)
    assert fact["raw"] == text


def test_secure_boot_setup_mode():
    assert sb("SecureBoot disabled\nPlatform is in Setup Mode")["setup_mode"] is True


def test_secure_boot_without_mokutil():
    assert sb(None, efivar=" 6 0 0 0 1\n")["state"] == "enabled"
    assert sb(None, efivar=" 6 0 0 0 0\n")["state"] == "disabled"
    bios = sb(None, efi="bios")
    assert (bios["state"], bios["source"]) == ("unsupported", "firmware")
    unknown = sb(None)
    assert (unknown["state"], unknown["source"], unknown["mokutil"]) == ("unknown", None, False)


def test_package_patterns_cover_every_name_the_driver_operation_decides_on():
    """The driver operation reads only NvidiaPackages: each name its naming rules act on must be listed by it."""
    from fnmatch import fnmatch

    from gpufleet.facts.packages import DEB_PATTERNS
    from gpufleet.operations import _packaging as pkg

    names = ["nvidia-open-580", "cuda-drivers-580", "cuda-drivers", "nvidia-driver-580-server-open",
             "nvidia-headless-580-server", "nvidia-fabricmanager-580", "libnvidia-compute-580", "libcuda1",
             "xserver-xorg-video-nvidia", "xserver-xorg-video-nvidia-580", "firmware-nvidia-gsp",
             "nvidia-kernel-common-580"]
    for name in names:
        assert pkg.is_apt_driver_selector(name) or pkg.is_apt_fabricmanager(name) or pkg.is_apt_driver_component(name)
        assert any(fnmatch(name, pattern) for pattern in DEB_PATTERNS), name


def test_managed_state_command_runs_here(tmp_path):
    """ManagedState's command on this machine: every kind of path, files stat'd and hashed together (a name with
    a space and one with a backslash among them), contents and what is absent."""
    files = {tmp_path / "a.conf": b"one\n", tmp_path / "b c.conf": b"two\n", tmp_path / "back\\slash": b"",
             tmp_path / "mode600": b"secret\n"}
    for path, data in files.items():
        path.write_bytes(data)
    (tmp_path / "mode600").chmod(0o600)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("/lib/systemd/system/x.service")
    os.mkfifo(tmp_path / "fifo")
    paths = (*[str(p) for p in files], str(tmp_path / "dir"), str(tmp_path / "link"), str(tmp_path / "fifo"),
             str(tmp_path / "absent"))
    command = ManagedState().command(paths=paths, read=(str(tmp_path / "a.conf"), str(tmp_path / "absent")))
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    fact = ManagedState().process(result.stdout.splitlines())
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    entry = {"mode": None, "user": None, "group": None, "sha1": None, "target": None}
    assert fact["files"] == {
        **{str(p): {**entry, "type": "file", "mode": f"{p.stat().st_mode & 0o7777:o}",
                    "user": user, "group": group, "sha1": hashlib.sha1(data).hexdigest()} for p, data in files.items()},
        str(tmp_path / "dir"): {**entry, "type": "dir"},
        str(tmp_path / "link"): {**entry, "type": "link", "target": "/lib/systemd/system/x.service"},
        str(tmp_path / "fifo"): {**entry, "type": "other"},
        str(tmp_path / "absent"): None,
    }
    assert fact["contents"] == {str(tmp_path / "a.conf"): "one\n", str(tmp_path / "absent"): None}
    assert set(fact) == {"files", "contents"}



@pytest.mark.parametrize("release", ["os_release_ubuntu_2204.txt", "os_release_rocky_9.txt"])
def test_distribution_is_pyinfras_linux_distribution_parsed_once(release):
    """The same dict as pyinfra's LinuxDistribution for the same output; a copy per read."""
    output = ["/etc/os-release", *fixture(release).splitlines(), "---"]
    first, second = Distribution().process(output), Distribution().process(output)
    assert first == second == LinuxDistribution().process(output) and first["name"]
    first["release_meta"]["ID"] = "changed"
    assert Distribution().process(output) == LinuxDistribution().process(output)


@pytest.mark.parametrize("text", ["", "a\nb\n", "a\nb", "\n\nx\n\n", "  sp  \n\tt\\ab\\\\n %s %d\n-n\n-e x"])
def test_print_file_prints_as_cat_and_sed_do(tmp_path, text):
    """The builtin-only printing the facts use instead of cat (and of sed 's/^/|/' for ManagedState contents)."""
    path = tmp_path / "f"
    path.write_text(text)

    def out(script: str) -> bytes:
        return subprocess.run(["sh", "-c", script], capture_output=True, timeout=30, check=True).stdout

    assert out(print_file(str(path))) == out(f"cat {path}")
    assert out(print_file(f'"{path}"', "|") + "; echo") == out(f"sed 's/^/|/' {path}; echo")


def test_distribution_prints_what_pyinfras_linux_distribution_prints(tmp_path):
    """Both commands run here on one release directory: regular files (one without a last newline, one with blank
    lines and backslashes), a link to one, a broken link and a directory that match *-release."""
    (tmp_path / "os-release").write_text(fixture("os_release_ubuntu_2204.txt"))
    (tmp_path / "lsb-release").write_text('DISTRIB_ID=Ubuntu\n\nDISTRIB_DESCRIPTION="a \\\\ b"')
    (tmp_path / "redhat-release").write_text("Rocky Linux release 9.4 (Blue Onyx)\n")
    (tmp_path / "system-release").symlink_to("redhat-release")
    (tmp_path / "broken-release").symlink_to("missing")
    (tmp_path / "dir-release").mkdir()

    def run(command: str) -> str:
        here = command.replace("/etc/", f"{tmp_path}/")
        return subprocess.run(["sh", "-c", here], capture_output=True, text=True, timeout=30,
                              env={"PATH": os.environ["PATH"], "LC_ALL": "C"}).stdout

    ours, theirs = run(Distribution().command()), run(LinuxDistribution().command())
    assert ours == theirs and "DISTRIB_DESCRIPTION" in ours and "dir-release" not in ours
    assert Distribution().process(ours.splitlines()) == LinuxDistribution().process(theirs.splitlines())
