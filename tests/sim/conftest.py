"""End-to-end tests on a simulated fleet of our own (separate state dir and network from a user's fleet)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("GPUFLEET_SIM_DIR", "/tmp/gpufleet-test-sim")
os.environ.setdefault("GPUFLEET_SIM_NET", "10.77.9")
# pytest-xdist (make test runs the end-to-end modules on parallel workers): one fleet per worker, each with its own
# state directory and /24, so that the workers' fleets never meet
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    _net = os.environ["GPUFLEET_SIM_NET"].split(".")
    os.environ["GPUFLEET_SIM_DIR"] += f"-{_WORKER}"
    os.environ["GPUFLEET_SIM_NET"] = ".".join([*_net[:2], str((int(_net[2]) + 100 + int(_WORKER[2:])) % 256)])
# the monitoring plane's generated passwords (gpufleet.web_auth): the test fleets', not the user's ~/.config
os.environ.setdefault("GPUFLEET_CREDENTIALS_DIR", os.environ["GPUFLEET_SIM_DIR"] + "-credentials")

from gpufleet.sim import hosts, image  # noqa: E402
from gpufleet.sim.repo import packages as sim_packages  # noqa: E402

SIM_PACKAGES = {name for name, *_ in sim_packages()}  # the simulator's repository's own: rebuilt, never cached

# The plain path, proven end to end on every `make test` (docs/design.md, "pyinfra internals: gpufleet/_pyinfra"):
# these tests run every command with both fast paths off (GPUFLEET_FACT_MEMO=off: pyinfra's own fact reads;
# GPUFLEET_ROLLOUT_INPROCESS=off: one pyinfra process per rollout pass and wave), the others with both on. A
# representative subset, at no added fleet: the converge suite of pyinfra's own options (--diff, a no-op run,
# --json, --limit over deploys/gpu_node.py) and the verify suite (whole modules, their fleet's converge included),
# and the rollout suite's tests that do not test the in-process engine itself (its single connection per host and
# its kept plan stay on the fast path). Each gpu_node converge and rollout these tests run asserts which path it
# took (check_path: pyinfra() below, test_pyinfra_native.pyinfra, test_verify's fleet, test_rollout's Rollout.run).
# GPUFLEET_TEST_PLAIN_PATH=none runs them on the fast paths too (to measure what the plain path costs).
PLAIN_PATH: dict[str, tuple[str, ...] | None] = {  # module -> its plain-path tests (None: the whole module)
    "test_pyinfra_native.py": None,
    "test_verify.py": None,
    "test_rollout.py": ("test_fault_on_the_canary_stops_with_no_other_host_changed",
                        "test_without_drain_one_wave_converges_every_host_and_reports"),
}
FAST_PATH_SWITCHES = ("GPUFLEET_FACT_MEMO", "GPUFLEET_ROLLOUT_INPROCESS")
PLAIN_LINES = {"GPUFLEET_FACT_MEMO": "gpufleet: plain path (GPUFLEET_FACT_MEMO is off)",
               "GPUFLEET_ROLLOUT_INPROCESS": "pyinfra runs as a subprocess per pass and wave "
                                             "(GPUFLEET_ROLLOUT_INPROCESS is off)"}


def plain_path_wanted(module: str, test: str | None) -> bool:
    """Whether ``test`` of ``module`` (None: the module's fixtures) runs with the fast paths off."""
    if os.environ.get("GPUFLEET_TEST_PLAIN_PATH") == "none" or module not in PLAIN_PATH:
        return False
    tests = PLAIN_PATH[module]
    return tests is None or (test is not None and test.split("[")[0] in tests)


def _switch(off: bool):
    saved = {name: os.environ.get(name) for name in FAST_PATH_SWITCHES}
    for name in FAST_PATH_SWITCHES:
        if off:
            os.environ[name] = "off"
        else:
            os.environ.pop(name, None)
    return saved


def _restore(saved: dict) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module", autouse=True)
def _module_path(request):
    """The module's fixtures (its fleet's converge) on the plain path where the whole module is (before its other
    module fixtures: autouse fixtures come first in their scope)."""
    saved = _switch(plain_path_wanted(Path(request.node.path).name, None))
    yield
    _restore(saved)


@pytest.fixture(autouse=True)
def _test_path(request):
    saved = _switch(plain_path_wanted(Path(request.node.path).name, request.node.name))
    yield
    _restore(saved)


def check_path(output: str, switch: str) -> None:
    """``output`` (of a command the test ran) shows the path the test is on: the plain path's line for ``switch``
    where its fast path is off, no such line where it is on."""
    plain = os.environ.get(switch) == "off"
    assert (PLAIN_LINES[switch] in output) == plain, (
        f"expected the {'plain' if plain else 'fast'} path for {switch}: {PLAIN_LINES[switch]!r} "
        f"{'missing from' if plain else 'found in'} the output:\n{output[-3000:]}")


def pytest_report_header(config):
    if os.environ.get("GPUFLEET_TEST_PLAIN_PATH") == "none":
        return "fast paths off: none (GPUFLEET_TEST_PLAIN_PATH=none)"
    shown = [f"{m}" + ("" if t is None else f" ({len(t)} tests)") for m, t in PLAIN_PATH.items()]
    return f"fast paths off (GPUFLEET_FACT_MEMO=off GPUFLEET_ROLLOUT_INPROCESS=off): {', '.join(shown)}"


def pytest_terminal_summary(terminalreporter):
    """The plain-path tests' outcome, in the CI log: one line per module."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") != "call" and outcome == "passed":
                continue
            path, _, name = report.nodeid.partition("::")
            module = Path(path).name
            if plain_path_wanted(module, name or None) and (name or PLAIN_PATH.get(module) is None):
                counts.setdefault(module, {}).setdefault(outcome, 0)
                counts[module][outcome] += 1
    for module, outcomes in sorted(counts.items()):
        terminalreporter.write_line(f"fast paths off: {module}: "
                                    + ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())))

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEPLOYS = Path(__file__).with_name("deploys")


def _can_simulate() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    missing = [cmd for cmd in hosts.REQUIRED_COMMANDS if shutil.which(cmd) is None]
    return f"missing {missing}" if missing else None


def bring_up(tmp_path_factory, profiles: list[str], driver: str | None = None):
    """A fresh simulated fleet for one test module (bring-up takes seconds); down it when done."""
    reason = _can_simulate()
    if reason:
        pytest.fail(f"the simulated fleet cannot run here: {reason} (make test installs the system packages)")
    inventory = tmp_path_factory.mktemp("sim") / "inventory.py"
    hosts.down(log=lambda *_: None)
    fleet = hosts.up(len(profiles), profiles, driver=driver, inventory=inventory, force=True, log=lambda *_: None)
    fleet.inventory = inventory
    prime_deb_cache(fleet)
    return fleet


def prime_deb_cache(fleet) -> None:
    """Put the cached Debian .debs into every host's apt archive, so apt installs them without downloading."""
    for h in fleet.hosts:
        cache = image.deb_cache_dir(h.os)  # the .debs from Debian (node_exporter...)
        if not cache.is_dir():
            continue
        archives = h.dir / "root/var/cache/apt/archives"
        archives.mkdir(parents=True, exist_ok=True)
        for deb in cache.glob("*.deb"):
            shutil.copy(deb, archives / deb.name)


def save_deb_cache(fleet) -> None:
    """Keep the Debian .debs the hosts downloaded, per release (atomically: test modules may run in parallel)."""
    for h in fleet.hosts:
        cache = image.deb_cache_dir(h.os)  # the .debs from Debian (node_exporter...)
        cache.mkdir(parents=True, exist_ok=True)
        for deb in (h.dir / "root/var/cache/apt/archives").glob("*.deb"):
            if not (cache / deb.name).exists() and deb.name.split("_")[0] not in SIM_PACKAGES:
                partial = cache / f".{deb.name}.{os.getpid()}"
                shutil.copy(deb, partial)
                os.replace(partial, cache / deb.name)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    fleet = bring_up(tmp_path_factory, ["h100-sxm-8", "a100-40gb-1"])
    yield fleet
    save_deb_cache(fleet)
    hosts.down(log=lambda *_: None)


def ssh(fleet, name: str, command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    result = hosts.run_on(fleet.host(name), ["sh", "-c", command], timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{name}: {command!r} exited {result.returncode}: {result.stdout}{result.stderr}")
    return result


def gpufleet(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "gpufleet"), *args], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"gpufleet {' '.join(args)} exited {result.returncode}: {result.stdout}{result.stderr}")
    return result


def pyinfra(fleet, deploy: str | Path, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run([str(BIN / "pyinfra"), "-y", *extra, str(fleet.inventory), str(deploy)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, cwd=REPO)
    if result.returncode != 0:
        raise AssertionError(f"pyinfra {deploy} failed:\n{result.stdout}")
    if Path(deploy).name == "gpu_node.py":
        check_path(result.stdout, "GPUFLEET_FACT_MEMO")
    return result


def grand_total(output: str) -> dict[str, str]:
    """pyinfra's result line: 'Grand total  <hosts> <success> <error> <no change>'."""
    match = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert match, output
    return dict(zip(("hosts", "success", "error", "no_change"), match.groups(), strict=True))


EXPORTER_UNITS = ("gpufleet-exporter", "nvidia-dcgm-exporter", "nvidia-dcgm",
                  "prometheus-node-exporter")


def exporter_units(fleet, names) -> str:
    """The exporter units' state and recent journal on ``names``: printed when a no-op run changed a host, so a CI log
    says why (an exporter found not running)."""
    command = ("systemctl show -p Id,ActiveState,SubState,NRestarts,ExecMainStatus " + " ".join(EXPORTER_UNITS)
               + "; journalctl -b --no-pager -n 40 " + " ".join(f"-u {u}" for u in EXPORTER_UNITS))
    return "\n".join(f"--- {n}:\n{ssh(fleet, n, command, check=False).stdout}" for n in sorted(names))
