"""Verify thresholds as data (``thresholds.json`` beside this file, or a user's file of the same shape).

``Thresholds.for_model(key)`` merges ``defaults`` with the model's overrides (dicts merged key by key), so a
model file only says what differs. Unknown top-level keys are rejected so a typo does not silently weaken a check.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

THRESHOLDS_SCHEMA_VERSION = 1
_TOP_KEYS = {"schema_version", "_comment", "defaults", "models", "pcie_lane_gbs", "fleet", "xid"}
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
        for where, values in [("defaults", data["defaults"]),
                              *[(f"models.{k}", v) for k, v in (data.get("models") or {}).items()]]:
            if not isinstance(values, dict):
                raise ThresholdsError(f"{origin}: '{where}' must be an object")
            bad = set(values) - _DEFAULT_KEYS
            if bad:
                raise ThresholdsError(f"{origin}: unknown keys {sorted(bad)} in '{where}'; "
                                      f"allowed: {sorted(_DEFAULT_KEYS)}")
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

    @property
    def fleet(self) -> dict[str, Any]:
        return self.data["fleet"]

    def pcie_lane_gbs(self, gen: int | None) -> float | None:
        if gen is None:
            return None
        return self.data["pcie_lane_gbs"].get(str(gen))

    def xid_severity(self, code: int) -> str:
        return "fail" if code in set(self.data["xid"].get("fail", [])) else "warn"

    def xid_description(self, code: int) -> str:
        return self.data["xid"].get("descriptions", {}).get(str(code), "see NVIDIA's Xid catalog")


_DEFAULT: Thresholds | None = None


def default_thresholds() -> Thresholds:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Thresholds.load()
    return _DEFAULT
