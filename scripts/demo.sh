#!/usr/bin/env bash
# The main job on the simulated fleet: bring up 3 bare GPU servers and a GPU-less monitoring host, converge them
# with `pyinfra inventories/sim.py deploys/gpu_node.py` (driver from the simulator's repository, persistence,
# power limits, MIG layout, NCCL, exporters), run it again (no change), show the fleet's state, verify it, deploy
# Prometheus + Alertmanager with `deploys/monitoring.py`, watch an alert fire and resolve, tear down.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"

trap 'echo; echo "--- tearing down the simulated fleet"; gpufleet sim down' EXIT
echo "--- bringing up 3 bare simulated GPU servers (no driver) and a monitoring host without GPU"
gpufleet sim up --force --hosts 4 --profile h100-sxm-8 --profile a100-40gb-1 --profile rtx4090-1 --profile cpu-only
gpufleet sim status
echo; echo "--- converging: pyinfra inventories/sim.py deploys/gpu_node.py -y"
pyinfra -y inventories/sim.py deploys/gpu_node.py 2>&1 | sed -n '/--> Results:/,$p'
echo; echo "--- second run: a converged fleet reports no change"
pyinfra -y inventories/sim.py deploys/gpu_node.py 2>&1 | sed -n '/--> Results:/,$p'
echo; echo "--- power-cycling node02: settings come back from the boot units"
gpufleet sim reboot node02
echo; echo "--- the fleet, read with one nvidia-smi query per host"
pyinfra -y inventories/sim.py deploys/fleet_inventory.py 2>&1 >/dev/null | sed -n '/^HOST /,/^$/p' | grep -v '^    '
echo; echo "--- verify: probe every node, check it against its configuration, write the fleet report"
gpufleet verify inventories/sim.py --out build/verify
echo; echo "--- a GPU overheats on node01: verify names that GPU and nothing else (exit code 1)"
gpufleet sim fault node01 overheat --gpu 3
gpufleet verify inventories/sim.py --out build/verify 2>/dev/null | sed -n '/^failures:/,/^report:/p' || true
gpufleet sim fault node01 clear
echo; echo "HTML report (the faulty run, with the change from the clean one): $PWD/build/verify/report.html"
echo; echo "--- monitoring: Prometheus, Alertmanager and Grafana on node04, scrape targets and labels from the same inventory"
# intervals shortened for the demo (the example group_data has production values); no receiver. Grafana comes from
# the simulator's repository (Grafana's own unit and /etc/default file, a stand-in server); its admin password from
# the environment, as the monitoring group data reads it
export GPUFLEET_GRAFANA_ADMIN_PASSWORD="${GPUFLEET_GRAFANA_ADMIN_PASSWORD:-demo-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
pyinfra -y inventories/sim.py deploys/monitoring.py --data gpufleet_monitoring_scrape_interval=2s \
    --data gpufleet_monitoring_evaluation_interval=2s --data 'gpufleet_monitoring_alert_for={"GpuOverheating": "4s"}' \
    --data gpufleet_monitoring_group_wait=1s --data 'gpufleet_monitoring_receivers=[]' \
    2>&1 | sed -n '/--> Results:/,$p'
monitor="$(gpufleet sim status | awk '$1 == "node04" {print $2}')"
echo; echo "--- Grafana on http://$monitor:3000 (admin, password in GPUFLEET_GRAFANA_ADMIN_PASSWORD): provisioned dashboards"
curl -fsS -u "admin:$GPUFLEET_GRAFANA_ADMIN_PASSWORD" "http://$monitor:3000/api/search" | python3 -c \
    'import json, sys; [print(" ", d["folderTitle"], "/", d["title"]) for d in json.load(sys.stdin)]'
echo; echo "--- a GPU overheats on node01: the alert reaches Alertmanager, then resolves once the fault is cleared"
python scripts/demo_alert.py "$(gpufleet sim status | awk '$1 == "node04" {print $2}')" node01 3
