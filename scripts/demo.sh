#!/usr/bin/env bash
# The main job on the simulated fleet: bring up 3 hosts with the driver preinstalled, read every host's
# GPU inventory with pyinfra and print a fleet table, tear down.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
inventory=build/sim-inventory.py

trap 'echo "--- tearing down the simulated fleet"; gpufleet sim down' EXIT
echo "--- bringing up 3 simulated GPU hosts"
gpufleet sim up --force --hosts 3 --profile h100-sxm-8 --profile a100-40gb-1 --profile rtx4090-1 \
    --driver preinstalled --inventory "$inventory"
gpufleet sim status
echo "--- pyinfra: reading the GPU inventory of every host"
pyinfra -y "$inventory" deploys/fleet_inventory.py
