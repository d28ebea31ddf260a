"""mig.layout: commands for given facts; the boot unit; the node script against the simulated nvidia-smi."""

from __future__ import annotations

import ast
import json
import logging
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyinfra.api import Config, OperationError, OperationValueError, State
from pyinfra.context import ctx_host, ctx_state
from pyinfra_harness import FakeHost, gpu_inventory, managed_state, render

from gpufleet.facts.files import ManagedState
from gpufleet.facts.mig import MigState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.systemd import UnitStates
from gpufleet.operations import mig
from gpufleet.operations.managed_files import node_script, put_file
from gpufleet.plan import Gpu, mig_target

REPO = Path(__file__).resolve().parents[2]
APPLIER_SRC = REPO / "gpufleet" / "node" / "mig_apply.py"
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
BUS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0"]
FM, PD = "nvidia-fabricmanager.service", "nvidia-persistenced.service"
MIXED = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}

# ------------------------------------------------------------------------------------------------ fact builders


def gpu(index: int, mig_current: str | None = "Disabled", mig_pending: str | None = None, name: str = H100) -> dict:
    return {"index": index, "name": name, "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
            "pci_bus_id": BUS[index], "mig_current": mig_current,
            "mig_pending": mig_current if mig_pending is None else mig_pending}


def inventory(*gpus: dict, status: str = "ok") -> dict:
    return gpu_inventory(gpus, status=status, error=None if status == "ok" else "NVIDIA-SMI has failed")


# profile name -> (profile id, compute slices, CI profile id)
PROFILES = {"1g.10gb": (19, 1, 0), "2g.20gb": (14, 2, 1), "3g.40gb": (9, 3, 2), "7g.80gb": (0, 7, 4),
            "3g.20gb": (9, 3, 2)}


def mig_state(instances: dict[int, list[str]], partial: tuple[int, int] | None = None,
              without_ci: tuple[int, int] | None = None) -> dict:
    """A MigState fact: {gpu: [profile, ...]}, each GPU instance with its full compute instance, except
    ``partial`` (gpu, n-th GI: a 1c compute instance) and ``without_ci`` (gpu, n-th GI: none)."""
    gis, cis = [], []
    for index, names in instances.items():
        for n, name in enumerate(names):
            profile_id, slices, ci_profile = PROFILES[name]
            gi_id = 20 + n
            gis.append({"gpu": index, "profile": name, "profile_id": profile_id, "gi_id": gi_id,
                        "placement_start": n, "placement_size": slices})
            if without_ci == (index, n):
                continue
            ci_name = f"1c.{name}" if partial == (index, n) else name
            cis.append({"gpu": index, "gi_id": gi_id, "profile": ci_name, "profile_id": ci_profile, "ci_id": 0,
                        "placement_start": 0, "placement_size": slices})
    return {"status": "ok" if gis else "not_enabled", "error": None, "gpu_instances": gis,
            "compute_instances": cis}


def layout_file(plans_layout: dict, gpus: list[dict], holders=mig.DEFAULT_HOLDER_SERVICES) -> str:
    by_index = {g["index"]: Gpu.from_fact(g) for g in gpus}
    plans = [mig_target(by_index[i], want)[0] for i, want in sorted(plans_layout.items())]
    return mig.layout_text(plans, holders)


def installed(layout: dict, gpus: list[dict]) -> dict:
    return {
        mig.LAYOUT_PATH: layout_file(layout, gpus),
        mig.APPLIER: node_script("mig_apply.py"),
        mig.COMPARE_PATH: node_script("mig_compare.py"),
        mig.LOCKED_APPLIER: mig.locked_applier_text(),
        mig.UNIT_PATH: mig.unit_text(),
    }


ENABLED = {mig.UNIT: {"unit_file_state": "enabled"}}
HOLDERS_RUNNING = {**ENABLED, FM: {"active_state": "active"}, PD: {"active_state": "active"}}


class Seq:
    """A fact whose value changes at each read (the state before and after the commands yielded so far)."""

    def __init__(self, *values):
        self.values = list(values)

    def next(self):
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


class SeqHost(FakeHost):
    def get_fact(self, fact_cls, *args, **kwargs):
        value = self.facts.get(fact_cls)
        if isinstance(value, Seq):
            self.fact_calls.append(fact_cls)
            return value.next()
        return super().get_fact(fact_cls, *args, **kwargs)


def run(layout: dict, inv, migs=None, files=None, units=None, status=None, executing=True, **kwargs):
    managed = managed_state(files, units, executables=(mig.APPLIER, mig.LOCKED_APPLIER),
                            contents={mig.STATUS_PATH: status})
    facts = {GpuInventory: inv, ManagedState: managed, UnitStates: lambda units: managed(units=units)["units"]}
    if migs is not None:
        facts[MigState] = migs
    host = SeqHost("testhost", facts)
    state = State()
    state.config = Config()
    state.is_executing = executing
    with ctx_state.use(state), ctx_host.use(host):
        commands = [render(c) for c in mig.layout._inner(layout=layout, **kwargs)]
    return commands, host.noops


def install_commands(layout: dict, gpus: list[dict]) -> list[str]:
    """What installing the layout file, node script and boot unit on a bare host yields (from the shared
    file helper) and the unit enabled."""
    state = State()
    state.config = Config()
    fake = FakeHost("testhost", {})
    with ctx_state.use(state), ctx_host.use(fake):
        files = [render(c) for path, text, mode in (
            (mig.LAYOUT_PATH, layout_file(layout, gpus), "644"),
            (mig.APPLIER, node_script("mig_apply.py"), "755"),
            (mig.COMPARE_PATH, node_script("mig_compare.py"), "644"),
            (mig.LOCKED_APPLIER, mig.locked_applier_text(), "755"),
            (mig.UNIT_PATH, mig.unit_text(), "644"),
        ) for c in put_file(None, path, text, mode)]
    assert f"upload {mig.LAYOUT_PATH}\n{layout_file(layout, gpus)}" in files
    assert f"upload {mig.UNIT_PATH}\n{mig.unit_text()}" in files
    return files + [f"systemctl daemon-reload && systemctl enable {mig.UNIT}"]


def join(*commands: str) -> str:
    return " && ".join(commands)


def guard(index: int) -> str:
    return (f"if nvidia-smi -i {index} --query-compute-apps=pid,process_name --format=csv,noheader | grep ,; "
            f"then echo 'gpufleet: GPU {index} ({BUS[index]}, {H100}): processes run on it (above): its MIG "
            "instances were not changed; stop them and run again' >&2; exit 1; fi")


# ------------------------------------------------------------------------------------------------ mode changes


def test_fresh_host_enables_mig_with_holders_stopped_and_restarted_then_creates_instances():
    layout = {0: MIXED, 1: None}
    before = [gpu(0), gpu(1)]
    after = [gpu(0, "Enabled"), gpu(1)]
    commands, noops = run(layout, Seq(inventory(*before), inventory(*after)), migs=mig_state({}),
                          units={FM: {"active_state": "active"}, PD: {"active_state": "active"}})
    assert commands == install_commands(layout, before) + [
        # only the running holders, in stop order; GPU 1 is already MIG-disabled
        f"{mig.APPLIER} mode --holder {FM} --holder {PD} 0=enabled",
        "nvidia-smi mig -i 0 -cgi 9,14,19,19 -C",  # largest first
    ]
    assert noops == []


def test_mode_change_without_running_holders_stops_nothing():
    layout = {0: {"7g.80gb": 1}}
    files = installed(layout, [gpu(0)])
    commands, _ = run(layout, Seq(inventory(gpu(0)), inventory(gpu(0, "Enabled"))), migs=mig_state({}),
                      files=files, units=ENABLED)
    assert commands == [f"{mig.APPLIER} mode 0=enabled", "nvidia-smi mig -i 0 -cgi 0 -C"]


def test_disable_goes_through_the_node_script_which_destroys_the_instances():
    layout = {0: None}
    files = installed(layout, [gpu(0, "Enabled")])
    commands, _ = run(layout, Seq(inventory(gpu(0, "Enabled")), inventory(gpu(0))),
                      migs=mig_state({0: ["7g.80gb"]}), files=files, units=HOLDERS_RUNNING)
    assert commands == [f"{mig.APPLIER} mode --holder {FM} --holder {PD} 0=disabled"]


def test_ampere_pending_mode_is_completed_by_the_node_script():
    """Ampere: "pending enable" after an earlier attempt: the node script resets the GPU (or says reboot)."""
    layout = {0: {"3g.20gb": 2}}
    before = gpu(0, "Disabled", "Enabled", name=A100)
    files = installed(layout, [before])
    commands, _ = run(layout, Seq(inventory(before), inventory(gpu(0, "Enabled", name=A100))),
                      migs=mig_state({}), files=files, units=ENABLED)
    assert commands == [f"{mig.APPLIER} mode 0=enabled", "nvidia-smi mig -i 0 -cgi 9,9 -C"]


def test_reboot_required_leaves_that_gpu_alone_and_says_why(caplog):
    layout = {0: MIXED, 1: {"1g.10gb": 7}}
    before = [gpu(0), gpu(1)]
    status = f"0\t{BUS[0]}\tMIG mode is Disabled (pending Disabled): Unable to enable MIG Mode for GPU " \
             f"{BUS[0]}: In use by another client\n"
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, _ = run(layout, Seq(inventory(*before), inventory(gpu(0), gpu(1, "Enabled"))),
                          migs=mig_state({}), files=installed(layout, before), units=HOLDERS_RUNNING,
                          status=status)
    assert commands == [
        f"{mig.APPLIER} mode --holder {FM} --holder {PD} 0=enabled 1=enabled",
        "nvidia-smi mig -i 1 -cgi 19,19,19,19,19,19,19 -C",  # GPU 1 switched; nothing for GPU 0
    ]
    warning = caplog.text
    assert f"GPU 0 ({BUS[0]}, {H100}): MIG mode is Disabled (pending Disabled), the layout needs Enabled" in warning
    assert "In use by another client" in warning
    assert "Reboot required" in warning and "GPU 1" not in warning


def test_reboot_when_allowed_then_instances_from_the_boot_unit_are_kept():
    layout = {0: MIXED}
    files = installed(layout, [gpu(0)])
    # mode refused now; after the reboot the boot unit switched it and created the instances
    inv = Seq(inventory(gpu(0)), inventory(gpu(0)), inventory(gpu(0, "Enabled")))
    commands, noops = run(layout, inv, migs=mig_state({0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}),
                          files=files, units=ENABLED, allow_reboot=True)
    assert commands[0] == f"{mig.APPLIER} mode 0=enabled"
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in commands
    assert "function wait_and_reconnect" in commands
    assert not any(c.startswith("nvidia-smi mig") for c in commands)


def test_reboot_that_does_not_change_the_mode_fails_this_host():
    layout = {0: MIXED}
    commands, _ = run(layout, Seq(inventory(gpu(0))), migs=mig_state({}), files=installed(layout, [gpu(0)]),
                      units=ENABLED, allow_reboot=True)
    assert commands[-1] == (f"echo 'gpufleet: error: mig.layout: testhost: MIG mode still wrong after a reboot on "
                            f"GPU 0 ({BUS[0]}, {H100}): Disabled, wanted Enabled' >&2; exit 1")


# ------------------------------------------------------------------------------------------------ instances


def test_create_only_when_mig_is_on_and_the_gpu_has_no_instance():
    layout = {0: {"1g.10gb": 7}}
    inv = inventory(gpu(0, "Enabled"))
    commands, _ = run(layout, inv, migs=mig_state({}), files=installed(layout, inv["gpus"]),
                      units=HOLDERS_RUNNING)
    assert commands == ["nvidia-smi mig -i 0 -cgi 19,19,19,19,19,19,19 -C"]  # holders untouched


def test_different_instances_are_destroyed_then_the_layout_created():
    layout = {0: MIXED}
    inv = inventory(gpu(0, "Enabled"))
    commands, _ = run(layout, inv, migs=mig_state({0: ["7g.80gb"]}), files=installed(layout, inv["gpus"]),
                      units=ENABLED)
    assert commands == [join(guard(0), "nvidia-smi mig -i 0 -dci", "nvidia-smi mig -i 0 -dgi",
                             "nvidia-smi mig -i 0 -cgi 9,14,19,19 -C")]


def test_same_profiles_in_another_order_and_gi_ids_match():
    layout = {0: MIXED}
    inv = inventory(gpu(0, "Enabled"))
    commands, noops = run(layout, inv, migs=mig_state({0: ["1g.10gb", "3g.40gb", "1g.10gb", "2g.20gb"]}),
                          files=installed(layout, inv["gpus"]), units=ENABLED)
    assert commands == []
    assert noops == [f"MIG layout already applied on 1 GPU(s), reapplied at boot by {mig.UNIT}"]


def test_partial_or_missing_compute_instance_is_recreated():
    layout = {0: {"3g.40gb": 2}}
    inv = inventory(gpu(0, "Enabled"))
    for kwargs in ({"partial": (0, 1)}, {"without_ci": (0, 0)}):
        migs = mig_state({0: ["3g.40gb", "3g.40gb"]}, **kwargs)
        commands, _ = run(layout, inv, migs=migs, files=installed(layout, inv["gpus"]), units=ENABLED)
        assert commands[-1].endswith(" && nvidia-smi mig -i 0 -dgi && nvidia-smi mig -i 0 -cgi 9,9 -C")


def test_empty_profile_dict_means_mig_on_without_instances():
    layout = {0: {}}
    inv = inventory(gpu(0, "Enabled"))
    commands, _ = run(layout, inv, migs=mig_state({0: ["1g.10gb"]}, without_ci=(0, 0)),
                      files=installed(layout, inv["gpus"]), units=ENABLED)
    assert commands == [join(guard(0), "nvidia-smi mig -i 0 -dgi")]  # no CI to destroy, nothing to create


def test_converged_host_is_noop():
    layout = {0: MIXED, 1: {"1g.10gb": 7}, 2: None}
    gpus = [gpu(0, "Enabled"), gpu(1, "Enabled"), gpu(2)]
    migs = mig_state({0: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], 1: ["1g.10gb"] * 7})
    commands, noops = run(layout, inventory(*gpus), migs=migs, files=installed(layout, gpus),
                          units=HOLDERS_RUNNING)
    assert commands == []
    assert noops == [f"MIG layout already applied on 3 GPU(s), reapplied at boot by {mig.UNIT}"]


def test_changed_layout_rewrites_the_file_but_not_the_unit():
    old, new = {0: {"7g.80gb": 1}}, {0: {"1g.10gb": 7}}
    gpus = [gpu(0, "Enabled")]
    commands, _ = run(new, inventory(*gpus), migs=mig_state({0: ["7g.80gb"]}), files=installed(old, gpus),
                      units=ENABLED)
    assert commands == [
        f"upload {mig.LAYOUT_PATH}\n{layout_file(new, gpus)}",
        join(guard(0), "nvidia-smi mig -i 0 -dci", "nvidia-smi mig -i 0 -dgi",
             "nvidia-smi mig -i 0 -cgi 19,19,19,19,19,19,19 -C"),
    ]


def test_gpus_not_in_the_layout_are_left_alone():
    layout = {1: {"1g.10gb": 7}}
    gpus = [gpu(0, "Enabled"), gpu(1, "Enabled")]
    commands, _ = run(layout, inventory(*gpus), migs=mig_state({0: ["7g.80gb"], 1: ["1g.10gb"] * 7}),
                      files=installed(layout, gpus), units=ENABLED)
    assert commands == []
    assert [g["index"] for g in json.loads(layout_file(layout, gpus))["gpus"]] == [1]


# ------------------------------------------------------------------------------------------------ refusals


def test_profile_the_gpu_does_not_offer_is_refused_naming_gpu_and_profiles():
    with pytest.raises(OperationError) as err:
        run({0: {"1g.5gb": 7}}, inventory(gpu(0, "Enabled")), executing=False)
    message = str(err.value)
    assert f"GPU 0 ({BUS[0]}, {H100}) offers no MIG profile '1g.5gb'" in message
    assert "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in message


HOST_STATE_PROBLEMS = [
    ({0: {"1g.10gb": 8}}, [gpu(0)],
     f"testhost: GPU 0 ({BUS[0]}, {H100}): 8 x 1g.10gb asked for, at most 7 instance(s) of 1g.10gb on {H100}"),
    ({0: {"3g.40gb": 2, "1g.10gb": 1}}, [gpu(0)],
     f"testhost: GPU 0 ({BUS[0]}, {H100}): {{'3g.40gb': 2, '1g.10gb': 1}}: the instances need 9 memory slices and "
     f"7 compute slices; allowed: at most 8 memory slices and 7 compute slices in total on {H100}"),
    ({3: {"1g.10gb": 1}}, [gpu(0), gpu(1)], "GPU 3 is not on testhost (its GPUs: 0, 1)"),
    ({0: {"1g.10gb": 1}}, [gpu(0, None, name="NVIDIA GeForce RTX 4090")],
     f"testhost: GPU 0 ({BUS[0]}, NVIDIA GeForce RTX 4090) does not support MIG (mig.mode.current is N/A)"),
]


@pytest.mark.parametrize(("layout", "gpus", "message"), HOST_STATE_PROBLEMS)
def test_host_state_problems_raise_while_planning(layout, gpus, message):
    # error policy (docs/error-policy.md): found while planning, the run stops before any change on any host
    with pytest.raises(OperationError) as err:
        run(layout, inventory(*gpus), executing=False)
    assert str(err.value) == f"mig.layout: {message}"


@pytest.mark.parametrize(("layout", "gpus", "message"), HOST_STATE_PROBLEMS)
def test_host_state_problems_fail_only_this_host_while_executing(layout, gpus, message):
    # planned while executing (after the driver stage of this run): this host fails, the others go on
    commands, _ = run(layout, inventory(*gpus), executing=True)
    assert commands == [f"echo {shlex.quote('gpufleet: error: mig.layout: ' + message)} >&2; exit 1"]


def test_layout_from_the_pyinfra_cli_has_string_indices():
    gpus = [gpu(0, "Enabled"), gpu(1, "Enabled")]
    from_cli = json.loads('{"0": {"1g.10gb": 7}, "1": null}')
    as_ints = {0: {"1g.10gb": 7}, 1: None}
    commands, _ = run(from_cli, inventory(*gpus), migs=mig_state({0: ["1g.10gb"] * 6}))
    assert commands == run(as_ints, inventory(*gpus), migs=mig_state({0: ["1g.10gb"] * 6}))[0]
    assert f"upload {mig.LAYOUT_PATH}\n{layout_file(as_ints, gpus)}" in commands


def test_deprecated_name_is_the_same_operation():
    assert mig.mig_layout is mig.layout


@pytest.mark.parametrize(("layout", "gpus", "match"), [
    ({"x": None}, [gpu(0)], r"'x' is not a GPU index"),
    ({"0": None, 0: None}, [gpu(0)], r"GPU 0 is listed twice"),
    ({0: ["1g.10gb"]}, [gpu(0)], r"neither None \(MIG disabled\) nor a \{profile: count\} dict"),
    ({0: {"1g.10gb": -1}}, [gpu(0)], r"1g.10gb: -1 is not an instance count"),
    ({0: {"1g.10gb": True}}, [gpu(0)], r"1g.10gb: True is not an instance count"),
])
def test_bad_layouts_are_refused_before_any_command(layout, gpus, match):
    with pytest.raises(OperationValueError, match=match):
        run(layout, inventory(*gpus))


@pytest.mark.parametrize("units", ["nvidia-fabricmanager.service", ["rm -rf /"], [3]])
def test_bad_holder_services_are_refused(units):
    with pytest.raises(OperationValueError, match="holder_services"):
        run({0: None}, inventory(gpu(0)), holder_services=units)


def test_holder_names_are_completed_and_quoted():
    layout = {0: {"7g.80gb": 1}}
    holders = ["my-exporter", "dcgm@gpu0.service"]
    units = {**ENABLED, "my-exporter.service": {"active_state": "active"},
             "dcgm@gpu0.service": {"active_state": "active"}}
    gpus = [gpu(0)]
    files = {**installed(layout, gpus),
             mig.LAYOUT_PATH: layout_file(layout, gpus, ("my-exporter.service", "dcgm@gpu0.service"))}
    commands, _ = run(layout, Seq(inventory(*gpus), inventory(gpu(0, "Enabled"))), migs=mig_state({}),
                      files=files, units=units, holder_services=holders)
    assert commands[0] == f"{mig.APPLIER} mode --holder my-exporter.service --holder dcgm@gpu0.service 0=enabled"


def test_no_gpu_listed_changes_nothing_and_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        commands, noops = run({0: MIXED}, inventory(status="driver_not_loaded"))
    assert commands == []
    assert noops == ["MIG layout not applied: nvidia-smi cannot list the GPUs (driver_not_loaded: NVIDIA-SMI has "
                     "failed)"]
    assert "MIG layout not applied" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert run({0: MIXED}, inventory(status="driver_not_loaded"), executing=False)[0] == []
    assert caplog.text == ""  # while checking for changes: an earlier operation may still load the driver


def test_mig_instances_that_cannot_be_listed_fail_the_operation():
    layout = {0: MIXED}
    inv = inventory(gpu(0, "Enabled"))
    broken = {"status": "error", "error": "Unknown Error", "gpu_instances": [], "compute_instances": []}
    commands, _ = run(layout, inv, migs=broken, files=installed(layout, inv["gpus"]), units=ENABLED)
    assert commands == ["echo 'gpufleet: error: mig.layout: testhost: nvidia-smi cannot list the MIG instances "
                        "(error: Unknown Error)' >&2; exit 1"]


def test_empty_layout_is_noop():
    commands, noops = run({}, inventory(gpu(0)))
    assert (commands, noops) == ([], ["no GPU in the MIG layout"])


# ------------------------------------------------------------------------------------------------ files


def test_layout_file_is_keyed_by_pci_bus_id_and_skips_gpus_without_mig():
    gpus = [gpu(0), gpu(1, None, name="NVIDIA GeForce RTX 4090"), gpu(2, "Enabled")]
    doc = json.loads(layout_file({0: MIXED, 1: None, 2: None}, gpus))
    assert doc["version"] == 1
    assert doc["holder_services"] == list(mig.DEFAULT_HOLDER_SERVICES)
    assert doc["gpus"] == [
        {"pci_bus_id": BUS[0], "index": 0, "name": H100, "mig_enabled": True,
         "instances": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, "create": [9, 14, 19, 19]},
        {"pci_bus_id": BUS[2], "index": 2, "name": H100, "mig_enabled": False, "instances": {}, "create": []},
    ]


def test_boot_unit_is_oneshot_after_the_driver_daemons_and_before_power_limits():
    lines = mig.unit_text().splitlines()
    assert "Type=oneshot" in lines and "RemainAfterExit=yes" in lines
    assert f"ExecStart={mig.LOCKED_APPLIER} {mig.APPLIER} apply {mig.LAYOUT_PATH}" in lines
    after = next(line for line in lines if line.startswith("After=")).split("=", 1)[1].split()
    before = next(line for line in lines if line.startswith("Before=")).split("=", 1)[1].split()
    assert {"nvidia-persistenced.service", "nvidia-fabricmanager.service"} <= set(after)
    assert "gpufleet-power-limits.service" in before
    assert "WantedBy=multi-user.target" in lines


# ------------------------------------------------------------------------------------------------ node script
# gpufleet-mig-apply run with the host's python3 against the simulated nvidia-smi (same state file as the
# simulated hosts use) and a fake systemctl whose "services" are processes holding every GPU open.

FAKE_SMI = """\
#!{python}
import os, sys
sys.path.insert(0, {repo!r})
os.geteuid = lambda: 0
from gpufleet.sim.gpu.nvidia_smi import main
sys.exit(main(sys.argv[1:]))
"""

FAKE_SYSTEMCTL = """\
#!{python}
# Fake systemctl: a "service" is a process registered as a client of every GPU (like nvidia-persistenced).
import os, signal, subprocess, sys
sys.path.insert(0, {repo!r})
from gpufleet.sim.gpu import state
run_dir = {run_dir!r}
with open(os.path.join(run_dir, "calls"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
verb, unit = args[0], args[1]
pid_file = os.path.join(run_dir, unit + ".pid")
def pid():
    try:
        return int(open(pid_file).read())
    except FileNotFoundError:
        return None
if verb == "is-active":
    sys.exit(0 if pid() else 3)
if verb == "stop" and pid():
    with state.locked() as gpus:
        for key in [k for k in gpus if k.endswith(f".client.{{pid()}}")]:
            del gpus[key]
    os.kill(pid(), signal.SIGKILL)
    os.unlink(pid_file)
if verb == "start" and not pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    open(pid_file, "w").write(str(proc.pid))
    with state.locked() as gpus:
        for i in range(state.gpu_count(gpus)):
            gpus[f"gpu.{{i}}.client.{{proc.pid}}"] = unit
"""


class Node:
    """A simulated node for the node script: GPU state file, fake nvidia-smi and systemctl on PATH."""

    def __init__(self, tmp_path: Path, profile: str):
        from gpufleet.sim.gpu import state as simstate
        from gpufleet.sim.hardware import build_state

        self.simstate = simstate
        self.dir = tmp_path
        self.state = tmp_path / "gpus.state"
        gpus = build_state(profile, "node")
        simstate.reset_for_boot(gpus, "580.95.05")
        simstate.write_state(str(self.state), gpus)
        (tmp_path / "driver-version").write_text("580.95.05\n")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name, text in (("nvidia-smi", FAKE_SMI), ("systemctl", FAKE_SYSTEMCTL)):
            (bin_dir / name).write_text(text.format(python=sys.executable, repo=str(REPO), run_dir=str(tmp_path)))
            (bin_dir / name).chmod(0o755)
        self.status = tmp_path / "run" / "mig-reboot-required"
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUFLEET_SIM_STATE": str(self.state),
                    "GPUFLEET_SIM_DRIVER_VERSION_FILE": str(tmp_path / "driver-version"),
                    "GPUFLEET_MIG_STATUS": str(self.status),
                    # the fake systemctl's units never fail: the wait for them to stay up is tested on its own
                    "GPUFLEET_MIG_SETTLE_S": "0"}
        self.procs: list[subprocess.Popen] = []

    def sh(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=60)

    def apply(self, *argv: str) -> subprocess.CompletedProcess:
        return self.sh("python3", str(APPLIER_SRC), *argv)

    def start(self, unit: str) -> None:
        assert self.sh("systemctl", "start", unit).returncode == 0

    def running(self, unit: str) -> bool:
        return self.sh("systemctl", "is-active", "--quiet", unit).returncode == 0

    def calls(self) -> list[str]:
        path = self.dir / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def hold(self, index: int, compute: bool) -> None:
        """A live process on GPU ``index``: a compute process (listed by nvidia-smi) or an NVML client."""
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.procs.append(proc)
        with self.simstate.locked(str(self.state)) as gpus:
            if compute:
                gpus[f"gpu.{index}.proc.{proc.pid}"] = "python3,1024"
            else:
                gpus[f"gpu.{index}.client.{proc.pid}"] = "monitoring-agent"

    def gpu(self, index: int) -> dict[str, str]:
        return self.simstate.gpu(self.simstate.read_state(str(self.state)), index)

    def instances(self, index: int) -> list[str]:
        fields = self.gpu(index)
        profiles = {k.split(".")[2]: v.split(",")[0] for k, v in fields.items() if k.startswith("mig.gip.")}
        return sorted(profiles[v.split(",")[0]] for k, v in fields.items() if k.startswith("mig.gi."))

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for pid_file in self.dir.glob("*.pid"):
            os.kill(int(pid_file.read_text()), 9)


@pytest.fixture
def node(tmp_path):
    made = []

    def make(profile: str = "h100-sxm-8") -> Node:
        made.append(Node(tmp_path, profile))
        return made[-1]

    yield make
    for n in made:
        n.close()


def test_node_script_is_standard_library_python_3_7():
    source = APPLIER_SRC.read_text()
    assert source.startswith("#!/usr/bin/env python3\n")
    imports = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "json", "os", "re", "subprocess", "sys", "time"}
    ast.parse(source, feature_version=(3, 7))


def test_node_mode_stops_running_holders_switches_and_restarts_them(node):
    n = node()
    n.start(FM)
    holders = ("--holder", "nvidia-dcgm.service", "--holder", FM, "--holder", PD)
    result = n.apply("mode", *holders, "0=enabled", "1=enabled")
    assert result.returncode == 0, result.stdout
    assert n.gpu(0)["mig.current"] == n.gpu(1)["mig.current"] == "1"
    assert n.gpu(2)["mig.current"] == "0"
    mutating = [c for c in n.calls() if not c.startswith("is-active")]
    assert mutating == [f"start {FM}", f"stop {FM}", f"start {FM}"]  # dcgm and persistenced were not running
    assert n.running(FM)
    assert not n.status.exists()


def test_node_mode_with_the_mode_already_right_touches_nothing(node):
    n = node()
    n.start(FM)
    assert n.apply("mode", "--holder", FM, "0=disabled").returncode == 0
    assert n.calls() == [f"start {FM}"]


def test_node_mode_leaves_a_gpu_with_a_compute_process_alone(node):
    n = node()
    n.start(FM)
    n.hold(3, compute=True)
    result = n.apply("mode", "--holder", FM, "3=enabled")
    assert result.returncode == 0
    assert n.gpu(3)["mig.current"] == "0"
    assert n.calls() == [f"start {FM}"]  # the fabric manager was not stopped for nothing
    index, bus, why = n.status.read_text().strip().split("\t")
    assert (index, bus) == ("3", n.gpu(3)["pci.bus_id"])
    assert why.startswith("in use by pid ") and why.endswith("(python3)")


def test_node_mode_hopper_client_that_is_no_service_means_reboot_and_holders_come_back(node):
    n = node()
    n.start(FM)
    n.hold(0, compute=False)  # e.g. a monitoring agent gpufleet does not know
    result = n.apply("mode", "--holder", FM, "0=enabled", "1=enabled")
    assert result.returncode == 0
    assert (n.gpu(0)["mig.current"], n.gpu(1)["mig.current"]) == ("0", "1")
    assert n.running(FM)
    lines = n.status.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("0\t")
    assert "Unable to enable MIG Mode" in lines[0] and "In use by another client" in lines[0]
    assert "reboot required" in result.stdout


def test_node_mode_ampere_pending_is_reset_or_reported(node):
    n = node("a100-40gb-1")
    n.hold(0, compute=False)
    assert n.apply("mode", "0=enabled").returncode == 0
    assert (n.gpu(0)["mig.current"], n.gpu(0)["mig.pending"]) == ("0", "1")  # pending: reset refused
    assert "In use by another client" in n.status.read_text()
    n.close()
    n.procs = []
    result = n.apply("mode", "0=enabled")
    assert "nvidia-smi -r -i 0: exit 0" in result.stdout
    assert n.gpu(0)["mig.current"] == "1"
    assert not n.status.exists()


def test_node_mode_disable_destroys_instances_first(node):
    n = node()
    n.apply("mode", "0=enabled")
    assert n.sh("nvidia-smi", "mig", "-i", "0", "-cgi", "9,9", "-C").returncode == 0
    result = n.apply("mode", "0=disabled")
    assert result.returncode == 0, result.stdout
    assert n.gpu(0)["mig.current"] == "0"
    assert n.instances(0) == []


def write_layout(n: Node, entries: list[dict], holders=(FM,)) -> str:
    path = n.dir / "mig-layout.json"
    path.write_text(json.dumps({"version": 1, "holder_services": list(holders), "gpus": entries}))
    return str(path)


def test_node_apply_at_boot_switches_mode_and_creates_missing_instances(node):
    n = node()
    n.start(FM)
    n.apply("mode", "0=enabled")
    bus = [n.gpu(i)["pci.bus_id"] for i in range(3)]
    path = write_layout(n, [
        {"pci_bus_id": bus[0], "mig_enabled": True, "create": [9, 14, 19, 19]},
        {"pci_bus_id": bus[1].replace("00000000:", "0000:").lower(), "mig_enabled": True, "create": [0]},
        {"pci_bus_id": bus[2], "mig_enabled": False, "create": []},
    ])
    result = n.apply("apply", path)
    assert result.returncode == 0, result.stdout
    assert n.instances(0) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert n.instances(1) == ["7g.80gb"] and n.gpu(1)["mig.current"] == "1"
    assert n.running(FM)
    again = n.apply("apply", path)
    assert again.returncode == 0 and "MIG instances match the layout" in again.stdout
    assert n.instances(0) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]


def test_node_apply_creates_a_missing_default_compute_instance(node):
    n = node()
    n.apply("mode", "0=enabled")
    assert n.sh("nvidia-smi", "mig", "-i", "0", "-cgi", "9,9").returncode == 0  # no -C
    path = write_layout(n, [{"pci_bus_id": n.gpu(0)["pci.bus_id"], "mig_enabled": True, "create": [9, 9]}])
    result = n.apply("apply", path)
    assert result.returncode == 0, result.stdout
    cis = [k for k in n.gpu(0) if k.startswith("mig.ci.")]
    assert len(cis) == 2


def test_node_apply_leaves_other_instances_and_missing_gpus_and_fails(node):
    n = node()
    n.apply("mode", "0=enabled")
    assert n.sh("nvidia-smi", "mig", "-i", "0", "-cgi", "0", "-C").returncode == 0
    path = write_layout(n, [
        {"pci_bus_id": n.gpu(0)["pci.bus_id"], "mig_enabled": True, "create": [19]},
        {"pci_bus_id": "00000000:FF:00.0", "mig_enabled": True, "create": [19]},
    ])
    result = n.apply("apply", path)
    assert result.returncode == 1
    assert n.instances(0) == ["7g.80gb"]
    assert "has other MIG instances than the layout (7g.80gb): left alone" in result.stdout
    assert "GPU 00000000:FF:00.0 of the layout is not present" in result.stdout


def test_node_script_usage_and_unreadable_layout(node, tmp_path):
    n = node()
    assert n.apply("mode", "0=on").returncode == 2
    assert n.apply("bogus").returncode == 2
    result = n.apply("apply", str(tmp_path / "missing.json"))
    assert result.returncode == 1 and "cannot read the layout" in result.stdout


def test_installed_script_is_the_packaged_source():
    assert node_script("mig_apply.py") == APPLIER_SRC.read_text()
    assert textwrap.dedent(mig.layout.__doc__ or "")  # documented


def test_layout_entry_of_a_lost_gpu_is_kept_for_boot_with_a_warning(caplog):
    # GPU 1 fell off the bus: nvidia-smi lists GPU 0 only and names GPU 1's bus id
    layout = {0: {"7g.80gb": 1}, 1: {"1g.10gb": 7}}
    gpus = [gpu(0, "Enabled"), gpu(1, "Enabled")]
    files = installed(layout, gpus)
    inv = gpu_inventory([gpus[0]], status="ok", lost=(BUS[1],))
    commands, noops = run({0: {"7g.80gb": 1}}, inv, migs=mig_state({0: ["7g.80gb"]}), files=files, units=ENABLED)
    assert commands == []  # the file still holds GPU 1's entry: nothing to rewrite, nothing reported changed
    assert noops == ["MIG layout already applied on 1 GPU(s), reapplied at boot by gpufleet-mig.service"]
    assert f"GPU {BUS[1]} is missing" in caplog.text


def test_entry_of_a_gpu_gone_without_a_lost_gpu_is_dropped():
    layout = {0: {"7g.80gb": 1}, 1: {"1g.10gb": 7}}
    gpus = [gpu(0, "Enabled"), gpu(1, "Enabled")]
    commands, _ = run({0: {"7g.80gb": 1}}, inventory(gpus[0]), migs=mig_state({0: ["7g.80gb"]}),
                      files=installed(layout, gpus), units=ENABLED)
    assert commands == [f"upload {mig.LAYOUT_PATH}\n{layout_file({0: {'7g.80gb': 1}}, gpus)}"]


def test_boot_apply_runs_under_the_host_lock_and_names_itself(tmp_path, monkeypatch):
    """The boot unit's wrapper takes the host lock (flock on the lock file), writes itself as the holder for the
    command's lifetime, and frees the holder after; a converge arriving meanwhile is refused naming it."""
    from gpufleet.operations import lock

    lock_file = tmp_path / "run" / "host.lock"
    monkeypatch.setattr(lock, "LOCK_FILE", str(lock_file))
    monkeypatch.setattr(lock, "LOCK_DIR", str(lock_file.parent))
    wrapper = tmp_path / "locked"
    wrapper.write_text(mig.locked_applier_text())
    wrapper.chmod(0o755)
    seen = tmp_path / "seen"
    subprocess.run([str(wrapper), "sh", "-c", f"cat {lock_file} > {seen}"], check=True, timeout=30)
    holder = dict(line.split("=", 1) for line in seen.read_text().splitlines())
    assert holder["command"] == f"{mig.UNIT} (boot)" and holder["pid"].isdigit()
    assert lock_file.read_text() == "generation=1\n"  # the holder is gone once the apply ends
