"""What a rollout tells people: the plan of ``--dry``, the terminal summary, and the rollout report
(``rollout.json``, ``rollout-junit.xml`` and ``rollout.html`` in ``--out``: per wave its hosts, per-phase timings
and the path of its verify report; per node its final state, reason and per-phase timings).

``rollout.html`` reads at 1000 hosts like verify's HTML report (and uses its page, CSS and badges): the summary
first (outcome, hosts by final state, failed hosts first with their reason, hosts still drained), per-wave and
per-phase timings with each wave's verify report linked, then every host in one collapsed table. Self-contained:
inline CSS, no script, no external asset."""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path
from typing import Any

from gpufleet.control_files import write_atomic
from gpufleet.report.html import badge, page, table

from .state import ACTIVE, DONE, FAILED, PENDING, SKIPPED, RolloutState, signals_held
from .waves import Count, plan_waves

REPORT_SCHEMA = "gpufleet.rollout.report"
REPORT_SCHEMA_VERSION = 1


def abbreviated(names: list[str], limit: int = 20) -> str:
    """The first ``limit`` names and how many more (a 10,000-host line helps nobody; the JSON lists every one)."""
    return ", ".join(names[:limit]) + (f" ... (+{len(names) - limit})" if len(names) > limit else "") or "none"


def dry_plan_text(state: RolloutState, need: list[str], unchanged: list[str], planned: dict[str, list[str]],
                  canary: int, waves: list[Count], *, to_confirm: bool = False) -> str:
    """The waves and what would change on each host: ``--dry``'s output, or the plan the rollout asks to confirm."""
    lines = [f"gpufleet rollout: {len(state.order)} host(s); the plan to confirm" if to_confirm else
             f"gpufleet rollout --dry: {len(state.order)} host(s); nothing is drained or changed",
             f"already converged (no change planned): {abbreviated(unchanged)}"]
    for i, wave in enumerate(plan_waves(need, canary=canary, waves=waves), start=1):
        kind = "canary" if i == 1 and canary else "wave"
        lines.append(f"wave {i} ({kind}): {abbreviated(wave)}")
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
        "may_be_drained": [n for n in state.order if nodes[n].drain_uncertain and not nodes[n].drained_by_rollout],
        "failed_not_drained": [n for n in state.order if nodes[n].state == FAILED and nodes[n].not_drained],
    }


def summary_text(state: RolloutState, opts: Any) -> str:
    groups = classify(state)
    stopped_by = state.interruption if state.status == "interrupted" else None
    lines = [f"gpufleet rollout {state.rollout_id}: {state.status.upper()}"
             + (f" by {stopped_by['signal']}" if stopped_by else ""),
             f"changed ({len(groups['changed'])}): {abbreviated(groups['changed'])}",
             f"already converged ({len(groups['unchanged'])}): {abbreviated(groups['unchanged'])}",
             f"failed ({len(groups['failed'])}): {abbreviated(groups['failed'])}"]
    for n in groups["failed"]:
        lines.append(f"  {n}: {state.nodes[n].reason}")
    if groups["failed_not_drained"]:  # apart from the nodes left drained: these are in service
        lines.append(f"failed, NOT drained ({len(groups['failed_not_drained'])}): "
                     + abbreviated([f"{n} ({state.nodes[n].not_drained})" for n in groups["failed_not_drained"]]))
    if groups["skipped"]:
        lines.append(f"skipped ({len(groups['skipped'])}): {abbreviated(groups['skipped'])}")
        lines += [f"  {n}: {state.nodes[n].reason}" for n in groups["skipped"]]
    lines.append(f"untouched ({len(groups['untouched'])}): {abbreviated(groups['untouched'])}")
    if groups["in_progress"]:
        lines.append(f"interrupted mid-phase ({len(groups['in_progress'])}): "
                     + abbreviated([f"{n} ({state.nodes[n].state})" for n in groups["in_progress"]]))
    if groups["drained_by_rollout"]:
        lines.append(f"STILL DRAINED by this rollout ({len(groups['drained_by_rollout'])}): "
                     f"{abbreviated(groups['drained_by_rollout'])}")
    if groups["may_be_drained"]:
        lines.append(f"MAY BE DRAINED by this rollout ({len(groups['may_be_drained'])}: its drain command was cut "
                     f"off and could not be asked again; --resume drains and then resumes them): "
                     f"{abbreviated(groups['may_be_drained'])}")
    for w in state.waves:
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in w["phases"].items())
        lines.append(f"wave {w['index']} ({w['kind']}, {len(w['hosts'])} host(s)): {phases}"
                     + (f"; verify report {w['verify_report']}" if w.get("verify_report") else ""))
    lines.append(f"state: {opts.state_path()}   report: {Path(opts.out) / 'rollout.html'} (and rollout.json)")
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


PHASES = ("drain", "converge", "verify", "return")
# a final state's colour in the page: the verify report's verdict colours
_STATE_COLOUR = {"changed": "pass", "unchanged": "pass", "failed": "fail", "skipped": "warn", "untouched": "skip",
                 "in_progress": "warn", "drained_by_rollout": "fail", "may_be_drained": "fail",
                 "failed_not_drained": "fail"}
_STATE_LABEL = {"changed": "changed", "unchanged": "already converged", "failed": "failed", "skipped": "skipped",
                "untouched": "untouched", "in_progress": "interrupted mid-phase",
                "drained_by_rollout": "still drained by this rollout",
                "may_be_drained": "may be drained by this rollout (drain command cut off)",
                "failed_not_drained": "failed before their drain (not drained)"}
_STATUS_COLOUR = {"finished": "pass", "stopped": "fail", "interrupted": "warn", "running": "warn"}


def _verify_link(wave: dict[str, Any], out: Path) -> str:
    """The wave's verify report (its HTML beside the JSON the state records), relative to ``out``."""
    if not wave.get("verify_report"):
        return "–"
    target = Path(wave["verify_report"]).with_name("report.html")
    try:
        href = os.path.relpath(target, out)
    except ValueError:  # another drive (Windows): an absolute link
        href = str(target)
    summary = wave.get("verify_summary") or {}
    verdict = summary.get("verdict")
    text = f"{summary.get('hosts_ok', '?')}/{summary.get('hosts', '?')} hosts verified" if summary else "report"
    return (badge(verdict) + " " if verdict else "") + f'<a href="{escape(href)}">{escape(text)}</a>'


def html(state: RolloutState, out: str | Path) -> str:
    """The rollout report as one self-contained HTML page (see the module docstring)."""
    out = Path(out)
    groups = classify(state)
    nodes = state.nodes
    total = len(state.order)
    counts = [(k, len(v)) for k, v in groups.items() if v]
    headline = ", ".join(f"{n} {_STATE_LABEL[k]}" for k, n in counts) or "no host"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.started_at))
    options = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in state.options.items()
                        if v is not None and k != "canary_failed")
    body = [f"<h1>gpufleet rollout {escape(state.rollout_id)}</h1>",
            f'<p class="headline">{badge(_STATUS_COLOUR.get(state.status, "skip"), state.status)} '
            f'<span id="headline">{escape(f"{total} host(s): {headline}")}</span></p>',
            f'<p class="facts">{escape(state.inventory)} · {escape(state.deploy)} · started {escape(started)} · '
            f'{escape(options)}</p>',
            '<h2 id="states">Hosts by final state</h2>',
            table(["state", "hosts"], [[badge(_STATE_COLOUR[k], _STATE_LABEL[k]), str(n)] for k, n in counts],
                  raw=True)]
    if groups["drained_by_rollout"]:
        body.append(f'<p id="still-drained">{badge("fail", "still drained")} '
                    f"{escape(abbreviated(groups['drained_by_rollout']))}: out of the scheduler until someone "
                    "resumes them (or <code>--resume</code> passes them)</p>")
    body.append('<h2 id="failed">Failed and skipped hosts</h2>')
    bad = groups["failed"] + groups["skipped"]
    if bad:
        body.append(table(["host", "state", "wave", "reason"],
                          [[escape(n), badge(_STATE_COLOUR[nodes[n].state], nodes[n].state),
                            escape(str(nodes[n].wave or "–")), escape(nodes[n].reason or "")] for n in bad],
                          raw=True))
    else:
        body.append("<p>None.</p>")
    body.append('<h2 id="waves">Waves</h2>')
    wave_rows, phase_totals = [], dict.fromkeys(PHASES, 0.0)
    for w in state.waves:
        for phase in PHASES:
            phase_totals[phase] += w["phases"].get(phase, 0.0)
        failed = [n for n in w["hosts"] if nodes[n].state == FAILED]
        wave_rows.append([str(w["index"]), escape(w["kind"]), str(len(w["hosts"])),
                          str(sum(1 for n in w["hosts"] if nodes[n].state == DONE and nodes[n].changed)),
                          str(len(failed)),
                          *[escape(f"{w['phases'][p]:.1f}") if p in w["phases"] else "–" for p in PHASES],
                          escape(f"{sum(w['phases'].values()):.1f}"), _verify_link(w, out)])
    if wave_rows:
        body.append(table(["wave", "kind", "hosts", "changed", "failed", *[f"{p} s" for p in PHASES], "total s",
                           "verify gate"], wave_rows, raw=True))
    else:
        body.append("<p>No wave ran.</p>")
    passes = [["every host" if p.get("hosts") is None else f"{p['hosts']} host(s)", f"{p.get('seconds', 0):.1f}"]
              for p in state.preflight]
    body.append('<h2 id="phases">Time by phase</h2>')
    preflight_s = sum(p.get("seconds", 0) for p in state.preflight)
    body.append(table(["phase", "seconds"], [["validation + preflight (whole fleet)", f"{preflight_s:.1f}"],
                                             *[[p, f"{phase_totals[p]:.1f}"] for p in PHASES]]))
    if passes:
        body.append('<p class="facts">Whole-fleet validation and preflight (<code>pyinfra --dry</code>) before any '
                    "change: " + "; ".join(f"{h}, {s} s" for h, s in passes) + "</p>")
    elif state.waves:
        body.append('<p class="facts">No separate whole-fleet pass: one wave over every host, whose own pyinfra run '
                    "validated and preflighted every host before any change.</p>")
    # every host, in inventory order: collapsed, the summary above says what needs reading
    rows = []
    for n in state.order:
        rec = nodes[n]
        key = next((k for k in ("failed", "skipped", "in_progress", "untouched", "changed", "unchanged")
                    if n in groups[k]), "untouched")
        rows.append([escape(n), badge(_STATE_COLOUR[key], _STATE_LABEL[key]), escape(str(rec.wave or "–")),
                     escape(f"{sum(rec.phases.values()):.1f}") if rec.phases else "–", escape(rec.reason or "")])
    body.append('<h2 id="hosts">Hosts</h2>')
    body.append(f'<details class="hosts"><summary>all {total} host(s) in inventory order: final state, wave, seconds, '
                "reason</summary>" + table(["host", "state", "wave", "seconds", "reason"], rows, raw=True)
                + "</details>")
    return page(f"gpufleet rollout {state.rollout_id}", body)


def _write(path: Path, text: str) -> None:
    with signals_held():  # a signal waits for the write: no temporary file left beside the report
        write_atomic(path, text)  # a random temporary name beside it, then os.replace: no symlink followed


def write(state: RolloutState, opts: Any) -> dict[str, Path]:
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "rollout.json", "junit": out / "rollout-junit.xml", "html": out / "rollout.html"}
    _write(paths["json"], json.dumps(report_dict(state), indent=1) + "\n")
    _write(paths["junit"], junit(state))
    _write(paths["html"], html(state, out))
    return paths
