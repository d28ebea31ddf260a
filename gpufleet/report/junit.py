"""JUnit XML for CI systems: one <testsuite> per host, one <testcase> per check.

fail -> <failure>, unreachable -> <error> (the host could not be verified), skip -> <skipped>, warn -> a passing
test case whose <system-out> starts with ``WARN:``. Test case names are ``<check> [gpuN (UUID)]``; the class name
is the host.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from gpufleet.results import FleetResult

from ._common import as_report, gpu_label


def _text(check: dict[str, Any]) -> str:
    text = check["message"]
    if check.get("remediation"):
        text += f"\nremediation: {check['remediation']}"
    return text


def render_junit(report: FleetResult | dict[str, Any]) -> str:
    data = as_report(report)
    stamp = (data.get("generated_at") or "").rstrip("Z").split(".")[0]
    root = ET.Element("testsuites", name="gpufleet verify")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for host in sorted(data["hosts"], key=lambda h: h["host"]):
        checks = host["checks"]
        counts = {
            "tests": len(checks),
            "failures": sum(1 for c in checks if c["verdict"] == "fail"),
            "errors": sum(1 for c in checks if c["verdict"] == "unreachable"),
            "skipped": sum(1 for c in checks if c["verdict"] == "skip"),
        }
        for k, v in counts.items():
            totals[k] += v
        suite = ET.SubElement(root, "testsuite", name=host["host"], hostname=host["host"], timestamp=stamp,
                              time="0", **{k: str(v) for k, v in counts.items()})
        props = ET.SubElement(suite, "properties")
        probe = host.get("probe") or {}
        for name, value in (("status", host.get("status")), ("verdict", host.get("verdict")),
                            ("driver_version", probe.get("driver_version")),
                            ("cuda_driver_version", probe.get("cuda_driver_version")),
                            ("gpu_count", probe.get("gpu_count"))):
            if value is not None:
                ET.SubElement(props, "property", name=name, value=str(value))
        for c in checks:
            name = f"{c['check']} {gpu_label(c)}".strip()
            case = ET.SubElement(suite, "testcase", classname=host["host"], name=name, time="0")
            verdict = c["verdict"]
            if verdict == "fail":
                ET.SubElement(case, "failure", message=c["message"], type=c["check"]).text = _text(c)
            elif verdict == "unreachable":
                ET.SubElement(case, "error", message=c["message"], type="unreachable").text = _text(c)
            elif verdict == "skip":
                ET.SubElement(case, "skipped", message=c["message"])
            elif verdict == "warn":
                ET.SubElement(case, "system-out").text = "WARN: " + _text(c)
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
