"""The HTML report of a recorded fleet (the probe documents in tests/fixtures/verify/) opened in headless Chromium:
the browser's DOM has the SVG charts with one bar per GPU, the bars are laid out with heights that follow the
values (a lost GPU: an empty bar), and a screenshot of the page is a real, non-blank PNG.

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

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and "chart" in a.get("class", "").split():
            self._chart = a.get("id", "")
            self.charts[self._chart] = []
        elif tag == "rect" and self._chart is not None and "bar" in a.get("class", "").split():
            self.charts[self._chart].append(a)
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
        if not gpus:
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


# Injected into a copy of the report (which has no script of its own): the layout as the browser computed it.
_LAYOUT_PROBE = """
<pre id="layout"></pre>
<script>
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
    healthy = layout["tflops-bf16-gpu-h100-01"]["bars"]
    assert len({round(b["height"]) for b in healthy}) == 1 and healthy[0]["height"] > 50
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
