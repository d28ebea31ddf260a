"""`pyinfra inventories/sim.py deploys/gpu_node.py` end to end on bare simulated hosts, Debian 12 and Debian 13
(node02) alike.

State is checked through the simulator (its GPU state file and nvidia-smi), never through gpufleet's facts.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import BIN, REPO, bring_up, exporter_units, gpufleet, grand_total, save_deb_cache, ssh

from gpufleet import apply
from gpufleet.sim import hosts
from gpufleet.sim.gpu import state as gpu_state

INVENTORY = REPO / "inventories" / "sim.py"
DEPLOY = REPO / "deploys" / "gpu_node.py"
PROFILES = ["h100-sxm-8", "a100-40gb-1@debian13", "rtx4090-1"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, PROFILES)
    yield fleet
    save_deb_cache(fleet)
    hosts.down(log=lambda *_: None)


def run_gpu_node(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "pyinfra"), "-y", *extra, str(INVENTORY), str(DEPLOY)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)


def gpus(fleet, name: str) -> list[dict[str, str]]:
    state = gpu_state.read_state(str(fleet.host(name).dir / "hw/gpus.state"))
    return [gpu_state.gpu(state, i) for i in range(gpu_state.gpu_count(state))], state


def untouched(fleet, name: str) -> bool:
    """Nothing of gpufleet's on the host: no apt source but the release's own (Debian 13 lists its archive in
    sources.list.d/debian.sources), no NCCL or gpufleet file, no driver."""
    probe = ssh(fleet, name, "ls -A /etc/apt/sources.list.d | grep -vx debian.sources; "
                             "ls -d /etc/nccl.conf /etc/gpufleet 2>/dev/null; "
                             "command -v nvidia-smi; dpkg -l | grep -c nvidia", check=False)
    return probe.stdout.split() == ["0"]


def test_the_fleet_runs_debian_12_and_debian_13(fleet):
    """The Debian 13 host is what a Debian 13 server is: its os-release, apt 3, its archive in deb822 sources."""
    release = {name: ssh(fleet, name, ". /etc/os-release; echo $VERSION_CODENAME").stdout.strip()
               for name in ("node01", "node02", "node03")}
    assert release == {"node01": "bookworm", "node02": "trixie", "node03": "bookworm"}
    assert ssh(fleet, "node02", "apt-get --version | head -1").stdout.startswith("apt 3.")
    assert "Suites: trixie trixie-updates" in ssh(fleet, "node02", "cat /etc/apt/sources.list.d/debian.sources").stdout
    assert ssh(fleet, "node02", "test -e /etc/apt/sources.list", check=False).returncode != 0


def override(tmp_path, group: str, text: str) -> list[str]:
    data = tmp_path / "group_data"
    data.mkdir(exist_ok=True)
    (data / f"{group}.py").write_text(text)
    return ["--group-data", str(data)]


def test_bad_value_on_one_host_stops_the_run_before_any_change(fleet, tmp_path):
    result = run_gpu_node(*override(tmp_path, "a100", "gpufleet_power_limit = 900\n"))
    assert result.returncode != 0
    assert "node02: gpufleet_power_limit=900 W on GPU 0 (NVIDIA A100-SXM4-40GB): outside this GPU's power " \
           "limit range; allowed: 100-400 W" in result.stdout
    assert "no host was changed" in result.stdout
    assert all(untouched(fleet, name) for name in ("node01", "node02", "node03"))


def test_invalid_key_stops_the_run_before_any_change(fleet, tmp_path):
    result = run_gpu_node(*override(tmp_path, "workstations", "gpufleet_power_limt = 300\n"))
    assert result.returncode != 0
    assert "node03: gpufleet_power_limt=300: unknown gpufleet setting" in result.stdout
    assert "did you mean 'gpufleet_power_limit'" in result.stdout
    assert all(untouched(fleet, name) for name in ("node01", "node02", "node03"))


def run_apply(*extra: str, inventory=INVENTORY) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gpufleet"), "apply", *extra, str(inventory), str(DEPLOY)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)


def test_apply_a_bad_value_on_the_last_host_of_the_last_slice_changes_no_host(fleet, tmp_path):
    """``gpufleet apply --jobs 2``: the workers of the other slices are prepared and wait at the barrier; the last
    slice's host fails validation, so no worker changes anything (as one pyinfra process)."""
    groups = {"node01": ["hgx_h100", "gpu_nodes"], "node02": ["a100", "gpu_nodes"],
              "node03": ["workstations", "gpu_nodes"]}
    assert apply.slice_hosts(list(groups.items()), 2)[-1][-1] == "node01"
    shutil.copytree(REPO / "inventories" / "group_data", tmp_path / "group_data")
    shutil.copy(INVENTORY, tmp_path / "sim.py")
    with (tmp_path / "group_data" / "hgx_h100.py").open("a") as data:
        data.write("\ngpufleet_power_limit = 900\n")
    result = run_apply("-y", "--jobs", "2", inventory=tmp_path / "sim.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "node01: gpufleet_power_limit=900 W" in result.stderr and "allowed: 200-700 W" in result.stderr
    assert "nothing was changed on any host" in result.stderr
    assert all(untouched(fleet, name) for name in ("node01", "node02", "node03"))


def test_mig_on_a_geforce_gpu_is_refused(fleet, tmp_path):
    layout = 'gpufleet_stages = ["driver", "mig"]\ngpufleet_mig = [{"devices": "all", "mig-enabled": True, ' \
             '"mig-devices": {"1g.10gb": 1}}]\n'
    result = run_gpu_node(*override(tmp_path, "workstations", layout))
    assert result.returncode != 0
    assert "node03: gpufleet_mig[0].mig-enabled=True on GPU 0 (NVIDIA GeForce RTX 4090): MIG requested on a GPU " \
           "without MIG" in result.stdout
    assert all(untouched(fleet, name) for name in ("node01", "node02", "node03"))


def test_gpu_known_only_after_the_driver_install_is_checked_then_and_fails_that_host(fleet, tmp_path):
    """A per-UUID limit cannot be checked on a bare host (no driver: no UUIDs); once this run's driver answers,
    a UUID naming no GPU of the host fails that host, with a message, instead of being ignored."""
    absent = "GPU-00000000-0000-0000-0000-0000000000aa"
    data = override(tmp_path, "workstations", f'gpufleet_power_limit_by_uuid = {{"{absent}": 300}}\n')
    result = run_gpu_node("--limit", "node03", *data)
    assert result.returncode != 0, result.stdout
    assert f"node03: gpufleet_power_limit_by_uuid['{absent}']='{absent}': no such GPU on this host; allowed: a " \
           "UUID of this host's GPUs: GPU-" in result.stdout
    assert ssh(fleet, "node03", "command -v nvidia-smi").stdout.strip()  # the driver stage ran before
    assert ssh(fleet, "node03", "ls /etc/gpufleet/power-limits.conf", check=False).returncode != 0  # no settings


def test_first_run_converges_bare_hosts(fleet):
    result = run_gpu_node()
    assert result.returncode == 0, result.stdout
    assert grand_total(result.stdout)["error"] == "-"
    h100, state = gpus(fleet, "node01")
    assert state["driver.loaded"] == "1" and state["driver.version"] == "580.95.05"
    assert state["fabric.state"] == "completed"  # fabric manager of the same version runs on the NVSwitch board
    assert [g["persistence"] for g in h100] == ["1"] * 8
    assert [g["mig.current"] for g in h100] == ["1", "1"] + ["0"] * 6
    gi_profiles = sorted(v.split(",")[0] for k, v in state.items() if k.startswith("gpu.0.mig.gi."))
    assert gi_profiles == ["14", "19", "19", "9"]  # 2g.20gb, 1g.10gb x2, 3g.40gb (mig-parted file's layout)
    a100, a100_state = gpus(fleet, "node02")
    assert a100[0]["power.limit_mw"] == "320000" and a100[0]["persistence"] == "1"  # 80 % of 400 W
    assert a100_state["fabric.state"] == "none"
    rtx, _ = gpus(fleet, "node03")
    assert rtx[0]["power.limit_mw"] == "350000"
    assert ssh(fleet, "node02", "stat -c '%a %U' /etc/nccl.conf").stdout.strip() == "644 root"
    assert "NCCL_DEBUG=WARN\n" in ssh(fleet, "node02", "cat /etc/nccl.conf").stdout
    held = ssh(fleet, "node02", "apt-mark showhold").stdout.split()
    # NVIDIA's naming (Debian's default): the guide's metapackage with the branch's pinning package
    assert {"nvidia-open", "nvidia-driver-pinning-580"} <= set(held) or "nvidia-driver-580-server-open" in held
    # NVIDIA's CUDA repository naming (Debian's default): from branch 580 the fabric manager is plain
    # nvidia-fabricmanager (tests/reference/upstream/nvidia-packaging/facts.json), installed and held with the driver
    fm = ssh(fleet, "node01", "dpkg-query -W -f='${db:Status-Abbrev}${Version}' nvidia-fabricmanager").stdout
    assert fm.split() == ["hi", "580.95.05-1"]
    assert "nvidia-fabricmanager" in ssh(fleet, "node01", "apt-mark showhold").stdout.split()
    # the persistence drop-in runs the daemon as the packaged unit's user, one the package created
    for name in ("node01", "node02"):
        exec_start = ssh(fleet, name, "systemctl show -p ExecStart nvidia-persistenced").stdout
        assert "argv[]=/usr/bin/nvidia-persistenced --user nvidia-persistenced --persistence-mode" in exec_start
        assert ssh(fleet, name, "getent passwd nvidia-persistenced", check=False).returncode == 0


def test_second_run_changes_nothing(fleet):
    result = run_gpu_node()
    assert result.returncode == 0, result.stdout
    total = grand_total(result.stdout)
    assert total["success"] == "-" and total["error"] == "-", result.stdout


NODE_NAMES = ("node01", "node02", "node03")


def test_settings_come_back_after_reboot_without_a_deploy(fleet):
    for name in NODE_NAMES:
        gpufleet("sim", "reboot", name)
    h100, state = gpus(fleet, "node01")
    assert [g["persistence"] for g in h100] == ["1"] * 8
    assert sorted(v.split(",")[0] for k, v in state.items() if k.startswith("gpu.1.mig.gi.")) == ["14", "19", "19", "9"]
    a100, _ = gpus(fleet, "node02")
    assert a100[0]["power.limit_mw"] == "320000" and a100[0]["persistence"] == "1"
    rtx, _ = gpus(fleet, "node03")
    assert rtx[0]["power.limit_mw"] == "350000"
    out = run_gpu_node().stdout
    total = grand_total(out)
    assert total["success"] == "-" and total["error"] == "-", out + exporter_units(fleet, NODE_NAMES)


def test_power_limit_changed_behind_our_back_is_restored(fleet):
    ssh(fleet, "node02", "nvidia-smi -i 0 -pl 250")
    result = run_gpu_node("--limit", "node02")
    assert grand_total(result.stdout)["success"] == "1"
    a100, _ = gpus(fleet, "node02")
    assert a100[0]["power.limit_mw"] == "320000"


def _changes(document: dict) -> dict[str, list[str]]:
    return {op["name"]: op["hosts_with_change"] for op in document["plan"] if op["hosts_with_change"]}


def test_apply_with_workers_changes_what_pyinfra_would_then_nothing(fleet):
    """``gpufleet apply --jobs 2`` on two hosts changed behind our back, one in each slice: the same plan as
    ``pyinfra --dry``; applied, the hosts are right again (seen on the hosts); applied again, nothing changes."""
    ssh(fleet, "node01", "printf 'NCCL_DEBUG=INFO\\n' > /etc/nccl.conf")  # slice 2 (of node01 alone)
    ssh(fleet, "node02", "nvidia-smi -i 0 -pl 250")  # slice 1 (node02, node03)
    single = subprocess.run([str(BIN / "pyinfra"), "--dry", "--json", str(INVENTORY), str(DEPLOY)], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert single.returncode == 0, single.stderr
    dry = run_apply("--dry", "--json", "--jobs", "2")
    assert dry.returncode == 0, dry.stderr
    assert _changes(json.loads(dry.stdout)) == _changes(json.loads(single.stdout))
    assert _changes(json.loads(dry.stdout)) == {"gpufleet: GPU node | /etc/nccl.conf": ["node01"],
                                                "gpufleet: GPU node | GPU power limits": ["node02"]}
    applied = run_apply("-y", "--json", "--jobs", "2")
    assert applied.returncode == 0, applied.stderr
    results = json.loads(applied.stdout)["results"]
    assert {op["name"]: op["success"] for op in results["operations"] if op["success"]} == \
        {"gpufleet: GPU node | /etc/nccl.conf": ["node01"], "gpufleet: GPU node | GPU power limits": ["node02"]}
    assert "NCCL_DEBUG=WARN\n" in ssh(fleet, "node01", "cat /etc/nccl.conf").stdout
    a100, _ = gpus(fleet, "node02")
    assert a100[0]["power.limit_mw"] == "320000"
    again = run_apply("-y", "--jobs", "2")
    assert again.returncode == 0, again.stderr
    total = grand_total(again.stdout)
    assert total["success"] == "-" and total["error"] == "-", again.stdout + again.stderr


def test_desired_power_limit_of_a_lost_gpu_survives_until_it_is_back(fleet, tmp_path):
    """Issue 8: a converge while GPU 3 is off the bus keeps its desired limit in the boot file (and changes nothing
    else); after the reboot that brings it back, the boot unit sets the configured limit on it."""
    capped = override(tmp_path, "hgx_h100", "gpufleet_power_limit = 600\n")
    result = run_gpu_node("--limit", "node01", *capped)
    assert result.returncode == 0, result.stdout
    h100, _ = gpus(fleet, "node01")
    assert [g["power.limit_mw"] for g in h100] == ["600000"] * 8
    uuid3 = h100[3]["uuid"]

    gpufleet("sim", "fault", "node01", "lost", "--gpu", "3")
    result = run_gpu_node("--limit", "node01", *capped)
    assert result.returncode == 0, result.stdout
    total = grand_total(result.stdout)
    assert total["success"] == "-" and total["error"] == "-", result.stdout  # nothing changed, none reported
    assert f"node01: GPU {uuid3} is missing" in result.stdout  # the warning names host and GPU
    conf = ssh(fleet, "node01", "cat /etc/gpufleet/power-limits.conf").stdout.splitlines()
    assert f"{uuid3}=600" in conf

    gpufleet("sim", "fault", "node01", "clear")
    gpufleet("sim", "reboot", "node01")  # power limits back to default: only the boot unit can set 600 W again
    h100, _ = gpus(fleet, "node01")
    assert h100[3]["lost"] == "0" and h100[3]["power.limit_mw"] == "600000"
    assert [g["power.limit_mw"] for g in h100] == ["600000"] * 8


def test_driver_installed_but_not_loaded_reports_no_change(fleet):
    """Issue 8: nothing can change until a reboot loads the driver: the run says so and reports no change."""
    gpufleet("sim", "fault", "node02", "driver-unloaded")
    try:
        result = run_gpu_node("--limit", "node02")
        assert result.returncode == 0, result.stdout
        total = grand_total(result.stdout)
        assert total["success"] == "-" and total["error"] == "-", result.stdout
        assert "node02: the NVIDIA driver does not answer" in result.stdout
    finally:
        gpufleet("sim", "fault", "node02", "clear")


def _dry_run_with_cache(cache) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([str(BIN / "pyinfra"), "-y", "--dry", str(INVENTORY), str(DEPLOY)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                          env={**os.environ, "GPUFLEET_CACHE_DIR": str(cache)})


def test_a_command_added_to_the_fact_cache_is_not_run_and_a_shared_cache_is_refused(fleet, tmp_path):
    """The fact cache is data: an entry holding a shell command (the old format, or a fact that runs its argument)
    is dropped, never run, also by --dry; a cache directory others can write stops the run naming it."""
    import json
    from urllib.parse import quote

    marker = "/tmp/gpufleet-cache-pwned"
    cache = tmp_path / "cache"
    (cache / "reads").mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    for name in NODE_NAMES:
        path = cache / "reads" / f"{quote(name + '@' + fleet.host(name).address, safe='')}.json"
        path.write_text(json.dumps([
            {"command": f"touch {marker}", "arguments": {}},
            {"fact": "pyinfra.facts.server.Command", "args": [f"touch {marker}"], "kwargs": {}},
            {"fact": "gpufleet.facts.system.OsInfo", "args": [], "kwargs": {}},
        ]))
        path.chmod(0o600)
    result = _dry_run_with_cache(cache)
    assert result.returncode == 0, result.stdout
    for name in NODE_NAMES:
        assert ssh(fleet, name, f"test -e {marker}", check=False).returncode == 1, f"{name}: the cached command ran"
    cache.chmod(0o777)
    result = _dry_run_with_cache(cache)
    assert result.returncode != 0
    assert f"{cache}: refused: the fact cache directory is writable by group or others (mode 0777" in result.stdout
