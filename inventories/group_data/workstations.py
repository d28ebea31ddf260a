# Workstation: no MIG on GeForce; a fixed 350 W cap for a quiet office.
gpufleet_stages = ["driver", "persistence", "power", "nccl"]
gpufleet_power_limit = 350
