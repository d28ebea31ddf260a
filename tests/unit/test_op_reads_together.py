"""Every gpufleet operation reads its files in the same ManagedState and its units in the same UnitStates: one read
of each per host and run (the fact memo then answers every operation from it), whatever paths an operation asks."""

from __future__ import annotations

from pyinfra.api import Config, State
from pyinfra.context import ctx_host, ctx_state
from pyinfra_harness import FakeHost, managed_state

from gpufleet.config import DEFAULT_TEXTFILE_DIR
from gpufleet.facts.files import ManagedState
from gpufleet.facts.systemd import UnitStates
from gpufleet.operations import clocks, driver, exporters, mig, nccl, persistence, power, reads, slurm

GPUS = [{"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0", "power_limit_w": 500.0,
         "persistence": True, "mig_enabled": None}]


def _reads(*calls) -> FakeHost:
    """The fact reads of ``calls`` (operation, kwargs), each run on a converged-looking host."""
    builder = managed_state()
    host = FakeHost("testhost", {ManagedState: builder, UnitStates: lambda units: builder(units=units)["units"]})
    state = State()
    state.config = Config()
    with ctx_state.use(state), ctx_host.use(host):
        for operation, kwargs in calls:
            list(operation._inner(**kwargs))
    return host


def _kwargs(host: FakeHost, fact: type) -> set[frozenset]:
    return {key[1] for key in host.fact_calls if isinstance(key, tuple) and key[0] is fact}


def test_operations_share_one_files_read_and_one_units_read():
    host = _reads(
        (nccl.nccl_conf, {"settings": {"NCCL_DEBUG": "WARN"}}),
        (exporters.desired_state, {"textfile_dir": DEFAULT_TEXTFILE_DIR, "gpus": GPUS}),
        (slurm.gres_conf, {"gpus": ["NVIDIA H100 80GB HBM3"]}),
        (exporters.gpu_exporter, {"kind": "none"}),
    )
    files, units = _kwargs(host, ManagedState), _kwargs(host, UnitStates)
    assert len(files) == 1 and len(units) == 1
    asked = dict(next(iter(files)))
    # every module's own files are in it, not only those of the operations that ran
    for path in (nccl.DEFAULT_PATH, slurm.GRES_CONF, *driver.MANAGED_FILES, persistence.DROP_IN, mig.LAYOUT_PATH,
                 power.CONF, clocks.LOCKED, exporters.NVML_BUNDLE, exporters.NODE_EXPORTER_DEFAULTS):
        assert path in asked["paths"]
    assert {mig.LAYOUT_PATH, mig.STATUS_PATH, power.CONF, clocks.CONF, clocks.LOCKED} <= set(asked["read"])
    assert list(asked["paths"]) == sorted(asked["paths"])


def test_a_path_no_module_declares_is_read_with_the_others():
    host = _reads((nccl.nccl_conf, {"settings": {"NCCL_DEBUG": "WARN"}, "path": "/opt/nccl/nccl.conf"}))
    (asked,) = _kwargs(host, ManagedState)
    paths = dict(asked)["paths"]
    assert "/opt/nccl/nccl.conf" in paths and set(reads._FILES_READ_TOGETHER) < set(paths)
