# Every host of the fleet: one driver branch everywhere (pinned and held).
gpufleet_driver_branch = "580"
gpufleet_driver_flavour = "auto"  # open kernel modules on Turing and newer (required on Blackwell)
