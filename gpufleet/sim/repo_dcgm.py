"""The dcgm-exporter releases the simulator's repository publishes, each with the field map of its release.

``dcgm_exporter_fields.json`` beside this file is generated from the record (tests/reference/upstream/go-dcgm/
facts.json: the names of the go-dcgm field maps each release pins; tests/unit/test_sim_repo_dcgm.py holds it equal
to the record): each release's package installs its names, and the stand-in (``simgpu/dcgm.py``) refuses a counters
file naming a field its release does not know, as the real one does ("could not find DCGM field") and stays down.
One release before 4.5.1-4.8.0 (which first knows ``DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION``) and the newest.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

FIELDS_JSON = Path(__file__).with_name("dcgm_exporter_fields.json")
EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"
REVISION = "1"
# where a simulated exporter package keeps its release's field map (read by simgpu/dcgm.py)
FIELD_MAP_RELPATH = "usr/lib/gpufleet-sim/dcgm-exporter-fields"


@cache
def releases() -> dict[str, list[str]]:
    """dcgm-exporter tag (``DCGM-EXPORTER`` versions) -> the DCGM field names its counters file may hold."""
    return json.loads(FIELDS_JSON.read_text())["releases"]


def exporter_packages() -> list[tuple[str, str, str]]:
    """(package, upstream version, Debian revision) of every dcgm-exporter release published, oldest first."""
    return [(EXPORTER_PACKAGE, tag, REVISION) for tag in releases()]


def core_version(tag: str) -> str:
    """The DCGM version a release is built against (the first part of its tag): its core package's minimum."""
    return tag.split("-", 1)[0]


def field_map_text(tag: str) -> str:
    """The file a release's package installs at ``FIELD_MAP_RELPATH``: its tag, then one field name a line."""
    return "\n".join([tag, *releases()[tag]]) + "\n"
