"""Self-contained HTML report: inline CSS, inline SVG charts, no scripts, no external assets.

Per host: one bar chart per measured precision (a bar per GPU: measured TFLOP/s, with the catalog's dense peak as
a marker) and a temperature chart (a bar per GPU, with its warn and slowdown limits). The markup is well-formed
XML (XHTML serialisation of HTML5) so it can be checked with any XML parser.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpufleet.verify.model import FleetResult

from ._common import as_report, bench_precisions, fmt, gpu_label, host_facts, sorted_checks

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif; margin: 2em; color: #1d232a; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.3em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1.1em; margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f5f7; }
.v { font-weight: bold; padding: 0.05em 0.5em; border-radius: 0.3em; white-space: nowrap; }
.v-pass { background: #dafbe1; color: #116329; } .v-warn { background: #fff8c5; color: #7d4e00; }
.v-fail, .v-unreachable { background: #ffebe9; color: #a40e26; } .v-skip { background: #eaeef2; color: #57606a; }
.facts { color: #57606a; }
.charts { display: flex; flex-wrap: wrap; gap: 1.2em; }
svg { background: #fbfcfd; border: 1px solid #d0d7de; }
svg text { font-size: 11px; fill: #1d232a; }
svg .bar { fill: #2f81f7; } svg .bar.warn { fill: #d4a72c; } svg .bar.fail { fill: #cf222e; }
svg .peak { stroke: #1d232a; stroke-width: 2; } svg .limit-warn { stroke: #d4a72c; stroke-dasharray: 4 3; }
svg .limit-fail { stroke: #cf222e; stroke-dasharray: 4 3; } svg .axis { stroke: #8c959f; }
details { margin: 0.5em 0; }
"""


def _badge(verdict: str | None) -> str:
    verdict = verdict or "skip"
    return f'<span class="v v-{escape(verdict)}">{escape(verdict.upper())}</span>'


def _table(header: list[str], rows: list[list[str]], raw: bool = False) -> str:
    """rows hold already-escaped HTML when raw is True."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def bar_chart(title: str, labels: list[str], values: list[float | None], *, unit: str, chart_id: str,
              markers: list[float | None] | None = None, warn_line: list[float | None] | None = None,
              fail_line: list[float | None] | None = None, classes: list[str] | None = None,
              value_labels: list[str] | None = None) -> str:
    """A vertical bar chart as inline SVG: one ``rect.bar`` per label (height 0 when the value is missing),
    optional per-bar peak markers and warn/fail limit ticks."""
    n = len(labels)
    bar_w, gap, left, top, plot_h, bottom = 34, 14, 48, 28, 160, 42
    width = left + n * (bar_w + gap) + gap
    height = top + plot_h + bottom
    candidates = [v for v in [*values, *(markers or []), *(fail_line or [])] if v is not None]
    vmax = max(candidates) * 1.1 if candidates else 1.0
    vmax = vmax or 1.0

    def y(v: float) -> float:
        return top + plot_h - (v / vmax) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<text x="{left}" y="16" font-weight="bold">{escape(title)}</text>',
             f'<line class="axis" x1="{left - 4}" y1="{top + plot_h}" x2="{width - 4}" y2="{top + plot_h}"/>',
             f'<text x="4" y="{top + 10}">{escape(fmt(vmax, 0))}</text>',
             f'<text x="4" y="{top + plot_h}">0</text>',
             f'<text x="4" y="{top + plot_h + 34}">{escape(unit)}</text>']
    for i, label in enumerate(labels):
        x = left + gap + i * (bar_w + gap)
        v = values[i]
        h = 0.0 if v is None else max(0.0, (v / vmax) * plot_h)
        cls = "bar" + (f" {classes[i]}" if classes and classes[i] else "")
        tip = f"{label}: {fmt(v)} {unit}"
        parts.append(f'<rect class="{cls}" data-gpu="{escape(label)}" x="{x}" y="{top + plot_h - h:.1f}" '
                     f'width="{bar_w}" height="{h:.1f}"><title>{escape(tip)}</title></rect>')
        text = value_labels[i] if value_labels else fmt(v, 0)
        parts.append(f'<text x="{x}" y="{top + plot_h - h - 3:.1f}">{escape(text)}</text>')
        parts.append(f'<text x="{x + 4}" y="{top + plot_h + 14}">{escape(label)}</text>')
        for series, cls in ((markers, "peak"), (warn_line, "limit-warn"), (fail_line, "limit-fail")):
            if series and series[i] is not None:
                yy = y(series[i])
                parts.append(f'<line class="{cls}" x1="{x - 3}" y1="{yy:.1f}" x2="{x + bar_w + 3}" y2="{yy:.1f}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _host_charts(host: dict[str, Any], precisions: list[str]) -> str:
    gpus = host.get("gpus") or []
    if not gpus:
        return ""
    labels = [f"gpu{g['index']}" for g in gpus]
    verdicts = {(c.get("gpu_index"), c["check"]): c["verdict"] for c in host.get("checks") or []}
    safe = "".join(ch if ch.isalnum() else "-" for ch in host["host"])
    charts = []
    for p in precisions:
        cells = [(g.get("matmul") or {}).get(p) or {} for g in gpus]
        if not any(c.get("tflops") is not None for c in cells):
            continue
        classes = [{"warn": "warn", "fail": "fail"}.get(verdicts.get((g["index"], f"perf.matmul.{p}")), "")
                   for g in gpus]
        charts.append(bar_chart(
            f"{p} matmul TFLOP/s vs dense peak", labels, [c.get("tflops") for c in cells], unit="TFLOP/s",
            chart_id=f"tflops-{p}-{safe}", markers=[c.get("peak_tflops") for c in cells], classes=classes,
            value_labels=[f"{c['fraction']:.0%}" if c.get("fraction") is not None else fmt(c.get("tflops"), 0)
                          for c in cells]))
    temps = [g.get("temperature_c") for g in gpus]
    warn = [g.get("temperature_warn_c") for g in gpus]
    fail = [g.get("temperature_fail_c") for g in gpus]
    classes = ["fail" if t is not None and f is not None and t >= f else
               "warn" if t is not None and w is not None and t >= w else "" for t, w, f in zip(temps, warn, fail,
                                                                                               strict=True)]
    charts.append(bar_chart("GPU temperature", labels, temps, unit="°C", chart_id=f"temperature-{safe}",
                            warn_line=warn, fail_line=fail, classes=classes))
    return '<div class="charts">' + "".join(charts) + "</div>"


def render_html(report: FleetResult | dict[str, Any], title: str = "gpufleet verify report") -> str:
    data = as_report(report)
    s = data["summary"]
    counts = s["checks"]
    precisions = bench_precisions(data)
    body = [f"<h1>{escape(title)}</h1>",
            f'<p class="facts">Generated {escape(data["generated_at"])} · bench profile '
            f'{escape(str(data.get("bench_profile") or "none"))} · {_badge(s["verdict"])} '
            f'exit code {s["exit_code"]}</p>',
            _table(["hosts", "verified", "unreachable", "GPUs", "pass", "warn", "fail", "skip"],
                   [[s["hosts"], s["hosts_ok"], s["hosts_unreachable"], s["gpus"], counts["pass"], counts["warn"],
                     counts["fail"] + counts["unreachable"], counts["skip"]]])]
    problems = [c for h in data["hosts"] for c in h["checks"] if c["verdict"] in ("fail", "unreachable", "warn")]
    body.append("<h2>Problems</h2>")
    if problems:
        body.append(_table(["host", "GPU", "check", "verdict", "message", "remediation"],
                           [[escape(c["host"]), escape(gpu_label(c)), escape(c["check"]), _badge(c["verdict"]),
                             escape(c["message"]), escape(c.get("remediation") or "")]
                            for c in sorted_checks(problems)], raw=True))
    else:
        body.append("<p>None: every check passed.</p>")
    if data.get("regressions"):
        body.append("<h2>Regressions since the previous report</h2>")
        body.append(_table(["host", "GPU", "what", "before", "after", "message"],
                           [[r["host"], "" if r.get("gpu_index") is None else f"gpu{r['gpu_index']}", r["check"],
                             r["before"], r["after"], r["message"]] for r in data["regressions"]]))
    body.append("<h2>Hosts</h2>")
    for host in sorted(data["hosts"], key=lambda h: h["host"]):
        body.append(f'<h3 id="host-{escape(host["host"])}">{escape(host["host"])} {_badge(host.get("verdict"))}</h3>')
        body.append(f'<p class="facts">{escape(host_facts(host))}</p>')
        body.append(_host_charts(host, precisions))
        if host.get("gpus"):
            header = ["GPU", "UUID", "model", "temp °C", "power W (limit)"]
            header += [f"{p} TFLOP/s" for p in precisions] + ["memory GB/s", "verdict"]
            rows = []
            for g in host["gpus"]:
                row = [escape(str(g["index"])), escape(g.get("uuid") or "–"), escape(g.get("name") or "–"),
                       escape(fmt(g.get("temperature_c"), 0)),
                       escape(f"{fmt(g.get('power_draw_w'))} ({fmt(g.get('power_limit_w'), 0)})")]
                for p in precisions:
                    m = (g.get("matmul") or {}).get(p) or {}
                    frac = f" ({m['fraction']:.0%})" if m.get("fraction") is not None else ""
                    row.append(escape(fmt(m.get("tflops")) + frac))
                row += [escape(fmt(g.get("memory_bandwidth_gbs"), 0)), _badge(g.get("verdict"))]
                rows.append(row)
            body.append(_table(header, rows, raw=True))
        checks = sorted_checks(host["checks"])
        body.append(f"<details><summary>{len(checks)} check(s)</summary>")
        body.append(_table(["GPU", "check", "verdict", "message", "remediation"],
                           [[escape(gpu_label(c)), escape(c["check"]), _badge(c["verdict"]), escape(c["message"]),
                             escape(c.get("remediation") or "")] for c in checks], raw=True))
        body.append("</details>")
    return ("<!DOCTYPE html>\n"
            '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
