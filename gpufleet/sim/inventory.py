"""The running simulated fleet as pyinfra inventory groups (used by inventories/sim.py)."""

from __future__ import annotations

from .hosts import Fleet, SimError, inventory_host_data


def sim_groups(profile_groups: dict[str, str]) -> dict[str, list]:
    """{group: [(host, data), ...]} for the fleet that is up; every host is also in ``gpu_nodes``."""
    fleet = Fleet.load()
    if fleet is None:
        raise SimError("no simulated fleet is up (gpufleet sim up)")
    groups: dict[str, list] = {"gpu_nodes": []}
    for host in fleet.hosts:
        entry = (host.name, inventory_host_data(fleet, host))
        groups["gpu_nodes"].append(entry)
        group = profile_groups.get(host.profile)
        if group:
            groups.setdefault(group, []).append(entry)
    return groups
