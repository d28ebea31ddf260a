# A100 nodes: power-capped to 80 % of the default limit (reapplied at every boot).
gpufleet_power_limit = "80%"
