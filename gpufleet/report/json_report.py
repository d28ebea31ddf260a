"""The versioned JSON report (schema ``gpufleet.verify.report``; see gpufleet.results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet.results import FleetResult, check_report_schema

from ._common import as_report


def render_json(report: FleetResult | dict[str, Any], indent: int | None = 1) -> str:
    return json.dumps(as_report(report), indent=indent, sort_keys=False, default=str) + "\n"


def load_report(path: str | Path) -> dict[str, Any]:
    """A JSON report from disk; raises ReportSchemaError for another schema or a newer schema version."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    check_report_schema(data)
    return data
