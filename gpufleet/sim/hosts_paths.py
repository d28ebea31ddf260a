"""Paths inside a simulated host that the harness and the simulated hardware agree on."""

HW_MOUNT = "/var/lib/gpufleet-sim/hw"  # the host's hardware directory (GPU state file, PCI devices)
