"""Where the plan's boot files and units live on a node (written by the operations, read at boot)."""

SETTINGS_DIR = "/etc/gpufleet"
POWER_CONF = f"{SETTINGS_DIR}/power-limits.conf"
CLOCKS_CONF = f"{SETTINGS_DIR}/gpu-clocks.conf"
MIG_LAYOUT = f"{SETTINGS_DIR}/mig-layout.json"
POWER_UNIT = "gpufleet-power-limits.service"
CLOCKS_UNIT = "gpufleet-gpu-clocks.service"
MIG_UNIT = "gpufleet-mig.service"
MIG_APPLIER = "/usr/local/sbin/gpufleet-mig-apply"
# the shared MIG comparison (gpufleet/node/mig_compare.py), which the applier imports
MIG_COMPARE = "/usr/local/lib/gpufleet/mig_compare.py"
