"""The simulated fleet (`gpufleet sim up`) as the example fleet's groups, so the same group_data applies.

    gpufleet sim up --hosts 3 --profile h100-sxm-8 --profile a100-40gb-1 --profile rtx4090-1
    pyinfra inventories/sim.py deploys/gpu_node.py

Profiles map to groups: h100-sxm-8 / h200-8 -> hgx_h100, a100-* -> a100, rtx4090-1 -> workstations, any other
-> gpu_nodes only; cpu-only -> monitoring (not a GPU node: `pyinfra inventories/sim.py deploys/monitoring.py`).
The simulator's package repository stands in for NVIDIA's (an air-gapped mirror, in effect).
"""

from gpufleet.sim.inventory import sim_groups

_groups = sim_groups({"h100-sxm-8": "hgx_h100", "h200-8": "hgx_h100", "a100-80gb-8": "a100", "a100-40gb-1": "a100",
                      "rtx4090-1": "workstations", "cpu-only": "monitoring"})
hgx_h100 = _groups.get("hgx_h100", [])
a100 = _groups.get("a100", [])
workstations = _groups.get("workstations", [])
monitoring = _groups.get("monitoring", [])
gpu_nodes = _groups["gpu_nodes"]
