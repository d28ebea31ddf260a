"""The simulator's package repository: NVIDIA driver packages (named as NVIDIA's and Ubuntu's) that
install the simulated driver into a host, DCGM packages (named as NVIDIA's: the host engine and
dcgm-exporter, answering from the simulated GPU state, ``simgpu/dcgm.py``) and a Grafana package (Grafana's own
unit and ``/etc/default`` file with a stand-in server, ``sim/grafana/standin.py``), served over HTTP from the
control machine on the fleet bridge.

A flat, signed apt repository like NVIDIA's CUDA repository (``deb [signed-by=KEYRING] URL /``); the
keyring is served at ``URL/gpufleet-sim-keyring.gpg``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from email.utils import formatdate
from pathlib import Path

from . import dcgm_files, network
from .paths import cache_dir, sim_dir

PORT = 8731
# branch -> (driver version, CUDA version it supports)
BRANCHES = {"570": ("570.172.08", "12.8"), "580": ("580.95.05", "13.0")}
# the driver generation whose nvidia-smi deprecates driver_version for kmd_version (real 610.57.04, CUDA 13.3)
BRANCHES["610"] = ("610.57.04", "13.3")
DEFAULT_BRANCH = "580"
# NVIDIA's CUDA repository names the fabric manager plain nvidia-fabricmanager from this branch on
# (tests/reference/upstream/nvidia-packaging/facts.json, fabricmanager_package_by_branch)
FABRICMANAGER_UNSUFFIXED_FROM = 580
KEYRING_NAME = "gpufleet-sim-keyring.gpg"
GRAFANA_KEY_NAME = "gpg-full.key"
SIMGPU_DIR = Path(__file__).with_name("gpu")
EXPORTER_WEB = Path(__file__).parent.parent / "exporter" / "web.py"
LIB_DIR = "usr/lib/x86_64-linux-gnu"


def url(net: str) -> str:
    return f"http://{network.bridge_address(net)}:{PORT}"


def parse_driver_option(option: str | None) -> str | None:
    """``None`` (no driver), ``preinstalled`` or ``preinstalled:BRANCH`` → branch or None."""
    if option in (None, "", "none"):
        return None
    kind, _, branch = option.partition(":")
    branch = branch or DEFAULT_BRANCH
    if kind != "preinstalled" or branch not in BRANCHES:
        raise ValueError(f"--driver {option!r}: allowed none, preinstalled, "
                         + ", ".join(f"preinstalled:{b}" for b in BRANCHES))
    return branch


# ------------------------------------------------------------------------------------ packages

# The start of every simulated program. -S: the simulator needs no site-packages, and site's start-up is a sixth of a
# simulated nvidia-smi call (~3 ms).
PREAMBLE = "#!/usr/bin/python3 -S\nimport sys\nsys.path.insert(0, '/usr/lib/gpufleet-sim')\n"


def _wrapper(module: str) -> str:
    return f"{PREAMBLE}from simgpu.{module} import main\nsys.exit(main(sys.argv[1:]))\n"


# nvidia-persistenced's unit as the packaging each simulated driver package imitates installs it: gpufleet's own text
# with the directives tests/reference/upstream/nvidia-packaging/facts.json records (tests/unit/
# test_upstream_nvidia_packaging.py holds them equal). NVIDIA's Ubuntu driver packaging (nvidia-compute-utils-<flavour>)
# runs the daemon as root with --verbose; NVIDIA's own init template, as its install.sh installs it, runs it as the
# user install.sh creates (__USER__ -> nvidia-persistenced by default).
PERSISTENCED_UNIT_UBUNTU = """\
[Unit]
Description=NVIDIA Persistence Daemon
After=syslog.target

[Service]
Type=forking
PIDFile=/var/run/nvidia-persistenced/nvidia-persistenced.pid
Restart=always
ExecStart=/usr/bin/nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced/*
TimeoutSec=300

[Install]
WantedBy=multi-user.target
"""

PERSISTENCED_TEMPLATE_USER = "nvidia-persistenced"
PERSISTENCED_UNIT_NVIDIA = f"""\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user {PERSISTENCED_TEMPLATE_USER}
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def _cuda_repository_driver(package: str) -> bool:
    """A driver package named as NVIDIA's CUDA repository names them (``nvidia-open-<branch>``); the others are
    named as Ubuntu's packaging names them (``nvidia-driver-<branch>[-server][-open]``)."""
    return package.startswith("nvidia-open-")


def persistenced_unit(package: str) -> str:
    """The nvidia-persistenced unit the simulated driver package ``package`` installs."""
    return PERSISTENCED_UNIT_NVIDIA if _cuda_repository_driver(package) else PERSISTENCED_UNIT_UBUNTU


def persistenced_user(package: str) -> str | None:
    """The user the package's postinst creates for the daemon (None: it runs as root)."""
    return PERSISTENCED_TEMPLATE_USER if _cuda_repository_driver(package) else None


FABRICMANAGER_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
PIDFile=/var/run/nvidia-fabricmanager/nv-fabricmanager.pid
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

DRIVER_POSTINST = """\
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    ldconfig
{create_user}    PYTHONPATH=/usr/lib/gpufleet-sim python3 -m simgpu.driver load
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
        systemctl start nvidia-persistenced.service || true
    fi
fi
"""

DRIVER_PRERM = """\
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl stop nvidia-persistenced.service || true
fi
"""


# NVIDIA's DCGM packages as the simulator offers them: the release of dcgm-exporter whose facts are recorded in
# tests/reference/upstream (its DCGM version first), with stand-in binaries (simgpu/dcgm.py) and the units and default
# counters file gpufleet writes with the packaged files' directives and rows (dcgm_files.py).
DCGM_VERSION = "4.5.3"
DCGM_EXPORTER_VERSION = "4.5.3-4.8.2"
DCGM_PROFILING_PACKAGE = "datacenter-gpu-manager-4-proprietary"
# DCGM's postinst (scripts/deb/postinst): the service account of nvidia-dcgm.service and DCGM_HOME_DIR
DCGM_POSTINST = """\
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    getent passwd nvidia-dcgm >/dev/null || useradd -Urs /usr/sbin/nologin nvidia-dcgm
    mkdir -p /var/log/nvidia-dcgm
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
    fi
fi
"""


def _dcgm_wrapper(program: str) -> str:
    return f"{PREAMBLE}from simgpu.dcgm import main\nsys.exit(main([{program!r}, *sys.argv[1:]]))\n"


def _dcgm_tree(work: Path, package: str, version: str, revision: str) -> Path:
    tree = work / package
    (tree / "DEBIAN").mkdir(parents=True)
    if package == "datacenter-gpu-manager-4-core":
        (tree / "usr/bin").mkdir(parents=True)
        (tree / "usr/bin/nv-hostengine").write_text(_dcgm_wrapper("nv-hostengine"))
        (tree / "usr/bin/nv-hostengine").chmod(0o755)
        (tree / "DEBIAN/postinst").write_text(DCGM_POSTINST)
        (tree / "DEBIAN/postinst").chmod(0o755)
        control = _control(package, f"1:{version}-{revision}", "NVIDIA Datacenter GPU Manager (core)",
                           Depends="nvidia-driver-sim")
    elif package == DCGM_PROFILING_PACKAGE:
        (tree / "usr/lib/gpufleet-sim").mkdir(parents=True)
        (tree / "usr/lib/gpufleet-sim/dcgm-proprietary").write_text("profiling module (simulated)\n")
        control = _control(package, f"1:{version}-{revision}", "NVIDIA Datacenter GPU Manager (proprietary modules)",
                           Depends=f"datacenter-gpu-manager-4-core (= 1:{version}-{revision})")
    else:
        (tree / "usr/bin").mkdir(parents=True)
        (tree / "usr/bin/dcgm-exporter").write_text(_dcgm_wrapper("dcgm-exporter"))
        (tree / "usr/bin/dcgm-exporter").chmod(0o755)
        control = _control(package, f"1:{version}-{revision}", "NVIDIA DCGM exporter for Prometheus",
                           Depends=f"datacenter-gpu-manager-4-core (>= 1:{DCGM_VERSION})")
    for relpath, text in dcgm_files.PACKAGE_FILES.get(package, {}).items():
        (tree / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tree / relpath).write_text(text)
    (tree / "DEBIAN/control").write_text(control)
    return tree


GRAFANA_VERSION = "11.6.0"
GRAFANA_DIR = Path(__file__).with_name("grafana")
# the simulated package's unit and /etc/default file: gpufleet's own text carrying what gpufleet relies on in Grafana's
# .deb, as tests/reference/upstream/grafana/facts.json records it (the current files could not be obtained, see
# docs/upstream.md); tests/unit/test_sim_grafana_upstream.py holds them to those facts. Only the program is a stand-in.
GRAFANA_UNIT = "grafana-server.service"
GRAFANA_DEFAULTS = "grafana-server.default"

# gpufleet's own script with the effects Grafana's deb postinst has on configure (recorded in grafana/facts.json under
# grafana/packaging/deb/control/postinst): the grafana system group and user, the log and data directories, the
# sample grafana.ini as $CONF_FILE when there is none, the provisioning directories, everything under /etc/grafana
# root:grafana (files 0640, directories 0755); a first install neither enables nor starts the service.
# CONF_FILE and PROVISIONING_CFG_DIR come from /etc/default/grafana-server only, as in Grafana's postinst.
GRAFANA_POSTINST = """\
#!/bin/sh
set -e
test -r /etc/default/grafana-server && . /etc/default/grafana-server
test "$1" = configure || exit 0
user=${GRAFANA_USER:-grafana}
group=${GRAFANA_GROUP:-grafana}
home=${GRAFANA_HOME:-/usr/share/grafana}
data=${DATA_DIR:-/var/lib/grafana}
getent group "$group" >/dev/null || addgroup --quiet --system "$group"
id "$user" >/dev/null 2>&1 || adduser --quiet --system --no-create-home --home "$home" \\
    --ingroup "$group" --disabled-password --shell /bin/false "$user"
for dir in /var/log/grafana "$data"; do
    mkdir -p "$dir"
    chown -R "$user:$group" "$dir"
    chmod 755 "$dir"
done
mkdir -p "$(dirname "$CONF_FILE")"
test -e "$CONF_FILE" || cp "$home/conf/sample.ini" "$CONF_FILE"
for kind in dashboards datasources plugins access-control alerting; do
    mkdir -p "$PROVISIONING_CFG_DIR/$kind"
done
find /etc/grafana -mindepth 1 -exec chown -h "root:$group" {} +
find /etc/grafana -type d -exec chmod 755 {} +
find /etc/grafana -type f -exec chmod 640 {} +
# systemd learns of the new unit; enabling and starting it is left to the administrator (gpufleet's stage)
if test -d /run/systemd/system; then systemctl daemon-reload || true; fi
"""

GRAFANA_SAMPLE_INI = """\
# gpufleet's simulated Grafana package: conf/sample.ini, every setting at its default (commented out)
[paths]
;data = /var/lib/grafana
[server]
;http_port = 3000
[security]
;admin_user = admin
;admin_password = admin
"""


def _grafana_tree(work: Path, version: str, revision: str) -> Path:
    tree = work / "grafana"
    home = tree / "usr/share/grafana"
    (home / "bin").mkdir(parents=True)
    (home / "sim").mkdir()
    (home / "conf").mkdir()
    shutil.copy(GRAFANA_DIR / "standin.py", home / "sim/standin.py")
    (home / "bin/grafana").write_text(
        "#!/usr/bin/python3 -S\nimport sys\nsys.path.insert(0, '/usr/share/grafana/sim')\n"
        "from standin import main\nsys.exit(main(sys.argv[1:]))\n")
    (home / "bin/grafana").chmod(0o755)
    (home / "conf/sample.ini").write_text(GRAFANA_SAMPLE_INI)
    (tree / "usr/sbin").mkdir(parents=True)
    for name, command in (("grafana-server", "server"), ("grafana-cli", "cli")):
        (tree / "usr/sbin" / name).write_text(f'#!/bin/sh\nexec /usr/share/grafana/bin/grafana {command} "$@"\n')
        (tree / "usr/sbin" / name).chmod(0o755)
    (tree / "usr/lib/systemd/system").mkdir(parents=True)
    shutil.copy(GRAFANA_DIR / GRAFANA_UNIT, tree / "usr/lib/systemd/system/grafana-server.service")
    (tree / "etc/default").mkdir(parents=True)
    shutil.copy(GRAFANA_DIR / GRAFANA_DEFAULTS, tree / "etc/default/grafana-server")
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN/control").write_text(_control("grafana", f"{version}", "Grafana",
                                                  Depends="adduser, python3"))
    # Grafana's build marks these conffiles (fpm --config-files): dpkg keeps a user's edit, --force-confmiss
    # restores a removed one
    (tree / "DEBIAN/conffiles").write_text("/etc/default/grafana-server\n"
                                            "/usr/lib/systemd/system/grafana-server.service\n")
    (tree / "DEBIAN/postinst").write_text(GRAFANA_POSTINST)
    (tree / "DEBIAN/postinst").chmod(0o755)
    return tree


def _control(package: str, version: str, description: str, **fields: str) -> str:
    lines = [f"Package: {package}", f"Version: {version}", "Architecture: amd64",
             "Maintainer: gpufleet simulator <sim@gpufleet.invalid>", "Priority: optional", "Section: non-free/libs"]
    lines += [f"{key.replace('_', '-')}: {value}" for key, value in fields.items()]
    lines.append(f"Description: {description}\n simulated for gpufleet's test fleet; drives no real GPU.")
    return "\n".join(lines) + "\n"


def _build_deb(tree: Path, out: Path) -> Path:
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-z1", "--build", str(tree), str(out)],
                   check=True, capture_output=True)
    return out


def _driver_tree(work: Path, package: str, version: str, revision: str, flavour: str, nvml: Path,
                 conflicts: str) -> Path:
    tree = work / package
    lib = tree / "usr/lib/gpufleet-sim"
    (lib / "simgpu").mkdir(parents=True)
    for source in SIMGPU_DIR.glob("*.py"):
        shutil.copy(source, lib / "simgpu" / source.name)
    # the dcgm-exporter stand-in serves --web-config-file with the code gpufleet's own exporter uses
    shutil.copy(EXPORTER_WEB, lib / "simgpu" / "web.py")
    (lib / "driver-version").write_text(version + "\n")
    (lib / "cuda-version").write_text(BRANCHES[version.split(".")[0]][1] + "\n")
    (lib / "kernel-flavour").write_text(flavour + "\n")
    (tree / LIB_DIR).mkdir(parents=True)
    shutil.copy(nvml, tree / LIB_DIR / "libnvidia-ml.so.1")
    os.symlink("libnvidia-ml.so.1", tree / LIB_DIR / "libnvidia-ml.so")
    (tree / "usr/bin").mkdir(parents=True)
    for command, module in (("nvidia-smi", "nvidia_smi"), ("nvidia-persistenced", "persistenced")):
        (tree / "usr/bin" / command).write_text(_wrapper(module))
        (tree / "usr/bin" / command).chmod(0o755)
    units = tree / "lib/systemd/system"
    units.mkdir(parents=True)
    (units / "nvidia-persistenced.service").write_text(persistenced_unit(package))
    (tree / "etc/modprobe.d").mkdir(parents=True)
    (tree / "etc/modprobe.d/nvidia-graphics-drivers.conf").write_text(
        "blacklist nouveau\noptions nouveau modeset=0\n")
    debian = tree / "DEBIAN"
    debian.mkdir()
    (debian / "control").write_text(_control(
        package, f"{version}-{revision}", f"NVIDIA driver metapackage ({flavour} kernel modules)",
        Depends="python3", Provides="nvidia-driver-sim, libnvidia-ml1",
        Conflicts=conflicts, Replaces=conflicts))
    user = persistenced_user(package)
    create_user = (f"    getent passwd {user} >/dev/null || "
                   f"useradd --system --home /nonexistent --shell /usr/sbin/nologin {user}\n") if user else ""
    postinst = DRIVER_POSTINST.replace("{create_user}", create_user)
    for script, body in (("postinst", postinst), ("prerm", DRIVER_PRERM)):
        (debian / script).write_text(body)
        (debian / script).chmod(0o755)
    return tree


def _fabricmanager_tree(work: Path, package: str, version: str, revision: str) -> Path:
    tree = work / f"{package}_{version}"  # nvidia-fabricmanager comes in several versions
    lib = tree / "usr/lib/gpufleet-sim"
    lib.mkdir(parents=True)
    (lib / "fabricmanager-version").write_text(version + "\n")
    (tree / "usr/bin").mkdir(parents=True)
    (tree / "usr/bin/nv-fabricmanager").write_text(_wrapper("fabricmanager"))
    (tree / "usr/bin/nv-fabricmanager").chmod(0o755)
    (tree / "usr/share/nvidia/nvswitch").mkdir(parents=True)
    (tree / "usr/share/nvidia/nvswitch/fabricmanager.cfg").write_text("LOG_LEVEL=4\nFABRIC_MODE=0\n")
    (tree / "lib/systemd/system").mkdir(parents=True)
    (tree / "lib/systemd/system/nvidia-fabricmanager.service").write_text(FABRICMANAGER_UNIT)
    (tree / "DEBIAN").mkdir()
    # the branch-suffixed package provides, conflicts with and replaces the plain name (NVIDIA's fabric manager
    # control template, recorded in nvidia-packaging/facts.json); the plain package is the name itself
    relations = {} if package == "nvidia-fabricmanager" else {
        "Provides": "nvidia-fabricmanager", "Conflicts": "nvidia-fabricmanager", "Replaces": "nvidia-fabricmanager"}
    (tree / "DEBIAN/control").write_text(_control(
        package, f"{version}-{revision}", "Fabric Manager for NVSwitch based systems", **relations))
    return tree


def packages() -> list[tuple[str, str, str, str]]:
    """(package, upstream version, debian revision, kind) of every package the repository offers."""
    found = []
    for branch, (version, _cuda) in BRANCHES.items():
        found += [
            (f"nvidia-driver-{branch}-server-open", version, "0ubuntu1", "open"),
            (f"nvidia-driver-{branch}-server", version, "0ubuntu1", "proprietary"),
            (f"nvidia-driver-{branch}-open", version, "0ubuntu1", "open"),
            (f"nvidia-driver-{branch}", version, "0ubuntu1", "proprietary"),
            (f"nvidia-open-{branch}", version, "1", "open"),  # NVIDIA's CUDA repository naming
            (f"nvidia-fabricmanager-{branch}", version, "1", "fabricmanager"),  # Ubuntu's archive, CUDA repo < 580
            # NVIDIA's CUDA repository naming of the proprietary modules (nvidia-packaging/facts.json); it carries the
            # driver itself, so that no Ubuntu-named driver package rides along for the product to remove
            (f"cuda-drivers-{branch}", version, "1", "proprietary"),
        ]
        if int(branch) >= FABRICMANAGER_UNSUFFIXED_FROM:
            # NVIDIA's CUDA repository from branch 580 on: one name, the branch in the version
            found.append(("nvidia-fabricmanager", version, "1", "fabricmanager"))
    found += [("datacenter-gpu-manager-4-core", DCGM_VERSION, "1", "dcgm"),
              (DCGM_PROFILING_PACKAGE, DCGM_VERSION, "1", "dcgm"),
              ("datacenter-gpu-manager-exporter", DCGM_EXPORTER_VERSION, "1", "dcgm")]
    found.append(("grafana", GRAFANA_VERSION, "", "grafana"))
    return found


def _source_key() -> str:
    digest = hashlib.sha256()
    for path in sorted([*SIMGPU_DIR.glob("*.py"), *SIMGPU_DIR.glob("*.c"), *GRAFANA_DIR.iterdir(),
                        Path(dcgm_files.__file__), Path(__file__), EXPORTER_WEB]):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(repr(packages()).encode())
    return digest.hexdigest()[:12]


def repo_dir() -> Path:
    return cache_dir() / f"repo-{_source_key()}"


def build() -> Path:
    """Build (or reuse) the repository for the current simulator sources; return its directory."""
    target = repo_dir()
    if (target / "InRelease").exists():
        return target
    from .gpu import build_nvml

    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        work = Path(tmp)
        out = work / "repo"
        out.mkdir()
        nvml = build_nvml.build(work / "nvml")
        driver_names = [p for p, _v, _r, kind in packages() if kind in ("open", "proprietary")]
        for package, upstream, revision, kind in packages():
            version = f"{upstream}-{revision}" if revision else upstream
            if kind in ("open", "proprietary"):
                others = ", ".join(n for n in driver_names if n != package)
                tree = _driver_tree(work, package, upstream, revision, kind, nvml, others)
            elif kind == "fabricmanager":
                tree = _fabricmanager_tree(work, package, upstream, revision)
            elif kind == "dcgm":
                tree = _dcgm_tree(work, package, upstream, revision)
            else:
                tree = _grafana_tree(work, upstream, revision)
            _build_deb(tree, out / f"{package}_{version}_amd64.deb")
        _write_index(out)
        _sign(out)
        shutil.rmtree(target, ignore_errors=True)
        out.rename(target)
    return target


def _write_index(repo: Path) -> None:
    entries = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True,
                                 text=True).stdout.rstrip("\n")
        data = deb.read_bytes()
        entries.append(f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    index = "\n".join(entries).encode()
    (repo / "Packages").write_bytes(index)
    (repo / "Packages.gz").write_bytes(gzip.compress(index, mtime=0))
    sums = "".join(f" {hashlib.sha256((repo / n).read_bytes()).hexdigest()} {(repo / n).stat().st_size} {n}\n"
                   for n in ("Packages", "Packages.gz"))
    (repo / "Release").write_text(textwrap.dedent(f"""\
        Origin: gpufleet-sim
        Label: gpufleet simulated NVIDIA driver repository
        Architectures: amd64
        Date: {formatdate(usegmt=True)}
        SHA256:
        """) + sums)


def _sign(repo: Path) -> None:
    home = cache_dir() / "gnupg"
    home.mkdir(mode=0o700, exist_ok=True)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--quiet", "--yes"]
    if subprocess.run([*gpg, "--list-secret-keys", "gpufleet-sim"], capture_output=True).returncode != 0:
        subprocess.run([*gpg, "--passphrase", "", "--quick-gen-key", "gpufleet-sim <sim@gpufleet.invalid>",
                        "ed25519", "sign", "never"], check=True)
    subprocess.run([*gpg, "--output", str(repo / KEYRING_NAME), "--export", "gpufleet-sim"], check=True)
    # the same key armored where Grafana publishes its own (https://apt.grafana.com/gpg-full.key)
    subprocess.run([*gpg, "--armor", "--output", str(repo / GRAFANA_KEY_NAME), "--export", "gpufleet-sim"],
                   check=True)
    subprocess.run([*gpg, "--local-user", "gpufleet-sim", "--clearsign", "--output", str(repo / "InRelease"),
                    str(repo / "Release")], check=True)
    subprocess.run([*gpg, "--local-user", "gpufleet-sim", "--detach-sign", "--armor",
                    "--output", str(repo / "Release.gpg"), str(repo / "Release")], check=True)


# -------------------------------------------------------------------------------------- serving

def _pid_file() -> Path:
    return sim_dir() / "repo.pid"


def server_pid() -> int | None:
    try:
        pid = int(_pid_file().read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def serve(net: str, log=print) -> None:
    directory = build()
    if server_pid():
        return
    with open(sim_dir() / "repo.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", network.bridge_address(net), "--directory",
             str(directory), str(PORT)],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    _pid_file().write_text(str(proc.pid))


def stop_serving() -> None:
    pid = server_pid()
    if pid:
        os.kill(pid, signal.SIGTERM)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    _pid_file().unlink(missing_ok=True)


def preinstall_driver(root: Path, branch: str, nvswitch: bool) -> None:
    """Install a branch's driver (and fabric manager on NVSwitch boards) into a host root before it boots,
    like a cloud image with the driver baked in."""
    directory = build()
    names = [f"nvidia-driver-{branch}-server-open"] + ([f"nvidia-fabricmanager-{branch}"] if nvswitch else [])
    debs = [next(directory.glob(f"{name}_*.deb")) for name in names]
    staging = root / "tmp/gpufleet-sim-debs"
    staging.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        shutil.copy(deb, staging / deb.name)
    subprocess.run(["chroot", str(root), "dpkg", "-i", *[f"/tmp/gpufleet-sim-debs/{d.name}" for d in debs]],
                   check=True, capture_output=True)
    if nvswitch:
        subprocess.run(["chroot", str(root), "systemctl", "enable", "nvidia-fabricmanager.service"],
                       check=True, capture_output=True)
    shutil.rmtree(staging)
