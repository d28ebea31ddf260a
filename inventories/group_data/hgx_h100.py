# HGX H100: GPUs 0-1 split with MIG for inference, the rest whole for training. The layout is NVIDIA
# mig-parted's own format, so an existing mig-parted config file works unchanged.
gpufleet_mig_config_file = "inventories/mig/hgx-h100.yaml"
gpufleet_mig_config = "inference-2-training-6"
