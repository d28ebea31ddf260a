"""An example heterogeneous GPU fleet (pyinfra inventory). Settings per group live in group_data/.

    pyinfra inventories/example.py deploys/gpu_node.py

Groups: an HGX H100 cluster with a MIG layout on part of its GPUs, an A100 group power-capped to 80 %,
an RTX 4090 workstation, and a monitoring host (no GPU stages).
"""

hgx_h100 = [f"gpu-h100-{n:02d}.cluster.example" for n in range(1, 5)]
a100 = ["gpu-a100-01.cluster.example", "gpu-a100-02.cluster.example"]
workstations = ["ws-rtx4090-01.lab.example"]
monitoring = ["monitor-01.cluster.example"]

gpu_nodes = hgx_h100 + a100 + workstations
