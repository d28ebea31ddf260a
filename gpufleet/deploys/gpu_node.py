"""Converge a GPU node: the stages of ``deploys/gpu_node.py``, in order, each skippable by ``gpufleet_stages``.

The node plan (:class:`gpufleet.plan.NodePlan`) decides the order (:data:`gpufleet.plan.STAGE_ORDER`) and what each
stage is given; this module only calls the operations with the plan's decisions. The GPU stages need what only the
driver can tell (the GPUs' UUIDs and state): on a host whose driver this very run installs they are planned right
after the driver stage, from fresh facts (a nested pyinfra step); on every later run they are planned up front like
any operation, so a converged node reports no change. Fact reads go through gpufleet's fact memo
(:func:`gpufleet._pyinfra.prepare_deploy_run`): one round trip per distinct read until something changes the host.
"""

from __future__ import annotations

from pyinfra import host, inventory, logger
from pyinfra.api import deploy, operation
from pyinfra.operations import python

from gpufleet import _pyinfra, fleet_ca, preflight, web_auth
from gpufleet.config import FLEET_CA_FILE, FLEET_TLS, InputError, NodeConfig
from gpufleet.control_files import UnsafePath
from gpufleet.facts.lock import HostLock
from gpufleet.facts.nvidia import GpuInventory
from gpufleet.facts.packages import NvidiaPackages
from gpufleet.facts.pci import NvidiaPciDevices
from gpufleet.facts.system import OsInfo, SecureBoot
from gpufleet.operations import apt_lists, clocks, driver, exporters, files, lock, mig, nccl, persistence, power, slurm
from gpufleet.operations.errors import refuse
from gpufleet.plan import GPU_STAGES, DriverPlan, ExportersPlan, NodePlan, gpus_from_facts
from gpufleet.preflight_repository import dcgm_exporter_offer

from .inputs import checked_facts, node_config

# what preflight.gather_facts reads on every host: prefetched on all hosts when the first one is prepared
PREFLIGHT_FACTS = (OsInfo, NvidiaPciDevices, SecureBoot, NvidiaPackages, GpuInventory)


def driver_plan(config: NodeConfig, facts: preflight.HostFacts) -> DriverPlan:
    """The plan's driver: branch, flavour (by GPU), package naming (by OS), fabric manager (NVSwitches)."""
    return DriverPlan.resolve(config, preflight.host_gpus(facts), (facts.os or {}).get("id"),
                              nvswitch=bool((facts.pci or {}).get("nvswitch_present")))


def driver_stage(config: NodeConfig, facts: preflight.HostFacts):
    plan = driver_plan(config, facts)
    return driver.nvidia_driver(
        name=f"NVIDIA driver {plan.branch}",
        branch=plan.branch,
        flavour=plan.flavour,
        repo_url=config.driver.repo_url,
        keyring_url=config.driver.repo_keyring_url,
        keyring_fingerprint=config.driver.repo_key_fingerprint,
        nvswitch=plan.nvswitch,
        packages_style=plan.packages_style,
        allow_reboot=config.allow_reboot,
    )


@operation()
def refused(message: str):
    """Fail this host with ``message``: a setting the plan cannot apply, found once the driver answered."""
    yield from refuse(message)


def gpu_stages(config: NodeConfig, inventory_fact: dict) -> None:
    """persistence, power, mig, nccl, clocks for the GPUs the driver reports, from the node plan."""
    gpus = gpus_from_facts(inventory_fact) if inventory_fact.get("gpus") else []
    plan = NodePlan.resolve(config, gpus)
    if gpus:
        # Checked by preflight already when the GPUs were known then; here for a driver installed by this run:
        # before any GPU setting, so that a refused host gets none of them.
        problems = plan.problems(lost=inventory_fact.get("lost_gpus") or [])
        if problems.errors:
            refused(name="GPU settings refused", message="; ".join(e.message for e in problems.errors))
            return
    if not gpus:
        logger.warning(f"{host.name}: the NVIDIA driver does not answer ({inventory_fact.get('error')}); "
                       "GPU settings are skipped until it does (a reboot is probably pending)")
    for stage in plan.stages:
        if stage in GPU_STAGES:
            _GPU_STAGE_OPERATIONS[stage](config, plan)


# One function per GPU stage, standing here in the plan's order (STAGE_ORDER): pyinfra orders a deploy's operations
# by the source lines they are called from, not by the order of the calls (tests/unit/test_stage_order.py).


def _persistence(config: NodeConfig, plan: NodePlan) -> None:
    assert plan.persistence is not None
    persistence.nvidia_persistenced(name="nvidia-persistenced with persistence mode",
                                    persistence_mode=plan.persistence.mode)


def _mig(config: NodeConfig, plan: NodePlan) -> None:
    if plan.gpus and plan.mig is not None and plan.mig.layout:
        mig.layout(name="MIG layout", layout=dict(plan.mig.layout), allow_reboot=config.allow_reboot)


def _power(config: NodeConfig, plan: NodePlan) -> None:
    if plan.gpus:
        power.limits(name="GPU power limits", limits=plan.power.limits if plan.power is not None else {})


def _nccl(config: NodeConfig, plan: NodePlan) -> None:
    assert plan.nccl is not None
    nccl.nccl_conf(name="/etc/nccl.conf", settings=dict(plan.nccl.settings))


def _clocks(config: NodeConfig, plan: NodePlan) -> None:
    if plan.gpus and plan.clocks is not None:
        clocks.locked(name="GPU clocks", lock_mhz=plan.clocks.lock_mhz)


def _slurm(config: NodeConfig, plan: NodePlan) -> None:
    if plan.gpus:
        slurm_stage(config, plan)


_GPU_STAGE_OPERATIONS = {"persistence": _persistence, "mig": _mig, "power": _power, "nccl": _nccl,
                         "clocks": _clocks, "slurm": _slurm}


def slurm_gres_args(config: NodeConfig, plan: NodePlan) -> dict:
    """The arguments of ``slurm.gres_conf`` from the node plan: its GPUs, and the MIG layout it applies."""
    layout = plan.mig.layout if plan.mig is not None else {}
    return {"gpus": [gpu.display_name for gpu in plan.gpus],
            "mig": {index: dict(counts) for index, counts in layout.items() if counts}, "mode": config.slurm_gres}


def health_plan(config: NodeConfig, plan: NodePlan, nvswitch: bool) -> dict:
    """What ``gpufleet-healthcheck`` checks this node against: the node plan's GPUs, persistence, MIG layout and
    NVSwitches (fabric manager), and the health settings."""
    names = {gpu.display_name for gpu in plan.gpus}
    layout = plan.mig.layout if plan.mig is not None else None
    return {"node": host.name, "gpu_count": len(plan.gpus), "gpu_model": names.pop() if len(names) == 1 else None,
            "persistence": plan.persistence.mode if plan.persistence is not None else None,
            "mig": None if layout is None else {str(i): None if c is None else dict(c) for i, c in layout.items()},
            "nvswitch": nvswitch, "checks": list(config.health.checks), "reason_prefix": config.health.reason_prefix}


def slurm_stage(config: NodeConfig, plan: NodePlan) -> None:
    """Slurm's gres.conf and health check for this node (stage ``slurm``); the slurm.conf lines to add are
    printed."""
    slurm.gres_conf(name="Slurm gres.conf", **slurm_gres_args(config, plan))
    nvswitch = bool((host.get_fact(NvidiaPciDevices) or {}).get("nvswitch_present"))
    slurm.healthcheck(name="Slurm health check (gpufleet-healthcheck)", plan=health_plan(config, plan, nvswitch))
    lines = slurm.slurm_conf_lines(config.health.interval, list(config.health.node_state))
    logger.info(f"{host.name}: slurm.conf lines for gpufleet-healthcheck (add them where they are missing): "
                + "; ".join(lines))


def exporters_stage(config: NodeConfig, facts: preflight.HostFacts, driver_changes: bool = False) -> None:
    """node_exporter and the GPU exporter (stage ``exporters``), and the desired GPU settings for the alerts."""
    settings = config.exporters
    # HTTPS with the fleet CA's certificate where the exporters have no certificate of their own
    node_tls = dict(settings.node_tls) or (dict(FLEET_TLS) if settings.tls_fleet_ca else {})
    gpu_tls = dict(settings.gpu_tls) or (dict(FLEET_TLS) if settings.tls_fleet_ca else {})
    if settings.tls_fleet_ca and ((settings.node and not settings.node_tls)
                                  or (settings.gpu != "none" and not settings.gpu_tls)):
        fleet_certificate(settings.node)
    # basic auth on both exporters: Prometheus scrapes as gpufleet with the control machine's generated password
    if settings.node:
        exporters.node_exporter(name="node_exporter", textfile_dir=settings.textfile_dir,
                                listen=settings.node_listen, web_config=exporter_web_config(host.name, node_tls))
    # auto: DCGM on datacenter GPUs where apt has dcgm-exporter for the host (installed, its candidate, or in the
    # NVIDIA repository the stage configures for the host's OS: the same answer before and after the first run),
    # asked only where the GPUs would take it
    gpus = preflight.host_gpus(facts)
    plan = ExportersPlan.resolve(config, gpus)
    if settings.gpu == "auto" and plan.profiling:
        offered, why_not = dcgm_exporter_offer(host, config)
        plan = ExportersPlan.resolve(config, gpus, dcgm_offered=offered is not None, why_not_offered=why_not)
    kind = plan.kind
    if settings.gpu == "auto":  # a warning where datacenter GPUs get the NVML exporter for want of DCGM
        (logger.warning if kind == "nvml" and plan.profiling else logger.info)(
            f"{host.name}: GPU exporter {kind}: {plan.why}")
    if kind == "dcgm":
        driver.nvidia_repository(name="NVIDIA repository (DCGM)", repo_url=config.driver.repo_url,
                                 keyring_url=config.driver.repo_keyring_url,
                                 keyring_fingerprint=config.driver.repo_key_fingerprint)
    tls, credentials = gpu_tls, ()
    if kind == "nvml" and tls:  # its dynamic user reads them as systemd credentials, named relative to its config
        credentials = tuple((NVML_TLS_CREDENTIALS[key], tls[key]) for key in NVML_TLS_CREDENTIALS)
        tls.update(NVML_TLS_CREDENTIALS)
    exporters.gpu_exporter(name="GPU exporter", kind=kind, listen=settings.gpu_listen, profiling=plan.profiling,
                           profiling_package=plan.profiling_package, collect_interval_ms=plan.collect_interval_ms,
                           web_config=exporter_web_config(host.name, tls), credentials=credentials,
                           version=settings.dcgm_exporter_version or "")
    if settings.node and kind != "none":
        publish_desired_state(config, facts, driver_changes)


NVML_TLS_CREDENTIALS = {"cert_file": "tls-cert.pem", "key_file": "tls-key.pem"}


def fleet_certificate(node_exporter: bool) -> None:
    """This host's certificate of the fleet CA (gpufleet.fleet_ca), its key and the CA's certificate in
    /etc/gpufleet/tls: for the address Prometheus scrapes (``ssh_hostname``, else the inventory name) and loopback.
    The key is 0640 root:prometheus where node_exporter (Debian's User=prometheus) reads it, else 0600."""
    address = host.data.get("ssh_hostname") or host.name
    try:
        cert, key = fleet_ca.address_certificate(host.name, address)
        ca_cert, _ = fleet_ca.ca()
    except UnsafePath as error:
        raise InputError(f"{host.name}: the fleet CA: {error}") from None
    group, mode = "root", "600"
    if node_exporter:  # its group must exist before the key is given to it
        apt_lists.packages(name="node_exporter (its group reads the fleet certificate's key)",
                           packages=[exporters.NODE_EXPORTER_PACKAGE])
        group, mode = exporters.NODE_EXPORTER_GROUP, "640"
    files.managed_file(name="fleet CA certificate", path=FLEET_CA_FILE, content=ca_cert)
    files.managed_file(name="this host's fleet certificate", path=FLEET_TLS["cert_file"], content=cert)
    files.secret_file(name="this host's fleet certificate key", path=FLEET_TLS["key_file"], content=key, mode=mode,
                      group=group)


def exporter_web_config(host_name: str, tls: dict | None = None) -> str:
    """An exporter's web configuration file: the ``exporters`` account's bcrypt hash (gpufleet.web_auth) and the
    ``tls_server_config`` of its setting."""
    try:
        secret = web_auth.password("exporters")
    except UnsafePath as error:
        raise InputError(f"{host_name}: the monitoring credentials: {error}") from None
    return web_auth.web_config({web_auth.USER: web_auth.bcrypt_hash(secret, web_auth.USER)},
                               tls_server_config=tls)


def desired_gpu_settings(config: NodeConfig, gpus: list) -> list[dict]:
    """What the node plan decides per GPU, for the desired-state alerts (``exporters.desired_state``)."""
    plan = NodePlan.resolve(config, gpus)
    limits = plan.power.limits if plan.power is not None else {}
    layout = plan.mig.layout if plan.mig is not None else {}
    persistence = plan.persistence is not None and plan.persistence.mode
    return [{"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
             "power_limit_w": limits.get(g.uuid), "persistence": persistence,
             "mig_enabled": (layout[g.index] is not None) if g.index in layout else None}
            for g in gpus if g.uuid]


def publish_desired_state(config: NodeConfig, facts: preflight.HostFacts, driver_changes: bool) -> None:
    """The desired GPU settings of the GPUs the driver lists: planned now, or, on a host whose driver this run
    installs, at execution time once the driver answers (as the GPU stages are)."""
    found = facts.gpu_inventory or {}
    if found.get("gpus"):
        _desired_state(config, found)
    elif driver_changes:
        python.call(name="desired GPU settings (published once the driver answers)",
                    function=_desired_state_after_driver, config=config)


def _desired_state(config: NodeConfig, inventory_fact: dict) -> None:
    gpus = gpus_from_facts(inventory_fact) if inventory_fact.get("gpus") else []
    if gpus:
        exporters.desired_state(name="desired GPU settings (Prometheus textfile)",
                                textfile_dir=config.exporters.textfile_dir,
                                gpus=desired_gpu_settings(config, gpus),
                                lost=list(inventory_fact.get("lost_gpus") or []))


def _desired_state_after_driver(config: NodeConfig) -> None:
    _pyinfra.forget_reads(host.state, host)
    _desired_state(config, host.get_fact(GpuInventory))


def _gpu_stages_after_driver(config: NodeConfig) -> None:
    _pyinfra.forget_reads(host.state, host)  # planned from what the node says now, never from an earlier read
    gpu_stages(config, host.get_fact(GpuInventory))


@deploy("gpufleet: GPU node")
def gpu_node() -> None:
    # HostLock first, before the others: the lock's generation check then covers every read the fact memo makes.
    # A host that stops answering fails alone (the others go on); SIGINT/SIGTERM/SIGHUP exit 130/143/129 naming
    # the hosts mid-change.
    _pyinfra.prepare_deploy_run(host.state, (HostLock, *PREFLIGHT_FACTS), _pyinfra.default_cache_dir())
    config = node_config(host, inventory)
    facts, ok = checked_facts(host, inventory, config)
    if not ok:
        return  # the run stops once every host is prepared; nothing is planned for a host that failed
    # first: a host another gpufleet run is changing is refused untouched
    lock.host_lock(name="gpufleet lock", seen=host.get_fact(HostLock)["seen"])
    driver_op = driver_stage(config, facts) if config.stage_enabled("driver") else None
    found = facts.gpu_inventory or {}
    # will_change (asked only when the GPUs do not answer: with -y it runs the driver operation once more to find
    # out): a driver that is installed but not loaded gets no deferred step (which pyinfra would count as a change
    # although nothing changes); the GPU stages are planned now and say why they wait
    driver_changes = not found.get("gpus") and driver_op is not None and driver_op.will_change
    if not any(config.stage_enabled(stage) for stage in GPU_STAGES):
        pass  # no GPU setting managed on this host
    elif not driver_changes:
        gpu_stages(config, found)
    else:
        python.call(name="GPU settings (planned once the driver answers)", function=_gpu_stages_after_driver,
                    config=config)
    if config.stage_enabled("exporters"):
        exporters_stage(config, facts, driver_changes)
