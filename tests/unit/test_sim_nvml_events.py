"""The simulated NVML's event API (Xid critical errors) through the real nvidia-ml-py, and the Xid fault's
kernel log line as verify parses it."""

from __future__ import annotations

import test_sim_nvml as base

from gpufleet.sim import faults
from gpufleet.sim.gpu import state as simstate
from gpufleet.verify.xid import parse_xid_lines

libdir = base.libdir  # the fixtures of the simulated NVML's own tests: the library built once per session
sim = base.sim
make_state = base.make_state

_WAIT = '''
nvmlInit()
h = nvmlDeviceGetHandleByIndex(1)
out["supported"] = err(nvmlDeviceGetSupportedEventTypes, h)
es = nvmlEventSetCreate()
out["register"] = err(nvmlDeviceRegisterEvents, h, nvmlEventTypeXidCriticalError, es)
out["before"] = err(nvmlEventSetWait_v2, es, 50)
import subprocess
subprocess.run([sys.executable, "-c", INJECT], check=True)
events = []
for _ in range(3):
    d = err(nvmlEventSetWait_v2, es, 2000)
    events.append(d if isinstance(d, str) else
                  [nvmlDeviceGetIndex(d.device), d.eventType, d.eventData, d.gpuInstanceId])
out["events"] = events
nvmlEventSetFree(es)
'''


def _inject_script(path, gpu: int, codes: list[int]) -> str:
    return ("from gpufleet.sim.gpu import state\n"
            f"with state.locked({str(path)!r}) as s:\n"
            f"    s['gpu.{gpu}.xid.log'] = ','.join(filter(None, [s.get('gpu.{gpu}.xid.log', ''), "
            f"{','.join(map(str, codes))!r}]))\n")


def test_xid_events_are_delivered_in_order_then_time_out(sim):
    state = make_state("h100-sxm-8")
    state["gpu.1.xid.log"] = "13"  # an Xid before the registration is not delivered
    sim.write(state)
    out = sim.run(f"INJECT = {_inject_script(sim.path, 1, [79, 48])!r}\n" + _WAIT)
    assert out["supported"] & 0x8 and out["supported"] & 0x3  # Xid; ECC events on an ECC GPU
    assert out["register"] is None
    assert out["before"] == "NVMLError_Timeout"
    assert out["events"] == [[1, 0x8, 79, 0xFFFFFFFF], [1, 0x8, 48, 0xFFFFFFFF], "NVMLError_Timeout"]


def test_no_events_on_a_platform_without_them(sim):
    state = make_state("rtx4090-1")
    state["gpu.0.events.supported"] = "0"
    sim.write(state)
    out = sim.run('''
nvmlInit()
h = nvmlDeviceGetHandleByIndex(0)
out["supported"] = err(nvmlDeviceGetSupportedEventTypes, h)
es = nvmlEventSetCreate()
out["register"] = err(nvmlDeviceRegisterEvents, h, nvmlEventTypeXidCriticalError, es)
''')
    assert out == {"supported": "NVMLError_NotSupported", "register": "NVMLError_NotSupported"}


def test_geforce_has_xid_events_but_no_ecc_events(sim):
    sim.write(make_state("rtx4090-1"))
    out = sim.run('''
nvmlInit()
h = nvmlDeviceGetHandleByIndex(0)
out["supported"] = nvmlDeviceGetSupportedEventTypes(h)
es = nvmlEventSetCreate()
out["ecc"] = err(nvmlDeviceRegisterEvents, h, nvmlEventTypeDoubleBitEccError, es)
''')
    assert out["supported"] & 0x8 and not out["supported"] & 0x3
    assert out["ecc"] == "NVMLError_NotSupported"


def test_xid_fault_line_is_what_verify_parses():
    gpus = {"gpu.count": "2", "gpu.1.pci.bus_id": "00000000:2A:00.0", "gpu.1.xid.log": "13"}
    line = faults._xid(gpus, "gpu.1.", 79)
    assert gpus["gpu.1.xid.log"] == "13,79"
    [event] = parse_xid_lines(f"2026-12-03T19:00:00+0000 node02 kernel: {line}")
    assert event.code == 79 and event.matches_bus_id("00000000:2A:00.0")
    faults._restore(gpus)
    assert "gpu.1.xid.log" not in gpus and simstate.gpu_count(gpus) == 2
