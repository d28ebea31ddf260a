"""Validated inputs of a run: every host's configuration and preflight, checked before any host is changed.

pyinfra prepares (runs the deploy code of) every host before it executes anything; an exception raised while
preparing stops the run with no change on any host, also with ``-y``. So the configuration of every host of
the run is validated when the first host is prepared, and preflight errors (which need each host's facts)
are collected host by host and raised, all together, when the last host has been prepared.

"Every host of the run" is the same set for both: pyinfra's activated hosts, those ``--limit`` selects and
pyinfra connected to. A host left out with ``--limit`` is neither validated nor preflighted: it is not
touched, and a half-edited inventory must not block a fix rolled out to the hosts that are ready.
"""

from __future__ import annotations

import weakref

from pyinfra import logger

from gpufleet import preflight
from gpufleet.config import ConfigErrors, InputError, NodeConfig, validate_inventory
from gpufleet.facts.files import ManagedState
from gpufleet.preflight_repository import check_dcgm_exporter, check_driver_repository

# Per run (pyinfra State): one process may run several (``gpufleet rollout`` runs each wave in its own State), and
# pyinfra's ``inventory`` is the same context proxy in all of them.
_configs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # State -> {host: NodeConfig}
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # State -> {host: PreflightResult}


def node_config(host, inventory) -> NodeConfig:
    """This host's validated configuration; the first call validates every host of the run (activated)."""
    key = inventory.state
    if key not in _configs:
        try:
            _configs[key] = validate_inventory((h.name, h.data.dict()) for h in inventory.iter_activated_hosts())
        except ConfigErrors as error:
            raise InputError(f"invalid configuration, no host was changed:\n{error}") from None
    return _configs[key][host.name]


def checked_facts(host, inventory, config: NodeConfig) -> tuple[preflight.HostFacts, bool]:
    """Read this host's facts and preflight it; return (facts, ok).

    When this is the last host to be prepared and any host failed, raise with every host's errors.
    """
    facts = preflight.gather_facts(host)
    results = _prepared.setdefault(inventory.state, {})
    results[host.name] = preflight.run_preflight(host.name, config, facts)
    results[host.name].errors.extend(check_driver_repository(host, config, facts))
    results[host.name].errors.extend(check_dcgm_exporter(host, config))
    tls = preflight.exporter_tls_files(config)
    if tls:  # the certificates and keys the exporters' TLS settings name exist (one read, only where set)
        state = host.get_fact(ManagedState, paths=tuple(sorted({path for *_, path in tls})))
        results[host.name].errors.extend(preflight.tls_file_problems(host.name, tls, state.get("files") or {}))
    for warning in results[host.name].warnings:
        logger.warning(warning)
    activated = {h.name for h in inventory.iter_activated_hosts()}
    errors = [e for result in results.values() for e in result.errors]
    if errors and activated <= set(results):
        raise InputError(str(preflight.PreflightFailed(errors)))
    return facts, not results[host.name].errors
