# The monitoring host has no GPU: no GPU stages (deploys/monitoring.py configures it).
gpufleet_stages = []
