"""Read every host's GPU inventory (one nvidia-smi query per host) and print a fleet table.

    pyinfra INVENTORY deploys/fleet_inventory.py
"""

from pyinfra import host, inventory

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.report.fleet_table import collect_and_print

collect_and_print(host, inventory, host.get_fact(GpuInventory))
