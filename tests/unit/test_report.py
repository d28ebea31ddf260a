"""Reports (gpufleet/report/): golden Markdown / JUnit / Prometheus files for a fleet built from the recorded probe
documents, JUnit parsed back, Prometheus exposition format validated, HTML well-formed with one bar per GPU,
regressions against a previous report, and write_reports() in an output directory.

Regenerate the golden files after an intended change:
    GPUFLEET_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_report.py
"""

from __future__ import annotations

import copy
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpufleet.report import (
    load_report,
    render_html,
    render_json,
    render_junit,
    render_markdown,
    render_prometheus,
    write_reports,
)
from gpufleet.report.regression import attach_regressions, compare
from gpufleet.verify import (
    ExpectedState,
    FleetResult,
    ReportSchemaError,
    build_fleet_result,
    evaluate_host,
    exit_code,
    unreachable_host,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
GOLDEN = FIXTURES / "golden"
STAMP = "2026-05-01T12:05:00.000Z"
NCCL = {"NCCL_SOCKET_IFNAME": "=ens1f0", "NCCL_IB_HCA": "mlx5"}


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def h100(**overrides) -> ExpectedState:
    values = dict(driver_branch="570", power_limit_w_all=700.0, nccl=NCCL, gpu_count=8, gpu_model="h100-sxm",
                  services={"nvidia-persistenced": "active", "dcgm-exporter": "active"})
    values.update(overrides)
    return ExpectedState(**values)


def make_fleet() -> FleetResult:
    hosts = [
        evaluate_host("gpu-h100-01", load("probe-h100-sxm-8.json"), h100()),
        evaluate_host("gpu-h100-02", load("probe-h100-sxm-8-faults.json"), h100()),
        evaluate_host("gpu-l40s-01", load("probe-l40s-4.json"), ExpectedState(gpu_count=4, gpu_model="l40s")),
        evaluate_host("gpu-h100-03", load("probe-driver-not-loaded.json"), h100()),
        unreachable_host("gpu-h100-04", "ssh: connect to host gpu-h100-04 port 22: No route to host"),
    ]
    fleet = build_fleet_result(hosts, bench_profile="quick")
    fleet.generated_at = STAMP
    return fleet


@pytest.fixture
def report() -> dict:
    return make_fleet().to_dict()


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPUFLEET_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"golden file {path} missing: run with GPUFLEET_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden file (GPUFLEET_UPDATE_GOLDEN=1 to accept)"


# --------------------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------------------


def test_json_report_is_versioned_and_round_trips(report, tmp_path):
    assert report["schema"] == "gpufleet.verify.report" and report["schema_version"] == 1
    s = report["summary"]
    assert s["hosts"] == 5 and s["hosts_ok"] == 4 and s["hosts_unreachable"] == 1  # NVML error: probed, failed
    assert s["verdict"] == "unreachable" and s["exit_code"] == 1
    assert s["gpus"] == 20  # 8 + 8 + 4, none for the host whose driver is not loaded
    path = tmp_path / "r.json"
    path.write_text(render_json(report))
    again = load_report(path)
    assert again == json.loads(json.dumps(report))
    assert FleetResult.from_dict(again).to_dict()["summary"] == s
    hosts = {h["host"]: h for h in again["hosts"]}
    assert hosts["gpu-h100-04"]["status"] == "unreachable" and hosts["gpu-h100-04"]["probe"] is None
    assert hosts["gpu-h100-01"]["probe"]["bench"]["profile"] == "quick"


def test_json_report_schema_is_checked(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema": "something.else"}))
    with pytest.raises(ReportSchemaError):
        load_report(path)
    path.write_text(json.dumps({"schema": "gpufleet.verify.report", "schema_version": 99}))
    with pytest.raises(ReportSchemaError, match="not supported"):
        load_report(path)


# --------------------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------------------


def test_markdown_golden(report):
    text = render_markdown(report)
    golden("report.md", text)


def test_markdown_content(report):
    text = render_markdown(report)
    assert text.startswith("# gpufleet verify report\n")
    assert "**FAIL: 2 hosts fail, 1 unreachable, 2 pass (5 hosts)** (exit code 1)" in text
    summary, details = text.split("## Hosts with problems: details", 1)
    problems = summary.split("## Problems by check", 1)[1].split("## By GPU model", 1)[0]
    # one row per check and verdict, with its hosts, GPUs and GPU models, not one per host and problem
    assert "| host.reachable | UNREACHABLE | 1 | 0 | no GPU data (1) |" in problems
    assert "| config.power_limit | FAIL | 1 | 1 | NVIDIA H100 80GB HBM3 (1) | gpu-h100-02: power limit 500 W, " \
           "expected 700 W |" in problems
    assert len([ln for ln in problems.splitlines() if "| health.xid | FAIL |" in ln]) == 1
    # failing hosts first (linked to their details), the unreachable one after them, passing hosts last
    listed = re.findall(r"^\| \[([\w.-]+)\]\(#host-[\w-]+\) \| (\w+) \|", summary, re.MULTILINE)
    assert listed == [("gpu-h100-02", "FAIL"), ("gpu-h100-03", "FAIL"), ("gpu-h100-04", "UNREACHABLE")]
    assert '<a id="host-gpu-h100-02"></a>' in details and "power limit 500 W, expected 700 W" in details
    others = details.split("## Other hosts", 1)[1]
    assert re.findall(r"^\| (gpu-[\w-]+) \| PASS \|", others, re.MULTILINE) == ["gpu-h100-01", "gpu-l40s-01"]
    # every table row has the header's column count (pipes inside messages are escaped)
    for block in re.split(r"\n\n", text):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if rows:
            widths = {len(re.findall(r"(?<!\\)\|", row)) for row in rows}
            assert len(widths) == 1, block


# --------------------------------------------------------------------------------------------------------------
# JUnit
# --------------------------------------------------------------------------------------------------------------


def test_junit_golden(report):
    golden("junit.xml", render_junit(report))


def test_junit_parses_back_with_correct_counts(report):
    root = ET.fromstring(render_junit(report))
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {h["host"] for h in report["hosts"]}
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for host in report["hosts"]:
        suite = suites[host["host"]]
        cases = suite.findall("testcase")
        verdicts = [c["verdict"] for c in host["checks"]]
        assert int(suite.get("tests")) == len(cases) == len(host["checks"])
        assert int(suite.get("failures")) == len([c for c in cases if c.find("failure") is not None]) == \
            verdicts.count("fail")
        assert int(suite.get("errors")) == len([c for c in cases if c.find("error") is not None]) == \
            verdicts.count("unreachable")
        assert int(suite.get("skipped")) == len([c for c in cases if c.find("skipped") is not None]) == \
            verdicts.count("skip")
        for key in totals:
            totals[key] += int(suite.get(key))
    assert {k: int(root.get(k)) for k in totals} == totals
    bad = suites["gpu-h100-02"]
    power = [c for c in bad.findall("testcase") if c.get("name").startswith("config.power_limit gpu5 (GPU-")]
    assert len(power) == 1 and power[0].get("classname") == "gpu-h100-02"
    failure = power[0].find("failure")
    assert failure.get("message") == "power limit 500 W, expected 700 W" and "remediation:" in failure.text
    down = suites["gpu-h100-04"].find("testcase")
    assert down.get("name") == "host.reachable" and down.find("error").get("type") == "unreachable"
    warn = [c for c in bad.findall("testcase") if c.get("name").startswith("perf.matmul.bf16 gpu3")][0]
    assert warn.find("failure") is None and warn.find("system-out").text.startswith("WARN: ")


# --------------------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:\\\\|\\"|\\n|[^"\\\n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(\{{(?:{_LABEL})(?:,{_LABEL})*\}})? (\S+)$")


def check_exposition(text: str) -> dict[str, list[str]]:
    """A strict check of the Prometheus text exposition format; returns samples per metric."""
    assert text.endswith("\n") and "\n\n" not in text
    types: dict[str, str] = {}
    helps: set[str] = set()
    samples: dict[str, list[str]] = {}
    series: set[str] = set()
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert re.fullmatch(_NAME, name) and name not in helps
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "untyped", "summary", "histogram") and name not in types
            assert name not in samples, f"TYPE after samples of {name}"
            types[name] = kind
            current = name
            continue
        assert not line.startswith("#"), line
        m = _SAMPLE.match(line)
        assert m, f"bad sample line: {line!r}"
        name, labels, value = m.groups()
        assert name == current, f"samples of {name} are not grouped under its TYPE"
        float(value)
        key = name + (labels or "")
        assert key not in series, f"duplicate series {key}"
        series.add(key)
        samples.setdefault(name, []).append(line)
    assert set(samples) <= set(types) and set(types) <= helps
    return samples


def test_prometheus_golden(report):
    golden("gpufleet_verify.prom", render_prometheus(report))


def test_prometheus_exposition_is_valid(report):
    samples = check_exposition(render_prometheus(report))
    assert {"gpufleet_verify_check", "gpufleet_verify_last_run_timestamp_seconds", "gpufleet_bench_tflops",
            "gpufleet_verify_checks", "gpufleet_verify_host_up", "gpufleet_bench_nccl_busbw_gbs"} <= set(samples)
    checks = samples["gpufleet_verify_check"]
    assert 'gpufleet_verify_check{hostname="gpu-h100-02",gpu="5",UUID="' in "\n".join(checks)
    power = [s for s in checks if 'hostname="gpu-h100-02",gpu="5"' in s and 'check="config.power_limit"' in s]
    assert len(power) == 1 and power[0].endswith(" 0")
    ok = [s for s in checks if 'hostname="gpu-h100-01",gpu="0"' in s and 'check="health.ecc"' in s]
    assert len(ok) == 1 and ok[0].endswith(" 1")
    assert 'gpufleet_verify_check{hostname="gpu-h100-04",gpu="",UUID="",check="host.reachable"} 0' in checks
    stamp = samples["gpufleet_verify_last_run_timestamp_seconds"][0]
    assert stamp.endswith(" 1777637100.0")  # 2026-05-01T12:05:00Z
    tflops = [s for s in samples["gpufleet_bench_tflops"] if 'hostname="gpu-h100-01",gpu="0"' in s and "bf16" in s]
    assert tflops == [next(s for s in tflops)] and tflops[0].endswith(" 742.0")
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return
    families = {f.name: f for f in text_string_to_metric_families(render_prometheus(report))}
    assert "gpufleet_verify_check" in families


def test_prometheus_per_host_file_and_label_escaping(report):
    text = render_prometheus(report, host="gpu-h100-01")
    samples = check_exposition(text)
    assert all('hostname="gpu-h100-01"' in s for lines in samples.values() for s in lines)
    odd = copy.deepcopy(report)
    odd["hosts"][0]["host"] = 'we"ird\\host'
    for c in odd["hosts"][0]["checks"]:
        c["host"] = odd["hosts"][0]["host"]
    check_exposition(render_prometheus(odd))
    assert render_prometheus(report, host="nope") == ""


# --------------------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"
XHTML = "{http://www.w3.org/1999/xhtml}"


def parse_html(text: str) -> ET.Element:
    assert text.startswith("<!DOCTYPE html>\n")
    return ET.fromstring(text.split("\n", 1)[1])


def test_html_is_well_formed_and_self_contained(report):
    text = render_html(report)
    root = parse_html(text)
    assert root.tag == f"{XHTML}html"
    assert root.find(f"{XHTML}head/{XHTML}style") is not None
    lowered = text.lower()
    assert "<script" not in lowered and "<link" not in lowered and " src=" not in lowered
    assert re.findall(r"https?://[^\s\"']+", text) == ["http://www.w3.org/1999/xhtml"] + \
        ["http://www.w3.org/2000/svg"] * len(root.findall(f".//{SVG}svg"))


def test_html_charts_have_one_bar_per_gpu(report):
    root = parse_html(render_html(report))
    charts = {svg.get("id"): svg for svg in root.iter(f"{SVG}svg")}
    for host in report["hosts"]:
        safe = "".join(ch if ch.isalnum() else "-" for ch in host["host"])
        gpus = host["gpus"]
        temp = charts.get(f"temperature-{safe}")
        if not gpus or host["verdict"] not in ("fail", "warn"):
            assert temp is None, host["host"]  # passing hosts are drawn in the fleet heatmap only
            continue
        bars = [r for r in temp.iter(f"{SVG}rect") if "bar" in r.get("class").split()]
        assert [b.get("data-gpu") for b in bars] == [f"gpu{g['index']}" for g in gpus]
        measured = any((g.get("matmul") or {}).get("bf16", {}).get("tflops") for g in gpus)
        chart = charts.get(f"tflops-bf16-{safe}")
        assert (chart is not None) == measured
        if chart is not None:
            bars = [r for r in chart.iter(f"{SVG}rect") if "bar" in r.get("class").split()]
            assert len(bars) == len(gpus)
            peaks = [ln for ln in chart.iter(f"{SVG}line") if ln.get("class") == "peak"]
            assert len(peaks) == sum(1 for g in gpus if g["matmul"].get("bf16", {}).get("peak_tflops"))
    faults = charts["tflops-bf16-gpu-h100-02"]
    classes = {r.get("data-gpu"): r.get("class") for r in faults.iter(f"{SVG}rect")}
    assert classes["gpu1"] == "bar" and "warn" in classes["gpu3"]  # lost GPU: empty bar; slow GPU: warn colour
    heights = {r.get("data-gpu"): float(r.get("height")) for r in faults.iter(f"{SVG}rect")}
    assert heights["gpu1"] == 0.0 and heights["gpu3"] < heights["gpu0"]


def test_html_escapes_text(report):
    odd = copy.deepcopy(report)
    failing = next(c for c in odd["hosts"][1]["checks"] if c["verdict"] == "fail")
    failing["message"] = "<script>alert(1)</script> & more"
    text = render_html(odd)
    parse_html(text)
    assert "<script>" not in text and "&lt;script&gt;" in text


# --------------------------------------------------------------------------------------------------------------
# Regressions and the output directory
# --------------------------------------------------------------------------------------------------------------


def test_regressions_against_previous_report():
    doc = load("probe-h100-sxm-8.json")
    before = build_fleet_result([evaluate_host("n1", doc, h100()), evaluate_host("n2", load("probe-l40s-4.json"))])
    worse = copy.deepcopy(doc)
    worse["gpus"][5]["power"]["limit_w"] = 500.0
    worse["bench"]["gpus"][0]["matmul"]["bf16"]["tflops"] = 742.0 * 0.8
    worse["bench"]["gpus"][1]["matmul"]["bf16"]["tflops"] = 742.0 * 0.95  # within 10 %: not a regression
    after = build_fleet_result([evaluate_host("n1", worse, h100()), unreachable_host("n2", "timeout")])
    regs = compare(after, before, drop_pct=10.0)
    kinds = {(r["kind"], r["host"], r["check"], r.get("gpu_index")) for r in regs}
    uuid0 = doc["gpus"][0]["uuid"]
    assert kinds == {("host", "n2", "host.reachable", None), ("check", "n1", "config.power_limit", 5),
                     ("bench", "n1", "matmul.bf16.tflops", 0)}
    bench = next(r for r in regs if r["kind"] == "bench")
    assert bench["gpu_uuid"] == uuid0 and bench["drop_pct"] == 20.0 and bench["before"] == 742.0
    assert compare(before, before) == []
    attach_regressions(after, before.to_dict())
    assert after.to_dict()["summary"]["regressions"] == 3
    assert "## Regressions since the previous report" in render_markdown(after)


def test_write_reports_compares_with_the_previous_run(tmp_path):
    fleet = make_fleet()
    first = write_reports(fleet, tmp_path)
    assert {"json", "markdown", "html", "junit", "prometheus"} <= set(first)
    assert (tmp_path / "prometheus" / "gpu-h100-01.prom").exists()
    assert not (tmp_path / "report.previous.json").exists()
    assert load_report(first["json"])["regressions"] == []
    again = make_fleet()
    down = again.hosts[0]
    again.hosts[0] = unreachable_host(down.host, "timeout")
    second = write_reports(again, tmp_path)
    assert (tmp_path / "report.previous.json").exists()
    regs = load_report(second["json"])["regressions"]
    assert [r["check"] for r in regs if r["kind"] == "host"] == ["host.reachable"]
    check_exposition(second["prometheus"].read_text())
    check_exposition((tmp_path / "prometheus" / "gpu-h100-02.prom").read_text())
    ET.fromstring(second["junit"].read_text())
    assert exit_code(load_report(second["json"])) == 1


# --------------------------------------------------------------------------------------------------------------
# HTML at fleet scale: summary first, headline, grouping, heatmap, collapsed hosts, MIG layout
# --------------------------------------------------------------------------------------------------------------


def test_html_headline_fail_outranks_unreachable_and_counts_both(report):
    root = parse_html(render_html(report))
    headline = root.find(f".//{XHTML}span[@id='headline']").text
    assert headline == "FAIL: 2 hosts fail, 1 unreachable, 2 pass (5 hosts)"
    badge = root.find(f".//{XHTML}p[@class='headline']/{XHTML}span")
    assert badge.text == "FAIL"


def test_html_summary_lists_failing_hosts_first_and_links_them(report):
    text = render_html(report)
    root = parse_html(text)
    ids = [d.get("id") for d in root.iter(f"{XHTML}details") if d.get("class") == "host"]
    assert ids == ["host-gpu-h100-02", "host-gpu-h100-03", "host-gpu-h100-04", "host-gpu-h100-01",
                   "host-gpu-l40s-01"]
    assert all(d.get("open") is None for d in root.iter(f"{XHTML}details"))  # collapsed
    # the summary comes before the per-host sections and links each host with a problem to its section
    assert text.index('id="hosts-with-problems"') < text.index('id="heatmap"') < text.index('id="hosts"')
    summary = text[text.index('id="hosts-with-problems"'):text.index('id="problems"')]
    assert re.findall(r'href="#(host-[^"]+)"', summary) == ["host-gpu-h100-02", "host-gpu-h100-03",
                                                            "host-gpu-h100-04"]


def test_html_groups_problems_by_check_and_hosts_by_model(report):
    root = parse_html(render_html(report))
    tables = [t for t in root.iter(f"{XHTML}table")]
    by_check = next(t for t in tables if [th.text for th in t.iter(f"{XHTML}th")][:4] ==
                    ["check", "verdict", "hosts", "GPUs"])
    rows = {(r[0].text, "".join(r[1].itertext())): (int(r[2].text), int(r[3].text))
            for r in (list(tr) for tr in by_check.find(f"{XHTML}tbody"))}
    models_hit = {(r[0].text, "".join(r[1].itertext())): r[4].text
                  for r in (list(tr) for tr in by_check.find(f"{XHTML}tbody"))}
    assert models_hit[("config.power_limit", "FAIL")] == "NVIDIA H100 80GB HBM3 (1)"
    assert models_hit[("host.reachable", "UNREACHABLE")] == "no GPU data (1)"
    checks = [c for h in report["hosts"] for c in h["checks"]]
    for (check, verdict), (hosts, gpus) in rows.items():
        hit = [c for c in checks if c["check"] == check and c["verdict"] == verdict.lower()]
        assert hosts == len({c["host"] for c in hit}) and gpus == sum(1 for c in hit if c["gpu_index"] is not None)
    assert ("host.reachable", "UNREACHABLE") in rows and ("config.power_limit", "FAIL") in rows
    assert len(rows) == len({(c["check"], c["verdict"]) for c in checks if c["verdict"] in ("fail", "warn",
                                                                                             "unreachable")})
    by_model = next(t for t in tables if [th.text for th in t.iter(f"{XHTML}th")][0] == "GPU model")
    models = {list(tr)[0].text: int(list(tr)[1].text) for tr in by_model.find(f"{XHTML}tbody")}
    assert models == {"NVIDIA H100 80GB HBM3": 2, "NVIDIA L40S": 1, "no GPU data": 2}


def test_html_heatmap_has_one_cell_per_gpu_coloured_by_verdict(report):
    root = parse_html(render_html(report))
    svg = next(s for s in root.iter(f"{SVG}svg") if s.get("id") == "fleet-heatmap")
    got = [(row.get("data-host"), r.get("data-gpu"), r.get("class").split()[1][2:])
           for row in svg.iter(f"{SVG}g") for r in row.iter(f"{SVG}rect") if "cell" in r.get("class").split()]
    expected = [(h["host"], f"gpu{g['index']}", g["verdict"] or "skip") for h in report["hosts"] for g in h["gpus"]]
    assert sorted(got) == sorted(expected)
    assert got[0][0] == "gpu-h100-02"  # worst host on top


def test_html_shows_the_mig_layout():
    hosts = [evaluate_host("gpu-a100-01", load("probe-a100-40gb-1-mig.json"))]
    text = render_html(build_fleet_result(hosts).to_dict())
    assert "<th>MIG</th>" in text and "MIG on: 1x 2g.10gb, 1x 3g.20gb" in text


def test_markdown_headline_fail_outranks_unreachable(report):
    text = render_markdown(report)
    assert "**FAIL: 2 hosts fail, 1 unreachable, 2 pass (5 hosts)** (exit code 1)" in text


def test_markdown_shows_the_mig_layout():
    hosts = [evaluate_host("gpu-a100-01", load("probe-a100-40gb-1-mig.json"))]
    text = render_markdown(build_fleet_result(hosts).to_dict())
    assert "| gpu-a100-01 | PASS | driver " in text and "| gpu0: MIG on: 1x 2g.10gb, 1x 3g.20gb |" in text


def test_markdown_at_1000_hosts_is_a_fleet_summary_first():
    from synthetic_fleet import synthetic_fleet

    data = synthetic_fleet(1000).to_dict()
    text = render_markdown(data)
    size = len(text.encode())
    assert size < 600_000, f"{size / 1e3:.0f} kB"
    assert "**FAIL: 18 hosts fail, 2 unreachable, 980 pass (1000 hosts)** (exit code 1)" in text
    head, details = text.split("## Hosts with problems: details", 1)
    # the summary names the 20 hosts with a problem, failing ones first, and no passing host
    listed = re.findall(r"^\| \[([\w.-]+)\]\(#host-[\w-]+\) \| (\w+) \|", head, re.MULTILINE)
    assert [v for _, v in listed] == ["FAIL"] * 18 + ["UNREACHABLE"] * 2
    assert [h for h, _ in listed] == sorted(h for h, v in listed if v == "FAIL") + sorted(
        h for h, v in listed if v == "UNREACHABLE")
    # problems grouped by check: one row per (check, verdict), however many hosts it hit
    problems = head.split("## Problems by check", 1)[1].split("## By GPU model", 1)[0]
    rows = [ln for ln in problems.splitlines() if ln.startswith("| ") and not ln.startswith("| check ")]
    keys = [tuple(ln.split(" | ")[:2]) for ln in rows]
    assert len(keys) == len(set(keys)) < 40
    temperature = next(ln for ln in rows if ln.startswith("| health.temperature | FAIL |"))
    assert "| 18 | 18 | NVIDIA H100 80GB HBM3 (18) |" in temperature and "… +8 more" in temperature
    models = head.split("## By GPU model", 1)[1]
    assert "| NVIDIA A100-SXM4-40GB | 100 | 100 | 100 pass |" in models
    # details only for the hosts with a problem; one compact row for every other host, with its MIG layout
    assert details.count("\n### ") == 20
    others = details.split("## Other hosts", 1)[1]
    assert len(re.findall(r"^\| gpu-\d{4}\.", others, re.MULTILINE)) == 980
    assert others.count("| gpu0: MIG on: 1x 2g.10gb, 1x 3g.20gb |") == 100
