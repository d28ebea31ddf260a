"""Validated gpufleet configuration from pyinfra host data.

Every setting is a pyinfra data key starting with ``gpufleet_``. :func:`load_node_config` turns one host's data into
a frozen :class:`NodeConfig`; :func:`validate_inventory` raises ONE :class:`ConfigErrors` listing every problem of
every host, so a run refuses bad input before any host is touched (checks that need facts: :mod:`.preflight`).

Strict: wrong types, out-of-range values, unknown choices and unknown ``gpufleet_*`` keys are errors, with a
did-you-mean; ``gpufleet_sim_*`` and non-``gpufleet_`` keys are not ours and are ignored. Every error names the
host, the key, the value and what is allowed::

    node03: gpufleet_driver_flavour='opne': unknown choice; allowed: auto, open, proprietary (did you mean 'open'?)

mig-parted's config files are YAML, accepted unchanged: hence PyYAML (``yaml.safe_load`` only).
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from pyinfra.api.exceptions import PyinfraError
except ImportError:  # on a node: the health check's zip carries this module, not pyinfra (it raises no InputError)
    PyinfraError = Exception

from gpufleet.catalog import CatalogError, GpuModel, UnknownGpuModel, load_catalog, use_user_models
from gpufleet.masking import mask_urls

KEY_PREFIX = "gpufleet_"
IGNORED_PREFIXES = ("gpufleet_sim_",)
CONFIG_VERSION = 1

# The stage names a user may list, in any order: they run in the plan's order (gpufleet.plan.STAGE_ORDER)
STAGES = ("clocks", "driver", "exporters", "mig", "nccl", "persistence", "power", "slurm")
DEFAULT_STAGES = ("driver", "exporters", "mig", "nccl", "persistence", "power")
# Stage ``slurm``: the health check's check groups (gpufleet/healthcheck/node.py GROUP_CHECKS) and the node states
# slurm.conf's HealthCheckNodeState takes in Slurm 22.05 (tests/reference/upstream/slurm/facts.json).
HEALTH_CHECKS = ("gpus", "persistence", "xid", "memory", "nvlink", "throttle", "fabricmanager", "mig")
HEALTH_NODE_STATES = ("ALLOC", "ANY", "CYCLE", "IDLE", "MIXED")
HEALTH_INTERVAL_RANGE = (5, 86400)  # seconds: well above one check's time, at most a day
_REASON_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,47}$")
# Stage ``slurm`` (gres.conf): ``files`` lists every GPU (Name=gpu Type=... File=/dev/nvidiaN), ``nvml`` lets
# slurmd find them (AutoDetect=nvml: a slurmd built with NVML), ``auto`` is files, or nvml where a MIG layout is
# configured (MIG devices' files exist only once the driver created the instances: gpufleet/operations/slurm.py).
SLURM_GRES_MODES = ("auto", "files", "nvml")
FLAVOURS = ("auto", "open", "proprietary")
PACKAGE_STYLES = ("ubuntu", "nvidia")
DEFAULT_DRIVER_BRANCH = "580"

POWER_WATTS_MAX = 5000.0
POWER_PERCENT_MAX = 200.0
CLOCK_MHZ_MAX = 5000

_BRANCH_RE = re.compile(r"^\d{3}\Z")
# a path of RFC 3986 characters that mean nothing to a shell, YAML, INI or apt source line (no quotes, $, `, {}, \)
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-]+(?::\d{1,5})?(?:/[A-Za-z0-9\-._~:/?#@!&()*+,;=%]*)?\Z")
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*\Z")
_UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
_PCI_FILTER_RE = re.compile(r"^0[xX][0-9a-fA-F]{8}\Z")
_MIG_PROFILE_RE = re.compile(r"^\d+g\.\d+gb(?:[+-][a-z]+(?:\.[a-z]+)*)*\Z")
_MIG_CI_PROFILE_RE = re.compile(r"^\d+c\.\d+g\.\d+gb")

_registered_namespaces: set[str] = set()


class FrozenMap(Mapping):
    """A read-only, hashable mapping (keeps NodeConfig hashable, e.g. for functools.cache)."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping | Iterable = ()):
        self._data = dict(data)
        self._hash: int | None = None

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._data.items()))
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._data) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


# ----------------------------------------------------------------------------------------------------- errors


def _show(value: Any, limit: int = 80) -> str:
    text = mask_urls(repr(value))  # a URL's user:token@ and query values never reach a message
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: Any, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or ``""``."""
    if not isinstance(word, str):
        return ""
    candidates = list(candidates)
    matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if not matches:
        folded = {c.casefold(): c for c in candidates}
        matches = difflib.get_close_matches(word.casefold(), list(folded), n=1, cutoff=0.6)
        matches = [folded[m] for m in matches]
    return f" (did you mean {matches[0]!r}?)" if matches else ""


class ConfigError(ValueError):
    """One bad setting: ``host``, ``key`` (a data key, possibly with a path into it), ``value``, ``allowed``.

    ``str(error)``: ``"<host>: <key>=<value!r>: <reason>; allowed: <allowed>"``.
    """

    def __init__(self, host: str, key: str, value: Any, allowed: str, reason: str = "invalid value"):
        self.host = host
        self.key = key
        self.value = value
        self.allowed = allowed
        self.reason = reason
        self.message = f"{host}: {key}={_show(value)}: {reason}; allowed: {allowed}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class ConfigErrors(ValueError):
    """All configuration errors found (one host, or every host of an inventory)."""

    def __init__(self, errors: Iterable[ConfigError]):
        self.errors: list[ConfigError] = list(errors)
        hosts = sorted({e.host for e in self.errors})
        head = f"{len(self.errors)} configuration error(s) on {len(hosts)} host(s) ({', '.join(hosts)}):"
        self.message = "\n".join([head, *(f"  - {e.message}" for e in self.errors)])
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class InputError(PyinfraError):
    """Bad input found while a deploy prepares: pyinfra prints the message without a traceback, and nothing is
    changed on any host."""


# -------------------------------------------------------------------------------------------- config objects


@dataclass(frozen=True)
class PowerLimit:
    """A desired power limit: ``watts`` (absolute), ``percent`` (of the GPU's default limit) or ``default``."""

    kind: str
    value: float = 100.0

    def resolve(self, default_w: float | None) -> float | None:
        """Watts for a GPU whose default limit is ``default_w``; None when a relative limit has no default."""
        if self.kind == "watts":
            return float(self.value)
        if default_w is None:
            return None
        factor = 1.0 if self.kind == "default" else self.value / 100.0
        return round(default_w * factor, 2)

    def __str__(self) -> str:
        if self.kind == "watts":
            return f"{self.value:g} W"
        if self.kind == "percent":
            return f"{self.value:g}%"
        return "default"


@dataclass(frozen=True)
class DriverConfig:
    branch: str = DEFAULT_DRIVER_BRANCH
    flavour: str = "auto"
    repo_url: str | None = None  # None: NVIDIA's repository for the OS
    repo_keyring_url: str | None = None  # None: the repository's default keyring location
    packages_style: str | None = None  # None: chosen by OS (ubuntu on Ubuntu, nvidia elsewhere)
    secure_boot_signing: bool = False
    repo_key_fingerprint: str | None = None  # None: the key is not checked (see operations/_repo_keys.py)


@dataclass(frozen=True)
class PowerConfig:
    limit: PowerLimit | None = None
    by_model: Mapping[str, PowerLimit] = field(default_factory=FrozenMap)  # catalog key ->
    by_uuid: Mapping[str, PowerLimit] = field(default_factory=FrozenMap)  # GPU-uuid ->

    @property
    def managed(self) -> bool:
        return self.limit is not None or bool(self.by_model) or bool(self.by_uuid)


@dataclass(frozen=True)
class MigDeviceConfig:
    """One entry of a mig-parted layout: which GPUs, MIG on/off, and how many instances per profile."""

    devices: str | tuple[int, ...]  # "all" or GPU indices
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=FrozenMap)  # profile -> count
    device_filter: tuple[str, ...] | None = None  # PCI device ids as nvidia-smi prints them: 0x233010DE

    def matches(self, index: int, pci_device_id: str | None) -> bool:
        if self.devices != "all" and index not in self.devices:
            return False
        if self.device_filter is None:
            return True
        return pci_device_id is not None and pci_device_id.upper().replace("0X", "0x") in self.device_filter


@dataclass(frozen=True)
class MigConfig:
    """A MIG layout in mig-parted's format (``gpufleet_mig`` inline, or a file + label)."""

    entries: tuple[MigDeviceConfig, ...]
    key: str = "gpufleet_mig"  # the data key it came from (for messages)
    file: str | None = None
    label: str | None = None

    def matching_entries(self, index: int, pci_device_id: str | None) -> list[int]:
        return [i for i, entry in enumerate(self.entries) if entry.matches(index, pci_device_id)]

    def layout_for(self, index: int, pci_device_id: str | None) -> MigDeviceConfig | None:
        """The entry for GPU ``index``; None when no entry selects it (its MIG state is left alone)."""
        found = self.matching_entries(index, pci_device_id)
        return self.entries[found[0]] if found else None


@dataclass(frozen=True)
class NcclConfig:
    settings: Mapping[str, str] = field(default_factory=FrozenMap)

    @property
    def managed(self) -> bool:
        return bool(self.settings)

    def lines(self) -> list[str]:
        """``KEY=VALUE`` lines for /etc/nccl.conf, sorted by key."""
        return [f"{k}={v}" for k, v in sorted(self.settings.items())]


@dataclass(frozen=True)
class ClocksConfig:
    mode: str | None = None  # None (not managed) | "lock" | "reset"
    lock_gpu_mhz: tuple[int, int] | None = None


@dataclass(frozen=True)
class HealthConfig:
    """Stage ``slurm``: the node's health check (gpufleet/healthcheck), its slurm.conf lines."""

    interval: int = 60  # HealthCheckInterval (seconds)
    checks: tuple[str, ...] = HEALTH_CHECKS
    reason_prefix: str = "gpufleet health"
    node_state: tuple[str, ...] = ("ANY",)  # HealthCheckNodeState


@dataclass(frozen=True)
class NodeConfig:
    host: str
    version: int = CONFIG_VERSION
    stages: tuple[str, ...] = DEFAULT_STAGES
    allow_reboot: bool = False
    driver: DriverConfig = field(default_factory=DriverConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    mig: MigConfig | None = None
    nccl: NcclConfig = field(default_factory=NcclConfig)
    clocks: ClocksConfig = field(default_factory=ClocksConfig)
    exporters: ExportersConfig = field(default_factory=lambda: ExportersConfig())
    slurm_gres: str = "auto"  # stage slurm: how gres.conf names the GPUs (SLURM_GRES_MODES)
    health: HealthConfig = field(default_factory=lambda: HealthConfig())

    def stage_enabled(self, stage: str) -> bool:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        return stage in self.stages


# ----------------------------------------------------------------------------------------------- key parsers


class _Ctx:
    """Collects errors for one host while every key is checked."""

    def __init__(self, host: str):
        self.host = host
        self.errors: list[ConfigError] = []

    def error(self, key: str, value: Any, allowed: str, reason: str = "invalid value") -> None:
        self.errors.append(ConfigError(self.host, key, value, allowed, reason))


_INVALID = object()  # returned by a parser that recorded an error


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bool(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, bool):
        ctx.error(key, value, "true or false", "not a boolean")
        return _INVALID
    return value


def _choice(choices: tuple[str, ...], optional: bool = False):
    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or value not in choices:
            allowed = ", ".join(choices) + (" (or unset)" if optional else "")
            ctx.error(key, value, allowed + did_you_mean(value, choices), "unknown choice")
            return _INVALID
        return value

    return parse


def _config_version(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool) or value != CONFIG_VERSION:
        ctx.error(key, value, f"{CONFIG_VERSION}", "unsupported configuration version")
        return _INVALID
    return value


def _stages(ctx: _Ctx, key: str, value: Any) -> Any:
    allowed = f"a list of stages, in any order: {', '.join(STAGES)}"
    if not isinstance(value, (list, tuple)):
        ctx.error(key, value, allowed, "not a list")
        return _INVALID
    ok = True
    for i, stage in enumerate(value):
        if stage not in STAGES:
            ctx.error(f"{key}[{i}]", stage, ", ".join(STAGES) + did_you_mean(stage, STAGES), "unknown stage")
            ok = False
    if not ok:
        return _INVALID
    if len(set(value)) != len(value):
        dup = next(s for s in value if list(value).count(s) > 1)
        ctx.error(key, value, allowed + "; each stage once", f"stage {dup!r} listed twice")
        return _INVALID
    return tuple(value)


def _branch(ctx: _Ctx, key: str, value: Any) -> Any:
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _BRANCH_RE.match(text):
        ctx.error(key, value, 'a driver branch: 3 digits, e.g. "580"', "not a driver branch")
        return _INVALID
    return text


def _url(ctx: _Ctx, key: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str) or not _URL_RE.match(value):
        ctx.error(key, value, "an http:// or https:// URL without spaces or quotes, e.g. "
                  "https://mirror.example.com/cuda/ubuntu2204/x86_64/", "not a URL")
        return _INVALID
    return value


_FINGERPRINT_RE = re.compile(r"^(?:[0-9A-F]{40}|[0-9A-F]{64})\Z")  # OpenPGP v4 (SHA-1) or v6 (SHA-256)


def normalise_fingerprint(value: Any) -> str | None:
    """``value`` as gpg prints a fingerprint with ``--with-colons`` (upper-case hex, no spaces), or None where it is
    not a full v4 (40 hex digits) or v6 (64) fingerprint. Key ids (8 or 16 digits) are refused: they can be forged."""
    if not isinstance(value, str):
        return None
    text = re.sub(r"\s+", "", value).upper().removeprefix("0X")
    return text if _FINGERPRINT_RE.match(text) else None


def _fingerprint(ctx: _Ctx, key: str, value: Any) -> Any:
    if value is None:
        return None
    found = normalise_fingerprint(value)
    if found is None:
        ctx.error(key, value, 'the key\'s full fingerprint: 40 hex digits, spaces allowed, e.g. '
                  '"EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC"', "not a key fingerprint")
        return _INVALID
    return found


_POWER_ALLOWED = (
    f'watts as a number (e.g. 300; > 0 and <= {POWER_WATTS_MAX:g}), a percent of the GPU\'s default limit '
    f'as a string (e.g. "80%"; > 0% and <= {POWER_PERCENT_MAX:g}%), or "default"'
)


def _power_value(ctx: _Ctx, key: str, value: Any) -> Any:
    if _is_number(value):
        if not 0 < value <= POWER_WATTS_MAX:
            ctx.error(key, value, _POWER_ALLOWED, "power limit out of range")
            return _INVALID
        return PowerLimit("watts", float(value))
    if isinstance(value, str):
        if value.strip() == "default":
            return PowerLimit("default")
        m = _PERCENT_RE.match(value)
        if m:
            pct = float(m.group(1))
            if not 0 < pct <= POWER_PERCENT_MAX:
                ctx.error(key, value, _POWER_ALLOWED, "percent out of range")
                return _INVALID
            return PowerLimit("percent", pct)
    ctx.error(key, value, _POWER_ALLOWED, "not a power limit")
    return _INVALID


def _power_limit(ctx: _Ctx, key: str, value: Any) -> Any:
    return None if value is None else _power_value(ctx, key, value)


def _power_by_model(ctx: _Ctx, key: str, value: Any) -> Any:
    if value is None:
        return FrozenMap({})
    if not isinstance(value, Mapping):
        ctx.error(key, value, '{GPU model: limit}, e.g. {"NVIDIA H100 80GB HBM3": 600, "a100-sxm4-80gb": "80%"}',
                  "not a mapping")
        return _INVALID
    catalog = load_catalog()
    out: dict[str, PowerLimit] = {}
    origin: dict[str, str] = {}
    ok = True
    for model_name, limit in value.items():
        sub = f"{key}[{model_name!r}]"
        model = catalog_model(model_name)
        if model is None:
            candidates = [*catalog.keys(), *catalog.names()]
            ctx.error(sub, model_name, "a GPU name as nvidia-smi prints it or a catalog key: "
                      + ", ".join(catalog.keys()) + did_you_mean(model_name, candidates), "unknown GPU model")
            ok = False
            continue
        if model.key in out:
            ctx.error(sub, model_name, "one entry per GPU model", f"same model as {origin[model.key]!r}")
            ok = False
            continue
        parsed = _power_value(ctx, sub, limit)
        if parsed is _INVALID:
            ok = False
            continue
        out[model.key] = parsed
        origin[model.key] = model_name
    return FrozenMap(out) if ok else _INVALID


def _normalize_uuid(uuid: str) -> str:
    return "GPU-" + uuid[4:].lower()


def _power_by_uuid(ctx: _Ctx, key: str, value: Any) -> Any:
    if value is None:
        return FrozenMap({})
    if not isinstance(value, Mapping):
        ctx.error(key, value, '{GPU UUID: limit}, e.g. {"GPU-76aef7ff-372d-2432-b4b4-beca4d8d3400": 500}',
                  "not a mapping")
        return _INVALID
    out: dict[str, PowerLimit] = {}
    ok = True
    for uuid, limit in value.items():
        sub = f"{key}[{uuid!r}]"
        if not isinstance(uuid, str) or not _UUID_RE.match(uuid):
            ctx.error(sub, uuid, "a GPU UUID as nvidia-smi -L prints it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                      "not a GPU UUID")
            ok = False
            continue
        parsed = _power_value(ctx, sub, limit)
        if parsed is _INVALID:
            ok = False
            continue
        if _normalize_uuid(uuid) in out:
            ctx.error(sub, uuid, "one entry per GPU UUID", "UUID listed twice")
            ok = False
            continue
        out[_normalize_uuid(uuid)] = parsed
    return FrozenMap(out) if ok else _INVALID


# --------------------------------------------------------------------------------------------------- MIG


MIG_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")


def parse_mig_entries(ctx: _Ctx, key: str, value: Any) -> Any:
    """A mig-parted layout (the list under one label of ``mig-configs``) -> tuple of MigDeviceConfig."""
    allowed = ('a mig-parted layout: a list of {devices: all | [indices], mig-enabled: true|false, '
               'mig-devices: {"1g.10gb": 7}, device-filter (optional): ["0x233010DE"]}')
    if not isinstance(value, list) or not value:
        ctx.error(key, value, allowed, "not a non-empty list")
        return _INVALID
    entries = []
    ok = True
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            ctx.error(where, item, allowed, "entry is not a mapping")
            ok = False
            continue
        misspelt = set()
        for unknown in [k for k in item if k not in MIG_ENTRY_KEYS]:
            ctx.error(f"{where}.{unknown}", item[unknown], ", ".join(MIG_ENTRY_KEYS)
                      + did_you_mean(unknown, MIG_ENTRY_KEYS), "unknown mig-parted key")
            misspelt.update(difflib.get_close_matches(str(unknown), MIG_ENTRY_KEYS, n=1, cutoff=0.6))
            ok = False
        entry = _mig_entry(ctx, where, item, misspelt)
        if entry is _INVALID:
            ok = False
        else:
            entries.append(entry)
    return tuple(entries) if ok else _INVALID


def _mig_entry(ctx: _Ctx, where: str, item: Mapping, misspelt: set[str]) -> Any:
    """One layout entry; ``misspelt``: required keys already reported as misspelt (not reported missing)."""
    ok = True
    devices: Any = None
    if "devices" not in item:
        if "devices" not in misspelt:
            ctx.error(f"{where}.devices", None, '"all" or a list of GPU indices', "missing")
        ok = False
    else:
        devices = item["devices"]
        if devices == "all":
            pass
        elif (isinstance(devices, list) and devices
              and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
              and len(set(devices)) == len(devices)):
            devices = tuple(devices)
        else:
            ctx.error(f"{where}.devices", devices, '"all" or a list of distinct GPU indices (0, 1, ...)',
                      "not a device selection")
            ok = False
    enabled = item.get("mig-enabled", _INVALID)
    if not isinstance(enabled, bool):
        if enabled is not _INVALID or "mig-enabled" not in misspelt:
            ctx.error(f"{where}.mig-enabled", None if enabled is _INVALID else enabled, "true or false",
                      "missing" if enabled is _INVALID else "not a boolean")
        ok = False
    device_filter = None
    if "device-filter" in item:
        raw = item["device-filter"]
        items = [raw] if isinstance(raw, str) else raw
        if (not isinstance(items, list) or not items
                or not all(isinstance(x, str) and _PCI_FILTER_RE.match(x) for x in items)):
            ctx.error(f"{where}.device-filter", raw, 'a PCI device id or a list of them, as nvidia-smi prints '
                      'pci.device_id: "0x233010DE"', "not a device filter")
            ok = False
        else:
            device_filter = tuple("0x" + x[2:].upper() for x in items)
    mig_devices: dict[str, int] = {}
    raw_devices = item.get("mig-devices", {})
    if raw_devices is None:
        raw_devices = {}
    if not isinstance(raw_devices, Mapping):
        ctx.error(f"{where}.mig-devices", raw_devices, '{profile: count}, e.g. {"1g.10gb": 7}', "not a mapping")
        ok = False
    else:
        for profile, count in raw_devices.items():
            sub = f"{where}.mig-devices[{profile!r}]"
            if isinstance(profile, str) and _MIG_CI_PROFILE_RE.match(profile):
                ctx.error(sub, profile, 'GPU instance profiles such as "3g.40gb" (each gets one full compute '
                          "instance)", "compute-instance profiles are not supported")
                ok = False
            elif not isinstance(profile, str) or not _MIG_PROFILE_RE.match(profile):
                ctx.error(sub, profile, 'a MIG profile name as nvidia-smi mig -lgip prints it without "MIG ", '
                          'e.g. "1g.10gb", "1g.10gb+me"', "not a MIG profile name")
                ok = False
            elif not isinstance(count, int) or isinstance(count, bool) or count < 0:
                ctx.error(sub, count, "a whole number of instances >= 0", "not an instance count")
                ok = False
            else:
                mig_devices[profile] = count
        if enabled is False and any(mig_devices.values()):
            ctx.error(f"{where}.mig-devices", dict(raw_devices), "empty when mig-enabled is false",
                      "MIG devices on a GPU with MIG disabled")
            ok = False
    if not ok:
        return _INVALID
    return MigDeviceConfig(
        devices=devices,
        mig_enabled=enabled,
        mig_devices=FrozenMap({p: c for p, c in mig_devices.items() if c > 0}),
        device_filter=device_filter,
    )


class MigFileError(ValueError):
    pass


@functools.lru_cache(maxsize=32)
def _read_mig_file(path: str, mtime_ns: int) -> Mapping:
    import yaml  # see the module docstring

    try:
        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise MigFileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, Mapping):
        raise MigFileError("not a mig-parted config (expected a mapping with version and mig-configs)")
    return doc


def load_mig_config_file(path: str | os.PathLike) -> Mapping:
    """Parse a mig-parted config file (cached per path and modification time). Raises MigFileError/OSError."""
    resolved = os.path.abspath(os.fspath(path))
    return _read_mig_file(resolved, os.stat(resolved).st_mtime_ns)


def _mig_from_file(ctx: _Ctx, data: Mapping) -> Any:
    file_key, label_key = "gpufleet_mig_config_file", "gpufleet_mig_config"
    path, label = data.get(file_key), data.get(label_key)
    if label is None:
        ctx.error(label_key, None, f"the label of the layout to apply, one of the mig-configs in {file_key}",
                  f"required when {file_key} is set")
        return _INVALID
    if not isinstance(path, (str, Path)) or not str(path):
        ctx.error(file_key, path, "a path to a mig-parted config file (version: v1, mig-configs: ...)",
                  "not a path")
        return _INVALID
    if not isinstance(label, str) or not label:
        ctx.error(label_key, label, "a label of the file's mig-configs", "not a label")
        return _INVALID
    try:
        doc = load_mig_config_file(path)
    except FileNotFoundError:
        ctx.error(file_key, str(path), f"an existing file (relative paths are from {os.getcwd()})",
                  "file not found")
        return _INVALID
    except (OSError, MigFileError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        ctx.error(file_key, str(path), "a readable mig-parted config file (version: v1, mig-configs: ...)", reason)
        return _INVALID
    version = doc.get("version")
    if version != "v1":
        ctx.error(f"{file_key}:version", version, '"v1" (mig-parted config format)', "unsupported version")
        return _INVALID
    for unknown in [k for k in doc if k not in ("version", "mig-configs")]:
        ctx.error(f"{file_key}:{unknown}", doc[unknown], "version, mig-configs"
                  + did_you_mean(unknown, ("version", "mig-configs")), "unknown top-level key")
        return _INVALID
    configs = doc.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        ctx.error(f"{file_key}:mig-configs", configs, "a mapping of label -> layout", "missing or empty")
        return _INVALID
    if label not in configs:
        labels = [str(k) for k in configs]
        ctx.error(label_key, label, ", ".join(labels) + did_you_mean(label, labels),
                  f"no such label in {path}")
        return _INVALID
    entries = parse_mig_entries(ctx, f"{file_key}:mig-configs[{label!r}]", configs[label])
    if entries is _INVALID:
        return _INVALID
    return MigConfig(entries=entries, key=label_key, file=str(path), label=label)


def _mig(ctx: _Ctx, data: Mapping) -> Any:
    inline = data.get("gpufleet_mig")
    from_file = data.get("gpufleet_mig_config_file") is not None or data.get("gpufleet_mig_config") is not None
    if inline is not None and from_file:
        ctx.error("gpufleet_mig", inline, "either gpufleet_mig (inline) or gpufleet_mig_config_file + "
                  "gpufleet_mig_config, not both", "two MIG layouts given")
        return _INVALID
    if inline is not None:
        entries = parse_mig_entries(ctx, "gpufleet_mig", inline)
        return _INVALID if entries is _INVALID else MigConfig(entries=entries)
    if from_file:
        if data.get("gpufleet_mig_config_file") is None:
            ctx.error("gpufleet_mig_config_file", None, "a path to a mig-parted config file",
                      "required when gpufleet_mig_config is set")
            return _INVALID
        return _mig_from_file(ctx, data)
    return None


# -------------------------------------------------------------------------------------------------- NCCL

_NCCL_LEVELS_P2P = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_NCCL_LEVELS_GDR = ("LOC", "PIX", "PXB", "PHB", "SYS")
_NCCL_ALGOS = ("ring", "tree", "collnet", "collnetchain", "collnetdirect", "nvls", "nvlstree", "pat")
_NCCL_PROTOS = ("ll", "ll128", "simple")
_NCCL_FUNCS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
_NCCL_SUBSYS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "ALLOC_HOST", "CALL",
                "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "DESTROY", "ALL")
_IFNAME_RE = re.compile(r"^\^?=?[A-Za-z0-9_.:@-]+(?:,=?[A-Za-z0-9_.:@-]+)*\Z")
_HCA_ITEM = r"[A-Za-z0-9_.-]+(?::\d*(?::-?\d*(?::-?\d*)?)?)?"  # <hca>[:<port>[:<rail>[:<plane>]]]
_HCA_RE = re.compile(rf"^\^?=?{_HCA_ITEM}(?:,{_HCA_ITEM})*\Z")
_PATH_RE = re.compile(r"^/[^\s'\"]*\Z")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.-]+\Z")


def _nccl_choice(choices: tuple[str, ...], case_insensitive: bool = False):
    def check(text: str) -> str | None:
        wanted = text.upper() if case_insensitive else text
        return wanted if wanted in choices else None

    return check, ", ".join(choices)


def _nccl_ints(low: int, high: int | None):
    def check(text: str) -> str | None:
        if re.match(r"^-?\d+\Z", text) and int(text) >= low and (high is None or int(text) <= high):
            return str(int(text))
        return None

    allowed = f"an integer {low}..{high}" if high is not None else f"an integer >= {low}"
    return check, allowed


def _nccl_level(levels: tuple[str, ...]):
    def check(text: str) -> str | None:
        if text.upper() in levels:
            return text.upper()
        if re.match(r"^\d+\Z", text):
            return text
        return None

    return check, ", ".join(levels) + " (or a legacy integer >= 0)"


def _nccl_list(names: tuple[str, ...]):
    """NCCL_ALGO / NCCL_PROTO: ``[^]a,b`` or, since 2.24, ``a,b;allreduce:^tree;broadcast:ring``."""

    def check_list(text: str) -> bool:
        text = text[1:] if text.startswith("^") else text
        return bool(text) and all(tok.lower() in names for tok in text.split(","))

    def check(text: str) -> str | None:
        for i, part in enumerate(text.split(";")):
            func, sep, items = part.rpartition(":")
            if sep and func.lower() not in _NCCL_FUNCS:
                return None
            if not sep and i > 0:
                return None
            if not check_list(items):
                return None
        return text

    return check, ("a comma list of " + ", ".join(names) + " (case-insensitive, ^ to exclude; since 2.24 also "
                   "per function: ring,tree;allreduce:^tree)")


def _nccl_subsys(text: str) -> str | None:
    body = text[1:] if text.startswith("^") else text
    return text if body and all(tok.upper() in _NCCL_SUBSYS for tok in body.split(",")) else None


def _nccl_regex(regex: re.Pattern):
    return lambda text: text if regex.match(text) and text.isprintable() else None  # as nccl.conf_text checks


NCCL_KEYS: dict[str, tuple[Any, str]] = {
    "NCCL_SOCKET_IFNAME": (_nccl_regex(_IFNAME_RE), "comma list of interface prefixes, ^ to exclude, = for exact "
                           "names, e.g. eth, =eth0,eth1, ^docker"),
    "NCCL_SOCKET_FAMILY": _nccl_choice(("AF_INET", "AF_INET6")),
    "NCCL_CROSS_NIC": _nccl_ints(0, 2),
    "NCCL_IB_HCA": (_nccl_regex(_HCA_RE), "comma list of <hca>[:<port>[:<rail>[:<plane>]]], optional ^ then =, "
                    "e.g. =mlx5_0:1,mlx5_1:1"),
    "NCCL_IB_GID_INDEX": _nccl_ints(-1, None),
    "NCCL_IB_DISABLE": _nccl_ints(0, 1),
    "NCCL_NET": (_nccl_regex(_TOKEN_RE), "IB, Socket or a network plugin's name"),
    "NCCL_NET_GDR_LEVEL": _nccl_level(_NCCL_LEVELS_GDR),
    "NCCL_P2P_DISABLE": _nccl_ints(0, 1),
    "NCCL_P2P_LEVEL": _nccl_level(_NCCL_LEVELS_P2P),
    "NCCL_SHM_DISABLE": _nccl_ints(0, 1),
    "NCCL_ALGO": _nccl_list(_NCCL_ALGOS),
    "NCCL_PROTO": _nccl_list(_NCCL_PROTOS),
    "NCCL_NVLS_ENABLE": _nccl_ints(0, 2),
    "NCCL_DEBUG": _nccl_choice(("VERSION", "WARN", "INFO", "TRACE"), case_insensitive=True),
    "NCCL_DEBUG_SUBSYS": (_nccl_subsys, "comma list of " + ", ".join(_NCCL_SUBSYS) + " (^ to exclude)"),
    "NCCL_DEBUG_FILE": (_nccl_regex(_PATH_RE), "an absolute path pattern, e.g. /tmp/nccl.%h.%p"),
    "NCCL_TOPO_FILE": (_nccl_regex(_PATH_RE), "an absolute path to a topology XML file"),
}
NCCL_RENAMED = {"NCCL_IB_GDR_LEVEL": "NCCL_NET_GDR_LEVEL"}
NCCL_NOT_IN_FILE = {"NCCL_CONF_FILE": "NCCL reads it before any config file, so setting it in /etc/nccl.conf "
                                      "has no effect"}


def _nccl_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    return None


def _nccl(ctx: _Ctx, key: str, value: Any) -> Any:
    if value is None:
        return NcclConfig()
    if not isinstance(value, Mapping):
        ctx.error(key, value, '{NCCL_KEY: value}, e.g. {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_HCA": "mlx5"}',
                  "not a mapping")
        return _INVALID
    settings: dict[str, str] = {}
    ok = True
    for name, raw in value.items():
        sub = f"{key}[{name!r}]"
        if name in NCCL_RENAMED:
            ctx.error(sub, raw, f"{NCCL_RENAMED[name]} (renamed in NCCL 2.4)", "renamed NCCL variable")
            ok = False
            continue
        if name in NCCL_NOT_IN_FILE:
            ctx.error(sub, raw, "set it in the environment of the job instead", NCCL_NOT_IN_FILE[name])
            ok = False
            continue
        if name not in NCCL_KEYS:
            ctx.error(sub, raw, "one of " + ", ".join(sorted(NCCL_KEYS)) + did_you_mean(name, NCCL_KEYS),
                      "unknown NCCL variable")
            ok = False
            continue
        check, allowed = NCCL_KEYS[name]
        text = _nccl_text(raw)
        if text is None or not text or any(c.isspace() for c in text) or any(c in text for c in "'\"\\#"):
            ctx.error(sub, raw, allowed + "; written as KEY=VALUE: no spaces, quotes, backslashes or #",
                      "not representable in nccl.conf")
            ok = False
            continue
        normalized = check(text)
        if normalized is None:
            ctx.error(sub, raw, allowed, f"invalid {name} value")
            ok = False
            continue
        settings[name] = normalized
    return NcclConfig(FrozenMap(settings)) if ok else _INVALID


# ------------------------------------------------------------------------------------------------ clocks


def _clocks(ctx: _Ctx, key: str, value: Any) -> Any:
    allowed = f'{{"lock_gpu_mhz": [min, max]}} (MHz, 1..{CLOCK_MHZ_MAX}, min <= max) or "reset"'
    if value is None:
        return ClocksConfig()
    if value == "reset":
        return ClocksConfig(mode="reset")
    if not isinstance(value, Mapping):
        ctx.error(key, value, allowed, "not a clock setting")
        return _INVALID
    for unknown in [k for k in value if k != "lock_gpu_mhz"]:
        ctx.error(f"{key}.{unknown}", value[unknown], "lock_gpu_mhz" + did_you_mean(unknown, ("lock_gpu_mhz",)),
                  "unknown clocks key")
        return _INVALID
    pair = value.get("lock_gpu_mhz")
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= CLOCK_MHZ_MAX for x in pair)
            or pair[0] > pair[1]):
        ctx.error(f"{key}.lock_gpu_mhz", pair, allowed, "not a [min, max] clock range")
        return _INVALID
    return ClocksConfig(mode="lock", lock_gpu_mhz=(pair[0], pair[1]))



# ------------------------------------------------------------------------------- exporters (stage exporters)
# The monitoring exporters of a GPU node. One table: key, parser, default, doc. ``gpufleet_exporters_textfile_dir``
# is also where verify writes its Prometheus textfile (one setting drives both).

GPU_EXPORTERS = ("auto", "dcgm", "nvml", "none")
DEFAULT_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian/Ubuntu prometheus-node-exporter's own
_LISTEN_RE = re.compile(r"^(?:(?P<v4>\d{1,3}(?:\.\d{1,3}){3})|\[(?P<v6>[0-9A-Fa-f:]+)\]|(?P<any>)):(?P<port>\d{1,5})\Z")
_TEXTFILE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]*\Z")
# dcgm-exporter collects every -c milliseconds and answers a scrape with its last collection: the collect interval
# follows Prometheus' scrape interval (gpufleet_monitoring_scrape_interval, 15s by default) unless set.
SCRAPE_INTERVAL_KEY = "gpufleet_monitoring_scrape_interval"
DEFAULT_COLLECT_INTERVAL_MS = 15_000
COLLECT_INTERVAL_RANGE_MS = (1_000, 3_600_000)
_DURATION_PART_RE = re.compile(r"(\d+)(ms|s|m|h)")
_DURATION_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}


GPU_EXPORTER_PORT = 9400  # dcgm-exporter's default port
NODE_EXPORTER_PORT = 9100  # node_exporter's default port
_IPV4_RE = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}\Z")


def management_address(data: Mapping) -> str:
    """The address the inventory reaches the host at (``ssh_hostname``) when it is an IP address, in listen-address
    form (``10.0.0.5``, ``[fd00::5]``); else ``0.0.0.0`` (a host name may resolve to several addresses, or to none
    of the host's own). The monitoring plane's listeners bind there by default."""
    address = data.get("ssh_hostname")
    if isinstance(address, str):
        if _IPV4_RE.match(address) and all(int(part) <= 255 for part in address.split(".")):
            return address
        if ":" in address and re.fullmatch(r"[0-9A-Fa-f:]+", address):
            return f"[{address}]"
    return "0.0.0.0"


# TLS of a listener: the subset of exporter-toolkit's tls_server_config that every listener of the monitoring plane
# (node_exporter, dcgm-exporter, Prometheus, Alertmanager, gpufleet's exporter) serves and Prometheus can scrape (no
# client certificates yet); the prometheus-community roles' *_tls_server_config: paths of files on the host
TLS_SERVER_KEYS = ("cert_file", "key_file", "min_version", "max_version")
TLS_VERSIONS = ("TLS12", "TLS13")
TLS_ALLOWED = ("{cert_file: PATH, key_file: PATH, [min_version: TLS12|TLS13], [max_version: TLS12|TLS13]}: PEM "
               "files on the host (absolute paths of letters, digits, . _ - /)")
_TLS_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+\Z")


def tls_server_config(value: Any) -> tuple[dict[str, str] | None, str | None]:
    """(the validated ``tls_server_config`` mapping, None) or (None, why it is refused)."""
    if not isinstance(value, Mapping):
        return None, "not a mapping"
    unknown = sorted(str(k) for k in value if k not in TLS_SERVER_KEYS)
    if unknown:
        return None, f"unknown or unsupported key(s) {', '.join(unknown)}"
    for key in ("cert_file", "key_file"):
        path = value.get(key)
        if not isinstance(path, str) or not _TLS_PATH_RE.match(path) or ".." in path.split("/"):
            return None, f"{key} missing or not an absolute path"
    for key in ("min_version", "max_version"):
        if key in value and value[key] not in TLS_VERSIONS:
            return None, f"{key} is not one of {', '.join(TLS_VERSIONS)}"
    return {k: value[k] for k in TLS_SERVER_KEYS if k in value}, None


# people's own accounts beside gpufleet's (the prometheus-community roles' *_web_config.basic_auth_users): user name
# to a bcrypt hash (exporter-toolkit checks bcrypt only; htpasswd -nBC 10 USER makes one)
BASIC_AUTH_ALLOWED = ("{user: bcrypt hash}: user names of letters, digits, . _ @ - (not \"gpufleet\", gpufleet's own "
                      "account), hashes $2a$/$2b$/$2y$ with cost 04-31 (htpasswd -nBC 10 USER)")
_BASIC_AUTH_USER_RE = re.compile(r"^[A-Za-z0-9._@-]{1,64}\Z")
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}\Z")


def basic_auth_users(value: Any, reserved: str) -> tuple[dict[str, str] | None, str | None]:
    """(the validated ``{user: bcrypt hash}``, None) or (None, why it is refused: the user named, never the hash)."""
    if not isinstance(value, Mapping):
        return None, "not a mapping of user name to bcrypt hash"
    for user, hashed in value.items():
        if not isinstance(user, str) or not _BASIC_AUTH_USER_RE.match(user):
            return None, f"user {user!r}: not a user name of letters, digits, . _ @ -"
        if user == reserved:
            return None, f"user {user!r}: gpufleet's own account (its password is generated)"
        if not isinstance(hashed, str) or not _BCRYPT_RE.match(hashed):
            return None, f"user {user!r}: its value is not a bcrypt hash"
    return dict(sorted(value.items())), None


FLEET_TLS_DIR = "/etc/gpufleet/tls"  # the fleet CA's files on a host
FLEET_TLS = {"cert_file": f"{FLEET_TLS_DIR}/cert.pem", "key_file": f"{FLEET_TLS_DIR}/key.pem"}
FLEET_CA_FILE = f"{FLEET_TLS_DIR}/ca.pem"


def tls_files(tls: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """(key, path) of the files a ``tls_server_config`` names."""
    return [(key, tls[key]) for key in ("cert_file", "key_file") if tls and tls.get(key)]


def listen_problem(listen: str, addresses: Iterable[str]) -> str | None:
    """Why a service of a host with ``addresses`` (its ``hostname -I``) cannot listen on ``listen``, or None: the
    address must be one of them, a wildcard (``0.0.0.0``, ``[::]``) or loopback. No addresses known: not checked."""
    address = listen.rsplit(":", 1)[0].strip("[]")
    addresses = set(addresses)
    if not addresses or address in ("0.0.0.0", "::", "", "::1") or address.startswith("127.") or address in addresses:
        return None
    return "not an address of this host"


@dataclass(frozen=True)
class ExportersConfig:
    gpu: str = "auto"
    gpu_listen: str = f"0.0.0.0:{GPU_EXPORTER_PORT}"
    node: bool = True
    node_listen: str = f"0.0.0.0:{NODE_EXPORTER_PORT}"
    textfile_dir: str = DEFAULT_TEXTFILE_DIR
    node_tls: tuple[tuple[str, str], ...] = ()  # tls_server_config items: () plain HTTP (or the fleet CA's)
    gpu_tls: tuple[tuple[str, str], ...] = ()
    tls_fleet_ca: bool = False  # exporters without a tls_server_config of their own: HTTPS with the fleet CA's
    gpu_count: int | None = None  # GPUs the host should have (monitoring's GpuMissing); None: the most seen
    collect_interval_ms: int = DEFAULT_COLLECT_INTERVAL_MS  # dcgm-exporter's -c (milliseconds)
    dcgm_exporter_version: str | None = None  # the dcgm-exporter release pinned and held; None: apt's candidate

    @staticmethod
    def port(listen: str) -> int:
        return int(listen.rsplit(":", 1)[1])


def _listen(ctx: _Ctx, key: str, value: Any) -> Any:
    allowed = 'ADDRESS:PORT, e.g. "0.0.0.0:9400", "10.0.0.5:9100", "[::]:9400" (port 1..65535)'
    m = _LISTEN_RE.match(value) if isinstance(value, str) else None
    ok = m is not None and 1 <= int(m.group("port")) <= 65535
    if ok and m.group("v4"):
        ok = all(int(part) <= 255 for part in m.group("v4").split("."))
    if not ok:
        ctx.error(key, value, allowed, "not a listen address")
        return _INVALID
    return value if not value.startswith(":") else "0.0.0.0" + value


def _tls(ctx: _Ctx, key: str, value: Any) -> Any:
    tls, reason = tls_server_config(value)
    if tls is None:
        ctx.error(key, value, TLS_ALLOWED, reason)
        return _INVALID
    return tuple(sorted(tls.items()))


def _textfile_dir(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, str) or not _TEXTFILE_PATH_RE.match(value) or ".." in value.split("/") or value == "/":
        ctx.error(key, value, "an absolute directory path (letters, digits, . _ - /), e.g. " + DEFAULT_TEXTFILE_DIR,
                  "not an absolute directory path")
        return _INVALID
    return value.rstrip("/")


def _gpu_count(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
        ctx.error(key, value, "an integer 1..64 (or unset: the most GPUs seen in the last day)", "not a GPU count")
        return _INVALID
    return value


def duration_ms(value: Any) -> int | None:
    """Milliseconds of a Prometheus duration up to hours (``"15s"``, ``"1m30s"``, ``"500ms"``); None when ``value``
    is not one."""
    if not isinstance(value, str) or not value or _DURATION_PART_RE.sub("", value):
        return None
    return sum(int(n) * _DURATION_MS[unit] for n, unit in _DURATION_PART_RE.findall(value))


_COLLECT_ALLOWED = "a duration between 1s and 1h, e.g. \"15s\" (unset: the scrape interval, else 15s)"


def _collect_interval(ctx: _Ctx, key: str, value: Any) -> Any:
    ms = duration_ms(value)
    low, high = COLLECT_INTERVAL_RANGE_MS
    if ms is None or not low <= ms <= high:
        ctx.error(key, value, _COLLECT_ALLOWED, "not a collect interval")
        return _INVALID
    return ms


def _default_collect_interval(ctx: _Ctx, data: Mapping) -> Any:
    """The scrape interval, when the host's data has it (a group_data of the fleet), else 15 s."""
    raw = data.get(SCRAPE_INTERVAL_KEY)
    if raw is None:
        return DEFAULT_COLLECT_INTERVAL_MS
    ms = duration_ms(raw)
    low, high = COLLECT_INTERVAL_RANGE_MS
    if ms is None or not low <= ms <= high:
        ctx.error(SCRAPE_INTERVAL_KEY, raw, "a Prometheus duration between 1s and 1h, e.g. \"15s\" (the GPU "
                  "exporter's collect interval follows it unless gpufleet_exporters_collect_interval is set)",
                  "not a scrape interval")
        return _INVALID
    return ms


# a dcgm-exporter release as NVIDIA tags it (DCGM version, exporter version) or its exporter version alone
_DCGM_EXPORTER_RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+(-\d+\.\d+\.\d+)?\Z")


def _matching(regex: re.Pattern, allowed: str, reason: str):
    """A parser of a string setting that ``regex`` matches whole."""
    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        if not isinstance(value, str) or not regex.match(value):
            ctx.error(key, value, allowed, reason)
            return _INVALID
        return value

    return parse


_dcgm_exporter_version = _matching(
    _DCGM_EXPORTER_RELEASE_RE, 'a dcgm-exporter release as NVIDIA tags it, e.g. "4.2.3-4.1.3" (DCGM version, exporter '
    'version), or its exporter version, e.g. "4.1.3"', "not a dcgm-exporter release")


EXPORTER_SETTINGS: tuple[tuple[str, Any, Any, str], ...] = (
    ("gpufleet_exporters_gpu", _choice(GPU_EXPORTERS), "auto",
     "GPU exporter: dcgm (NVIDIA DCGM + dcgm-exporter from the NVIDIA repository), nvml (gpufleet's own), auto "
     "(dcgm on datacenter GPUs when the repository offers it, else nvml) or none"),
    ("gpufleet_exporters_gpu_listen", _listen, None,
     "address:port the GPU exporter listens on (basic auth always); unset: the host's ssh_hostname when it is an IP "
     "address, else 0.0.0.0, port 9400"),
    ("gpufleet_exporters_node", _bool, True, "install node_exporter (the distribution's package)"),
    ("gpufleet_exporters_node_listen", _listen, None,
     "address:port node_exporter listens on (basic auth always); unset: the host's ssh_hostname when it is an IP "
     "address, else 0.0.0.0, port 9100"),
    ("gpufleet_exporters_node_tls_server_config", _tls, None,
     "node_exporter serves HTTPS with these files on the host (the prometheus-community role's "
     "node_exporter_tls_server_config); unset: HTTP"),
    ("gpufleet_exporters_gpu_tls_server_config", _tls, None,
     "the GPU exporter serves HTTPS with these files on the host; unset: HTTP"),
    ("gpufleet_exporters_tls_fleet_ca", _bool, False,
     "HTTPS for the exporters without a *_tls_server_config of their own, with a certificate of gpufleet's fleet CA "
     "(created on the control machine)"),
    ("gpufleet_exporters_textfile_dir", _textfile_dir, DEFAULT_TEXTFILE_DIR,
     "node_exporter's textfile collector directory; verify writes its results there too"),
    ("gpufleet_exporters_gpu_count", _gpu_count, None,
     "GPUs this host should have (alert GpuMissing below it); unset: the most seen in the last day"),
    ("gpufleet_exporters_collect_interval", _collect_interval, None,
     "how often dcgm-exporter collects (its -c); unset: gpufleet_monitoring_scrape_interval where the host's data "
     "has it, else 15s"),
    ("gpufleet_dcgm_exporter_version", _dcgm_exporter_version, None,
     "the dcgm-exporter release installed, pinned and held (dcgm path); its counters file holds only the fields that "
     "release knows; unset: apt's candidate, not held"),
)


def _exporters_config(ctx: _Ctx, values: Mapping[str, Any], data: Mapping) -> ExportersConfig | None:
    collect = values["gpufleet_exporters_collect_interval"]
    if collect is None:
        collect = _default_collect_interval(ctx, data)
    if collect is _INVALID or any(values[key] is _INVALID for key, *_ in EXPORTER_SETTINGS):
        return None
    address = management_address(data)
    config = ExportersConfig(
        gpu=values["gpufleet_exporters_gpu"],
        gpu_listen=values["gpufleet_exporters_gpu_listen"] or f"{address}:{GPU_EXPORTER_PORT}",
        node=values["gpufleet_exporters_node"],
        node_listen=values["gpufleet_exporters_node_listen"] or f"{address}:{NODE_EXPORTER_PORT}",
        textfile_dir=values["gpufleet_exporters_textfile_dir"], gpu_count=values["gpufleet_exporters_gpu_count"],
        node_tls=values["gpufleet_exporters_node_tls_server_config"] or (),
        gpu_tls=values["gpufleet_exporters_gpu_tls_server_config"] or (),
        tls_fleet_ca=values["gpufleet_exporters_tls_fleet_ca"],
        collect_interval_ms=collect, dcgm_exporter_version=values["gpufleet_dcgm_exporter_version"])
    if config.node and config.gpu != "none" and config.port(config.gpu_listen) == config.port(config.node_listen):
        ctx.error("gpufleet_exporters_node_listen", config.node_listen,
                  f"a port other than the GPU exporter's (gpufleet_exporters_gpu_listen={config.gpu_listen!r})",
                  "port clash")
    return config

# ------------------------------------------------------------------------------------------------- schema

# key -> (parser, default). The MIG keys are parsed together (_mig).
def _health_interval(ctx: _Ctx, key: str, value: Any) -> Any:
    low, high = HEALTH_INTERVAL_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        ctx.error(key, value, f"seconds, an integer {low}..{high} (slurm.conf HealthCheckInterval)", "not an interval")
        return _INVALID
    return value


def _names(choices: tuple[str, ...], what: str):
    """A non-empty list of distinct names out of ``choices``."""

    def parse(ctx: _Ctx, key: str, value: Any) -> Any:
        allowed = f"a non-empty list of {what} out of: {', '.join(choices)}"
        if not isinstance(value, (list, tuple)) or not value:
            ctx.error(key, value, allowed, "not a non-empty list")
            return _INVALID
        bad = [v for v in value if v not in choices]
        if bad:
            ctx.error(key, value, allowed + did_you_mean(bad[0], choices), f"unknown {what[:-1]} {bad[0]!r}")
            return _INVALID
        if len(set(value)) != len(value):
            ctx.error(key, value, allowed + ", each once", "listed twice")
            return _INVALID
        return tuple(value)

    return parse


_reason_prefix = _matching(
    _REASON_PREFIX_RE, "1-48 characters: letters, digits, space, '.', '_', '-' (starting with a letter or digit)",
    "not a drain reason prefix")


def _templates_dir(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, str | os.PathLike) or not os.path.isdir(value):
        ctx.error(key, value, "a directory on the control machine holding templates named as gpufleet's "
                  "(e.g. nccl.conf.j2, systemd/...)", "not a directory")
        return _INVALID
    return os.fspath(value)


def _catalog_dir(ctx: _Ctx, key: str, value: Any) -> Any:
    if not isinstance(value, str | os.PathLike) or not os.path.isdir(value):
        ctx.error(key, value, "a directory on the control machine holding GPU model files (<key>.json, as "
                  "`gpufleet catalog learn` writes them)", "not a directory")
        return _INVALID
    try:
        use_user_models(value)
    except CatalogError as err:
        ctx.error(key, value, "model files the catalog's strict loader accepts, one directory for the whole fleet",
                  str(err))
        return _INVALID
    return os.path.abspath(value)


# the catalog directory first: the user's models are in the catalog before any GPU model name is validated
_KEYS: dict[str, tuple[Any, Any]] = {
    "gpufleet_catalog_dir": (_catalog_dir, None),
    "gpufleet_config_version": (_config_version, CONFIG_VERSION),
    "gpufleet_stages": (_stages, DEFAULT_STAGES),
    "gpufleet_allow_reboot": (_bool, False),
    "gpufleet_driver_branch": (_branch, DEFAULT_DRIVER_BRANCH),
    "gpufleet_driver_flavour": (_choice(FLAVOURS), "auto"),
    "gpufleet_driver_repo_url": (_url, None),
    "gpufleet_driver_repo_keyring_url": (_url, None),
    "gpufleet_driver_repo_key_fingerprint": (_fingerprint, None),
    "gpufleet_driver_packages_style": (_choice(PACKAGE_STYLES, optional=True), None),
    "gpufleet_driver_secure_boot_signing": (_bool, False),
    "gpufleet_power_limit": (_power_limit, None),
    "gpufleet_power_limit_by_model": (_power_by_model, None),
    "gpufleet_power_limit_by_uuid": (_power_by_uuid, None),
    "gpufleet_nccl": (_nccl, None),
    "gpufleet_clocks": (_clocks, None),
    "gpufleet_templates_dir": (_templates_dir, None),  # read by gpufleet.resources through host data
    "gpufleet_slurm_gres": (_choice(SLURM_GRES_MODES), "auto"),
    "gpufleet_health_interval": (_health_interval, HealthConfig.interval),
    "gpufleet_health_checks": (_names(HEALTH_CHECKS, "check groups"), HEALTH_CHECKS),
    "gpufleet_health_reason_prefix": (_reason_prefix, HealthConfig.reason_prefix),
    "gpufleet_health_node_state": (_names(HEALTH_NODE_STATES, "node states"), ("ANY",)),
    **{key: (parser, default) for key, parser, default, _doc in EXPORTER_SETTINGS},
}
_MIG_KEYS = ("gpufleet_mig", "gpufleet_mig_config_file", "gpufleet_mig_config")
KNOWN_KEYS: tuple[str, ...] = (*_KEYS, *_MIG_KEYS)


def register_namespace(prefix: str) -> None:
    """Let another gpufleet component own the keys under ``prefix`` (e.g. ``gpufleet_verify_``): this module
    then neither validates nor rejects them; the owner must validate them itself."""
    if not prefix.startswith(KEY_PREFIX) or not prefix.endswith("_") or prefix == KEY_PREFIX:
        raise ValueError(f"namespace must look like 'gpufleet_<name>_', got {prefix!r}")
    _registered_namespaces.add(prefix)


# The verify stage's settings (gpufleet/verify/run.py validates them); registered here so that the converge
# deploy, which never imports the verify code, accepts an inventory that sets them.
register_namespace("gpufleet_verify_")
register_namespace("gpufleet_monitoring_")  # gpufleet/monitoring/config.py validates them (deploys/monitoring.py)

# SSH bounds (connect timeout, keepalive, dead-peer detection) of every gpufleet run: gpufleet/connection.py
# validates the gpufleet_ssh_* keys (it is used by the converge and by verify alike).
register_namespace("gpufleet_ssh_")




def _slurm_gres_problem(ctx: _Ctx, values: Mapping[str, Any], mig: MigConfig | None) -> None:
    stages = values["gpufleet_stages"]
    mode = values["gpufleet_slurm_gres"]
    if mode != "files" or stages is _INVALID or "slurm" not in stages or "mig" not in stages \
            or not isinstance(mig, MigConfig):
        return
    if any(entry.mig_enabled for entry in mig.entries):
        ctx.error("gpufleet_slurm_gres", mode, "auto or nvml on a host with a MIG layout (MIG devices are found by "
                  "slurmd through NVML: AutoDetect=nvml)", "gres.conf files cannot name MIG devices")


def _is_ours(key: Any) -> bool:
    if not isinstance(key, str) or not key.startswith(KEY_PREFIX):
        return False
    return not key.startswith(IGNORED_PREFIXES + tuple(_registered_namespaces))


def _collect(host_name: str, data: Mapping) -> tuple[NodeConfig | None, list[ConfigError]]:
    ctx = _Ctx(host_name)
    ours = {k: v for k, v in data.items() if _is_ours(k)}
    for key in ours:
        if key not in KNOWN_KEYS:
            ctx.error(key, ours[key], "a known gpufleet_* key" + did_you_mean(key, KNOWN_KEYS),
                      "unknown gpufleet setting")
    values: dict[str, Any] = {}
    for key, (parser, default) in _KEYS.items():
        raw = ours.get(key)
        values[key] = default if raw is None else parser(ctx, key, raw)
    mig = _mig(ctx, ours)
    exporters = _exporters_config(ctx, values, data)
    _slurm_gres_problem(ctx, values, mig)
    if ctx.errors:
        return None, ctx.errors
    config = NodeConfig(
        host=host_name,
        version=values["gpufleet_config_version"],
        stages=tuple(values["gpufleet_stages"]),
        allow_reboot=values["gpufleet_allow_reboot"],
        driver=DriverConfig(
            branch=values["gpufleet_driver_branch"],
            flavour=values["gpufleet_driver_flavour"],
            repo_url=values["gpufleet_driver_repo_url"],
            repo_keyring_url=values["gpufleet_driver_repo_keyring_url"],
            repo_key_fingerprint=values["gpufleet_driver_repo_key_fingerprint"],
            packages_style=values["gpufleet_driver_packages_style"],
            secure_boot_signing=values["gpufleet_driver_secure_boot_signing"],
        ),
        power=PowerConfig(
            limit=values["gpufleet_power_limit"],
            by_model=values["gpufleet_power_limit_by_model"] or FrozenMap({}),
            by_uuid=values["gpufleet_power_limit_by_uuid"] or FrozenMap({}),
        ),
        mig=mig,
        nccl=values["gpufleet_nccl"] or NcclConfig(),
        clocks=values["gpufleet_clocks"] or ClocksConfig(),
        exporters=exporters,
        slurm_gres=values["gpufleet_slurm_gres"],
        health=HealthConfig(interval=values["gpufleet_health_interval"], checks=values["gpufleet_health_checks"],
                            reason_prefix=values["gpufleet_health_reason_prefix"],
                            node_state=values["gpufleet_health_node_state"]),
    )
    return config, []


def load_node_config(host_name: str, data: Mapping) -> NodeConfig:
    """Validate one host's data (``host.data.dict()`` or any mapping) into a NodeConfig.

    Raises :class:`ConfigErrors` listing every problem of this host.
    """
    config, errors = _collect(host_name, data)
    if errors:
        raise ConfigErrors(errors)
    assert config is not None
    return config


def validate_hosts(hosts: Iterable[tuple[str, Mapping]], load) -> dict[str, Any]:
    """Every host's data through ``load(name, data) -> (value or None, errors)``; raise ONE :class:`ConfigErrors`
    with the errors of all hosts, else return {name: value}."""
    values: dict[str, Any] = {}
    errors: list[ConfigError] = []
    for name, data in hosts:
        value, host_errors = load(name, data)
        errors.extend(host_errors)
        if value is not None:
            values[name] = value
    if errors:
        raise ConfigErrors(errors)
    return values


def validate_inventory(hosts: Iterable[tuple[str, Mapping]]) -> dict[str, NodeConfig]:
    """Validate every host; raise ONE :class:`ConfigErrors` with the errors of all hosts, else return configs."""
    return validate_hosts(hosts, _collect)


def validate_pyinfra_inventory(inventory) -> dict[str, NodeConfig]:
    """:func:`validate_inventory` over every host of a pyinfra ``Inventory`` (active or not)."""
    return validate_inventory((host.name, host.data.dict()) for host in inventory)


# --------------------------------------------------------------------------- GPU model names (validation)


def catalog_model(name: Any) -> GpuModel | None:
    """The catalog model named ``name`` (a catalog key or the GPU name nvidia-smi prints), None when unknown."""
    if not isinstance(name, str):
        return None
    catalog = load_catalog()
    if name in catalog:
        return catalog.get(name)
    try:
        return catalog.by_name(name)
    except UnknownGpuModel:
        return None
