"""GPU catalog: dataclasses and the strict loader for ``models/<key>.json``.

Each model file holds one GPU model. Every field is an object ``{"value": ..., "source": "tag: detail"}``
where tag is one of ``real`` (printed by real hardware), ``doc`` (NVIDIA documentation / datasheet) or
``unverified`` (recalled, secondhand, assumed). ``null`` values mean "not known" - never a guess.
The loader rejects unknown or missing fields, wrong types and bad source tags, so a typo in a data file
fails at import of the catalog, not in a deploy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
SOURCE_TAGS = ("real", "doc", "unverified")
PRECISIONS = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
NVIDIA_VENDOR_ID = 0x10DE
# NVIDIA's GPU architectures, oldest first: what a rule "on Ampere and earlier" compares (a model's architecture must
# be one of them).
ARCHITECTURES = ("Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell")

_SOURCE_RE = re.compile(r"^(real|doc|unverified): \S.*$", re.DOTALL)
_PCI_RE = re.compile(r"^0x[0-9A-F]{4}10DE$")

# Aliases accepted by GpuModel.dense_peak (torch / numpy style dtype names).
_PRECISION_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "int8": "int8",
}


class CatalogError(ValueError):
    """A catalog data file is malformed (unknown/missing field, wrong type, bad source tag)."""


class UnknownGpuModel(KeyError, ValueError):  # public name fixed by the API
    """No catalog model matches the key / nvidia-smi name asked for. The message lists the known ones."""

    def __init__(self, message: str, known: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.known = known

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class UnknownMigProfile(KeyError, ValueError):
    """No MIG profile of this GPU matches the name / id asked for. The message lists the valid ones."""

    def __init__(self, message: str, known: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.known = known

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile, as ``nvidia-smi mig -lgip`` / ``-lgipp`` print it.

    ``id`` is the -lgip ID column (what ``-cgi`` accepts), not the NVML profile enum.
    ``memory_slices`` is the placement size in memory slices. ``placements`` are ``(start, size)`` pairs.
    Numeric fields that were never captured for this GPU are ``None`` (see ``verified``).
    """

    name: str
    id: int
    nvml_profile_enum: int
    max_instances: int
    memory_mib: int | None
    memory_gib_printed: str | None
    compute_slices: int
    memory_slices: int
    sm_count: int | None
    copy_engines: int | None
    decoders: int | None
    encoders: int | None
    jpeg: int | None
    ofa: int | None
    p2p: bool
    placements: tuple[tuple[int, int], ...]
    verified: str = field(repr=False)

    @property
    def display_name(self) -> str:
        """The name as -lgip / -L print it: ``MIG 1g.10gb``."""
        return f"MIG {self.name}"

    @property
    def source_tag(self) -> str:
        return self.verified.split(":", 1)[0]


@dataclass(frozen=True)
class MigSpec:
    compute_slices: int
    memory_slices: int
    gpu_instance_profiles: tuple[MigProfile, ...]

    def profile(self, name_or_id: str | int) -> MigProfile:
        """Look up a profile by name (``1g.10gb``, ``MIG 1g.10gb``, any case) or by -lgip ID (19 or "19")."""
        wanted: int | str
        if isinstance(name_or_id, bool):
            raise self._unknown(name_or_id)
        if isinstance(name_or_id, int):
            wanted = name_or_id
        elif isinstance(name_or_id, str):
            text = name_or_id.strip()
            if text[:4].lower() == "mig ":
                text = text[4:].strip()
            wanted = int(text) if text.isdigit() else text
        else:
            raise self._unknown(name_or_id)
        for prof in self.gpu_instance_profiles:
            if isinstance(wanted, int) and prof.id == wanted:
                return prof
            if isinstance(wanted, str) and prof.name == wanted:
                return prof
        if isinstance(wanted, str):
            folded = wanted.casefold()
            for prof in self.gpu_instance_profiles:
                if prof.name.casefold() == folded:
                    return prof
        raise self._unknown(name_or_id)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.gpu_instance_profiles)

    def _unknown(self, name_or_id: object) -> UnknownMigProfile:
        valid = ", ".join(f"{p.name} (ID {p.id})" for p in self.gpu_instance_profiles)
        return UnknownMigProfile(f"unknown MIG profile {name_or_id!r}; valid profiles: {valid}", self.profile_names)


@dataclass(frozen=True)
class PowerLimits:
    """One board variant's power limits in watts as nvidia-smi reports them (``Default / Min / Max Power Limit``);
    ``None``: not known. Boards sold under one name differ (VBIOS, cooling, OEM): each variant seen is kept."""

    default_w: float | None
    min_w: float | None
    max_w: float | None
    source: str = field(repr=False, compare=False)  # the same figures are the same variant, whoever saw them


@dataclass(frozen=True)
class GpuModel:
    """One GPU model. Values are as nvidia-smi prints them; ``None`` = not known (see ``sources``).

    ``dense_tflops`` / ``sparse_tflops`` have exactly the keys of ``PRECISIONS`` (int8 in TOPS); dense rates
    are without sparsity (H100 SXM bf16 = 989.4). ``sources`` maps every field name to
    ``"real|doc|unverified: detail"``. The fields after ``sources`` are additions for the simulator and
    verify (examples and thresholds seen in real captures).
    """

    key: str
    name: str
    pci_device_id: int
    architecture: str
    compute_capability: str
    datacenter: bool
    form_factor: str
    sm_count: int | None  # None: never printed by a real source for this GPU (see sources)
    memory_mib: int
    memory_type: str
    memory_bandwidth_gbs: float | None  # None: not known (a learned model before its datasheet figure)
    power_limits_w: tuple[PowerLimits, ...]  # one entry per board variant seen (see power_default_w & co.)
    clocks_max_sm_mhz: int | None
    clocks_max_mem_mhz: int | None
    clocks_max_graphics_mhz: int | None
    pcie_gen_max: int
    pcie_width_max: int
    nvlink_count: int
    nvswitch_systems: bool
    ecc_supported: bool
    row_remap_supported: bool
    persistence_supported: bool
    temp_slowdown_c: int | None
    temp_shutdown_c: int | None
    temp_max_operating_c: int | None
    dense_tflops: dict[str, float | None]
    sparse_tflops: dict[str, float | None]
    mig: MigSpec | None
    sources: dict[str, str]
    # --- additions (defaults so hand-built test models need not give them)
    brand: str | None = None  # nvidia-smi -q "Product Brand": NVIDIA, GeForce, ...
    other_pci_device_ids: tuple[int, ...] = ()  # further device ids sold under the same name
    pci_sub_device_id_example: int | None = None
    vbios_example: str | None = None
    memory_reserved_mib: int | None = None  # memory.reserved as nvidia-smi prints it
    clocks_max_video_mhz: int | None = None
    nvlink_speed_gbs: float | None = None  # per link, as `nvidia-smi nvlink -s` prints it
    temp_target_c: int | None = None  # "GPU Target Temperature" (GeForce)
    # Since R5xx datacenter GPUs print thresholds relative to T.Limit ("GPU Shutdown T.Limit Temp : -8 C").
    temp_shutdown_tlimit_c: int | None = None
    temp_slowdown_tlimit_c: int | None = None
    temp_max_operating_tlimit_c: int | None = None

    def __hash__(self) -> int:  # dict fields are unhashable; the key identifies a model
        return hash(self.key)

    def __repr__(self) -> str:
        return f"GpuModel(key={self.key!r}, name={self.name!r})"

    @property
    def power_default_w(self) -> float | None:
        """The default power limit every known board variant shares; None when they differ or none is known (the
        driver's own figure decides then)."""
        defaults = {v.default_w for v in self.power_limits_w}
        return defaults.pop() if len(defaults) == 1 else None

    @property
    def power_min_w(self) -> float | None:
        """The lowest minimum any known board variant accepts (None: not known)."""
        return min((v.min_w for v in self.power_limits_w if v.min_w is not None), default=None)

    @property
    def power_max_w(self) -> float | None:
        """The highest maximum any known board variant accepts (None: not known)."""
        return max((v.max_w for v in self.power_limits_w if v.max_w is not None), default=None)

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None

    def architecture_at_most(self, architecture: str) -> bool:
        """Whether this GPU's architecture is ``architecture`` or an earlier one (:data:`ARCHITECTURES`)."""
        return ARCHITECTURES.index(self.architecture) <= ARCHITECTURES.index(architecture)

    @property
    def pci_device_id_hex(self) -> str:
        """``0x233010DE``, the form nvidia-smi prints."""
        return f"0x{self.pci_device_id:08X}"

    def dense_peak(self, precision: str) -> float | None:
        """Dense (no sparsity) peak TFLOP/s (TOPS for int8) for ``precision``; None when not known/supported.

        Accepts the catalog keys (``bf16``) and common dtype names (``bfloat16``, ``torch.float16``).
        Raises ValueError for an unknown precision.
        """
        return self.dense_tflops[_normalize_precision(precision)]

    def sparse_peak(self, precision: str) -> float | None:
        """Datasheet peak with 2:4 sparsity, where NVIDIA publishes one."""
        return self.sparse_tflops[_normalize_precision(precision)]

    def source_tag(self, field_name: str) -> str:
        """``real``, ``doc`` or ``unverified`` for a field."""
        return self.sources[field_name].split(":", 1)[0]


def _normalize_precision(precision: str) -> str:
    text = str(precision).strip().lower()
    for prefix in ("torch.", "np.", "numpy."):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if text in PRECISIONS:
        return text
    if text in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[text]
    raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(PRECISIONS)}")


def _normalize_name(name: str) -> str:
    return "".join(name.split()).casefold()


def _parse_pci_id(value: int | str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not a PCI device id: {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        value = int(text, 16)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"not a PCI device id: {value!r}")
    if value <= 0xFFFF:  # bare device id (0x2330) -> nvidia-smi form
        value = (value << 16) | NVIDIA_VENDOR_ID
    return value


class Catalog:
    """All GPU models, sorted by key. Build with :func:`load_catalog` (cached) or :meth:`from_directory`."""

    def __init__(self, models: Mapping[str, GpuModel]):
        self.models: dict[str, GpuModel] = {k: models[k] for k in sorted(models)}
        by_norm: dict[str, GpuModel] = {}
        for model in self.models.values():
            norm = _normalize_name(model.name)
            if norm in by_norm:
                raise CatalogError(f"models {by_norm[norm].key!r} and {model.key!r} have the same name {model.name!r}")
            by_norm[norm] = model
        self._by_norm_name = by_norm

    @classmethod
    def from_directory(cls, directory: str | Path | Any, allow_empty: bool = False) -> Catalog:
        """Load every ``*.json`` under ``directory`` (a path or an importlib.resources Traversable)."""
        if isinstance(directory, str):
            directory = Path(directory)
        models: dict[str, GpuModel] = {}
        entries = sorted((e for e in directory.iterdir() if e.name.endswith(".json")), key=lambda e: e.name)
        for entry in entries:
            try:
                doc = json.loads(entry.read_text(encoding="utf-8"))
            except ValueError as err:
                raise CatalogError(f"{entry.name}: not JSON: {err}") from None
            model = parse_model(doc, origin=entry.name)
            if entry.name != f"{model.key}.json":
                raise CatalogError(f"{entry.name}: file name must be {model.key}.json")
            models[model.key] = model
        if not models and not allow_empty:
            raise CatalogError(f"no GPU model files in {directory}")
        return cls(models)

    # --- lookups
    def get(self, key: str) -> GpuModel:
        try:
            return self.models[key]
        except (KeyError, TypeError):
            known = tuple(self.models)
            raise UnknownGpuModel(f"unknown GPU model {key!r}; known models: {', '.join(known)}", known) from None

    def by_name(self, name: str) -> GpuModel:
        """Model for an nvidia-smi name: exact match first, then ignoring case and whitespace."""
        for model in self.models.values():
            if model.name == name:
                return model
        if isinstance(name, str):
            model = self._by_norm_name.get(_normalize_name(name))
            if model is not None:
                return model
        known = tuple(m.name for m in self.models.values())
        raise UnknownGpuModel(f"unknown GPU name {name!r}; known names: {', '.join(repr(n) for n in known)}", known)

    def by_pci_device_id(self, device_id: int | str) -> GpuModel | None:
        """Model for a PCI device id as nvidia-smi prints it (0x233010DE; 0x2330 and strings accepted).

        Several SKUs may share a device id: the first model in key order wins, primary ids before
        ``other_pci_device_ids``. Returns None when no model matches.
        """
        try:
            wanted = _parse_pci_id(device_id)
        except (TypeError, ValueError):
            return None
        for model in self.models.values():
            if model.pci_device_id == wanted:
                return model
        for model in self.models.values():
            if wanted in model.other_pci_device_ids:
                return model
        return None

    # --- container protocol
    def keys(self) -> tuple[str, ...]:
        return tuple(self.models)

    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models.values())

    def __iter__(self) -> Iterator[GpuModel]:
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def __contains__(self, key: object) -> bool:
        return key in self.models

    def __repr__(self) -> str:
        return f"Catalog({', '.join(self.models)})"


def load_package_catalog() -> Catalog:
    """Read the model files shipped with the package (uncached; use ``load_catalog``)."""
    return Catalog.from_directory(resources.files("gpufleet.catalog") / "models")


# ----------------------------------------------------------------------------------------------- parsing


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _check(cond: bool, origin: str, where: str, msg: str) -> None:
    if not cond:
        raise CatalogError(f"{origin}: {where}: {msg}")


def _int(o: str, w: str, v: Any) -> int:
    _check(_is_int(v), o, w, f"expected an integer, got {v!r}")
    return v


def _opt_int(o: str, w: str, v: Any) -> int | None:
    return None if v is None else _int(o, w, v)


def _pos_int(o: str, w: str, v: Any) -> int:
    _check(_is_int(v) and v > 0, o, w, f"expected a positive integer, got {v!r}")
    return v


def _opt_pos_int(o: str, w: str, v: Any) -> int | None:
    return None if v is None else _pos_int(o, w, v)


def _opt_num(o: str, w: str, v: Any) -> float | None:
    if v is None:
        return None
    _check(_is_num(v) and v >= 0, o, w, f"expected a non-negative number, got {v!r}")
    return float(v)


def _num(o: str, w: str, v: Any) -> float:
    _check(v is not None, o, w, "must not be null")
    return _opt_num(o, w, v)  # type: ignore[return-value]


def _str(o: str, w: str, v: Any) -> str:
    _check(isinstance(v, str) and v.strip() == v and v != "", o, w, f"expected a non-empty string, got {v!r}")
    return v


def _architecture(o: str, w: str, v: Any) -> str:
    _check(v in ARCHITECTURES, o, w, f"expected one of {', '.join(ARCHITECTURES)}, got {v!r}")
    return v


def _opt_str(o: str, w: str, v: Any) -> str | None:
    return None if v is None else _str(o, w, v)


def _bool(o: str, w: str, v: Any) -> bool:
    _check(isinstance(v, bool), o, w, f"expected true/false, got {v!r}")
    return v


def _pci(o: str, w: str, v: Any) -> int:
    _check(isinstance(v, str) and bool(_PCI_RE.match(v)), o, w, f"expected '0xDDDD10DE' (upper-case hex), got {v!r}")
    return int(v, 16)


def _opt_pci_any_vendor(o: str, w: str, v: Any) -> int | None:
    if v is None:
        return None
    _check(isinstance(v, str) and bool(re.match(r"^0x[0-9A-F]{8}$", v)), o, w, f"expected '0xXXXXXXXX', got {v!r}")
    return int(v, 16)


def _pci_list(o: str, w: str, v: Any) -> tuple[int, ...]:
    _check(isinstance(v, list), o, w, f"expected a list, got {v!r}")
    return tuple(_pci(o, f"{w}[{i}]", x) for i, x in enumerate(v))


def _cc(o: str, w: str, v: Any) -> str:
    _check(isinstance(v, str) and bool(re.match(r"^\d+\.\d$", v)), o, w, f"expected like '9.0', got {v!r}")
    return v


def _tflops(o: str, w: str, v: Any) -> dict[str, float | None]:
    _check(isinstance(v, dict), o, w, f"expected an object, got {v!r}")
    _check(set(v) == set(PRECISIONS), o, w, f"keys must be exactly {', '.join(PRECISIONS)}; got {', '.join(v)}")
    return {p: _opt_num(o, f"{w}.{p}", v[p]) for p in PRECISIONS}


def _source(o: str, w: str, v: Any) -> str:
    _check(
        isinstance(v, str) and bool(_SOURCE_RE.match(v)),
        o,
        w,
        f"source must be 'real|doc|unverified: detail', got {v!r}",
    )
    return v


_PROFILE_FIELDS: dict[str, Callable[[str, str, Any], Any]] = {
    "name": _str,
    "id": _int,
    "nvml_profile_enum": _int,
    "max_instances": _pos_int,
    "memory_mib": _opt_pos_int,
    "memory_gib_printed": lambda o, w, v: _gib(o, w, v),
    "compute_slices": _pos_int,
    "memory_slices": _pos_int,
    "sm_count": _opt_pos_int,
    "copy_engines": _opt_int,
    "decoders": _opt_int,
    "encoders": _opt_int,
    "jpeg": _opt_int,
    "ofa": _opt_int,
    "p2p": _bool,
    "placements": lambda o, w, v: _placements(o, w, v),
    "verified": _source,
}


def _gib(o: str, w: str, v: Any) -> str | None:
    if v is None:
        return None
    _check(isinstance(v, str) and bool(re.match(r"^\d+\.\d\d$", v)), o, w, f"expected like '9.75', got {v!r}")
    return v


def _placements(o: str, w: str, v: Any) -> tuple[tuple[int, int], ...]:
    _check(isinstance(v, list), o, w, f"expected a list of [start, size], got {v!r}")
    out = []
    for i, item in enumerate(v):
        _check(
            isinstance(item, list) and len(item) == 2 and all(_is_int(x) for x in item),
            o,
            f"{w}[{i}]",
            f"expected [start, size], got {item!r}",
        )
        out.append((item[0], item[1]))
    return tuple(out)


def _mig(o: str, w: str, v: Any) -> MigSpec | None:
    if v is None:
        return None
    _check(isinstance(v, dict), o, w, f"expected an object or null, got {v!r}")
    expected = {"compute_slices", "memory_slices", "gpu_instance_profiles"}
    _check(set(v) == expected, o, w, f"keys must be exactly {sorted(expected)}; got {sorted(v)}")
    profiles_raw = v["gpu_instance_profiles"]
    _check(isinstance(profiles_raw, list) and profiles_raw, o, w, "gpu_instance_profiles must be a non-empty list")
    profiles = []
    for i, raw in enumerate(profiles_raw):
        pw = f"{w}.gpu_instance_profiles[{i}]"
        _check(isinstance(raw, dict), o, pw, "expected an object")
        unknown = set(raw) - set(_PROFILE_FIELDS)
        missing = set(_PROFILE_FIELDS) - set(raw)
        _check(not unknown, o, pw, f"unknown keys {sorted(unknown)}")
        _check(not missing, o, pw, f"missing keys {sorted(missing)}")
        profiles.append(MigProfile(**{k: conv(o, f"{pw}.{k}", raw[k]) for k, conv in _PROFILE_FIELDS.items()}))
    return MigSpec(
        compute_slices=_pos_int(o, f"{w}.compute_slices", v["compute_slices"]),
        memory_slices=_pos_int(o, f"{w}.memory_slices", v["memory_slices"]),
        gpu_instance_profiles=tuple(profiles),
    )


_POWER_KEYS = {"default_w", "min_w", "max_w", "source"}


def _power_limits(o: str, w: str, v: Any) -> tuple[PowerLimits, ...]:
    _check(isinstance(v, list) and v, o, w, "expected a non-empty list of board variants")
    out = []
    for i, item in enumerate(v):
        iw = f"{w}[{i}]"
        _check(isinstance(item, dict) and set(item) == _POWER_KEYS, o, iw,
               f"keys must be exactly {sorted(_POWER_KEYS)}")
        low, default, high = (_opt_num(o, f"{iw}.{k}", item[k]) for k in ("min_w", "default_w", "max_w"))
        known = [x for x in (low, default, high) if x is not None]
        _check(known == sorted(known), o, iw, f"expected min_w <= default_w <= max_w, got {low}, {default}, {high}")
        out.append(PowerLimits(default, low, high, _source(o, f"{iw}.source", item["source"])))
    return tuple(out)


# Field name -> converter; the order is the GpuModel order (key and sources are handled separately).
_MODEL_FIELDS: dict[str, Callable[[str, str, Any], Any]] = {
    "name": _str,
    "pci_device_id": _pci,
    "architecture": _architecture,
    "compute_capability": _cc,
    "datacenter": _bool,
    "form_factor": _str,
    "sm_count": _opt_pos_int,
    "memory_mib": _pos_int,
    "memory_type": _str,
    "memory_bandwidth_gbs": _opt_num,
    "power_limits_w": _power_limits,
    "clocks_max_sm_mhz": _opt_pos_int,
    "clocks_max_mem_mhz": _opt_pos_int,
    "clocks_max_graphics_mhz": _opt_pos_int,
    "pcie_gen_max": _pos_int,
    "pcie_width_max": _pos_int,
    "nvlink_count": _int,
    "nvswitch_systems": _bool,
    "ecc_supported": _bool,
    "row_remap_supported": _bool,
    "persistence_supported": _bool,
    "temp_slowdown_c": _opt_int,
    "temp_shutdown_c": _opt_int,
    "temp_max_operating_c": _opt_int,
    "dense_tflops": _tflops,
    "sparse_tflops": _tflops,
    "mig": _mig,
    "brand": _opt_str,
    "other_pci_device_ids": _pci_list,
    "pci_sub_device_id_example": _opt_pci_any_vendor,
    "vbios_example": _opt_str,
    "memory_reserved_mib": _opt_pos_int,
    "clocks_max_video_mhz": _opt_pos_int,
    "nvlink_speed_gbs": _opt_num,
    "temp_target_c": _opt_int,
    "temp_shutdown_tlimit_c": _opt_int,
    "temp_slowdown_tlimit_c": _opt_int,
    "temp_max_operating_tlimit_c": _opt_int,
}

MODEL_FIELDS: tuple[str, ...] = tuple(_MODEL_FIELDS)


def parse_model(doc: Any, origin: str = "<model>") -> GpuModel:
    """Validate one model document (the parsed JSON of a model file) and build a GpuModel."""
    _check(isinstance(doc, dict), origin, "top level", "expected an object")
    _check(
        doc.get("schema") == SCHEMA_VERSION, origin, "schema", f"expected {SCHEMA_VERSION}, got {doc.get('schema')!r}"
    )
    key = doc.get("key")
    _check(
        isinstance(key, str) and bool(re.match(r"^[a-z0-9][a-z0-9-]*$", key)),
        origin,
        "key",
        f"expected a lower-case key like 'h100-sxm', got {key!r}",
    )
    unknown = set(doc) - set(_MODEL_FIELDS) - {"schema", "key"}
    missing = set(_MODEL_FIELDS) - set(doc)
    _check(not unknown, origin, "top level", f"unknown fields {sorted(unknown)}")
    _check(not missing, origin, "top level", f"missing fields {sorted(missing)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, conv in _MODEL_FIELDS.items():
        entry = doc[name]
        _check(
            isinstance(entry, dict) and set(entry) == {"value", "source"},
            origin,
            name,
            'expected {"value": ..., "source": "real|doc|unverified: detail"}',
        )
        values[name] = conv(origin, name, entry["value"])
        sources[name] = _source(origin, f"{name}.source", entry["source"])
    return GpuModel(key=key, sources=sources, **values)


def known_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in GpuModel.__dataclass_fields__.values())


# keep the dataclass and the parser in step
if set(MODEL_FIELDS) | {"key", "sources"} != set(known_field_names()):  # pragma: no cover
    raise RuntimeError("gpufleet.catalog: GpuModel fields and the model-file parser are out of sync")
