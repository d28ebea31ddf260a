"""MIG state from ``nvidia-smi mig -lgi`` and ``nvidia-smi mig -lci`` (one remote command): parse, never decide.

Table rows are matched by pattern, not by column position, so the narrow (R5xx) and wide (R570+) layouts and
the older ``-lci`` without a Placement column all parse.
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from .nvidia import classify_smi_failure
from .sections import Section, join, parse_sections, section

# |   0  MIG 1g.10gb         19        7          0:1     |
_GI_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+MIG\s+(?P<profile>\S+)\s+(?P<profile_id>\d+)\s+(?P<gi>\d+)\s+"
    r"(?P<start>\d+):(?P<size>\d+)\s*\|$"
)
# |   0      7       MIG 1g.10gb          0         0          0:1     |   (Placement column optional)
_CI_ROW = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+MIG\s+(?P<profile>\S+)\s+(?P<profile_id>\d+)\s+(?P<ci>\d+)"
    r"(?:\s+(?P<start>\d+):(?P<size>\d+))?\s*\|$"
)
_NONE_FOUND = ("no gpu instances found", "no compute instances found")
_NOT_SUPPORTED = "no mig-supported devices found"
_NOT_ENABLED = "no mig-enabled devices found"


def parse_gpu_instances(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        m = _GI_ROW.match(line.strip())
        if m:
            out.append({
                "gpu": int(m["gpu"]),
                "profile": m["profile"],
                "profile_id": int(m["profile_id"]),
                "gi_id": int(m["gi"]),
                "placement_start": int(m["start"]),
                "placement_size": int(m["size"]),
            })
    return out


def parse_compute_instances(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        m = _CI_ROW.match(line.strip())
        if m:
            out.append({
                "gpu": int(m["gpu"]),
                "gi_id": int(m["gi"]),
                "profile": m["profile"],
                "profile_id": int(m["profile_id"]),
                "ci_id": int(m["ci"]),
                "placement_start": int(m["start"]) if m["start"] is not None else None,
                "placement_size": int(m["size"]) if m["size"] is not None else None,
            })
    return out


def _section_status(sec: Section) -> tuple[str, str | None]:
    """(status, error) of one listing: ok (incl. "none found"), not_supported, not_enabled or a failure."""
    text = sec.text
    lowered = text.lower()
    if sec.rc == 0:
        return "ok", None
    if any(marker in lowered for marker in _NONE_FOUND):
        return "ok", None
    if _NOT_SUPPORTED in lowered:
        return "not_supported", None
    if _NOT_ENABLED in lowered:
        return "not_enabled", None
    if sec.rc is None:
        return "error", text or "nvidia-smi output was cut short"
    return classify_smi_failure(sec.rc, text), text or f"nvidia-smi exited {sec.rc}"


class MigState(FactBase):
    """
    MIG GPU instances and compute instances of every GPU, one remote command.

    .. code:: python

        {"status": "ok",  # | absent | not_supported | not_enabled | driver_not_loaded | version_mismatch | error
         "error": None,
         "gpu_instances": [{"gpu": 0, "profile": "1g.10gb", "profile_id": 19, "gi_id": 7,
                            "placement_start": 0, "placement_size": 1}],
         "compute_instances": [{"gpu": 0, "gi_id": 7, "profile": "1g.10gb", "profile_id": 0, "ci_id": 0,
                                "placement_start": 0, "placement_size": 1}]}  # placement None on older drivers

    ``profile`` has no ``MIG `` prefix (a compute instance smaller than its GPU instance: ``1c.3g.40gb``).
    """

    @staticmethod
    def default():
        return {"status": "absent", "error": "nvidia-smi not found", "gpu_instances": [], "compute_instances": []}

    def command(self) -> str:
        return join(
            section("lgi", "nvidia-smi mig -lgi", requires="nvidia-smi"),
            section("lci", "nvidia-smi mig -lci", requires="nvidia-smi"),
        )

    def process(self, output):
        sections = parse_sections(output)
        lgi, lci = sections.get("lgi"), sections.get("lci")
        if lgi is None or lci is None:
            return {**self.default(), "status": "error", "error": "no output from nvidia-smi mig"}
        if not lgi.present:
            return self.default()
        gi_status, gi_error = _section_status(lgi)
        ci_status, ci_error = _section_status(lci)
        result = {
            "status": gi_status,
            "error": gi_error,
            "gpu_instances": parse_gpu_instances(lgi.lines) if gi_status == "ok" else [],
            "compute_instances": parse_compute_instances(lci.lines) if ci_status == "ok" else [],
        }
        if gi_status == "ok" and ci_status not in ("ok", "not_enabled", "not_supported"):
            result.update(status=ci_status, error=ci_error)
        return result


def instances_by_gpu(state: dict) -> dict[int, dict[int, dict]]:
    """``{gpu index: {gi_id: {**gpu_instance, "compute_instances": [..]}}}`` from a MigState fact."""
    out: dict[int, dict[int, dict]] = {}
    for gi in state.get("gpu_instances", []):
        out.setdefault(gi["gpu"], {})[gi["gi_id"]] = {**gi, "compute_instances": []}
    for ci in state.get("compute_instances", []):
        gi = out.get(ci["gpu"], {}).get(ci["gi_id"])
        if gi is not None:
            gi["compute_instances"].append(ci)
    return out
