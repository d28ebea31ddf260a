"""driver.nvidia_driver: commands for given facts (bare host, converged host, branch change, flavours, NVSwitch,
quoting, RHEL 9), and the private facts it parses."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from pyinfra.api import OperationError, OperationValueError, State
from pyinfra.facts.dnf import DnfEnabledModules
from pyinfra.facts.files import Directory, File
from pyinfra.facts.rpm import RpmPackages
from pyinfra.facts.server import Arch, KernelVersion, RebootRequired, Which
from pyinfra_harness import fixture, managed_state, run_operation, wrap

from gpufleet.facts.files import ManagedState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages, PackageHolds
from gpufleet.facts.system import Distribution
from gpufleet.facts.systemd import UnitStates
from gpufleet.operations import _packaging, apt_lists, driver

REPO = "http://mirror.example.internal/nvidia/debian12/x86_64"
KEY = f"{REPO}/3bf863cc.pub"
KEYRING = "/etc/apt/keyrings/gpufleet-nvidia.asc"
SOURCE = "/etc/apt/sources.list.d/gpufleet-nvidia.list"
PIN = "/etc/apt/preferences.d/gpufleet-nvidia-driver"
NOUVEAU = "/etc/modprobe.d/blacklist-nouveau.conf"
KERNEL = "6.1.0-26-amd64"
FM_UNIT = "nvidia-fabricmanager.service"
UPDATE = apt_lists.checked_update()  # apt-get update, checked (issue 20)
APT_INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install'
)
DEBIAN = {
    "name": "Debian",
    "major": 12,
    "minor": None,
    "release_meta": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"},
}
UBUNTU = {
    "name": "Ubuntu",
    "major": 24,
    "minor": 4,
    "release_meta": {"ID": "ubuntu", "ID_LIKE": "debian", "VERSION_ID": "24.04"},
}
ROCKY = {
    "name": "Rocky Linux",
    "major": 9,
    "minor": 4,
    "release_meta": {"ID": "rocky", "ID_LIKE": "rhel centos fedora", "VERSION_ID": "9.4"},
}
VERSIONS = {"580": "580.95.05", "570": "570.172.08"}


def source_text(repo=REPO, keyring=KEYRING):
    return (
        "# Managed by gpufleet: NVIDIA driver repository (flat, like NVIDIA's CUDA repositories).\n"
        f"deb [signed-by={keyring}] {repo.rstrip('/')}/ /\n"
    )


def policy(packages):
    """apt-cache policy of the simulated repository: every branch at its version, the pin gives candidates (the
    branch of the pinning package asked for with them, else 580)."""
    known = {}
    pinned = next((name.rsplit("-", 1)[1] for name in packages if name.startswith("nvidia-driver-pinning-")), "580")
    for name in packages:
        if name in ("nvidia-fabricmanager", "nvidia-open", "cuda-drivers"):  # NVIDIA's plain names: the pin picks
            versions = [{"version": f"{VERSIONS[b]}-1", "priority": 1000 if b == pinned else -1} for b in VERSIONS]
            known[name] = {"installed": None, "candidate": f"{VERSIONS[pinned]}-1", "versions": versions}
            continue
        match = next((b for b in VERSIONS if f"-{b}" in name), None)
        if match:
            version = f"{VERSIONS[match]}-1"
            known[name] = {
                "installed": None,
                "candidate": version,
                "versions": [{"version": version, "priority": 1000}],
            }
    return known


def gpus(status="absent", version=None):
    return {"status": status, "driver_version": version, "gpus": [], "lost_gpus": [], "error": None}


def unit_states(units, running: bool) -> dict:
    """UnitStates of a loaded unit, enabled and running or disabled and stopped."""
    state = {"load_state": "loaded", "active_state": "active" if running else "inactive",
             "sub_state": "running" if running else "dead", "unit_file_state": "enabled" if running else "disabled",
             "need_daemon_reload": False}
    return {unit: dict(state) for unit in units}


def host_facts(facts: dict, extra: dict | None) -> dict:
    """A host without the driver, its services or a pending reboot: ``facts`` (OS, packages), then ``extra``."""
    return {
        Directory: lambda path: False,
        driver._PathExists: lambda path: False,
        GpuInventory: gpus(),
        RebootRequired: False,
        UnitStates: lambda units: unit_states(units, running=False),
        **facts,
        **(extra or {}),
    }


def nvidia_packages(installed: dict | None = None, holds=()) -> dict:
    """The ``NvidiaPackages`` fact of a dpkg host: ``installed`` maps names to {version}, ``holds`` are held."""
    packages = {name: {"version": version, "status": "hi " if name in holds else "ii ", "installed": True,
                       "held": name in holds}
                for name, versions in (installed or {}).items() for version in versions}
    return {"manager": "dpkg", "packages": packages, "held": sorted(n for n in packages if n in holds), "error": None}


def apt_facts(managed: dict[str, str] | None = None, installed=None, holds=(), extra: dict | None = None):
    """Facts of an apt host: ``managed`` maps each gpufleet-managed file that exists to its content."""
    managed = managed or {}

    def file(path):
        if path in managed:
            return {"mode": 644, "user": "root", "group": "root", "size": len(managed[path]), "mtime": None}
        return None

    return host_facts({
        Distribution: DEBIAN,
        File: file,  # the keyring (files.download)
        ManagedState: managed_state(files=managed),
        Which: lambda command: {"curl": "/usr/bin/curl", "update-initramfs": "/usr/sbin/update-initramfs"}.get(command),
        KernelVersion: KERNEL,
        driver._AptCachePolicy: policy,
        NvidiaPackages: nvidia_packages(installed, holds),
    }, extra)


def converged(branch="580", style="nvidia", flavour="open", nvswitch=True, extra: dict | None = None):
    """Facts of a host this operation already converged (branch 580 loaded and running)."""
    names = [_packaging.driver_package(branch, flavour, style)]
    names += [pinning] if (pinning := _packaging.pinning_package(branch, style)) else []
    if nvswitch:
        names.append(_packaging.fabricmanager_package(branch, style))
    version = f"{VERSIONS[branch]}-1"
    managed = {
        KEYRING: "key",
        SOURCE: source_text(),
        PIN: _packaging.apt_pin(branch),
        NOUVEAU: driver.NOUVEAU_BLACKLIST,
    }
    facts = apt_facts(
        managed,
        installed={name: {version} for name in names},
        holds=names,
        extra={
            driver._PathExists: lambda path: True,
            GpuInventory: gpus("ok", VERSIONS[branch]),
            UnitStates: lambda units: unit_states(units, running=True),
        },
    )
    facts.update(extra or {})
    return facts


def created(path: str, content: str) -> list[str]:
    """The commands that write a file gpufleet manages where there was none (``put_file``)."""
    return [f"mkdir -p {path.rsplit('/', 1)[0]}", f"upload {path}\n{content}",
            f"chown root:root {path} && chmod 644 {path}"]


def run(facts, **kwargs):
    args = {"branch": "580", "flavour": "open", "repo_url": REPO, "nvswitch": True}
    args.update(kwargs)
    return run_operation(driver.nvidia_driver, facts=facts, **args)


# ------------------------------------------------------------------------------------------ apt


def test_bare_debian_host_gets_repository_pin_blacklist_driver_fabricmanager_and_holds():
    headers = f"linux-headers-{KERNEL}"

    def with_headers(packages):
        found = policy(packages)
        if headers in packages:
            found[headers] = {"installed": None, "candidate": "6.1.112-1", "versions": []}
        return found

    commands, noops = run(apt_facts(extra={driver._AptCachePolicy: with_headers}))
    assert commands[0] == f"mkdir -p {driver.KEYRING_DIR}"
    assert commands[1].startswith(f"curl -sSLf {KEY} -o ")
    assert commands[2].endswith(f" {KEYRING}") and commands[2].startswith("mv ")
    assert commands[3] == f"chmod 644 {KEYRING}"
    assert commands[4:7] == created(SOURCE, source_text())
    assert commands[7:10] == created(PIN, _packaging.apt_pin("580"))
    assert commands[10:] == [
        UPDATE,
        *created(NOUVEAU, "# Managed by gpufleet: keep nouveau away from NVIDIA GPUs (the NVIDIA driver needs them)."
                 "\nblacklist nouveau\noptions nouveau modeset=0\n"),
        f"update-initramfs -u || {{ rm -f {NOUVEAU}; exit 1; }}",
        f"{APT_INSTALL} {headers}",
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages "
        "nvidia-driver-pinning-580 nvidia-open=580.95.05-1 nvidia-fabricmanager=580.95.05-1",
        "apt-mark hold nvidia-open nvidia-driver-pinning-580 nvidia-fabricmanager",
        "systemctl daemon-reload",
        f"systemctl enable {FM_UNIT}",
        f"systemctl start {FM_UNIT}",
    ]
    assert commands.count(UPDATE) == 1
    assert not any("reboot" in noop for noop in noops)


def test_debian_13_kernel_headers_are_named_and_asked_for_as_apt_knows_them():
    """Debian 13's kernels are ``6.12.107+deb13-amd64``: the ``+`` is a regex character to apt-cache, so the
    headers' name is asked for only where apt lists it, and installed by that exact name."""
    kernel = "6.12.107+deb13-amd64"
    headers = f"linux-headers-{kernel}"
    trixie = {**DEBIAN, "major": 13, "release_meta": {"ID": "debian", "VERSION_ID": "13", "VERSION_CODENAME": "trixie"}}

    def with_headers(packages):
        found = policy(packages)
        if headers in packages:
            found[headers] = {"installed": None, "candidate": "6.12.107-1", "versions": []}
        return found

    commands, _ = run(apt_facts(extra={Distribution: trixie, KernelVersion: kernel,
                                       driver._AptCachePolicy: with_headers}))
    assert f"{APT_INSTALL} {headers}" in commands
    assert driver._AptCachePolicy().command((headers,)).startswith(
        f"set --; if apt-cache pkgnames {headers} | grep -qxF -e {headers}; then")


def test_pin_admits_only_the_branch_first_record_wins():
    pin = _packaging.apt_pin("580")
    records = pin.split("\n\n")[1:]
    assert "Pin: version /^([0-9]+:)?580\\./\nPin-Priority: 1000" in records[0]
    assert "Pin: version *\nPin-Priority: -1" in records[1]
    for record in records:
        names = next(line for line in record.splitlines() if line.startswith("Package: ")).split()[1:]
        assert {
            "nvidia-driver-580-server-open",
            "nvidia-fabricmanager-580",
            "nvidia-fabricmanager",
            "cuda-drivers",
            "nvidia-open",
        } <= set(names)
        assert not any("*" in name or name.startswith("/") for name in names)  # globs cost apt ~20 ms each


def test_converged_host_is_noop():
    commands, noops = run(converged())
    assert commands == []
    assert "nvidia-open, nvidia-driver-pinning-580, nvidia-fabricmanager installed (580.95.05-1) and held" in noops
    assert f"{FM_UNIT} is enabled and running" in noops
    assert not any("reboot" in noop for noop in noops)


def test_converged_host_missing_a_hold_gets_only_the_hold():
    installed = {"nvidia-open": {"580.95.05-1"}, "nvidia-driver-pinning-580": {"580.95.05-1"},
                 "nvidia-fabricmanager": {"580.95.05-1"}}
    holds = {"nvidia-open", "nvidia-driver-pinning-580"}
    commands, _ = run(converged(extra={NvidiaPackages: nvidia_packages(installed, holds=holds)}))
    assert commands == ["apt-mark hold nvidia-fabricmanager"]


def test_the_whole_driver_release_is_held_not_container_tools_or_other_versions():
    installed = {
        "nvidia-open": {"580.95.05-1"},
        "nvidia-driver-pinning-580": {"580.95.05-1"},
        "nvidia-fabricmanager": {"580.95.05-1"},
        "libnvidia-compute-580": {"580.95.05-0ubuntu1"},
        "nvidia-kernel-common-580": {"580.95.05-0ubuntu1"},
        "nvidia-firmware-570": {"570.172.08-0ubuntu1"},
        "libnvidia-container1": {"1.17.8-1"},
        "nvidia-container-toolkit": {"1.17.8-1"},
        "bash": {"5.2.15-2+b7"},
    }
    holds = {"nvidia-open", "nvidia-driver-pinning-580", "nvidia-fabricmanager"}
    commands, _ = run(converged(extra={NvidiaPackages: nvidia_packages(installed, holds)}))
    assert commands == ["apt-mark hold libnvidia-compute-580 nvidia-kernel-common-580"]


def test_branch_change_installs_other_branch_removes_old_and_reports_reboot_pending():
    commands, noops = run(converged("580"), branch="570")
    assert commands == [
        f"upload {PIN}\n{_packaging.apt_pin('570')}",  # an existing file of root, mode 644: its text changes
        UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-pinning-570 "
        "nvidia-open=570.172.08-1 nvidia-fabricmanager-570=570.172.08-1 nvidia-driver-pinning-580- "
        "nvidia-fabricmanager-",
        "apt-mark hold nvidia-open nvidia-driver-pinning-570 nvidia-fabricmanager-570",
        "systemctl daemon-reload",
    ]
    assert f"{FM_UNIT} starts after the reboot (it only runs with the driver of its own version loaded)" in noops
    assert any(
        noop.startswith("reboot pending: NVIDIA driver 580.95.05 is loaded, 570.172.08 is installed") for noop in noops
    )


def test_reboot_pending_reboots_only_when_allowed():
    facts = converged(extra={GpuInventory: gpus("ok", "570.172.08")})
    commands, noops = run(facts)
    assert commands == []
    assert any(
        noop.startswith("reboot pending: NVIDIA driver 570.172.08 is loaded, 580.95.05 is installed") for noop in noops
    )

    commands, _ = run(facts, allow_reboot=True)
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in commands
    assert commands[-2:] == ["function wait_and_reconnect", "function clean_sudo_info"]


@pytest.mark.parametrize(
    "status, reason",
    [
        ("version_mismatch", "the loaded NVIDIA kernel module is not the installed driver"),
        ("driver_not_loaded", "is installed but its kernel module is not loaded"),
    ],
)
def test_driver_not_loaded_or_mismatched_means_reboot_pending(status, reason):
    _, noops = run(converged(extra={GpuInventory: gpus(status)}))
    assert any(noop.startswith("reboot pending") and reason in noop for noop in noops)


def test_reboot_required_flag_means_reboot_pending():
    _, noops = run(converged(extra={RebootRequired: True}))
    assert any("reboot pending: the system flags a pending reboot (/var/run/reboot-required)" in n for n in noops)


@pytest.mark.parametrize(
    "distro, style, flavour, package",
    [
        (UBUNTU, None, "open", "nvidia-driver-580-server-open"),
        (UBUNTU, None, "proprietary", "nvidia-driver-580-server"),
        (DEBIAN, None, "open", "nvidia-open"),
        (DEBIAN, None, "proprietary", "cuda-drivers"),
        (DEBIAN, "ubuntu", "open", "nvidia-driver-580-server-open"),
        (UBUNTU, "nvidia", "proprietary", "cuda-drivers"),
    ],
)
def test_open_and_proprietary_package_names_per_style(distro, style, flavour, package):
    commands, _ = run(
        apt_facts(extra={Distribution: distro}), flavour=flavour, packages_style=style, nvswitch=False
    )
    install = next(c for c in commands if "--allow-change-held-packages" in c)
    assert install.endswith(f" {package}=580.95.05-1")
    assert any(command.startswith(f"apt-mark hold {package}") for command in commands)


def test_flavour_change_replaces_the_metapackage_and_flags_the_reboot():
    facts = converged(flavour="open", nvswitch=False)
    commands, _ = run(facts, flavour="proprietary", nvswitch=False)
    assert commands == [
        UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages cuda-drivers=580.95.05-1 nvidia-open-",
        "echo '*** System restart required ***' > /var/run/reboot-required "
        "&& echo cuda-drivers >> /var/run/reboot-required.pkgs",
        "apt-mark hold cuda-drivers nvidia-driver-pinning-580",
    ]


def test_style_change_of_the_same_flavour_replaces_the_metapackage_without_reboot_flag():
    facts = converged(style="nvidia", nvswitch=False)
    commands, _ = run(facts, packages_style="ubuntu", nvswitch=False)
    assert commands == [
        UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages "
        "nvidia-driver-580-server-open=580.95.05-1 nvidia-driver-pinning-580- nvidia-open-",
        "apt-mark hold nvidia-driver-580-server-open",
    ]


def test_style_change_on_nvswitch_swaps_the_fabric_manager_name_in_the_same_transaction():
    """NVIDIA's repositories name branch 580's fabric manager ``nvidia-fabricmanager``, Ubuntu's archive
    ``nvidia-fabricmanager-580`` (tests/unit/test_upstream_nvidia_packaging.py holds the rule to upstream)."""
    commands, _ = run(converged(style="nvidia"), packages_style="ubuntu")
    assert commands[:3] == [
        UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages "
        "nvidia-driver-580-server-open=580.95.05-1 nvidia-fabricmanager-580=580.95.05-1 "
        "nvidia-driver-pinning-580- nvidia-fabricmanager- nvidia-open-",
        "apt-mark hold nvidia-driver-580-server-open nvidia-fabricmanager-580",
    ]


def test_without_nvswitch_no_fabric_manager_and_no_unit():
    commands, _ = run(apt_facts(), nvswitch=False)
    assert not any("fabricmanager" in c for c in commands if not c.startswith("upload "))
    assert not any(c.startswith("systemctl") for c in commands)
    assert commands[-1] == "apt-mark hold nvidia-open nvidia-driver-pinning-580"


def test_fabric_manager_of_another_version_is_replaced_by_the_drivers_version_and_restarted():
    facts = converged(
        extra={NvidiaPackages: nvidia_packages(
            {"nvidia-open": {"580.95.05-1"}, "nvidia-driver-pinning-580": {"580.95.05-1"},
             "nvidia-fabricmanager": {"580.65.06-1"}},
            holds={"nvidia-open", "nvidia-driver-pinning-580", "nvidia-fabricmanager"})}
    )
    commands, _ = run(facts)
    assert commands == [
        UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages nvidia-fabricmanager=580.95.05-1",
        "apt-mark hold nvidia-open nvidia-driver-pinning-580 nvidia-fabricmanager",
        "systemctl daemon-reload",
        f"systemctl restart {FM_UNIT}",
    ]


def test_fabric_manager_missing_in_the_repository_at_the_drivers_version_fails_clearly():
    def no_match(packages):
        found = policy(packages)
        if "nvidia-fabricmanager" in found:
            found["nvidia-fabricmanager"]["versions"] = [{"version": "580.65.06-1", "priority": 1000}]
        return found

    with pytest.raises(OperationError, match=r"nvidia-fabricmanager: .* no version 580\.95\.05.*exactly"):
        run(apt_facts(extra={driver._AptCachePolicy: no_match}))


def test_branch_missing_from_the_repository_fails_clearly():
    with pytest.raises(OperationError, match=r"nvidia-driver-pinning-580: NVIDIA.s branch pinning package is not"):
        run(apt_facts(extra={driver._AptCachePolicy: lambda packages: {}}))


def test_branch_missing_while_executing_fails_only_this_host(monkeypatch):
    # issue 7: an exception at execute time stops every host (-y); the host is refused, the others go on
    monkeypatch.setattr(State, "is_executing", True)
    commands, _ = run(apt_facts(extra={driver._AptCachePolicy: lambda packages: {}}))
    assert commands[-1] == (
        "echo 'gpufleet: error: nvidia-driver-pinning-580: NVIDIA'\"'\"'s branch pinning package is not offered by the "
        f"configured repositories (repository {REPO}); check that the repository or mirror carries it' >&2; exit 1"
    )
    assert not any("apt-mark hold" in command or "install --allow" in command for command in commands)


def test_unsupported_distribution_while_executing_fails_only_this_host(monkeypatch):
    monkeypatch.setattr(State, "is_executing", True)
    commands, _ = run(apt_facts(extra={Distribution: {"name": "Alpine", "major": 3,
                                                           "release_meta": {"ID": "alpine"}}}))
    assert commands == [
        "echo 'gpufleet: error: unsupported distribution '\"'\"'Alpine'\"'\"': the NVIDIA driver operations support "
        "Debian/Ubuntu (apt) and RHEL-family 9 (dnf)' >&2; exit 1"
    ]


def test_headers_unavailable_are_reported_not_failed():
    # installed, not loaded: DKMS may have to build for the running kernel, and no repository offers its headers
    commands, noops = run(converged(extra={driver._PathExists: lambda path: False,
                                           GpuInventory: gpus("driver_not_loaded")}))
    assert commands == []
    assert any(
        noop.startswith(f"kernel headers: linux-headers-{KERNEL} is not installed and no configured repository")
        for noop in noops
    )


@pytest.mark.parametrize("loaded", ["ok", "other version"])
def test_headers_are_looked_at_only_when_dkms_may_build(loaded):
    """A host running the driver it has installed needs no module build: its headers are neither looked for nor
    missed (a custom kernel is not warned about on every run); a loaded driver of another version is."""
    looked = []
    facts = converged(extra={driver._PathExists: lambda path: looked.append(path) or False,
                             driver._AptCachePolicy: lambda packages: looked.append(packages) or {}})
    if loaded == "other version":
        facts[GpuInventory] = gpus("ok", VERSIONS["570"])
    commands, noops = run(facts)
    headers_noted = any(noop.startswith("kernel headers:") for noop in noops)
    assert (bool(looked), headers_noted) == ((False, False) if loaded == "ok" else (True, True))


def test_rhel9_headers_only_when_dkms_may_build():
    looked = []
    facts = rhel_converged(extra={driver._PathExists: lambda path: looked.append(path) or False,
                                  driver._DnfAvailable: lambda package: False})
    _, noops = run(facts)
    assert looked == [] and not any(noop.startswith("kernel headers:") for noop in noops)
    facts[GpuInventory] = gpus("driver_not_loaded")
    _, noops = run(facts)
    assert looked and any(noop.startswith("kernel headers: kernel-devel-") for noop in noops)


def test_headers_present_skip_the_repository_query():
    calls = []
    facts = converged(extra={driver._AptCachePolicy: lambda packages: calls.append(packages) or {}})
    run(facts)
    assert calls == []


def test_headers_not_wanted_are_not_looked_at():
    facts = converged(extra={driver._PathExists: lambda path: pytest.fail("headers looked at")})
    commands, _ = run(facts, kernel_headers=False)
    assert commands == []


def test_no_initramfs_tool_is_reported_and_the_blacklist_still_written():
    managed = {KEYRING: "key", SOURCE: source_text(), PIN: _packaging.apt_pin("580")}
    facts = converged(extra={Which: lambda command: None})
    facts[File] = lambda path: {"mode": 644} if path in managed else None
    facts[ManagedState] = managed_state(files=managed)
    commands, noops = run(facts)
    assert commands == created(NOUVEAU, driver.NOUVEAU_BLACKLIST)
    assert any("neither update-initramfs nor dracut" in noop for noop in noops)


def test_repository_url_with_shell_characters_is_quoted():
    url = "https://mirror.example/nv;id=$(reboot)/it's/x86_64"
    commands, _ = run(apt_facts(), repo_url=url, nvswitch=False)
    download = next(c for c in commands if c.startswith("curl "))
    assert download.startswith("curl -sSLf 'https://mirror.example/nv;id=$(reboot)/it'\"'\"'s/x86_64/3bf863cc.pub' -o ")
    assert f"upload {SOURCE}\n{source_text(url)}" in commands


def test_keyring_url_with_shell_characters_is_quoted_and_binary_keys_go_to_gpg():
    key = "https://keys.example/a&b/nvidia`id`.gpg"
    commands, _ = run(apt_facts(), keyring_url=key, nvswitch=False)
    download = next(c for c in commands if c.startswith("curl "))
    assert download.startswith("curl -sSLf 'https://keys.example/a&b/nvidia`id`.gpg' -o ")
    assert f"upload {SOURCE}\n{source_text(keyring='/etc/apt/keyrings/gpufleet-nvidia.gpg')}" in commands


@pytest.mark.parametrize(
    "url",
    ["http://mirror.example/nvidia repo/", "ftp://mirror.example/", "mirror.example/x", "http://mirror.example/\nx"],
)
def test_urls_that_cannot_go_into_a_source_line_are_refused(url):
    with pytest.raises(OperationValueError, match="repo_url .*expected an http://, https:// or file:// URL"):
        run(apt_facts(), repo_url=url)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"branch": "latest"}, "branch 'latest': expected a driver branch number"),
        ({"branch": "580; reboot"}, "branch '580; reboot'"),
        ({"flavour": "auto"}, "flavour 'auto': expected one of open, proprietary"),
        ({"packages_style": "debian"}, "packages_style 'debian': expected one of ubuntu, nvidia"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(OperationValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(apt_facts(), **kwargs)


def test_branch_may_be_an_int():
    commands, _ = run(converged(), branch=580)
    assert commands == []


def test_unsupported_distribution_is_refused():
    with pytest.raises(OperationError, match="unsupported distribution 'Alpine'"):
        run(apt_facts(extra={Distribution: {"name": "Alpine", "major": 3, "release_meta": {"ID": "alpine"}}}))


def test_default_repository_is_nvidias_for_the_release_and_cpu():
    facts = apt_facts(extra={Distribution: UBUNTU, Arch: "aarch64"})
    commands, _ = run(facts, repo_url=None, nvswitch=False)
    base = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa"
    assert next(c for c in commands if c.startswith("curl ")).startswith(f"curl -sSLf {base}/3bf863cc.pub -o ")
    assert f"upload {SOURCE}\n{source_text(base)}" in commands


def test_default_key_on_debian_13_is_the_key_of_nvidias_debian13_repository():
    """NVIDIA signs repos/debian13/ with its own key (8793F200.pub); Debian 12's repository keeps 3bf863cc.pub."""
    for version, codename, key in (("13", "trixie", "8793F200.pub"), ("12", "bookworm", "3bf863cc.pub")):
        distro = {**DEBIAN, "major": int(version),
                  "release_meta": {"ID": "debian", "VERSION_ID": version, "VERSION_CODENAME": codename}}
        commands, _ = run(apt_facts(extra={Distribution: distro, Arch: "x86_64"}), repo_url=None, nvswitch=False)
        base = f"https://developer.download.nvidia.com/compute/cuda/repos/debian{version}/x86_64"
        assert next(c for c in commands if c.startswith("curl ")).startswith(f"curl -sSLf {base}/{key} -o ")
        assert f"upload {SOURCE}\n{source_text(base)}" in commands


def test_nvidia_repository_operation_alone():
    commands, _ = run_operation(driver.nvidia_repository, facts=apt_facts(), repo_url=REPO)
    assert commands[-1] == UPDATE
    commands, _ = run_operation(driver.nvidia_repository, facts=converged(), repo_url=REPO)
    assert commands == []


# ------------------------------------------------------------------------------------------ dnf


def dnf_facts(extra: dict | None = None):
    return host_facts({
        Distribution: ROCKY,
        Arch: "x86_64",
        File: lambda path: None,
        ManagedState: managed_state(),
        Which: lambda command: "/usr/bin/dracut" if command == "dracut" else None,
        KernelVersion: "5.14.0-427.13.1.el9_4.x86_64",
        driver._DnfAvailable: lambda package: True,
        RpmPackages: {},
        DnfEnabledModules: {},
        PackageHolds: set(),
    }, extra)


def test_rhel9_bare_host_module_stream_fabric_manager_versionlock():
    commands, noops = run(dnf_facts(), repo_url=None)
    base = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/"
    assert commands == [
        *created("/etc/yum.repos.d/gpufleet-nvidia.repo", "# Managed by gpufleet: NVIDIA driver repository.\n"
                 f"[gpufleet-nvidia]\nname=NVIDIA driver repository (gpufleet)\nbaseurl={base}\nenabled=1\n"
                 f"gpgcheck=1\ngpgkey={base}D42D0685.pub\n"),
        *created(NOUVEAU, driver.NOUVEAU_BLACKLIST),
        f"dracut -f || {{ rm -f {NOUVEAU}; exit 1; }}",
        "dnf install -y kernel-devel-5.14.0-427.13.1.el9_4.x86_64",
        "dnf module install -y --allowerasing nvidia-driver:580-open",
        "dnf install -y \"nvidia-fabric-manager-$(rpm -q --qf '%{VERSION}' nvidia-driver)\"",
        "dnf install -y python3-dnf-plugin-versionlock",
        "dnf versionlock add nvidia-driver 'nvidia-driver-*' 'kmod-nvidia-*' nvidia-fabric-manager",
        "systemctl daemon-reload",
        f"systemctl enable {FM_UNIT}",
        f"systemctl start {FM_UNIT}",
    ]


def rhel_converged(stream="580-open", extra: dict | None = None):
    repo = (
        "# Managed by gpufleet: NVIDIA driver repository.\n[gpufleet-nvidia]\nname=NVIDIA driver repository "
        f"(gpufleet)\nbaseurl={REPO}\nenabled=1\ngpgcheck=1\ngpgkey={REPO}/D42D0685.pub\n"
    )
    contents = {"/etc/yum.repos.d/gpufleet-nvidia.repo": repo, NOUVEAU: driver.NOUVEAU_BLACKLIST}
    facts = dnf_facts(
        extra={
            ManagedState: managed_state(files=contents),
            driver._PathExists: lambda path: True,
            RpmPackages: {
                "nvidia-driver": {"580.95.05-1.el9"},
                "nvidia-fabric-manager": {"580.95.05-1"},
                "python3-dnf-plugin-versionlock": {"4.3.0-13.el9"},
            },
            DnfEnabledModules: {"nvidia-driver": stream},
            PackageHolds: {"nvidia-driver", "nvidia-fabric-manager", "kmod-nvidia-open-dkms"},
            GpuInventory: gpus("ok", "580.95.05"),
            UnitStates: lambda units: unit_states(units, running=True),
        }
    )
    facts.update(extra or {})
    return facts


def test_rhel9_converged_is_noop():
    commands, noops = run(rhel_converged())
    assert commands == []
    assert "nvidia-driver:580-open installed (580.95.05-1.el9) and version-locked" in noops


def test_rhel9_branch_change_unlocks_resets_stream_and_reinstalls():
    commands, _ = run(rhel_converged(), branch="570", flavour="proprietary")
    assert commands == [
        "dnf versionlock delete kmod-nvidia-open-dkms nvidia-driver nvidia-fabric-manager",
        "dnf module reset -y nvidia-driver",
        "dnf module install -y --allowerasing nvidia-driver:570-dkms",
        "dnf remove -y nvidia-fabric-manager",
        "dnf install -y \"nvidia-fabric-manager-$(rpm -q --qf '%{VERSION}' nvidia-driver)\"",
        "dnf versionlock add nvidia-driver 'nvidia-driver-*' 'kmod-nvidia-*' nvidia-fabric-manager",
        "systemctl daemon-reload",
        f"systemctl restart {FM_UNIT}",
    ]


# ---------------------------------------------------------------------------------------- facts

POLICY_OUTPUT = """\
nvidia-driver-580-server-open:
  Installed: 580.95.05
  Candidate: 580.95.05
  Version table:
 *** 580.95.05 1000
        500 http://10.77.21.1:8731  Packages
        100 /var/lib/dpkg/status
nvidia-fabricmanager-570:
  Installed: (none)
  Candidate: (none)
  Version table:
     570.172.08-1 -1
        500 http://10.77.21.1:8731  Packages
""".splitlines()


def test_apt_cache_policy_parses_installed_candidate_and_version_table():
    assert driver._AptCachePolicy().process(POLICY_OUTPUT) == {
        "nvidia-driver-580-server-open": {
            "installed": "580.95.05",
            "candidate": "580.95.05",
            "versions": [{"version": "580.95.05", "priority": 1000}],
        },
        "nvidia-fabricmanager-570": {
            "installed": None,
            "candidate": None,
            "versions": [{"version": "570.172.08-1", "priority": -1}],
        },
    }
    assert driver._AptCachePolicy().command(("nvidia-driver-580-open", "nvidia-fabricmanager-580")) == (
        'set --; set -- "$@" nvidia-driver-580-open; set -- "$@" nvidia-fabricmanager-580; '
        'if [ $# -gt 0 ]; then LC_ALL=C apt-cache policy "$@"; fi'
    )
    # a name with a regex character is asked for only where apt knows it (else apt-cache scans every name)
    assert driver._AptCachePolicy().command(("linux-headers-6.1 x",)) == (
        "set --; if apt-cache pkgnames 'linux-headers-6.1 x' | grep -qxF -e 'linux-headers-6.1 x'; "
        "then set -- \"$@\" 'linux-headers-6.1 x'; fi; if [ $# -gt 0 ]; then LC_ALL=C apt-cache policy \"$@\"; fi"
    )


def test_apt_cache_policy_of_apt_3_parses_as_apt_2s():
    """apt 3.0's ``apt-cache policy`` (Debian 13, real capture on a simulated host) in the same shape."""
    lines = fixture("apt_cache_policy_debian_13.txt").splitlines()
    parsed = driver._AptCachePolicy().process(lines)
    assert parsed["nvidia-open-580"] == {"installed": "580.95.05-1", "candidate": "580.95.05-1",
                                         "versions": [{"version": "580.95.05-1", "priority": 1000}]}
    assert parsed["nvidia-open-570"] == {"installed": None, "candidate": "570.172.08-1",
                                         "versions": [{"version": "570.172.08-1", "priority": 500}]}
    assert parsed["prometheus-node-exporter"]["candidate"] == "1.9.0-1+b4"
    assert sorted(parsed) == ["nvidia-fabricmanager-580", "nvidia-open-570", "nvidia-open-580",
                              "prometheus-node-exporter"]


@pytest.mark.skipif(shutil.which("apt-cache") is None, reason="needs apt-cache (a Debian/Ubuntu machine)")
def test_apt_cache_policy_command_answers_as_plain_apt_cache_policy():
    """The real apt-cache of this machine: the guarded command prints exactly what ``apt-cache policy`` prints
    for a known name with a dot, a known plain name and an unknown kernel's headers."""
    known = subprocess.run(["apt-cache", "pkgnames", "python3."], capture_output=True, text=True).stdout.split()
    names = (*sorted(known)[:1], "bash", "linux-headers-0.0.0-gpufleet-none")
    command = driver._AptCachePolicy().command(names)
    guarded = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    plain = subprocess.run(["sh", "-c", "LC_ALL=C apt-cache policy " + " ".join(names)], capture_output=True,
                           text=True)
    assert (guarded.returncode, guarded.stdout) == (plain.returncode, plain.stdout)
    parsed = driver._AptCachePolicy().process(guarded.stdout.splitlines())
    assert "bash" in parsed and "linux-headers-0.0.0-gpufleet-none" not in parsed
    assert not known or sorted(known)[0] in parsed


def test_holds_and_versionlocks_and_availability_facts():
    apt = wrap("apt-holds", "nvidia-open-580\nnvidia-fabricmanager-580:amd64\n") + wrap("versionlock", None)
    assert PackageHolds().process(apt) == {"nvidia-open-580", "nvidia-fabricmanager-580"}
    dnf4 = wrap("apt-holds", None) + wrap(
        "versionlock", "nvidia-driver-3:580.95.05-1.el9.*\nkmod-nvidia-open-dkms-3:580.95.05-1.el9.*\nLast metadata x")
    assert PackageHolds().process(dnf4) == {"nvidia-driver", "kmod-nvidia-open-dkms"}
    dnf5 = wrap("apt-holds", None) + wrap(
        "versionlock", "# Added by 'versionlock add' command on 2026-01-05 10:00:00\nPackage name: nvidia-driver\n"
        "evr = 3:580.95.05-1.el9\n\nPackage name: nvidia-fabric-manager\nevr = 580.95.05-1")
    assert PackageHolds().process(dnf5) == {"nvidia-driver", "nvidia-fabric-manager"}
    assert PackageHolds().process(wrap("apt-holds", None) + wrap("versionlock", "No such command", 2)) == set()
    assert "apt-mark showhold" in PackageHolds().command() and "dnf -q versionlock list" in PackageHolds().command()
    assert driver._DnfAvailable().process(["Available Packages", "kernel-devel.x86_64  5.14.0-427.el9  baseos"])
    assert not driver._DnfAvailable().process([])
    assert driver._PathExists().process(["yes"]) and not driver._PathExists().process(["no"])


def test_upstream_version():
    assert _packaging.upstream_version("580.95.05-0ubuntu0.24.04.1") == "580.95.05"
    assert _packaging.upstream_version("3:580.95.05-1.el9") == "580.95.05"
    assert _packaging.upstream_version("580.95.05") == "580.95.05"
    assert _packaging.upstream_version(None) is None


def test_a_key_fingerprint_is_checked_before_the_key_is_installed():
    from gpufleet.facts.repository import KeyFingerprints
    from gpufleet.operations import _repo_keys

    fingerprint = _repo_keys.NVIDIA_APT_KEY_FINGERPRINT
    absent = {KeyFingerprints: lambda path: {"present": False, "gpg": None, "fingerprints": []}}
    commands, _ = run_operation(driver.nvidia_repository, facts=apt_facts(extra=absent), repo_url=REPO,
                                keyring_fingerprint=fingerprint)
    fetch = next(c for c in commands if "gpg --batch --show-keys" in c)
    assert f"grep -qx {fingerprint}" in fetch and f"mv -f \"$tmp\" {KEYRING}" in fetch
    assert not any(c.startswith("curl ") for c in commands)  # never the unchecked download
    assert commands[-1] == UPDATE
    other = {KeyFingerprints: lambda path: {"present": True, "gpg": True, "fingerprints": ["AB" * 20]}}
    commands, _ = run_operation(driver.nvidia_repository, facts=converged(extra=other), repo_url=REPO,
                                keyring_fingerprint=fingerprint)
    assert any("gpg --batch --show-keys" in c for c in commands)  # a key without it is replaced (if it checks)
    trusted = {KeyFingerprints: lambda path: {"present": True, "gpg": True, "fingerprints": [fingerprint]}}
    commands, _ = run_operation(driver.nvidia_repository, facts=converged(extra=trusted), repo_url=REPO,
                                keyring_fingerprint=fingerprint)
    assert commands == []


def test_a_host_converged_with_the_older_branch_named_package_moves_to_nvidias_names_without_reboot():
    """Hosts gpufleet converged before it followed NVIDIA's guide carry ``nvidia-open-580`` (held): one transaction
    installs NVIDIA's pinning package and ``nvidia-open`` at the same version and removes the old name; the loaded
    driver is the installed one, so no reboot is flagged or pending."""
    old = nvidia_packages({"nvidia-open-580": {"580.95.05-1"}, "nvidia-fabricmanager": {"580.95.05-1"}},
                          holds={"nvidia-open-580", "nvidia-fabricmanager"})
    commands, noops = run(converged(extra={NvidiaPackages: old}))
    assert commands == [
        UPDATE,
        f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-pinning-580 "
        "nvidia-open=580.95.05-1 nvidia-open-580-",
        "apt-mark hold nvidia-open nvidia-driver-pinning-580 nvidia-fabricmanager",
    ]
    assert not any("reboot" in noop for noop in noops)


def test_nvidias_unsuffixed_metapackage_of_another_branch_is_not_the_wanted_driver():
    installed = nvidia_packages({"nvidia-open": {"570.172.08-1"}, "nvidia-driver-pinning-570": {"570.172.08-1"}},
                                holds={"nvidia-open", "nvidia-driver-pinning-570"})
    commands, _ = run(converged(nvswitch=False, extra={NvidiaPackages: installed}), nvswitch=False)
    assert f"{APT_INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-pinning-580 " \
           "nvidia-open=580.95.05-1 nvidia-driver-pinning-570-" in commands
