"""Test deploy for the persistence, power, NCCL and clocks stages; its arguments come from host data.

Host data (all optional; ``pyinfra --data key=value``):
  settings_power_percent  power limit as percent of each GPU's default (default 80); "none": limits={}
  settings_nccl           "KEY=VALUE,KEY=VALUE" (default: two keys); "none": settings={}
  settings_clocks         "MIN,MAX" locks the clocks; "reset": lock_mhz=None; absent: no clocks stage
  settings_bad_uuid_host  a host name: that host's limits also name a GPU it does not have
"""

from pyinfra import host

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.operations import clocks, nccl, persistence, power

gpus = host.get_fact(GpuInventory)["gpus"]
percent = str(host.data.get("settings_power_percent", "80"))
limits = (
    {} if percent == "none" else {gpu["uuid"]: round(gpu["power_default_w"] * float(percent) / 100) for gpu in gpus}
)
if host.data.get("settings_bad_uuid_host") == host.name:
    limits["GPU-00000000-0000-0000-0000-000000000000"] = 300
nccl_data = str(host.data.get("settings_nccl", "NCCL_SOCKET_IFNAME==eth0,NCCL_DEBUG=WARN,NCCL_IB_DISABLE=1"))
settings = {} if nccl_data == "none" else dict(item.split("=", 1) for item in nccl_data.split(","))

persistence.nvidia_persistenced(name="nvidia-persistenced with persistence mode on")
power.limits(name=f"power limits at {percent}% of default", limits=limits)
nccl.nccl_conf(name="NCCL settings", settings=settings)

lock = host.data.get("settings_clocks")
if lock == "reset":
    clocks.locked(name="GPU clocks reset", lock_mhz=None)
elif lock:
    low, high = (int(v) for v in str(lock).split(","))
    clocks.locked(name=f"GPU clocks locked at {low},{high} MHz", lock_mhz=(low, high))
