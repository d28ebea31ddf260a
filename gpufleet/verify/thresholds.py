"""Verify thresholds as data (``thresholds.json`` beside this file, or a user's file of the same shape).

``Thresholds.for_model(key)`` merges ``defaults`` with the model's overrides (dicts merged key by key), so a
model file only says what differs. Unknown top-level keys are rejected so a typo does not silently weaken a check.

:class:`TemperatureRule` is the one temperature decision: verify's ``health.temperature`` check and the alert rules
(``gpufleet.monitoring.rules``) both judge a GPU by it, from its own slowdown temperature as the GPU reports it
(NVML; dcgm-exporter's ``DCGM_FI_DEV_SLOWDOWN_TEMP``), else the catalog's, else the data's fallback values.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .xid import critical_xids, xid_info

THRESHOLDS_SCHEMA_VERSION = 1
_TOP_KEYS = {"schema_version", "_comment", "defaults", "models", "pcie_lane_gbs", "fleet", "xid"}
_TEMPERATURE_KEYS = {"warn_below_slowdown_c", "fail_below_slowdown_c", "fallback_warn_c", "fallback_fail_c",
                     "memory_warn_below_max_c", "memory_fallback_warn_c", "memory_fallback_fail_c"}
_XID_KEYS = {"_comment", "fail", "descriptions"}
_DEFAULT_KEYS = {"temperature", "matmul_fraction", "memory_bandwidth_fraction", "host_transfer_fraction",
                 "nccl_busbw_gbs", "ecc_aggregate_uncorrected_warn", "row_remap_uncorrectable_warn"}


class ThresholdsError(ValueError):
    """A thresholds file that is malformed."""


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_temperature(origin: str, where: str, temperature: Any, complete: bool) -> None:
    if temperature is None and not complete:
        return
    if not isinstance(temperature, dict):
        raise ThresholdsError(f"{origin}: '{where}.temperature' must be an object")
    unknown, missing = set(temperature) - _TEMPERATURE_KEYS, _TEMPERATURE_KEYS - set(temperature)
    if unknown or (complete and missing):
        raise ThresholdsError(f"{origin}: '{where}.temperature' keys must be {sorted(_TEMPERATURE_KEYS)}"
                              + (f"; unknown {sorted(unknown)}" if unknown else f"; missing {sorted(missing)}"))
    for key, value in temperature.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ThresholdsError(f"{origin}: {where}.temperature.{key}={value!r}: not a number of °C")
    for key in ("warn_below_slowdown_c", "fail_below_slowdown_c"):
        if temperature.get(key, 0) < 0:
            raise ThresholdsError(f"{origin}: {where}.temperature.{key}={temperature[key]!r}: must be >= 0")


@dataclass(frozen=True)
class TemperatureLimits:
    """Where a GPU's core temperature warns and fails, and where that came from."""

    warn_c: float
    fail_c: float
    source: str  # "gpu" (its own slowdown temperature), "catalog" (its model's), "fallback" (the data's)
    slowdown_c: float | None = None


@dataclass(frozen=True)
class TemperatureRule:
    """The one temperature decision of verify and the alerts: warn at ``slowdown - warn_below_slowdown_c``, fail at
    ``slowdown - fail_below_slowdown_c`` (the slowdown temperature: the GPU's own, else its catalog model's); the
    fallback values where neither is known."""

    warn_below_slowdown_c: float
    fail_below_slowdown_c: float
    fallback_warn_c: float
    fallback_fail_c: float

    @classmethod
    def from_data(cls, temperature: dict[str, Any]) -> TemperatureRule:
        """The rule of one model's merged ``temperature`` thresholds (``Thresholds.for_model(key)``)."""
        return cls(temperature["warn_below_slowdown_c"], temperature["fail_below_slowdown_c"],
                   temperature["fallback_warn_c"], temperature["fallback_fail_c"])

    @property
    def warn_margin_c(self) -> float:
        """How far below the slowdown temperature a GPU warns (never above where it fails)."""
        return max(self.warn_below_slowdown_c, self.fail_below_slowdown_c)

    @property
    def fail_margin_c(self) -> float:
        return self.fail_below_slowdown_c

    def limits(self, reported_slowdown_c: float | None, catalog_slowdown_c: float | None = None) -> TemperatureLimits:
        """The limits of a GPU that reports ``reported_slowdown_c`` (None: not reported) and whose catalog model
        says ``catalog_slowdown_c`` (None: unknown)."""
        for slowdown, source in ((reported_slowdown_c, "gpu"), (catalog_slowdown_c, "catalog")):
            if slowdown is not None:
                return TemperatureLimits(slowdown - self.warn_margin_c, slowdown - self.fail_margin_c, source,
                                         slowdown)
        return TemperatureLimits(min(self.fallback_warn_c, self.fallback_fail_c), self.fallback_fail_c, "fallback")


@dataclass(frozen=True)
class Thresholds:
    data: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "thresholds") -> Thresholds:
        if not isinstance(data, dict):
            raise ThresholdsError(f"{origin}: expected a JSON object")
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise ThresholdsError(f"{origin}: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
        if data.get("schema_version") != THRESHOLDS_SCHEMA_VERSION:
            raise ThresholdsError(f"{origin}: schema_version must be {THRESHOLDS_SCHEMA_VERSION}")
        for section in ("defaults", "fleet", "xid", "pcie_lane_gbs"):
            if not isinstance(data.get(section), dict):
                raise ThresholdsError(f"{origin}: '{section}' must be an object")
        bad = set(data["xid"]) - _XID_KEYS
        if bad:
            raise ThresholdsError(f"{origin}: unknown keys {sorted(bad)} in 'xid'; allowed: {sorted(_XID_KEYS)}")
        fail = data["xid"].get("fail", [])
        if not isinstance(fail, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0
                                                 for c in fail):
            raise ThresholdsError(f"{origin}: xid.fail={fail!r}: must be a list of Xid codes (integers > 0)")
        for where, values in [("defaults", data["defaults"]),
                              *[(f"models.{k}", v) for k, v in (data.get("models") or {}).items()]]:
            if not isinstance(values, dict):
                raise ThresholdsError(f"{origin}: '{where}' must be an object")
            bad = set(values) - _DEFAULT_KEYS
            if bad:
                raise ThresholdsError(f"{origin}: unknown keys {sorted(bad)} in '{where}'; "
                                      f"allowed: {sorted(_DEFAULT_KEYS)}")
            _check_temperature(origin, where, values.get("temperature"), complete=where == "defaults")
            for prec, pair in (values.get("matmul_fraction") or {}).items():
                if not (isinstance(pair, dict) and {"warn", "fail"} <= set(pair)
                        and 0 <= pair["fail"] <= pair["warn"] <= 1):
                    raise ThresholdsError(f"{origin}: {where}.matmul_fraction.{prec} needs 0 <= fail <= warn <= 1")
        return cls(data)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Thresholds:
        """The shipped thresholds, or the file at ``path``."""
        if path is None:
            text = resources.files("gpufleet.verify").joinpath("thresholds.json").read_text(encoding="utf-8")
            origin = "gpufleet/verify/thresholds.json"
        else:
            text = Path(path).read_text(encoding="utf-8")
            origin = str(path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ThresholdsError(f"{origin}: invalid JSON: {exc}") from None
        return cls.from_dict(data, origin)

    @property
    def version(self) -> int:
        return self.data["schema_version"]

    def for_model(self, model_key: str | None) -> dict[str, Any]:
        override = (self.data.get("models") or {}).get(model_key or "", {})
        return _merge(self.data["defaults"], override)

    def temperature_rule(self, model_key: str | None) -> TemperatureRule:
        """The temperature decision for GPUs of this catalog model (None: a model the catalog does not know)."""
        return TemperatureRule.from_data(self.for_model(model_key)["temperature"])

    @property
    def fleet(self) -> dict[str, Any]:
        return self.data["fleet"]

    def pcie_lane_gbs(self, gen: int | None) -> float | None:
        if gen is None:
            return None
        return self.data["pcie_lane_gbs"].get(str(gen))

    def xid_fails(self, code: int) -> bool:
        """True for an Xid of a critical class in NVIDIA's catalog (``xid.xid_info``), or one the data's
        ``xid.fail`` lists."""
        return xid_info(code).critical or code in set(self.data["xid"].get("fail", []))

    def xid_critical(self) -> tuple[int, ...]:
        """Every Xid that fails, ascending (the catalog's critical ones and the data's ``xid.fail``)."""
        return tuple(sorted({*critical_xids(), *self.data["xid"].get("fail", [])}))

    def xid_severity(self, code: int) -> str:
        return "fail" if self.xid_fails(code) else "warn"

    def xid_description(self, code: int) -> str:
        info = xid_info(code)
        text = self.data["xid"].get("descriptions", {}).get(str(code)) or info.mnemonic or "unknown Xid"
        # the catalog's buckets are identifiers (RESET_GPU), but for Xid 154's sentence
        where = (f"; NVIDIA's catalog: {info.resolution}"
                 if info.resolution and re.fullmatch(r"[A-Z0-9_]+", info.resolution) else "")
        return f"{text} ({info.means}{where})"


_DEFAULT: Thresholds | None = None


def default_thresholds() -> Thresholds:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Thresholds.load()
    return _DEFAULT
