"""ONE answer to "is this MIG layout applied?" from the four places that ask it (gpufleet/node/mig_compare.py):

* the MIG operation (``gpufleet.operations.mig.layout``): its facts read by their real commands from the simulated
  nvidia-smi; applied when it yields nothing and says "already applied";
* the node-side applier (``gpufleet-mig-apply apply``) against the simulated nvidia-smi: applied when it exits 0
  and leaves the GPU state as it was;
* the NVML exporter (its bundle, against the simulated NVML): ``gpufleet_gpu_mig_layout_match`` is 1;
* verify: the probe (against the simulated NVML) evaluated: ``config.mig`` passes.

Every case is one simulated GPU state (the oracle) and one layout; the four must agree with each other and with
the case's expectation."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import Config, OperationError, State
from pyinfra.context import ctx_host, ctx_state
from pyinfra_harness import FakeHost, managed_state, render

from gpufleet.exporter import write_bundle
from gpufleet.facts.files import ManagedState
from gpufleet.facts.mig import MigState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.systemd import UnitStates
from gpufleet.node import mig_compare
from gpufleet.operations import mig
from gpufleet.operations.managed_files import node_script
from gpufleet.plan import Gpu, mig_layout_doc, mig_target
from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.gpu.build_nvml import build
from gpufleet.sim.hardware import build_state
from gpufleet.verify.checks import PASS, ExpectedState, evaluate

REPO = Path(__file__).resolve().parents[2]
DRIVER = "580.95.05"
NODE = REPO / "gpufleet" / "node"
FAKE_SMI = """\
#!{python}
import os, sys
sys.path.insert(0, {repo!r})
os.geteuid = lambda: 0
from gpufleet.sim.gpu.nvidia_smi import main
sys.exit(main(sys.argv[1:]))
"""

# H100 80GB profiles: GPU-instance profile id, start, size (memory slices); compute-instance profile id, slices
GI = {"1g.10gb": (19, 1, 0, 1), "2g.20gb": (14, 2, 1, 2), "3g.40gb": (9, 4, 2, 3), "7g.80gb": (0, 8, 4, 7)}


def gpu_instances(*names: str, compute: str = "whole") -> dict[str, str]:
    """State keys of GPU 0's GPU instances ``names`` (placed one after another), each with its full compute
    instance (``compute="whole"``), none (``"none"``) or a one-slice one (``"partial"``)."""
    keys, start = {}, 0
    for gi_id, name in enumerate(names, start=1):
        profile_id, size, ci_profile, slices = GI[name]
        keys[f"gpu.0.mig.gi.{gi_id}"] = f"{profile_id},{start},{size}"
        if compute == "whole":
            keys[f"gpu.0.mig.ci.{gi_id}.0"] = f"{ci_profile},{slices},0"
        elif compute == "partial":
            keys[f"gpu.0.mig.ci.{gi_id}.0"] = "0,1,0"
        start += size
    return keys


MIG_ON = {"gpu.0.mig.current": "1", "gpu.0.mig.pending": "1"}
MIG_OFF = {"gpu.0.mig.current": "0", "gpu.0.mig.pending": "0"}

# (case, layout of GPU 0, state keys of GPU 0, applied)
CASES = [
    ("applied", {"1g.10gb": 2, "2g.20gb": 1}, {**MIG_ON, **gpu_instances("2g.20gb", "1g.10gb", "1g.10gb")}, True),
    ("applied in another order", {"1g.10gb": 1, "3g.40gb": 1}, {**MIG_ON, **gpu_instances("1g.10gb", "3g.40gb")},
     True),
    ("disabled as wanted", None, MIG_OFF, True),
    ("enabled, no instances wanted", {}, MIG_ON, True),
    ("missing instance", {"1g.10gb": 2}, {**MIG_ON, **gpu_instances("1g.10gb")}, False),
    ("extra instance", {"1g.10gb": 1}, {**MIG_ON, **gpu_instances("1g.10gb", "1g.10gb")}, False),
    ("wrong profile", {"2g.20gb": 1}, {**MIG_ON, **gpu_instances("1g.10gb")}, False),
    ("no instance at all", {"1g.10gb": 1}, MIG_ON, False),
    ("MIG disabled, layout wants it", {"1g.10gb": 1}, MIG_OFF, False),
    ("MIG enabled, layout wants it off", None, {**MIG_ON, **gpu_instances("1g.10gb")}, False),
    ("enable pending a reboot", {"1g.10gb": 1}, {"gpu.0.mig.current": "0", "gpu.0.mig.pending": "1"}, False),
    ("enable pending, layout wants it off", None, {"gpu.0.mig.current": "0", "gpu.0.mig.pending": "1"}, False),
    ("disable pending, instances right", {"1g.10gb": 1},
     {"gpu.0.mig.current": "1", "gpu.0.mig.pending": "0", **gpu_instances("1g.10gb")}, False),
    ("GPU instance without compute instance", {"1g.10gb": 1}, {**MIG_ON, **gpu_instances("1g.10gb", compute="none")},
     False),
    ("compute instance not spanning its GPU instance", {"3g.40gb": 1},
     {**MIG_ON, **gpu_instances("3g.40gb", compute="partial")}, False),
    ("absent GPU (fallen off the bus)", {"1g.10gb": 1}, {**MIG_ON, **gpu_instances("1g.10gb"), "gpu.0.lost": "1"},
     False),
]


class Node:
    """One simulated 2-GPU H100 host: the state file, the simulated NVML, nvidia-smi on PATH; the layout file of
    GPU 0 as the MIG operation writes it (no holder services: nothing to stop)."""

    def __init__(self, root: Path, layout, keys: dict[str, str]):
        self.root = root
        state = build_state("h100-sxm-8", "node1")
        for key in [k for k in state if k.startswith("gpu.") and k.split(".")[1].isdigit()
                    and int(k.split(".")[1]) >= 2]:
            del state[key]
        state["gpu.count"] = "2"
        simstate.reset_for_boot(state, DRIVER)
        state.update({"driver.loaded": "1", "driver.version": DRIVER, "driver.cuda_version": "13.0"})
        self.identity = Gpu.from_fact({"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": state["gpu.0.uuid"],
                                       "pci_bus_id": state["gpu.0.pci.bus_id"], "mig_current": "Disabled",
                                       "mig_pending": "Disabled"})
        state.update(keys)
        self.state = root / "gpus.state"
        simstate.write_state(str(self.state), state)
        self.layout = layout
        target, problem = mig_target(self.identity, layout)
        assert problem is None, problem
        self.layout_text = json.dumps(mig_layout_doc([target], ()), indent=2, sort_keys=True) + "\n"
        (root / "settings").mkdir(exist_ok=True)
        (root / "settings" / "mig-layout.json").write_text(self.layout_text)
        self.env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}", "GPUFLEET_SIM_STATE": str(self.state),
                    "GPUFLEET_SIM_DRIVER_VERSION_FILE": str(root / "driver-version"), "LD_LIBRARY_PATH":
                    str(root / "lib"), "GPUFLEET_MIG_STATUS": str(root / "run" / "mig-reboot-required"),
                    "GPUFLEET_MIG_SETTLE_S": "0", "PYTHONPATH": ""}

    def sh(self, argv, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, **kwargs)

    def fact(self, fact_cls):
        fact = fact_cls()
        out = self.sh(["sh", "-c", fact.command()]).stdout.splitlines()
        return fact.process(out)

    # ------------------------------------------------------------------------------------------ the four callers

    def operation_says_applied(self) -> bool:
        installed = {mig.LAYOUT_PATH: self.layout_text, mig.APPLIER: node_script("mig_apply.py"),
                     mig.COMPARE_PATH: node_script("mig_compare.py"), mig.LOCKED_APPLIER: mig.locked_applier_text(),
                     mig.UNIT_PATH: mig.unit_text()}
        managed = managed_state(installed, {mig.UNIT: {"unit_file_state": "enabled"}},
                                executables=(mig.APPLIER, mig.LOCKED_APPLIER), contents={mig.STATUS_PATH: None})
        facts = {GpuInventory: self.fact(GpuInventory), MigState: self.fact(MigState), ManagedState: managed,
                 UnitStates: lambda units: managed(units=units)["units"]}
        host = FakeHost("node1", facts)
        state = State()
        state.config = Config()
        state.is_executing = True
        try:
            with ctx_state.use(state), ctx_host.use(host):
                commands = [render(c) for c in mig.layout._inner(layout={0: self.layout}, holder_services=())]
        except OperationError:  # refused: the layout cannot be applied to this host as it is
            return False
        return not commands and any("already applied" in text for text in host.noops)

    def applier_says_applied(self) -> bool:
        before = self.state.read_text()
        path = self.root / "settings" / "mig-layout.json"
        result = self.sh(["python3", str(NODE / "mig_apply.py"), "apply", str(path)])
        return result.returncode == 0 and self.state.read_text() == before

    def exporter_says_applied(self, pyz: Path) -> bool:
        script = (f"import sys; sys.path.insert(0, {str(pyz)!r})\nimport gpu_exporter\n"
                  f"print(gpu_exporter.scrape_text(gpu_exporter.GpuCollector({str(self.root / 'settings')!r}, "
                  "'node1')), end='')\n")
        proc = self.sh(["/usr/bin/python3", "-c", script])
        assert proc.returncode == 0, proc.stderr
        match = [line for line in proc.stdout.splitlines()
                 if line.startswith("gpufleet_gpu_mig_layout_match{") and 'gpu="0"' in line]
        return bool(match) and float(match[0].rsplit(" ", 1)[1]) == 1

    def verify_says_applied(self) -> bool:
        proc = self.sh([sys.executable, "-m", "gpufleet.probe", "--kernel-log", "none", "--services", ""],
                       cwd=str(REPO))
        assert proc.returncode == 0, proc.stderr
        checks = evaluate(json.loads(proc.stdout), ExpectedState(persistence=None, mig={0: self.layout}))
        mig_checks = [c for c in checks if c.check == "config.mig" and c.gpu_index == 0]
        return bool(mig_checks) and all(c.verdict == PASS for c in mig_checks)


@pytest.fixture(scope="module")
def shared():
    root = Path(tempfile.mkdtemp(prefix="gf-migcmp-"))
    build(root / "lib")
    (root / "driver-version").write_text(DRIVER + "\n")
    (root / "bin").mkdir()
    (root / "bin" / "nvidia-smi").write_text(FAKE_SMI.format(python=sys.executable, repo=str(REPO)))
    (root / "bin" / "nvidia-smi").chmod(0o755)
    pyz = write_bundle(root)
    yield root, pyz
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(("layout", "keys", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_four_callers_agree_on_whether_the_layout_is_applied(shared, tmp_path, layout, keys, expected):
    root, pyz = shared
    for name in ("lib", "bin", "driver-version"):
        (tmp_path / name).symlink_to(root / name)
    node = Node(tmp_path, layout, keys)
    answers = {"operation": node.operation_says_applied(), "exporter": node.exporter_says_applied(pyz),
               "verify": node.verify_says_applied(),
               "applier": node.applier_says_applied()}  # last: it changes the state when not applied
    assert answers == dict.fromkeys(answers, expected)


@pytest.mark.parametrize("bus", ["0000:18:00.0", "00000000:18:00.0", "0000:18:00.0".lower(), " 00000000:18:00.0 "])
def test_bus_ids_of_the_layout_file_in_any_form_name_the_same_gpu(bus):
    assert mig_compare.norm_bus(bus) == "00000000:18:00.0"
    assert mig_compare.norm_bus("0000:2a:00.0") == "00000000:2A:00.0"


def test_the_comparison_is_standard_library_python_3_7_importing_nothing_of_gpufleet():
    source = (NODE / "mig_compare.py").read_text()
    tree = ast.parse(source, feature_version=(3, 7))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__"}
