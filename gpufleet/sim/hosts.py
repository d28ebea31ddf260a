"""Simulated hosts: systemd-nspawn containers booting real systemd, each on its own overlay root,
network namespace, hostname, sshd and simulated GPUs.

Lifecycle: ``up`` → ``status``/``reboot``/``ssh`` → ``down``. The fleet's description lives in
``<sim dir>/fleet.json``; nothing is left behind by ``down`` (processes, mounts, namespaces, nft table).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from . import cgroups, hardware, image, network, pci, repo
from .gpu import state as gpu_state
from .hosts_paths import HW_MOUNT
from .paths import host_dir, sim_dir

REQUIRED_COMMANDS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "nft": "nftables",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "dpkg-deb": "dpkg",
    "gcc": "gcc",
    "lxcfs": "lxcfs",
}
BOOT_TIMEOUT_S = 90
STOP_TIMEOUT_S = 15


class SimError(RuntimeError):
    """A user-facing error of the simulator (printed without a traceback)."""


@dataclass(frozen=True)
class Host:
    name: str
    index: int
    address: str
    profile: str
    os: str = image.DEFAULT_OS  # the Debian release it boots (image.RELEASES); fleets saved before had only Debian 12

    @property
    def dir(self) -> Path:
        return host_dir(self.name)


@dataclass
class Fleet:
    hosts: list[Host]
    net: str
    repo_url: str
    driver: str | None

    @classmethod
    def load(cls) -> Fleet | None:
        path = sim_dir() / "fleet.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["hosts"] = [Host(**h) for h in data["hosts"]]
        return cls(**data)

    def save(self) -> None:
        (sim_dir() / "fleet.json").write_text(json.dumps(asdict(self), indent=2) + "\n")

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if name in (host.name, host.address):
                return host
        raise SimError(f"no simulated host {name!r}; hosts: {', '.join(h.name for h in self.hosts)}")


def check_requirements() -> None:
    if os.geteuid() != 0:
        raise SimError("gpufleet sim needs root (it creates network namespaces and containers)")
    missing = sorted({pkg for cmd, pkg in REQUIRED_COMMANDS.items() if shutil.which(cmd) is None})
    if missing:
        raise SimError(f"missing system packages: apt-get install {' '.join(missing)}")


def ssh_key() -> Path:
    return sim_dir() / "id_ed25519"


def known_hosts() -> Path:
    return sim_dir() / "known_hosts"


def ssh_command(host: Host, command: list[str] | str | None = None, tty: bool = False) -> list[str]:
    """ssh to a host; a list is quoted word by word, a string goes to the remote shell as ssh passes it."""
    args = ["ssh", "-i", str(ssh_key()), "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts()}",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    args.append("-t" if tty else "-T")
    args.append(f"root@{host.address}")
    if command:
        args.append(command if isinstance(command, str) else shlex.join(command))
    return args


def run_on(host: Host, command: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(ssh_command(host, command), capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------- up

def parse_host_specs(specs: list[str], default_os: str = image.DEFAULT_OS) -> list[tuple[str, str]]:
    """``PROFILE`` or ``PROFILE@OS`` per entry (``h100-sxm-8@debian13``) -> [(profile, os)], ``default_os`` where an
    entry names none; ValueError naming the entry, the bad part and what is allowed."""
    try:
        image.release(default_os)
    except image.UnknownRelease as error:
        raise ValueError(f"--os: {error}") from None
    parsed = []
    for spec in specs:
        profile, at, os_name = spec.partition("@")
        if profile not in hardware.PROFILES:
            raise hardware.UnknownProfile(profile)
        if at:
            try:
                image.release(os_name)
            except image.UnknownRelease as error:
                raise ValueError(f"--profile {spec!r}: {error}") from None
        parsed.append((profile, os_name if at else default_os))
    return parsed


def up(count: int, profiles: list[str], driver: str | None = None, inventory: Path | None = None,
       force: bool = False, net: str | None = None, os_name: str = image.DEFAULT_OS, log=print) -> Fleet:
    """Bring up ``count`` hosts (profiles assigned round-robin, each ``PROFILE`` or ``PROFILE@OS``, ``os_name`` for
    those that name no OS); return the running fleet."""
    if count < 1:
        raise SimError("--hosts must be at least 1")
    specs = parse_host_specs(profiles, os_name)
    driver_branch = repo.parse_driver_option(driver)
    check_requirements()
    net = net or network.default_net()
    if Fleet.load() is not None or (sim_dir() / "hosts").exists():
        if not force:
            raise SimError("a simulated fleet is already up (gpufleet sim down, or sim up --force)")
        down(log=log)
    fleet = Fleet(
        hosts=[Host(f"node{i + 1:02d}", i, network.host_address(net, i), *specs[i % len(specs)])
               for i in range(count)],
        net=net, repo_url=repo.url(net), driver=driver,
    )
    try:
        sim_dir().mkdir(parents=True, exist_ok=True)
        fleet.save()
        _prepare_control(fleet, log)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda h: _prepare_host(fleet, h, driver_branch), fleet.hosts))
        known_hosts().write_text("".join(
            f"{h.address} {(h.dir / 'root/etc/ssh/ssh_host_ed25519_key.pub').read_text().split(' root@')[0]}\n"
            for h in fleet.hosts))
        for host in fleet.hosts:
            _start_host(fleet, host)
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(_wait_ready, fleet.hosts))
        if inventory is not None:
            write_inventory(fleet, inventory)
    except BaseException:
        log("bring-up failed; tearing down what was created")
        down(log=lambda *_: None)
        raise
    return fleet


def base_dir(os_name: str) -> Path:
    """The read-only lower layer of every host of one release."""
    return sim_dir() / f"base-{os_name}"


def _prepare_bases(releases: set[str], log) -> None:
    legacy = sim_dir() / "base"  # the single Debian 12 layer of fleets before Debian 13 came
    if (legacy / ".gpufleet-base").exists():
        shutil.rmtree(legacy)
    for os_name in sorted(releases):
        base = base_dir(os_name)
        marker = base / ".gpufleet-base"
        if not marker.exists() or marker.read_text() != image.cache_key(os_name):
            shutil.rmtree(base, ignore_errors=True)
            image.build(os_name, log=log)
            image.extract(os_name, base)
            marker.write_text(image.cache_key(os_name))


def _prepare_control(fleet: Fleet, log) -> None:
    _prepare_bases({host.os for host in fleet.hosts}, log)
    if not ssh_key().exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_key())], check=True)
    nspawn_run = Path("/run/systemd/nspawn")
    nspawn_run.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(nspawn_run):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(nspawn_run)], check=True)
    network.setup_bridge(fleet.net)
    _start_lxcfs()
    repo.serve(fleet.net, log=log)


def _start_lxcfs() -> None:
    mountpoint = sim_dir() / "lxcfs"
    mountpoint.mkdir(exist_ok=True)
    if os.path.ismount(mountpoint):
        return
    with open(sim_dir() / "lxcfs.log", "ab") as out:
        command = ["lxcfs", "--foreground", f"--pidfile={sim_dir() / 'lxcfs.lock'}", str(mountpoint)]
        proc = subprocess.Popen(command, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    (sim_dir() / "lxcfs.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 10
    while not (mountpoint / "proc/uptime").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SimError(f"lxcfs did not start; see {sim_dir() / 'lxcfs.log'}")
        time.sleep(0.05)


def _prepare_host(fleet: Fleet, host: Host, driver_branch: str | None) -> None:
    h = host.dir
    for sub in ("upper", "work", "root", "hw"):
        (h / sub).mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={base_dir(host.os)},upperdir={h / 'upper'},workdir={h / 'work'}", str(h / "root")],
                   check=True)
    root = h / "root"
    (root / "etc/hostname").write_text(host.name + "\n")
    hosts_file = f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    (root / "etc/hosts").write_text(hosts_file)
    (root / "etc/machine-id").write_text(
        subprocess.run(["systemd-id128", "new"], check=True, capture_output=True, text=True).stdout)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}",
                    "-f", str(root / "etc/ssh/ssh_host_ed25519_key")], check=True)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(str(ssh_key()) + ".pub").read_text())
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
    (root / HW_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)
    gpu_state.write_state(str(h / "hw/gpus.state"), hardware.build_state(host.profile, host.name))
    pci.write_devices(gpu_state.read_state(str(h / "hw/gpus.state")), h / "hw/pci")
    pci.install_mount_unit(root)
    if driver_branch is not None:
        repo.preinstall_driver(root, driver_branch, nvswitch=hardware.PROFILES[host.profile].nvswitch_count > 0)


def _nspawn_args(host: Host, net: str) -> list[str]:
    lxcfs = sim_dir() / "lxcfs"
    return [
        "--boot", "--register=no", "--keep-unit", "--console=read-only", "--quiet",
        f"--machine={host.name}", f"--directory={host.dir / 'root'}",
        f"--network-namespace-path=/run/netns/{network.netns_name(host.name, net)}", "--capability=CAP_NET_ADMIN",
        f"--bind={host.dir / 'hw'}:{HW_MOUNT}",
        f"--bind={lxcfs}:/var/lib/lxcfs", "--bind-ro=/var/lib/lxcfs/proc/uptime:/proc/uptime",
    ]


def _start_host(fleet: Fleet, host: Host) -> None:
    network.setup_host(host.name, host.index, fleet.net)
    for flag in ("stop", "power-cycle"):
        (host.dir / flag).unlink(missing_ok=True)
    loop = Path(__file__).with_name("boot_loop.sh")
    with open(host.dir / "loop.log", "ab") as out:
        subprocess.Popen(["bash", str(loop), str(host.dir), sys.executable, *_nspawn_args(host, fleet.net)],
                         stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]),
                              "GPUFLEET_SIM_CGROUPS": " ".join(map(str, cgroups.host_cgroups(
                                  network.net_tag(fleet.net), host.name)))})


def _wait_ready(host: Host, timeout: float = BOOT_TIMEOUT_S) -> None:
    """Wait until sshd answers and systemd reports the boot finished."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.address, 22), timeout=1) as conn:
                if conn.recv(4).startswith(b"SSH-"):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SimError(f"{host.name}: sshd did not answer within {timeout:.0f}s; see {host.dir / 'nspawn.log'}")
        time.sleep(0.1)
    result = run_on(host, ["systemctl", "is-system-running", "--wait"], timeout=max(5, deadline - time.monotonic()))
    if result.stdout.strip() != "running":
        failed = run_on(host, ["sh", "-c", "systemctl --failed --no-legend --plain; for u in $(systemctl --failed "
                                           "--no-legend --plain | cut -d' ' -f1); do journalctl -b -u $u --no-pager "
                                           "-n 8; done"]).stdout
        raise SimError(f"{host.name}: systemd is {result.stdout.strip() or 'unreachable'}; failed units: {failed}")


def wait_ready(fleet: Fleet, names: list[str] | None = None) -> None:
    hosts = [fleet.host(n) for n in names] if names else fleet.hosts
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(_wait_ready, hosts))


# ------------------------------------------------------------------------------ inventory

def inventory_host_data(fleet: Fleet, host: Host) -> dict:
    """pyinfra host data for a simulated host: how to reach it, and the simulator's package repository as the
    NVIDIA driver repository and Grafana's (mirrors, as on an air-gapped site)."""
    return {
        "ssh_hostname": host.address, "ssh_user": "root", "ssh_key": str(ssh_key()),
        "ssh_known_hosts_file": str(known_hosts()), "ssh_strict_host_key_checking": "yes",
        "gpufleet_sim_profile": host.profile, "gpufleet_sim_os": host.os, "gpufleet_sim_repo_url": fleet.repo_url,
        "gpufleet_driver_repo_url": fleet.repo_url + "/",
        "gpufleet_driver_repo_keyring_url": f"{fleet.repo_url}/{repo.KEYRING_NAME}",
        # the simulator's repository as Grafana's (a flat repository: its key at URL/gpg-full.key, as Grafana's)
        "gpufleet_monitoring_grafana_repo_url": f"{fleet.repo_url} /",
    }


def write_inventory(fleet: Fleet, path: Path) -> None:
    """A pyinfra inventory of the fleet: one group per hardware profile (``sim_<profile>``) and ``gpu_nodes``; each
    host's OS is its ``gpufleet_sim_os``."""
    lines = ["# Generated by `gpufleet sim up`: the simulated fleet as a pyinfra inventory.", ""]
    groups: dict[str, list[Host]] = {}
    for host in fleet.hosts:
        groups.setdefault(host.profile, []).append(host)
    for profile, members in groups.items():
        hosts = [(h.name, inventory_host_data(fleet, h)) for h in members]
        lines.append(f"sim_{profile.replace('-', '_')} = {hosts!r}")
    lines.append("gpu_nodes = " + repr([h.name for h in fleet.hosts]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------- status / reboot

def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def status() -> list[dict]:
    fleet = Fleet.load()
    if fleet is None:
        return []
    rows = []
    for host in fleet.hosts:
        running = _pid(host.dir / "nspawn.pid") is not None
        state = "down"
        if running:
            state = _systemd_state(host) or "starting"
        gpus = gpu_state.read_state(str(host.dir / "hw/gpus.state"))
        rows.append({
            "name": host.name, "address": host.address, "profile": host.profile, "os": host.os, "state": state,
            "gpus": gpu_state.gpu_count(gpus), "driver": gpus.get("driver.version") or None,
            "nspawn_pid": _pid(host.dir / "nspawn.pid"),
        })
    return rows


def _signal(pid: int, signum: int, group: bool = False) -> None:
    """Signal a process of ours that may have exited since we read its pid file."""
    try:
        os.killpg(pid, signum) if group else os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _systemd_state(host: Host) -> str | None:
    try:
        result = run_on(host, ["systemctl", "is-system-running"], timeout=5)
    except subprocess.TimeoutExpired:
        return "unreachable"
    return result.stdout.strip() or ("unreachable" if result.returncode == 255 else None)


def reboot(name: str, wait: bool = True) -> None:
    """Power-cycle a host: clean halt, simulated GPU power-on reset, boot."""
    fleet = _require_fleet()
    host = fleet.host(name)
    pid = _pid(host.dir / "nspawn.pid")
    if pid is None:
        raise SimError(f"{host.name} is not running")
    (host.dir / "power-cycle").touch()
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _pid(host.dir / "nspawn.pid") == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid(host.dir / "nspawn.pid") == pid:
        _signal(pid, signal.SIGKILL)
    if wait:
        time.sleep(0.2)
        _wait_ready(host)


def _require_fleet() -> Fleet:
    fleet = Fleet.load()
    if fleet is None:
        raise SimError("no simulated fleet is up (gpufleet sim up)")
    return fleet


# ------------------------------------------------------------------------------------ down

def down(log=print) -> list[str]:
    """Stop every host and remove everything `up` created; return what could not be removed."""
    fleet = Fleet.load()
    net = fleet.net if fleet else network.default_net()
    hosts_root = sim_dir() / "hosts"
    names = sorted(p.name for p in hosts_root.iterdir()) if hosts_root.exists() else []
    for name in names:
        (host_dir(name) / "stop").touch()
    pids = {name: _pid(host_dir(name) / "nspawn.pid") for name in names}
    for pid in filter(None, pids.values()):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(_pid(host_dir(n) / "loop.pid") for n in names) and time.monotonic() < deadline:
        time.sleep(0.1)
    for name in names:
        for pidfile in ("nspawn.pid", "loop.pid"):
            pid = _pid(host_dir(name) / pidfile)
            if pid:
                _signal(pid, signal.SIGKILL, group=pidfile == "loop.pid")
    time.sleep(0.2) if names else None
    for index, name in enumerate(names):
        root = host_dir(name) / "root"
        if os.path.ismount(root):
            subprocess.run(["umount", str(root)], check=False, capture_output=True)
        if os.path.ismount(root):
            subprocess.run(["umount", "-l", str(root)], check=False, capture_output=True)
        host = fleet.host(name) if fleet else None
        network.teardown_host(name, host.index if host else index, net)
    repo.stop_serving()
    _stop_lxcfs()
    network.teardown_bridge(net)
    cgroups.remove(network.net_tag(net))
    nspawn_run = Path("/run/systemd/nspawn")
    if os.path.ismount(nspawn_run):  # shared with other fleets: stays while one of them runs
        subprocess.run(["umount", str(nspawn_run)], check=False, capture_output=True)
    problems = leftovers(net)
    if not problems:
        if hosts_root.exists():
            shutil.rmtree(hosts_root)
        (sim_dir() / "fleet.json").unlink(missing_ok=True)
        known_hosts().unlink(missing_ok=True)
    else:
        log("could not remove: " + ", ".join(problems))
    return problems


def _stop_lxcfs() -> None:
    mountpoint = sim_dir() / "lxcfs"
    pid = _pid(sim_dir() / "lxcfs.pid")
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", str(mountpoint)], check=False, capture_output=True)
    if pid:
        _signal(pid, signal.SIGTERM)
        for _ in range(50):
            if _pid(sim_dir() / "lxcfs.pid") is None:
                break
            time.sleep(0.05)
    (sim_dir() / "lxcfs.pid").unlink(missing_ok=True)
    (sim_dir() / "lxcfs.lock").unlink(missing_ok=True)


def leftovers(net: str | None = None) -> list[str]:
    """Processes, mounts and network objects of the fleet that still exist."""
    net = net or network.default_net()
    found = network.leftovers(net)
    found += [f"cgroup {c}" for c in cgroups.fleet_cgroups(network.net_tag(net)) if c.exists()]
    mounts = Path("/proc/mounts").read_text().splitlines()
    root = str(sim_dir())
    # this fleet's directory and what is under it, not a sibling fleet's (``/tmp/sim`` is no mount of ``/tmp/sim-2``)
    found += [f"mount {m.split()[1]}" for m in mounts if m.split()[1] == root or m.split()[1].startswith(root + "/")]
    hosts_root = sim_dir() / "hosts"
    if hosts_root.exists():
        for h in hosts_root.iterdir():
            for pidfile in ("nspawn.pid", "loop.pid"):
                if _pid(h / pidfile):
                    found.append(f"process {pidfile} of {h.name}")
    if repo.server_pid():
        found.append("package repository server")
    return found
