"""The HTML report of a recorded fleet (the probe documents in tests/fixtures/verify/) opened in headless Chromium:
the browser's DOM has the SVG charts of the hosts with a problem with one bar per GPU and the fleet heatmap with
one cell per GPU, the bars are laid out with heights that follow the values (a lost GPU: an empty bar), and a
screenshot of the page is a real, non-blank PNG. A synthetic 1000-host fleet (built through the real result model)
gives a report under 5 MB that Chromium loads and lays out.

Needs Debian's ``chromium`` (``make test`` installs it: Makefile SYSTEM_PACKAGES).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpufleet.report import render_html
from gpufleet.verify import ExpectedState, build_fleet_result, evaluate_host, unreachable_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WINDOW = (1280, 1600)


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def report() -> dict:
    h100 = ExpectedState(driver_branch="570", power_limit_w_all=700.0, gpu_count=8, gpu_model="h100-sxm")
    hosts = [evaluate_host("gpu-h100-01", load("probe-h100-sxm-8.json"), h100),
             evaluate_host("gpu-h100-02", load("probe-h100-sxm-8-faults.json"), h100),
             evaluate_host("gpu-l40s-01", load("probe-l40s-4.json"), ExpectedState(gpu_count=4)),
             evaluate_host("gpu-a100-01", load("probe-a100-40gb-1-mig.json")),
             evaluate_host("gpu-h100-03", load("probe-driver-not-loaded.json"), h100),
             unreachable_host("gpu-h100-04", "Could not connect (timed out)")]
    fleet = build_fleet_result(hosts, bench_profile="quick")
    fleet.generated_at = "2026-05-01T12:05:00.000Z"
    return fleet.to_dict()


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("headless Chromium is not installed (Debian package chromium; `make test` installs it)")
    return exe


def browse(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120, check=False)


class Dom(HTMLParser):
    """The SVG charts of a serialized DOM: {chart id: [bar rect attributes]}, plus the <pre id=...> texts."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, list[dict[str, str]]] = {}
        self.pre: dict[str, str] = {}
        self._chart: str | None = None
        self._pre: str | None = None
        self.heatmap_cells = 0
        self.host_sections = 0

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and "chart" in a.get("class", "").split():
            self._chart = a.get("id", "")
            self.charts[self._chart] = []
        elif tag == "rect" and self._chart is not None and "bar" in a.get("class", "").split():
            self.charts[self._chart].append(a)
        elif tag == "rect" and "cell" in a.get("class", "").split():
            self.heatmap_cells += 1
        elif tag == "details" and "host" in a.get("class", "").split():
            self.host_sections += 1
        elif tag == "pre" and a.get("id"):
            self._pre = a["id"]
            self.pre[self._pre] = ""

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None
        elif tag == "pre":
            self._pre = None

    def handle_data(self, data):
        if self._pre is not None:
            self.pre[self._pre] += data


def dump_dom(tmp_path: Path, page: Path) -> Dom:
    result = browse(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom()
    dom.feed(result.stdout)
    return dom


def safe(host: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in host)


def test_rendered_dom_has_the_charts_with_one_bar_per_gpu(report, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(report))
    dom = dump_dom(tmp_path, page)
    expected_charts = set()
    for host in report["hosts"]:
        gpus = host["gpus"]
        if not gpus or host["verdict"] not in ("fail", "warn"):
            assert not any(cid.endswith("-" + safe(host["host"])) for cid in dom.charts), host["host"]
            continue
        labels = [f"gpu{g['index']}" for g in gpus]
        temp = f"temperature-{safe(host['host'])}"
        expected_charts.add(temp)
        assert [bar["data-gpu"] for bar in dom.charts[temp]] == labels
        for precision in ("bf16", "fp16", "tf32", "fp32", "fp8"):
            measured = any((g.get("matmul") or {}).get(precision, {}).get("tflops") for g in gpus)
            chart = f"tflops-{precision}-{safe(host['host'])}"
            assert (chart in dom.charts) == measured, chart
            if measured:
                expected_charts.add(chart)
                assert [bar["data-gpu"] for bar in dom.charts[chart]] == labels
    assert set(dom.charts) == expected_charts
    assert len(dom.charts["tflops-bf16-gpu-h100-02"]) == 8
    assert dom.heatmap_cells == sum(len(h["gpus"]) for h in report["hosts"])


# Injected into a copy of the report (which has no script of its own): the layout as the browser computed it.
_LAYOUT_PROBE = """
<pre id="layout"></pre>
<script>
for (const d of document.querySelectorAll("details")) d.open = true;  // a reader opening every host
const out = {};
for (const svg of document.querySelectorAll("svg.chart")) {
  const box = svg.getBoundingClientRect();
  out[svg.id] = {width: box.width, height: box.height,
                 bars: Array.from(svg.querySelectorAll("rect.bar")).map(r => ({
                   gpu: r.getAttribute("data-gpu"), height: r.getBoundingClientRect().height,
                   fill: getComputedStyle(r).fill}))};
}
document.getElementById("layout").textContent = JSON.stringify(out);
</script>
"""


def test_browser_lays_out_bars_that_follow_the_values(report, tmp_path):
    page = tmp_path / "report-layout.html"
    page.write_text(render_html(report).replace("</body>", _LAYOUT_PROBE + "</body>"))
    layout = json.loads(dump_dom(tmp_path, page).pre["layout"])
    assert layout, "no chart was laid out"
    for chart in layout.values():
        assert chart["width"] > 100 and chart["height"] > 100
    faults = {b["gpu"]: b for b in layout["tflops-bf16-gpu-h100-02"]["bars"]}
    assert faults["gpu1"]["height"] == 0  # the lost GPU has no figure: an empty bar, not a made-up one
    assert 0 < faults["gpu3"]["height"] < faults["gpu0"]["height"]  # the slow GPU's bar is visibly shorter
    assert faults["gpu3"]["fill"] != faults["gpu0"]["fill"]  # and coloured as a warning
    assert "tflops-bf16-gpu-h100-01" not in layout  # a passing host: in the heatmap, no chart of its own
    temps = {b["gpu"]: b["height"] for b in layout["temperature-gpu-h100-02"]["bars"]}
    assert temps["gpu2"] > temps["gpu0"] > 0  # the overheating GPU stands out


def png_info(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_screenshot_is_a_non_blank_png(report, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(report))
    shot = tmp_path / "report.png"
    result = browse(tmp_path, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
                    "--hide-scrollbars", page.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert len(data) > 10_000
    width, height, pixels = png_info(data)
    assert (width, height) == WINDOW
    assert len(set(pixels)) > 16  # text, badges and bars: many distinct values, not an empty page


# The time to parse and lay out the page, measured by the page itself once everything is laid out.
_TIMING_PROBE = """
<pre id="timing"></pre>
<script>
const map = document.getElementById("fleet-heatmap").getBoundingClientRect();
document.getElementById("timing").textContent = JSON.stringify({
  ms: performance.now(), hosts: document.querySelectorAll("details.host").length,
  heatmap: [map.width, map.height]});
</script>
"""


def test_1000_host_report_is_small_and_opens_fast(tmp_path):
    from synthetic_fleet import synthetic_fleet

    fleet = synthetic_fleet(1000).to_dict()
    text = render_html(fleet)
    size = len(text.encode())
    assert size < 5_000_000, f"{size / 1e6:.2f} MB"
    gpus = sum(len(h["gpus"]) for h in fleet["hosts"])
    page = tmp_path / "report-1000.html"
    page.write_text(text)
    dom = dump_dom(tmp_path, page)
    assert dom.host_sections == 1000 and dom.heatmap_cells == gpus
    problem_hosts = {safe(h["host"]) for h in fleet["hosts"] if h["verdict"] in ("fail", "warn") and h["gpus"]}
    assert len(problem_hosts) == 18
    # bar charts only for the hosts with a problem (a temperature chart and one per precision), none for the rest
    assert {cid.split("-", 2)[-1] if cid.startswith("tflops") else cid.split("-", 1)[1] for cid in dom.charts} \
        == problem_hosts
    timed = tmp_path / "report-1000-timed.html"
    timed.write_text(text.replace("</body>", _TIMING_PROBE + "</body>"))
    timing = json.loads(dump_dom(tmp_path, timed).pre["timing"])
    assert timing["hosts"] == 1000 and timing["heatmap"][1] > 1000
    print(f"1000-host report: {size / 1e6:.2f} MB, laid out in {timing['ms']:.0f} ms")
    assert timing["ms"] < 5000
