"""The rollout's HTML report (``rollout.html``): summary first, failed hosts first with their reason, per-wave and
per-phase timings, each wave's verify report linked; well-formed, self-contained and small for a synthetic
1000-host rollout, which headless Chromium loads and lays out (as the verify report's scale test)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from test_report_browser import dump_dom

from gpufleet.rollout import report
from gpufleet.rollout import state as st

XHTML = "{http://www.w3.org/1999/xhtml}"


def synthetic_rollout(n: int, out: Path) -> st.RolloutState:
    """n hosts, canary + 25% waves: stopped in wave 3 (n // 200 hosts failed there, one of them left drained),
    two skipped by the drain timeout in wave 2, one already converged, the rest of the fleet untouched."""
    hosts = [f"gpu-{i:04d}.rack{i // 40:02d}.example.net" for i in range(n)]
    state = st.RolloutState.new("20260501T120000Z-abc123", "inventories/fleet.py", "deploys/gpu_node.py",
                                {"canary": 1, "waves": "25%", "max_failures": "0", "verify": "quick",
                                 "drain": "slurm", "wait_for_jobs": 600, "on_timeout": "skip"}, hosts)
    state.status = "stopped"
    state.preflight = [{"hosts": None, "seconds": 41.2}]
    quarter = -(-(n - 1) // 4)
    waves = [hosts[:1], hosts[1:1 + quarter], hosts[1 + quarter:1 + 2 * quarter]]
    failing = set(waves[2][5::40][: max(1, n // 200)])
    for index, names in enumerate(waves, start=1):
        vdir = out / f"wave-{index:03d}-verify"
        state.waves.append({"index": index, "kind": "canary" if index == 1 else "wave", "hosts": names,
                            "phases": {"drain": 12.5, "converge": 30.25, "verify": 20.0, "return": 1.5},
                            "verify_report": str(vdir / "report.json"), "failed": sorted(failing & set(names)),
                            "verify_summary": {"hosts": len(names), "hosts_ok": len(names) - len(failing & set(names)),
                                               "verdict": "fail" if failing & set(names) else "pass"}})
        for name in names:
            rec = state.nodes[name]
            rec.wave = index
            rec.phases = dict(state.waves[-1]["phases"])
            if name in failing:
                rec.move(st.FAILED, "verify: FAIL (health.temperature)")
                rec.drained_by_rollout = name == min(failing)
            elif index == 2 and name in names[-2:]:
                rec.move(st.SKIPPED, "jobs still running after --wait-for-jobs 600 s (left as it was)")
            else:
                rec.changed = name != names[0] or index != 2
                rec.move(st.DONE)
    return state


def test_summary_first_failed_hosts_first_and_waves_linked(tmp_path):
    state = synthetic_rollout(40, tmp_path)
    text = report.html(state, tmp_path)
    root = ET.fromstring(text.split("\n", 1)[1])  # well-formed XHTML
    assert root.find(f".//{XHTML}style") is not None and "<script" not in text and "http://" not in text.replace(
        "http://www.w3.org/1999/xhtml", "")
    headline = root.find(f".//{XHTML}span[@id='headline']").text
    assert headline == "40 host(s): 17 changed, 1 already converged, 1 failed, 2 skipped, 19 untouched, " \
                       "1 still drained by this rollout"
    assert ">STOPPED<" in text
    order = [m.group(1) for m in re.finditer(r'<h2 id="([\w-]+)"', text)]
    assert order == ["states", "failed", "waves", "phases", "hosts"]
    failed = text.split('id="failed"', 1)[1].split("<h2", 1)[0]
    assert re.findall(r"<tr><td>([\w.-]+)</td>", failed) == [
        "gpu-0016.rack00.example.net", "gpu-0009.rack00.example.net", "gpu-0010.rack00.example.net"]
    assert "verify: FAIL (health.temperature)" in failed and "jobs still running" in failed
    assert "STILL DRAINED</span> gpu-0016.rack00.example.net: out of the scheduler" in text
    waves = text.split('id="waves"', 1)[1].split("<h2", 1)[0]
    assert [f"wave-{i:03d}-verify/report.html" for i in (1, 2, 3)] == re.findall(r'href="([^"]+)"', waves)
    assert "9/10 hosts verified" in waves and "<td>30.2</td>" in waves and "<td>64.2</td>" in waves
    phases = text.split('id="phases"', 1)[1].split("<h2", 1)[0]
    assert "<td>validation + preflight (whole fleet)</td><td>41.2</td>" in phases
    assert "<td>converge</td><td>90.8</td>" in phases and "every host, 41.2 s" in phases


def test_the_rollout_writes_the_html_beside_the_json_and_junit(tmp_path):
    state = synthetic_rollout(8, tmp_path)

    class Opts:
        out = str(tmp_path / "out")

    paths = report.write(state, Opts())
    assert set(paths) == {"json", "junit", "html"} and paths["html"] == tmp_path / "out" / "rollout.html"
    assert json.loads(paths["json"].read_text())["rollout_id"] in paths["html"].read_text()


def test_1000_host_rollout_report_is_small_and_chromium_lays_it_out(tmp_path):
    state = synthetic_rollout(1000, tmp_path)
    text = report.html(state, tmp_path)
    size = len(text.encode())
    assert size < 1_000_000, f"{size / 1e6:.2f} MB"
    page = tmp_path / "rollout.html"
    page.write_text(text.replace("</body>", _PROBE + "</body>"))
    laid_out = json.loads(dump_dom(tmp_path, page).pre["layout"])
    assert laid_out["rows"] == 1000 + 1 and laid_out["failed"] == 5 + 2 + 1
    assert laid_out["height"] > 1000 and laid_out["ms"] < 5000
    print(f"1000-host rollout report: {size / 1e3:.0f} kB, laid out in {laid_out['ms']:.0f} ms")


# Injected into a copy: the page opened by a reader (the host table expanded), as the browser laid it out.
_PROBE = """
<pre id="layout"></pre>
<script>
for (const d of document.querySelectorAll("details")) d.open = true;
const hosts = document.querySelector("details.hosts table");
document.getElementById("layout").textContent = JSON.stringify({
  ms: performance.now(), rows: hosts.querySelectorAll("tr").length,
  failed: document.querySelectorAll("#failed + table tr").length,
  height: hosts.getBoundingClientRect().height});
</script>
"""
