#!/usr/bin/env bash
# The main job on the simulated fleet: bring up 3 bare GPU servers, converge them with
# `pyinfra inventories/sim.py deploys/gpu_node.py` (driver from the simulator's repository, persistence,
# power limits, MIG layout, NCCL), run it again (no change), show the fleet's state, tear down.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"

trap 'echo; echo "--- tearing down the simulated fleet"; gpufleet sim down' EXIT
echo "--- bringing up 3 bare simulated GPU servers (no driver)"
gpufleet sim up --force --hosts 3 --profile h100-sxm-8 --profile a100-40gb-1 --profile rtx4090-1
gpufleet sim status
echo; echo "--- converging: pyinfra inventories/sim.py deploys/gpu_node.py -y"
pyinfra -y inventories/sim.py deploys/gpu_node.py 2>&1 | sed -n '/--> Results:/,$p'
echo; echo "--- second run: a converged fleet reports no change"
pyinfra -y inventories/sim.py deploys/gpu_node.py 2>&1 | sed -n '/--> Results:/,$p'
echo; echo "--- power-cycling node02: settings come back from the boot units"
gpufleet sim reboot node02
echo; echo "--- the fleet, read with one nvidia-smi query per host"
pyinfra -y inventories/sim.py deploys/fleet_inventory.py 2>/dev/null | sed -n '/^HOST /,/^$/p' | grep -v '^    '
