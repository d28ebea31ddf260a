"""The running simulated fleet as pyinfra inventory groups (used by inventories/sim.py)."""

from __future__ import annotations

from .hosts import Fleet, SimError, inventory_host_data

NOT_GPU_NODES = ("monitoring",)  # groups whose hosts are not GPU nodes (a GPU-less monitoring host)


def sim_groups(profile_groups: dict[str, str]) -> dict[str, list]:
    """{group: [(host, data), ...]} for the fleet that is up; every host is also in ``gpu_nodes``, but those of a
    group in :data:`NOT_GPU_NODES`."""
    fleet = Fleet.load()
    if fleet is None:
        raise SimError("no simulated fleet is up (gpufleet sim up)")
    groups: dict[str, list] = {"gpu_nodes": []}
    for host in fleet.hosts:
        entry = (host.name, inventory_host_data(fleet, host))
        group = profile_groups.get(host.profile)
        if group not in NOT_GPU_NODES:
            groups["gpu_nodes"].append(entry)
        if group:
            groups.setdefault(group, []).append(entry)
    return groups
