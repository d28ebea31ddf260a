"""Markdown report for people: headline (a failure outranks an unreachable host), summary, problems first,
regressions, then one section per host, worst first."""

from __future__ import annotations

from typing import Any

from gpufleet.verify.model import FleetResult

from ._common import (
    as_report,
    bench_precisions,
    fleet_headline,
    fmt,
    gpu_label,
    host_facts,
    hosts_worst_first,
    sorted_checks,
)

_BADGE = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP", "unreachable": "UNREACHABLE"}


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(report: FleetResult | dict[str, Any]) -> str:
    data = as_report(report)
    s = data["summary"]
    counts = s["checks"]
    out = [
        "# gpufleet verify report",
        "",
        f"Generated {data['generated_at']} · bench profile {data.get('bench_profile') or 'none'} · "
        f"**{fleet_headline(data)[1]}** (exit code {s['exit_code']})",
        "",
    ]
    out += _table(["hosts", "verified", "unreachable", "GPUs", "pass", "warn", "fail", "skip"],
                  [[s["hosts"], s["hosts_ok"], s["hosts_unreachable"], s["gpus"], counts["pass"], counts["warn"],
                    counts["fail"] + counts["unreachable"], counts["skip"]]])
    problems = [c for h in data["hosts"] for c in h["checks"] if c["verdict"] in ("fail", "unreachable", "warn")]
    out += ["", "## Problems", ""]
    if problems:
        out += _table(["host", "GPU", "check", "verdict", "message", "remediation"],
                      [[c["host"], gpu_label(c), c["check"], _BADGE[c["verdict"]], c["message"], c.get("remediation")]
                       for c in sorted_checks(problems)])
    else:
        out.append("None: every check passed.")
    if data.get("regressions"):
        out += ["", "## Regressions since the previous report", ""]
        out += _table(["host", "GPU", "what", "before", "after", "message"],
                      [[r["host"], "" if r.get("gpu_index") is None else f"gpu{r['gpu_index']}", r["check"],
                        r["before"], r["after"], r["message"]] for r in data["regressions"]])
    precisions = bench_precisions(data)
    out += ["", "## Hosts"]
    for host in hosts_worst_first(data["hosts"]):
        verdict = host.get("verdict") or "pass"
        out += ["", f"### {host['host']} — {_BADGE[verdict]}", "", host_facts(host)]
        if host.get("gpus"):
            header = ["GPU", "UUID", "model", "temp °C", "power W (limit)"]
            header += [f"{p} TFLOP/s (% dense peak)" for p in precisions]
            header += ["memory GB/s", "verdict"]
            rows = []
            for g in host["gpus"]:
                row = [g["index"], g.get("uuid") or "–", g.get("name") or "–", fmt(g.get("temperature_c"), 0),
                       f"{fmt(g.get('power_draw_w'))} ({fmt(g.get('power_limit_w'), 0)})"]
                for p in precisions:
                    m = (g.get("matmul") or {}).get(p) or {}
                    frac = f" ({m['fraction']:.0%})" if m.get("fraction") is not None else ""
                    row.append(fmt(m.get("tflops")) + frac)
                row += [fmt(g.get("memory_bandwidth_gbs"), 0), _BADGE.get(g.get("verdict") or "", "–")]
                rows.append(row)
            out += [""] + _table(header, rows)
        shown = [c for c in host["checks"] if c["verdict"] != "pass"]
        passed = len(host["checks"]) - len(shown)
        out += ["", f"{passed} check(s) passed." + (" Others:" if shown else "")]
        if shown:
            out += [""] + _table(["GPU", "check", "verdict", "message"],
                                 [[gpu_label(c), c["check"], _BADGE[c["verdict"]], c["message"]]
                                  for c in sorted_checks(shown)])
    return "\n".join(out) + "\n"
