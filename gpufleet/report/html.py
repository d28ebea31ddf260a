"""Self-contained HTML report: inline CSS, inline SVG charts, no scripts, no external assets.

Built to read at 1000 hosts: the fleet summary comes first (headline where a failure outranks an unreachable host,
hosts by verdict, hosts with problems worst first, problems grouped by check, hosts by GPU model), then one fleet
heatmap (host x GPU, coloured by verdict), then one collapsed <details> per host linked from the summary. Bar
charts (TFLOP/s per measured precision against the catalog's dense peak, temperature against its warn and
slowdown limits) are drawn only for hosts with a problem: that is where a picture tells something.
The markup is well-formed XML (XHTML serialisation of HTML5) so it can be checked with any XML parser.
"""

from __future__ import annotations

from html import escape
from typing import Any

from gpufleet.results import FleetResult

from ._common import (
    HEADLINE_ORDER,
    as_report,
    bench_precisions,
    fleet_headline,
    fmt,
    gpu_label,
    host_facts,
    host_verdict,
    hosts_by_verdict,
    hosts_worst_first,
    mig_layouts,
    model_groups,
    problem_groups,
    sorted_checks,
)

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
details.host > summary { cursor: pointer; padding: 0.2em 0; }
.headline { font-size: 1.2em; }
.heatmap-box { max-height: 40em; overflow: auto; border: 1px solid #d0d7de; display: inline-block; }
svg.heatmap { border: none; } svg .cell { stroke: #ffffff; }
svg .c-pass { fill: #2da44e; } svg .c-warn { fill: #d4a72c; } svg .c-fail, svg .c-unreachable { fill: #cf222e; }
svg .c-skip { fill: #afb8c1; }
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


def _host_id(name: str) -> str:
    return "host-" + "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def _host_link(name: str) -> str:
    return f'<a href="#{escape(_host_id(name))}">{escape(name)}</a>'


def heatmap(hosts: list[dict[str, Any]], precision: str | None) -> str:
    """One SVG for the whole fleet: a row per host (worst first), a cell per GPU coloured by the GPU's verdict,
    its temperature (and the matmul fraction of dense peak when benchmarked) in the cell's tooltip, so a large
    fleet stays one picture the eye can scan for the red cells."""
    rows = [h for h in hosts if h.get("gpus")]
    if not rows:
        return ""
    cols = max(len(h["gpus"]) for h in rows)
    cell, gap, label_w, top = 12, 2, 10 + 7 * max(len(h["host"]) for h in rows), 18
    width = label_w + cols * (cell + gap) + 10
    height = top + len(rows) * (cell + gap) + 4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="fleet-heatmap" class="heatmap" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="GPU verdicts, host x GPU">']
    parts += [f'<text x="{label_w + i * (cell + gap)}" y="12">{i}</text>' for i in range(cols)]
    for r, host in enumerate(rows):
        # One <g> per host row: the host name once, cells positioned inside it (keeps a large fleet's SVG small).
        parts.append(f'<g class="row" data-host="{escape(host["host"])}" '
                     f'transform="translate(0,{top + r * (cell + gap)})">'
                     f'<text x="2" y="{cell - 2}">{escape(host["host"])}</text>')
        for g in host["gpus"]:
            verdict = g.get("verdict") or "skip"
            tip = f"gpu{g['index']} {verdict.upper()} {fmt(g.get('temperature_c'), 0)} °C"
            frac = ((g.get("matmul") or {}).get(precision) or {}).get("fraction") if precision else None
            if frac is not None:
                tip += f", {precision} {frac:.0%} of peak"
            x = label_w + int(g["index"]) * (cell + gap)
            parts.append(f'<rect class="cell c-{escape(verdict)}" data-gpu="gpu{g["index"]}" x="{x}" '
                         f'width="{cell}" height="{cell}"><title>{escape(tip)}</title></rect>')
        parts.append("</g>")
    parts.append("</svg>")
    return '<div class="heatmap-box">' + "".join(parts) + "</div>"


def _summary(data: dict[str, Any]) -> list[str]:
    s = data["summary"]
    counts = s["checks"]
    by_verdict = hosts_by_verdict(data["hosts"])
    out = [_table(["hosts", *[f"{v}" for v in by_verdict], "GPUs", "checks pass", "warn", "fail", "skip"],
                  [[str(s["hosts"]), *[str(n) for n in by_verdict.values()], str(s["gpus"]), str(counts["pass"]),
                    str(counts["warn"]), str(counts["fail"] + counts["unreachable"]), str(counts["skip"])]])]
    bad = [h for h in hosts_worst_first(data["hosts"]) if host_verdict(h) in ("fail", "unreachable", "warn")]
    out.append('<h2 id="hosts-with-problems">Hosts with problems</h2>')
    if bad:
        rows = []
        for h in bad:
            checks = sorted_checks([c for c in h["checks"] if c["verdict"] == host_verdict(h)])
            names = sorted({c["check"] for c in checks})
            rows.append([_host_link(h["host"]), _badge(host_verdict(h)), escape(host_facts(h)),
                         escape(", ".join(names))])
        out.append(_table(["host", "verdict", "driver, CUDA, GPUs", "checks with that verdict"], rows, raw=True))
    else:
        out.append("<p>None: every host passed.</p>")
    groups = problem_groups(data)
    out.append('<h2 id="problems">Problems by check</h2>')
    if groups:
        rows = []
        for g in groups:
            links = " ".join(_host_link(h) for h in g["hosts"])
            if len(g["hosts"]) > 12:
                links = f"<details><summary>{len(g['hosts'])} hosts</summary>{links}</details>"
            models = ", ".join(f"{m} ({n})" for m, n in g["models"].items())
            rows.append([escape(g["check"]), _badge(g["verdict"]), str(len(g["hosts"])), str(g["gpus"]),
                         escape(models), f'{escape(g["example_host"])}: {escape(g["example"])}',
                         escape(g["remediation"]), links])
        out.append(_table(["check", "verdict", "hosts", "GPUs", "GPU models (hosts)", "example", "remediation",
                           "hosts"], rows, raw=True))
    else:
        out.append("<p>None: every check passed.</p>")
    out.append('<h2 id="models">By GPU model</h2>')
    out.append(_table(["GPU model", "hosts", "GPUs", "hosts by verdict"],
                      [[escape(g["model"]), str(g["hosts"]), str(g["gpus"]),
                        " ".join(f"{_badge(v)} {n}" for v, n in sorted(
                            g["verdicts"].items(), key=lambda kv: HEADLINE_ORDER.index(kv[0])))]
                       for g in model_groups(data)], raw=True))
    return out


def _host_details(host: dict[str, Any], precisions: list[str]) -> str:
    verdict = host_verdict(host)
    parts = [f'<details class="host" id="{escape(_host_id(host["host"]))}"><summary>{escape(host["host"])} '
             f'{_badge(verdict)} <span class="facts">{escape(host_facts(host))}</span></summary>']
    if verdict in ("fail", "warn"):
        # A picture where it says something: the bars of a host with a problem. Passing hosts are in the heatmap.
        parts.append(_host_charts(host, precisions))
    migs = mig_layouts(host)
    if host.get("gpus"):
        # The model is in the summary line; a column only where the host's GPUs differ (or one lost its name).
        mixed = len({g.get("name") for g in host["gpus"]}) > 1
        header = ["GPU", "UUID"] + (["model"] if mixed else []) + ["temp °C", "power W (limit)"]
        header += [f"{p} TFLOP/s" for p in precisions] + ["memory GB/s"] + (["MIG"] if migs else []) + ["verdict"]
        rows = []
        for g in host["gpus"]:
            row = [escape(str(g["index"])), escape(g.get("uuid") or "–")]
            row += [escape(g.get("name") or "–")] if mixed else []
            row += [escape(fmt(g.get("temperature_c"), 0)),
                   escape(f"{fmt(g.get('power_draw_w'))} ({fmt(g.get('power_limit_w'), 0)})")]
            for p in precisions:
                m = (g.get("matmul") or {}).get(p) or {}
                frac = f" ({m['fraction']:.0%})" if m.get("fraction") is not None else ""
                row.append(escape(fmt(m.get("tflops")) + frac))
            row.append(escape(fmt(g.get("memory_bandwidth_gbs"), 0)))
            if migs:
                row.append(escape(migs.get(g["index"], "–")))
            row.append(_badge(g.get("verdict")))
            rows.append(row)
        parts.append(_table(header, rows, raw=True))
    shown = sorted_checks([c for c in host["checks"] if c["verdict"] != "pass"])
    passed = sorted({c["check"] for c in host["checks"] if c["verdict"] == "pass"})
    if shown:
        parts.append(_table(["GPU", "check", "verdict", "message", "remediation"],
                            [[escape(gpu_label(c)), escape(c["check"]), _badge(c["verdict"]), escape(c["message"]),
                              escape(c.get("remediation") or "")] for c in shown], raw=True))
    npass = len(host["checks"]) - len(shown)
    parts.append(f'<p class="facts">{npass} check(s) passed ({len(passed)} kinds)</p></details>')
    return "".join(parts)


def badge(verdict: str | None, label: str | None = None) -> str:
    """A coloured badge: the verdict's colour (pass, warn, fail, unreachable, skip), its name or ``label``."""
    verdict = verdict or "skip"
    return f'<span class="v v-{escape(verdict)}">{escape((label or verdict).upper())}</span>'


def table(header: list[str], rows: list[list[str]], *, raw: bool = False) -> str:
    """An HTML table; rows hold already-escaped HTML when ``raw``."""
    return _table(header, rows, raw=raw)


def page(title: str, body: list[str]) -> str:
    """A self-contained page (the report's inline CSS, no script, no external asset) around ``body``."""
    return ("<!DOCTYPE html>\n"
            '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def render_html(report: FleetResult | dict[str, Any], title: str = "gpufleet verify report") -> str:
    """Fleet summary first (headline, hosts by verdict, hosts with problems, problems grouped by check, hosts by
    GPU model), the fleet heatmap, then one collapsed section per host (worst first) linked from the summary."""
    data = as_report(report)
    s = data["summary"]
    precisions = bench_precisions(data)
    verdict, headline = fleet_headline(data)
    body = [f"<h1>{escape(title)}</h1>",
            f'<p class="headline">{_badge(verdict)} <span id="headline">{escape(headline)}</span></p>',
            f'<p class="facts">Generated {escape(data["generated_at"])} · bench profile '
            f'{escape(str(data.get("bench_profile") or "none"))} · exit code {s["exit_code"]}</p>']
    body += _summary(data)
    if data.get("regressions"):
        body.append("<h2>Regressions since the previous report</h2>")
        body.append(_table(["host", "GPU", "what", "before", "after", "message"],
                           [[r["host"], "" if r.get("gpu_index") is None else f"gpu{r['gpu_index']}", r["check"],
                             r["before"], r["after"], r["message"]] for r in data["regressions"]]))
    hosts = hosts_worst_first(data["hosts"])
    chart = heatmap(hosts, precisions[0] if precisions else None)
    if chart:
        body.append('<h2 id="heatmap">GPUs: host × GPU</h2>')
        body.append('<p class="facts">One cell per GPU, coloured by its verdict (hover for temperature and '
                    'benchmark); hosts worst first.</p>')
        body.append(chart)
    body.append('<h2 id="hosts">Hosts</h2>')
    body += [_host_details(h, precisions) for h in hosts]
    return page(title, body)
