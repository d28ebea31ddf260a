"""Which DCGM fields a dcgm-exporter release accepts in its counters file, and the release a package version is.

dcgm-exporter looks every name of its counters file up in the field map of the go-dcgm its go.mod pins, and
refuses the whole file ("could not find DCGM field") for a name that map lacks: the exporter stays down. The
counters file gpufleet writes therefore holds only the fields the release that runs knows.
tests/reference/upstream/go-dcgm/facts.json records each release's map; tests/unit/test_dcgm_counters.py holds
the table below to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

Release = tuple[int, int, int]  # dcgm-exporter's own version (the second part of its tag, 4.1.3 of 4.2.3-4.1.3)

# The oldest release whose field map is recorded: older ones are taken to know what it knows.
OLDEST_RECORDED: Release = (3, 2, 0)
# The first release whose field map knows each field gpufleet writes that not every recorded release knows. A
# field not listed is known by every recorded release.
FIELD_SINCE: dict[str, Release] = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (4, 0, 1),
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": (4, 8, 0),
}

_VERSION = re.compile(r"\d+\.\d+\.\d+")


def exporter_release(version: str | None) -> Release | None:
    """dcgm-exporter's own version in a package version or a tag: ``1:4.2.3-4.1.3-1``, ``4.2.3-4.1.3`` and
    ``4.1.3-1`` are all 4.1.3 (epoch and Debian revision dropped; of two versions, the second)."""
    if not version:
        return None
    text = version.split(":", 1)[1] if re.match(r"^\d+:", version) else version
    found = _VERSION.findall(text)
    if not found:
        return None
    major, minor, patch = (int(part) for part in found[1 if len(found) > 1 else 0].split("."))
    return major, minor, patch


def release_text(release: Release) -> str:
    return ".".join(str(part) for part in release)


def known_fields(fields: Iterable[str], release: Release) -> tuple[list[str], list[str]]:
    """(the fields ``release`` knows, those it does not), each in the given order."""
    kept, left_out = [], []
    for field in fields:
        since = FIELD_SINCE.get(field)
        (kept if since is None or release >= since else left_out).append(field)
    return kept, left_out


def pin_pattern(setting: str) -> str:
    """apt's ``Pin: version`` regular expression admitting the package versions of the release ``setting`` names
    (any epoch and Debian revision; a bare exporter version matches any DCGM part)."""
    escaped = setting.replace(".", r"\.")  # a validated setting: digits, dots and one dash
    body = escaped if "-" in setting else "([0-9.]+-)?" + escaped
    return f"/^([0-9]+:)?{body}(-|$)/"
