"""Markdown report for people, built to read at 1000 hosts like the HTML one (same ordering and grouping, from
``_common``): the headline (a failure outranks an unreachable host, every verdict counted), hosts by verdict, the
hosts with a problem worst first, problems grouped by check (with the GPU models they hit) instead of a row per
host and problem, hosts by GPU model, regressions; then the details of each host with a problem (GPU table with
the MIG layout, its non-passing checks) and one compact row per other host (facts, MIG layout, checks passed)."""

from __future__ import annotations

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
    mig_summary,
    model_groups,
    problem_groups,
    sorted_checks,
)

_BADGE = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP", "unreachable": "UNREACHABLE"}
PROBLEM = ("fail", "unreachable", "warn")
GROUP_HOSTS_SHOWN = 10  # hosts named in a problem group's row; every one of them is in "Hosts with problems"


def _cell(text: Any) -> str:
    """Text as Markdown shows it literally: raw HTML escaped (``<``, ``>``, ``&`` as entities: a GPU or host name
    cannot add markup to a page that renders the report), link brackets and table pipes backslash-escaped,
    one line."""
    text = str(text if text is not None else "").replace("\\", "\\\\")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "|[]":
        text = text.replace(char, "\\" + char)
    return text.replace("\r", " ").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]], *, raw: tuple[int, ...] = ()) -> list[str]:
    """A Markdown table; the columns ``raw`` hold ready Markdown (links), the others are escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) if i in raw else _cell(c) for i, c in enumerate(row)) + " |" for row in rows]
    return lines


def _anchor(name: str) -> str:
    return "host-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name.lower())


def _link(name: str) -> str:
    return f"[{_cell(name)}](#{_anchor(name)})"


def _names(hosts: list[str], links: set[str]) -> str:
    shown = [_link(h) if h in links else _cell(h) for h in hosts[:GROUP_HOSTS_SHOWN]]
    more = len(hosts) - GROUP_HOSTS_SHOWN
    return ", ".join(shown) + (f" … +{more} more" if more > 0 else "")


def _summary(data: dict[str, Any], detailed: set[str]) -> list[str]:
    s = data["summary"]
    counts = s["checks"]
    by_verdict = hosts_by_verdict(data["hosts"])
    out = _table(["hosts", *[f"{v}" for v in by_verdict], "GPUs", "checks pass", "warn", "fail", "skip"],
                 [[s["hosts"], *by_verdict.values(), s["gpus"], counts["pass"], counts["warn"],
                   counts["fail"] + counts["unreachable"], counts["skip"]]])
    bad = [h for h in hosts_worst_first(data["hosts"]) if host_verdict(h) in PROBLEM]
    out += ["", "## Hosts with problems", ""]
    if bad:
        rows = []
        for h in bad:
            names = sorted({c["check"] for c in h["checks"] if c["verdict"] == host_verdict(h)})
            rows.append([_link(h["host"]), _BADGE[host_verdict(h)], host_facts(h), ", ".join(names)])
        out += _table(["host", "verdict", "driver, CUDA, GPUs", "checks with that verdict"], rows, raw=(0,))
    else:
        out.append("None: every host passed.")
    out += ["", "## Problems by check", ""]
    groups = problem_groups(data)
    if groups:
        rows = [[g["check"], _BADGE[g["verdict"]], len(g["hosts"]), g["gpus"],
                 ", ".join(f"{m} ({n})" for m, n in g["models"].items()), f"{g['example_host']}: {g['example']}",
                 g["remediation"], _names(g["hosts"], detailed)] for g in groups]
        out += _table(["check", "verdict", "hosts", "GPUs", "GPU models (hosts)", "example", "remediation",
                       "hosts hit"], rows, raw=(7,))
    else:
        out.append("None: every check passed.")
    out += ["", "## By GPU model", ""]
    out += _table(["GPU model", "hosts", "GPUs", "hosts by verdict"],
                  [[g["model"], g["hosts"], g["gpus"],
                    ", ".join(f"{n} {v}" for v, n in sorted(g["verdicts"].items(),
                                                             key=lambda kv: HEADLINE_ORDER.index(kv[0])))]
                   for g in model_groups(data)])
    return out


def _host_details(host: dict[str, Any], precisions: list[str]) -> list[str]:
    out = ["", f'<a id="{_anchor(host["host"])}"></a>', "",
           f"### {_cell(host['host'])} — {_BADGE[host_verdict(host)]}", "", _cell(host_facts(host))]
    migs = mig_layouts(host)
    if host.get("gpus"):
        mixed = len({g.get("name") for g in host["gpus"]}) > 1  # the model is in the facts line unless they differ
        header = ["GPU", "UUID"] + (["model"] if mixed else []) + ["temp °C", "power W (limit)"]
        header += [f"{p} TFLOP/s (% dense peak)" for p in precisions] + ["memory GB/s"]
        header += (["MIG"] if migs else []) + ["verdict"]
        rows = []
        for g in host["gpus"]:
            row = [g["index"], g.get("uuid") or "–"] + ([g.get("name") or "–"] if mixed else [])
            row += [fmt(g.get("temperature_c"), 0), f"{fmt(g.get('power_draw_w'))} ({fmt(g.get('power_limit_w'), 0)})"]
            for p in precisions:
                m = (g.get("matmul") or {}).get(p) or {}
                row.append(fmt(m.get("tflops")) + (f" ({m['fraction']:.0%})" if m.get("fraction") is not None else ""))
            row.append(fmt(g.get("memory_bandwidth_gbs"), 0))
            row += [migs.get(g["index"], "–")] if migs else []
            row.append(_BADGE.get(g.get("verdict") or "", "–"))
            rows.append(row)
        out += [""] + _table(header, rows)
    shown = sorted_checks([c for c in host["checks"] if c["verdict"] != "pass"])
    out += ["", f"{len(host['checks']) - len(shown)} check(s) passed." + (" Others:" if shown else "")]
    if shown:
        out += [""] + _table(["GPU", "check", "verdict", "message", "remediation"],
                             [[gpu_label(c), c["check"], _BADGE[c["verdict"]], c["message"], c.get("remediation")]
                              for c in shown])
    return out


def render_markdown(report: FleetResult | dict[str, Any]) -> str:
    data = as_report(report)
    s = data["summary"]
    hosts = hosts_worst_first(data["hosts"])
    detailed = [h for h in hosts if host_verdict(h) in PROBLEM]
    others = [h for h in hosts if host_verdict(h) not in PROBLEM]
    out = ["# gpufleet verify report", "", f"**{fleet_headline(data)[1]}** (exit code {s['exit_code']})", "",
           f"Generated {data['generated_at']} · bench profile {data.get('bench_profile') or 'none'}", ""]
    out += _summary(data, {h["host"] for h in detailed})
    if data.get("regressions"):
        out += ["", "## Regressions since the previous report", ""]
        out += _table(["host", "GPU", "what", "before", "after", "message"],
                      [[r["host"], "" if r.get("gpu_index") is None else f"gpu{r['gpu_index']}", r["check"],
                        r["before"], r["after"], r["message"]] for r in data["regressions"]])
    precisions = bench_precisions(data)
    if detailed:
        out += ["", "## Hosts with problems: details"]
        for host in detailed:
            out += _host_details(host, precisions)
    if others:
        out += ["", "## Other hosts", ""]
        out += _table(["host", "verdict", "driver, CUDA, GPUs", "MIG", "checks passed"],
                      [[h["host"], _BADGE[host_verdict(h)], host_facts(h), mig_summary(h) or "–",
                        sum(1 for c in h["checks"] if c["verdict"] == "pass")] for h in others])
    return "\n".join(out) + "\n"
