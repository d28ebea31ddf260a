"""What a rollout tells people: the plan of ``--dry``, the terminal summary, and the rollout report
(``rollout.json`` and ``rollout-junit.xml`` in ``--out``: per wave its hosts, per-phase timings and the path of
its verify report; per node its final state, reason and per-phase timings)."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .state import ACTIVE, DONE, FAILED, PENDING, SKIPPED, RolloutState
from .waves import Count, plan_waves

REPORT_SCHEMA = "gpufleet.rollout.report"
REPORT_SCHEMA_VERSION = 1


def _names(names: list[str], limit: int = 20) -> str:
    return ", ".join(names[:limit]) + (f" ... (+{len(names) - limit})" if len(names) > limit else "") or "none"


def dry_plan_text(state: RolloutState, need: list[str], unchanged: list[str], planned: dict[str, list[str]],
                  canary: int, waves: list[Count]) -> str:
    lines = [f"gpufleet rollout --dry: {len(state.order)} host(s); nothing is drained or changed",
             f"already converged (no change planned): {_names(unchanged)}"]
    for i, wave in enumerate(plan_waves(need, canary=canary, waves=waves), start=1):
        kind = "canary" if i == 1 and canary else "wave"
        lines.append(f"wave {i} ({kind}): {_names(wave)}")
    for name in need:
        lines.append(f"  {name}: " + "; ".join(op.split(" | ", 1)[-1] for op in planned[name]))
    return "\n".join(lines)


def classify(state: RolloutState) -> dict[str, list[str]]:
    nodes = state.nodes
    return {
        "changed": [n for n in state.order if nodes[n].state == DONE and nodes[n].changed],
        "unchanged": [n for n in state.order if nodes[n].state == DONE and not nodes[n].changed],
        "failed": [n for n in state.order if nodes[n].state == FAILED],
        "skipped": [n for n in state.order if nodes[n].state == SKIPPED],
        "untouched": [n for n in state.order if nodes[n].state == PENDING],
        "in_progress": [n for n in state.order if nodes[n].state in ACTIVE],
        "drained_by_rollout": state.drained_now(),
    }


def summary_text(state: RolloutState, opts: Any) -> str:
    groups = classify(state)
    lines = [f"gpufleet rollout {state.rollout_id}: {state.status.upper()}",
             f"changed ({len(groups['changed'])}): {_names(groups['changed'])}",
             f"already converged ({len(groups['unchanged'])}): {_names(groups['unchanged'])}",
             f"failed ({len(groups['failed'])}): {_names(groups['failed'])}"]
    for n in groups["failed"]:
        lines.append(f"  {n}: {state.nodes[n].reason}")
    if groups["skipped"]:
        lines.append(f"skipped ({len(groups['skipped'])}): {_names(groups['skipped'])}")
        lines += [f"  {n}: {state.nodes[n].reason}" for n in groups["skipped"]]
    lines.append(f"untouched ({len(groups['untouched'])}): {_names(groups['untouched'])}")
    if groups["in_progress"]:
        lines.append(f"interrupted mid-phase ({len(groups['in_progress'])}): "
                     + _names([f"{n} ({state.nodes[n].state})" for n in groups["in_progress"]]))
    if groups["drained_by_rollout"]:
        lines.append(f"STILL DRAINED by this rollout ({len(groups['drained_by_rollout'])}): "
                     f"{_names(groups['drained_by_rollout'])}")
    for w in state.waves:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in w["phases"].items())
        lines.append(f"wave {w['index']} ({w['kind']}, {len(w['hosts'])} host(s)): {phases}"
                     + (f"; verify report {w['verify_report']}" if w.get("verify_report") else ""))
    lines.append(f"state: {opts.state_path()}   report: {Path(opts.out) / 'rollout.json'}")
    if state.status in ("interrupted", "stopped") or groups["failed"]:
        lines.append(f"continue with: gpufleet rollout {state.inventory} {state.deploy} --state "
                     f"{opts.state_path()} --resume")
    return "\n".join(lines)


def report_dict(state: RolloutState) -> dict[str, Any]:
    data = state.to_dict()
    data["schema"], data["schema_version"] = REPORT_SCHEMA, REPORT_SCHEMA_VERSION
    data["summary"] = {k: v for k, v in classify(state).items()}
    return data


def junit(state: RolloutState) -> str:
    root = ET.Element("testsuites", name=f"gpufleet rollout {state.rollout_id}")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    waves = list(state.waves)
    untouched = [n for n in state.order if state.nodes[n].state == PENDING]
    if untouched:
        waves.append({"index": None, "kind": "not run", "hosts": untouched, "phases": {}})
    for w in waves:
        name = f"wave {w['index']} ({w['kind']})" if w["index"] is not None else "not run"
        cases = []
        for n in w["hosts"]:
            rec = state.nodes[n]
            case = ET.Element("testcase", classname=name, name=n, time=f"{sum(rec.phases.values()):.3f}")
            props = ET.SubElement(case, "properties")
            for phase, seconds in rec.phases.items():
                ET.SubElement(props, "property", name=f"phase.{phase}.seconds", value=f"{seconds:.3f}")
            ET.SubElement(props, "property", name="state", value=rec.state)
            if rec.state == FAILED:
                ET.SubElement(case, "failure", message=rec.reason or "failed", type="rollout")
            elif rec.state != DONE:
                ET.SubElement(case, "skipped", message=rec.reason or f"not rolled out ({rec.state})")
            cases.append(case)
        counts = {"tests": len(cases), "failures": sum(1 for c in cases if c.find("failure") is not None),
                  "skipped": sum(1 for c in cases if c.find("skipped") is not None)}
        suite = ET.SubElement(root, "testsuite", name=name, time=f"{sum(w['phases'].values()):.3f}",
                              **{k: str(v) for k, v in counts.items()})
        props = ET.SubElement(suite, "properties")
        for phase, seconds in w["phases"].items():
            ET.SubElement(props, "property", name=f"phase.{phase}.seconds", value=f"{seconds:.3f}")
        suite.extend(cases)
        for k, v in counts.items():
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write(state: RolloutState, opts: Any) -> dict[str, Path]:
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "rollout.json", "junit": out / "rollout-junit.xml"}
    _write(paths["json"], json.dumps(report_dict(state), indent=1) + "\n")
    _write(paths["junit"], junit(state))
    return paths
