"""Converge a GPU node: the stages of ``deploys/gpu_node.py``, in order, each skippable by ``gpufleet_stages``.

driver → persistence → power → mig → nccl → clocks. The GPU stages need the GPUs' UUIDs and current state,
which only the driver can tell: on a host whose driver is installed by this very run they are planned at
execution time, right after the driver stage, from fresh facts (a nested pyinfra step); on every later run
they are planned up front like any operation, so a converged node reports no change.

Fact reads go through :mod:`gpufleet.facts.prefetch` (installed when the first host is prepared): each distinct
read costs one SSH round trip until something changes the host, and the preflight facts of every host are read
concurrently.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from gpufleet import connection, interruption, preflight
from gpufleet.config import NodeConfig, resolve_power_limits
from gpufleet.facts import prefetch
from gpufleet.facts.lock import HostLock
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages
from gpufleet.facts.pci import NvidiaPciDevices
from gpufleet.facts.system import OsInfo, SecureBoot
from gpufleet.operations import clocks, driver, lock, mig, nccl, persistence, power

from ._inputs import checked_facts, node_config

GPU_STAGES = ("persistence", "power", "mig", "nccl", "clocks")
# what preflight.gather_facts reads on every host: prefetched on all hosts when the first one is prepared
PREFLIGHT_FACTS = (OsInfo, NvidiaPciDevices, SecureBoot, NvidiaPackages, GpuInventory)


def driver_stage(config: NodeConfig, facts: preflight.HostFacts):
    models = [gpu.model for gpu in preflight.host_gpus(facts)]
    return driver.nvidia_driver(
        name=f"NVIDIA driver {config.driver.branch}",
        branch=config.driver.branch,
        flavour=preflight.choose_kernel_flavour(config.driver.flavour, models),
        repo_url=config.driver.repo_url,
        keyring_url=config.driver.repo_keyring_url,
        nvswitch=bool((facts.pci or {}).get("nvswitch_present")),
        packages_style=config.driver.packages_style,
        allow_reboot=config.allow_reboot,
    )


def mig_layout(config: NodeConfig, gpus: list[dict]) -> dict[int, dict[str, int] | None]:
    """The MIG layout of each GPU the configuration selects: {index: {profile: count}} or None (disabled)."""
    layout: dict[int, dict[str, int] | None] = {}
    if config.mig is None:
        return layout
    for gpu in gpus:
        entry = config.mig.layout_for(gpu["index"], gpu.get("pci_device_id"))
        if entry is not None:
            layout[gpu["index"]] = dict(entry.mig_devices) if entry.mig_enabled else None
    return layout


def gpu_stages(config: NodeConfig, inventory_fact: dict) -> None:
    """persistence, power, mig, nccl, clocks for the GPUs the driver reports."""
    gpus = inventory_fact.get("gpus") or []
    if config.stage_enabled("persistence"):
        persistence.nvidia_persistenced(name="nvidia-persistenced with persistence mode")
    if not gpus:
        logger.warning(f"{host.name}: the NVIDIA driver does not answer ({inventory_fact.get('error')}); "
                       "GPU settings are skipped until it does (a reboot is probably pending)")
    if gpus and config.stage_enabled("mig"):
        layout = mig_layout(config, gpus)
        if layout:
            mig.mig_layout(name="MIG layout", layout=layout, allow_reboot=config.allow_reboot)
    if gpus and config.stage_enabled("power"):
        power.power_limits(name="GPU power limits", limits=resolve_power_limits(config, gpus))
    if config.stage_enabled("nccl"):
        nccl.nccl_conf(name="/etc/nccl.conf", settings=dict(config.nccl.settings))
    if gpus and config.stage_enabled("clocks") and config.clocks.mode is not None:
        lock = config.clocks.lock_gpu_mhz if config.clocks.mode == "lock" else None
        clocks.gpu_clocks(name="GPU clocks", lock_mhz=lock)


def _gpu_stages_after_driver(config: NodeConfig) -> None:
    prefetch.invalidate(host.state, host)  # planned from what the node says now, never from an earlier read
    gpu_stages(config, host.get_fact(GpuInventory))


@deploy("gpufleet: GPU node")
def gpu_node() -> None:
    prefetch.install(host.state, (*PREFLIGHT_FACTS, HostLock))  # HostLock: read with them, for the lock's check
    connection.install(host.state)  # a host that stops answering fails within ~30 s; the others go on
    interruption.install(host.state)  # SIGINT/SIGTERM: exit 130/143 naming the hosts mid-change
    config = node_config(host, inventory)
    facts, ok = checked_facts(host, inventory, config)
    if not ok:
        return  # the run stops once every host is prepared; nothing is planned for a host that failed
    # first: a host another gpufleet run is changing is refused untouched
    lock.host_lock(name="gpufleet lock", seen=host.get_fact(HostLock)["seen"])
    driver_changes = False
    if config.stage_enabled("driver"):
        # will_change: a driver that is installed but not loaded gets no deferred step (which pyinfra would count
        # as a change although nothing changes); the GPU stages are planned now and say why they wait
        driver_changes = driver_stage(config, facts).will_change
    if not any(config.stage_enabled(stage) for stage in GPU_STAGES):
        return
    if (facts.gpu_inventory or {}).get("gpus") or not driver_changes:
        gpu_stages(config, facts.gpu_inventory or {})
    else:
        python.call(name="GPU settings (planned once the driver answers)", function=_gpu_stages_after_driver,
                    config=config)
