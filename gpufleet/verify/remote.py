"""What verify runs on a node, through the host's pyinfra connector: ONE command that reads the NVIDIA PCI devices,
checks the installed probe against the bundle by SHA-256 and runs it; the uploads of what differs; the node's
Prometheus textfile, written atomically."""

from __future__ import annotations

import io
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import StringCommand

from gpufleet import _pyinfra
from gpufleet.facts.pci import NvidiaPciDevices
from gpufleet.facts.sections import parse_sections, section

from . import ProbeOutputError, parse_probe_output
from .bundle import PROBE_REMOTE_DIR, BundleFile, ProbeBundle
from .settings import BENCH_PROFILES

TEXTFILE_NAME = "gpufleet_verify.prom"
# Seconds one probe run may take on a node (the benchmarks dominate; quick is <= 60 s per node on a real GPU).
PROBE_TIMEOUT_S = {"none": 120, "quick": 900, "full": 3600}

def probe_command(python: str, bench: str, remote_dir: str = PROBE_REMOTE_DIR, exporters: bool = False) -> str:
    if bench not in BENCH_PROFILES:
        raise ValueError(f"bench profile {bench!r}; allowed: {', '.join(BENCH_PROFILES)}")
    return (f"cd {shlex.quote(remote_dir)} && {shlex.quote(python)} probe.py --bench {bench}"
            + (" --exporters-stdin" if exporters else ""))


def probe_script(bundle: ProbeBundle, *, python: str = "python3", bench: str = "none",
                 remote_dir: str = PROBE_REMOTE_DIR, check_bundle: bool = True, exporters: bool = False) -> str:
    """The one command verify runs on a node: the PCI section (the ``NvidiaPciDevices`` fact's command), then —
    when the installed probe matches ``bundle`` file by file (``sha256sum -c``) — the probe in section ``probe``;
    otherwise the probe directory is created and the installed files' checksums are printed in section ``sums``
    (the caller uploads what differs and runs :func:`probe_command`). Sections: gpufleet.facts.sections."""
    q = shlex.quote
    run = section("probe", probe_command(python, bench, remote_dir, exporters))
    parts = [NvidiaPciDevices().command()]
    if not check_bundle:
        return "; ".join([*parts, run])
    manifest = " ".join(q(f"{f.sha256}  {f.name}") for f in bundle.files)
    names = " ".join(q(name) for name in bundle.names)
    parts.append(
        f"if printf '%s\\n' {manifest} | (cd {q(remote_dir)} 2>/dev/null && sha256sum -c --status -) 2>/dev/null; "
        f"then {run}; "
        f"else mkdir -p {q(remote_dir)}; "
        + section("sums", f"cd {q(remote_dir)} && sha256sum -- {names} 2>/dev/null; true")
        + "; fi")
    return "; ".join(parts)


@dataclass
class ScriptOutput:
    """What :func:`probe_script` printed: the PCI fact, the probe section (None when the bundle must be uploaded
    first) and the installed files' checksums."""

    pci: dict[str, Any] | None
    probe_lines: list[str] | None
    probe_rc: int | None
    remote_sums: dict[str, str] = field(default_factory=dict)


def parse_script_output(lines: list[str]) -> ScriptOutput:
    sections = parse_sections(lines)
    pci = NvidiaPciDevices().process(lines) if ("lspci" in sections or "sysfs" in sections) else None
    probe = sections.get("probe")
    sums: dict[str, str] = {}
    if "sums" in sections:
        for line in sections["sums"].lines:
            parts = line.split(None, 1)
            if len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                sums[parts[1].lstrip("*").strip()] = parts[0]
    return ScriptOutput(pci=pci, probe_lines=None if probe is None else probe.lines,
                        probe_rc=None if probe is None else probe.rc, remote_sums=sums)


class ProbeFailed(Exception):
    """The node answered, but the probe could not be installed or produced no document."""


def probe_document(lines: list[str] | None, rc: int | None) -> dict[str, Any]:
    """The probe document in the probe section's lines, or ProbeFailed with the reason (exit status, last line)."""
    if lines is None:
        raise ProbeFailed("the probe did not run")
    text = "\n".join(lines)
    try:
        return parse_probe_output(text)
    except ProbeOutputError:
        tail = [line.strip() for line in lines if line.strip()][-3:]
        detail = " | ".join(tail)[-400:] or "no output"
        status = "cut short" if rc is None else f"exit status {rc}"
        raise ProbeFailed(f"{status}: {detail}") from None


# ------------------------------------------------------------------------------------------ pyinfra plumbing


def connector_kwargs(host: Any) -> dict[str, Any]:
    """The connector arguments (``_sudo``, ``_su_user``, ``_timeout``...) that apply to this host, from its data and
    the pyinfra config, as pyinfra computes them for a fact."""
    return _pyinfra.connector_arguments(host)


def _run(host: Any, command: str, kwargs: Mapping[str, Any], timeout: float | None,
         stdin: str | None = None) -> tuple[bool, list[str], str]:
    """(ok, stdout lines, stderr text)."""
    args = dict(kwargs)
    args["_timeout"] = timeout
    if stdin is not None:
        args["_stdin"] = stdin
    ok, output = host.run_shell_command(StringCommand(command), **args)
    return ok, list(output.stdout_lines), "\n".join(output.stderr_lines)


def install_probe(host: Any, files: Iterable[BundleFile], kwargs: Mapping[str, Any],
                  remote_dir: str = PROBE_REMOTE_DIR) -> list[str]:
    """Upload ``files`` into the node's probe directory (it exists: probe_script created it); returns their names."""
    uploaded = []
    for f in files:
        if not host.put_file(f.path, f"{remote_dir}/{f.name}", **kwargs):
            raise ProbeFailed(f"could not upload {f.name} to {remote_dir} (see the error above)")
        uploaded.append(f.name)
    return uploaded


def run_probe(host: Any, bundle: ProbeBundle, *, python: str, bench: str, kwargs: Mapping[str, Any],
              check_bundle: bool = True, remote_dir: str = PROBE_REMOTE_DIR, exporters: Mapping | None = None
              ) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """Run the probe on a connected host (installing or updating it first where needed). ``exporters``: the
    endpoints the probe scrapes (``{name: {"url", "user", "password"}}``), sent on its stdin (a password never
    stands in a command line).

    Returns (probe document, NvidiaPciDevices fact or None, names of the files uploaded); raises ProbeFailed."""
    timeout = PROBE_TIMEOUT_S[bench]
    stdin = json.dumps(dict(exporters)) + "\n" if exporters else None
    script = probe_script(bundle, python=python, bench=bench, remote_dir=remote_dir, check_bundle=check_bundle,
                          exporters=bool(exporters))
    ok, lines, stderr = _run(host, script, kwargs, timeout, stdin)
    out = parse_script_output(lines)
    uploaded: list[str] = []
    if out.probe_lines is None and check_bundle:
        if "sums" not in parse_sections(lines):
            raise ProbeFailed(f"the node's shell did not run verify's command: {(stderr or ' '.join(lines))[-300:]}")
        uploaded = install_probe(host, bundle.changed(out.remote_sums), kwargs, remote_dir)
        ok, lines, stderr = _run(host, section("probe", probe_command(python, bench, remote_dir, bool(exporters))),
                                 kwargs, timeout, stdin)
        second = parse_script_output(lines)
        out.probe_lines, out.probe_rc = second.probe_lines, second.probe_rc
    if out.probe_lines is not None and stderr.strip():
        out.probe_lines = out.probe_lines + stderr.splitlines()
    return probe_document(out.probe_lines, out.probe_rc), out.pci, uploaded


def write_node_textfile(host: Any, text: str, directory: str, kwargs: Mapping[str, Any],
                        staging_dir: str = PROBE_REMOTE_DIR) -> None:
    """Write the node's Prometheus textfile into ``directory`` atomically: upload beside the probe, copy to a
    dot-file in ``directory`` (node_exporter ignores files not ending in .prom) and rename it into place."""
    q = shlex.quote
    staging = f"{staging_dir}/.{TEXTFILE_NAME}.upload"
    tmp = f"{directory}/.{TEXTFILE_NAME}.tmp"
    final = f"{directory}/{TEXTFILE_NAME}"
    if not host.put_file(io.BytesIO(text.encode("utf-8")), staging, **kwargs):
        raise OSError(f"could not upload the textfile to {staging}")
    ok, lines, stderr = _run(host, f"mkdir -p {q(directory)} && cp {q(staging)} {q(tmp)} && chmod 0644 {q(tmp)} "
                                   f"&& mv -f {q(tmp)} {q(final)}; rc=$?; rm -f {q(staging)}; exit $rc", kwargs, 60)
    if not ok:
        raise OSError(f"could not write {final}: {(stderr or ' '.join(lines)).strip()[-300:]}")


def _disconnect(host: Any) -> None:
    _pyinfra.close_connection(host)
