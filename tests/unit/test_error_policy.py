"""docs/error-policy.md, per operation: bad arguments raise at plan time; host-state problems refuse(): an
OperationError while planning (no host changed), a command failing only this host while executing; the message
names the operation, host, GPU and cause."""

from __future__ import annotations

import shlex

import pytest
from pyinfra.api import OperationError, OperationValueError, State
from pyinfra_harness import gpu_inventory, managed_state, run_operation

from gpufleet.facts.files import ManagedState
from gpufleet.facts.mig import MigState
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.operations import clocks, mig, power

H100 = "NVIDIA H100 80GB HBM3"
RTX = "NVIDIA GeForce RTX 4090"
UUID0 = "GPU-0c5ef656-7642-5c6a-a509-453b0e5cca1e"
ABSENT = "GPU-61da76c4-0cad-5e7c-83d5-994bce5c83e1"
BUS0 = "00000000:18:00.0"


def gpu(name: str = H100, **more) -> dict:
    return {"index": 0, "uuid": UUID0, "name": name, "pci_bus_id": BUS0, "power_limit_w": 700.0,
            "power_default_w": 700.0, "power_min_w": 200.0, "power_max_w": 700.0, "mig_current": "Disabled",
            "mig_pending": "Disabled", "clocks_max_sm_mhz": 1980, **more}


def run(operation, inventory_gpu: dict, **kwargs):
    facts = {GpuInventory: gpu_inventory([inventory_gpu]), ManagedState: managed_state(),
             MigState: {"status": "not_enabled", "error": None, "gpu_instances": [], "compute_instances": []}}
    return run_operation(operation, facts=facts, **kwargs)


BAD_ARGUMENTS = [
    (power.limits, {"limits": {"0": 300}}, "power.limits: '0' is not a GPU UUID"),
    (power.limits, {"limits": {UUID0: -1}}, "is not a power limit in watts"),
    (clocks.locked, {"lock_mhz": (2000, 1000)}, "clocks.locked: lock_mhz 2000,1000: need 0 < min <= max"),
    (clocks.locked, {"lock_mhz": "fast"}, "clocks.locked: lock_mhz must be (min MHz, max MHz) integers"),
    (mig.layout, {"layout": {0: ["1g.10gb"]}}, "mig.layout: GPU 0: ['1g.10gb'] is neither None"),
    (mig.layout, {"layout": {"first": None}}, "mig.layout: 'first' is not a GPU index"),
]

HOST_STATE = [
    (power.limits, gpu(), {"limits": {ABSENT: 500}},
     f"power.limits: GPU {ABSENT} is not on testhost (its GPUs: {UUID0})"),
    (power.limits, gpu(), {"limits": {UUID0: 800}},
     f"power.limits: 800 W for GPU {UUID0} ({H100}) on testhost is outside its range 200-700 W"),
    (power.limits, gpu(power_limit_w=None), {"limits": {UUID0: 500}},
     f"power.limits: GPU {UUID0} ({H100}) on testhost does not report a power limit (not supported)"),
    (clocks.locked, gpu(clocks_max_sm_mhz=1410), {"lock_mhz": (1500, 1500)},
     f"clocks.locked: testhost: GPU 0 ({H100}): lock_mhz 1500,1500 starts above the GPU's max SM clock 1410 MHz"),
    (mig.layout, gpu(), {"layout": {1: None}}, "mig.layout: GPU 1 is not on testhost (its GPUs: 0)"),
    (mig.layout, gpu(RTX, mig_current=None, mig_pending=None), {"layout": {0: {"1g.10gb": 1}}},
     f"mig.layout: testhost: GPU 0 ({BUS0}, {RTX}) does not support MIG (mig.mode.current is N/A)"),
    (mig.layout, gpu(), {"layout": {0: {"1g.5gb": 1}}},
     f"mig.layout: testhost: GPU 0 ({BUS0}, {H100}) offers no MIG profile '1g.5gb'; its profiles: 1g.10gb, "
     "1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
]


@pytest.mark.parametrize(("operation", "kwargs", "message"), BAD_ARGUMENTS)
def test_bad_arguments_raise_at_plan_time(operation, kwargs, message, monkeypatch):
    monkeypatch.setattr(State, "is_executing", True)  # also while executing: the call itself is wrong
    with pytest.raises(OperationValueError) as err:
        run(operation, gpu(), **kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize(("operation", "state", "kwargs", "message"), HOST_STATE)
def test_host_state_problems_stop_the_run_while_planning(operation, state, kwargs, message):
    with pytest.raises(OperationError) as err:
        run(operation, state, **kwargs)
    assert not isinstance(err.value, OperationValueError)
    assert str(err.value) == message


@pytest.mark.parametrize(("operation", "state", "kwargs", "message"), HOST_STATE)
def test_host_state_problems_fail_only_this_host_while_executing(operation, state, kwargs, message, monkeypatch):
    monkeypatch.setattr(State, "is_executing", True)
    commands, _ = run(operation, state, **kwargs)
    assert commands == [f"echo {shlex.quote('gpufleet: error: ' + message)} >&2; exit 1"]  # nothing else runs
