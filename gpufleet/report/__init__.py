"""Renderers of the verify report: JSON (versioned), Markdown, self-contained HTML, JUnit XML, Prometheus
textfile, and the regression comparison with the previous report.

Every renderer takes a FleetResult or the JSON report dict. ``write_reports(fleet, out_dir)`` writes them all
(``report.json``, ``report.md``, ``report.html``, ``junit.xml``, ``gpufleet_verify.prom`` and one
``prometheus/<host>.prom`` per host) after comparing with the ``report.json`` already there, which is kept as
``report.previous.json``. (``fleet_table`` is the terminal table of the inventory fact, unrelated to verify.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet.control_files import write_atomic
from gpufleet.results import FleetResult, ReportSchemaError, exit_code

from .html import render_html
from .json_report import load_report, render_json
from .junit import render_junit
from .markdown import render_markdown
from .prometheus import render_prometheus, write_textfile
from .regression import DEFAULT_DROP_PCT, attach_regressions, compare

REPORT_FILES = {
    "json": "report.json",
    "markdown": "report.md",
    "html": "report.html",
    "junit": "junit.xml",
    "prometheus": "gpufleet_verify.prom",
}


def _write(path: Path, text: str) -> Path:
    return write_atomic(path, text)  # a random temporary name beside it, then os.replace: no symlink followed


def write_reports(fleet: FleetResult, out_dir: str | Path, *, drop_pct: float = DEFAULT_DROP_PCT,
                  compare_previous: bool = True) -> dict[str, Path]:
    """Write every report format into ``out_dir``; returns {format: path} (``prometheus:<host>`` per host)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] | None = None
    current_json = out / REPORT_FILES["json"]
    if compare_previous and current_json.exists():
        try:
            previous = load_report(current_json)
        except (OSError, ValueError, ReportSchemaError, json.JSONDecodeError):
            previous = None
        if previous is not None:
            _write(out / "report.previous.json", current_json.read_text(encoding="utf-8"))
    attach_regressions(fleet, previous, drop_pct=drop_pct)
    data = fleet.to_dict()
    paths = {
        "markdown": _write(out / REPORT_FILES["markdown"], render_markdown(data)),
        "html": _write(out / REPORT_FILES["html"], render_html(data)),
        "junit": _write(out / REPORT_FILES["junit"], render_junit(data)),
        "prometheus": write_textfile(render_prometheus(data), out / REPORT_FILES["prometheus"]),
    }
    for host in data["hosts"]:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in host["host"])
        paths[f"prometheus:{host['host']}"] = write_textfile(render_prometheus(data, host=host["host"]),
                                                             out / "prometheus" / f"{safe}.prom")
    paths["json"] = _write(current_json, render_json(data))
    return paths


__all__ = [
    "DEFAULT_DROP_PCT", "REPORT_FILES", "attach_regressions", "compare", "exit_code", "load_report", "render_html",
    "render_json", "render_junit", "render_markdown", "render_prometheus", "write_reports", "write_textfile",
]
