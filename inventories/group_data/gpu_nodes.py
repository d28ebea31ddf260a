# All GPU nodes: NCCL defaults for the cluster network (the job's environment still wins).
gpufleet_nccl = {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "^docker,lo"}
