"""The fleet runner of ``gpufleet verify INVENTORY [--limit ...] [--bench ...] [--out DIR]``.

1. The inventory is loaded with pyinfra's own loader (``pyinfra_cli.inventory.make_inventory``: the same inventory
   files, ``group_data/`` directories and ``ssh_*`` host data as ``pyinfra INVENTORY deploy.py``) into a pyinfra
   ``State``; ``--limit`` takes host names, group names or glob patterns, like pyinfra's.
2. Every host's ``gpufleet_*`` configuration is validated (the same :func:`gpufleet.config.validate_pyinfra_inventory`
   the converge deploy runs) and so are the ``gpufleet_verify_*`` keys (:data:`VERIFY_KEYS`) before any host is
   contacted. Hosts whose ``gpufleet_stages`` is empty (a monitoring host) are not GPU nodes and are left out.
3. All hosts in parallel on pyinfra's gevent pool: connect (an unreachable host becomes an ``unreachable`` result,
   the others go on); ONE remote command reads the NVIDIA PCI devices (the ``NvidiaPciDevices`` fact's command:
   NVSwitches, GPU count), compares the probe installed under ``/opt/gpufleet/probe/`` with the control machine's
   copy by SHA-256 and, when it matches, runs it with the node's ``python3``. Otherwise only the files that differ
   are uploaded and the probe is run in a second command. The probe bundle is ``gpufleet/probe/`` plus
   ``pynvml.py``, the single-file module of the control machine's nvidia-ml-py: the node needs Python 3.9+ and
   the NVIDIA driver, no pip, no internet. A probe that cannot run or prints no document is ``probe_failed``.
4. Checks against the expected state built from the host's NodeConfig (:mod:`gpufleet.verify.expected`), fleet
   outliers, every report written into ``--out`` (compared with the previous report there), and each node's own
   Prometheus textfile written, atomically, into its node_exporter textfile directory
   (``gpufleet_verify_textfile_dir``, default :data:`DEFAULT_TEXTFILE_DIR`).

Exit codes: 0 nothing failed (warnings allowed), 1 a check failed or a host was unreachable, 2 verify could not
run (bad inventory, bad configuration, no host reachable).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from gevent import monkey

# pyinfra's connectors run on gevent: patch the standard library before pyinfra (and paramiko, whose transport is a
# thread) is imported, as pyinfra's own CLI does on import.
if not monkey.is_module_patched("socket"):
    monkey.patch_all()

import gevent  # noqa: E402
from pyinfra.api import Config, State, StringCommand  # noqa: E402
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments  # noqa: E402
from pyinfra.api.exceptions import ConnectError, NoGroupError  # noqa: E402
from pyinfra.context import ctx_config, ctx_inventory, ctx_state  # noqa: E402
from pyinfra_cli.inventory import make_inventory  # noqa: E402
from pyinfra_cli.util import exec_file  # noqa: E402

from gpufleet import connection  # noqa: E402
from gpufleet.config import (  # noqa: E402
    ConfigError,
    ConfigErrors,
    NodeConfig,
    did_you_mean,
    register_namespace,
    validate_pyinfra_inventory,
)
from gpufleet.facts._sections import parse_sections, section  # noqa: E402
from gpufleet.facts.pci import NvidiaPciDevices  # noqa: E402
from gpufleet.probe import PROBE_DIR, PROBE_FILES  # noqa: E402
from gpufleet.report import REPORT_FILES, render_prometheus, write_reports  # noqa: E402

from . import EXIT_COULD_NOT_RUN, FAIL, UNREACHABLE, WARN, ProbeOutputError, parse_probe_output  # noqa: E402
from .checks import build_fleet_result, evaluate_host, probe_failed_host, unreachable_host  # noqa: E402
from .expected import expected_state  # noqa: E402
from .model import FleetResult, HostResult, exit_code  # noqa: E402

PROBE_REMOTE_DIR = "/opt/gpufleet/probe"
DEFAULT_TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
TEXTFILE_NAME = "gpufleet_verify.prom"
DEFAULT_OUT = "gpufleet-verify"
BENCH_PROFILES = ("none", "quick", "full")
# Seconds one probe run may take on a node (the benchmarks dominate; quick is <= 60 s per node on a real GPU).
PROBE_TIMEOUT_S = {"none": 120, "quick": 900, "full": 3600}
NVML_MODULE = "pynvml"

# ------------------------------------------------------------------------------------------ verify settings

VERIFY_PREFIX = "gpufleet_verify_"
register_namespace(VERIFY_PREFIX)

_ABS_PATH_RE = re.compile(r"^/[^\x00\n\r]*$")
_COMMAND_RE = re.compile(r"^[A-Za-z0-9_.+/-]+$")
VERIFY_KEYS: dict[str, str] = {
    "gpufleet_verify_textfile_dir": "an absolute directory path (node_exporter's --collector.textfile.directory; "
                                    f"default {DEFAULT_TEXTFILE_DIR}), or False to write no textfile on the node",
    "gpufleet_verify_python": "the node's Python 3 (>= 3.9) interpreter: a command name or an absolute path "
                              "(default python3)",
    "gpufleet_verify_out": "a local directory for the reports (pyinfra verify/gpu_node.py; gpufleet verify uses "
                           f"--out; default ./{DEFAULT_OUT})",
    "gpufleet_verify_bench": "none, quick or full (pyinfra verify/gpu_node.py; gpufleet verify uses --bench; "
                             "default none)",
}


@dataclass(frozen=True)
class VerifySettings:
    """A host's ``gpufleet_verify_*`` settings, validated."""

    textfile_dir: str | None = DEFAULT_TEXTFILE_DIR  # None: no textfile on the node
    python: str = "python3"
    out: str = DEFAULT_OUT
    bench: str = "none"


def load_verify_settings(host_name: str, data: Mapping[str, Any]) -> tuple[VerifySettings | None, list[ConfigError]]:
    """(settings, errors) for one host's data; strict: an unknown ``gpufleet_verify_*`` key is an error."""
    errors: list[ConfigError] = []
    ours = {k: v for k, v in data.items() if isinstance(k, str) and k.startswith(VERIFY_PREFIX)}
    for key in ours:
        if key not in VERIFY_KEYS:
            errors.append(ConfigError(host_name, key, ours[key], "one of " + ", ".join(VERIFY_KEYS)
                                      + did_you_mean(key, VERIFY_KEYS), "unknown gpufleet verify setting"))
    values: dict[str, Any] = {}
    key = "gpufleet_verify_textfile_dir"
    if key in ours and ours[key] is not None:
        value = ours[key]
        if value is False:
            values["textfile_dir"] = None
        elif isinstance(value, str) and _ABS_PATH_RE.match(value) and ".." not in value.split("/"):
            values["textfile_dir"] = value.rstrip("/") or "/"
        else:
            errors.append(ConfigError(host_name, key, value, VERIFY_KEYS[key], "not an absolute directory path"))
    key = "gpufleet_verify_python"
    if key in ours and ours[key] is not None:
        value = ours[key]
        if isinstance(value, str) and _COMMAND_RE.match(value):
            values["python"] = value
        else:
            errors.append(ConfigError(host_name, key, value, VERIFY_KEYS[key], "not a command"))
    key = "gpufleet_verify_out"
    if key in ours and ours[key] is not None:
        value = ours[key]
        if isinstance(value, (str, os.PathLike)) and str(value).strip() and "\n" not in str(value):
            values["out"] = str(value)
        else:
            errors.append(ConfigError(host_name, key, value, VERIFY_KEYS[key], "not a directory path"))
    key = "gpufleet_verify_bench"
    if key in ours and ours[key] is not None:
        value = ours[key]
        if value in BENCH_PROFILES:
            values["bench"] = value
        else:
            errors.append(ConfigError(host_name, key, value, ", ".join(BENCH_PROFILES)
                                      + did_you_mean(value, BENCH_PROFILES), "unknown bench profile"))
    if errors:
        return None, errors
    return VerifySettings(**values), []


def validate_verify_inventory(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, VerifySettings]:
    """Every host's verify settings; ONE :class:`ConfigErrors` with all hosts' errors."""
    settings: dict[str, VerifySettings] = {}
    errors: list[ConfigError] = []
    for name, data in hosts:
        found, host_errors = load_verify_settings(name, data)
        errors.extend(host_errors)
        if found is not None:
            settings[name] = found
    if errors:
        raise ConfigErrors(errors)
    return settings


# ------------------------------------------------------------------------------------------ the probe bundle


@dataclass(frozen=True)
class BundleFile:
    name: str  # file name under the remote probe directory
    path: str  # local file
    sha256: str


@dataclass(frozen=True)
class ProbeBundle:
    """What is shipped to ``/opt/gpufleet/probe/``: gpufleet's probe directory and nvidia-ml-py's ``pynvml.py``."""

    files: tuple[BundleFile, ...]
    nvml_py_version: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    def changed(self, remote_sums: Mapping[str, str]) -> list[BundleFile]:
        return [f for f in self.files if remote_sums.get(f.name) != f.sha256]


class VerifyError(Exception):
    """Verify cannot run at all (exit code 2); the message says why."""


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def nvml_module_path() -> str:
    """The control machine's nvidia-ml-py ``pynvml.py`` (a single pure-Python module: shipped as is)."""
    spec = importlib.util.find_spec(NVML_MODULE)
    origin = spec.origin if spec else None
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        raise VerifyError("nvidia-ml-py's pynvml.py is not installed on the control machine (pip install "
                          "nvidia-ml-py): verify ships it to the nodes with the probe")
    return origin


@lru_cache(maxsize=1)
def probe_bundle() -> ProbeBundle:
    paths = [(name, os.path.join(PROBE_DIR, name)) for name in PROBE_FILES]
    paths.append((f"{NVML_MODULE}.py", nvml_module_path()))
    try:
        version = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        version = None
    return ProbeBundle(files=tuple(BundleFile(name, path, _sha256(path)) for name, path in paths),
                       nvml_py_version=version)


# ------------------------------------------------------------------------------------------ remote commands


def probe_command(python: str, bench: str, remote_dir: str = PROBE_REMOTE_DIR) -> str:
    if bench not in BENCH_PROFILES:
        raise ValueError(f"bench profile {bench!r}; allowed: {', '.join(BENCH_PROFILES)}")
    return f"cd {shlex.quote(remote_dir)} && {shlex.quote(python)} probe.py --bench {bench}"


def probe_script(bundle: ProbeBundle, *, python: str = "python3", bench: str = "none",
                 remote_dir: str = PROBE_REMOTE_DIR, check_bundle: bool = True) -> str:
    """The one command verify runs on a node: the PCI section (the ``NvidiaPciDevices`` fact's command), then —
    when the installed probe matches ``bundle`` file by file (``sha256sum -c``) — the probe in section ``probe``;
    otherwise the probe directory is created and the installed files' checksums are printed in section ``sums``
    (the caller uploads what differs and runs :func:`probe_command`). Sections: gpufleet.facts._sections."""
    q = shlex.quote
    run = section("probe", probe_command(python, bench, remote_dir))
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
    arguments, _ = pop_global_arguments(host.state, host, {})
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS}


def _run(host: Any, command: str, kwargs: Mapping[str, Any], timeout: float | None) -> tuple[bool, list[str], str]:
    """(ok, stdout lines, stderr text)."""
    args = dict(kwargs)
    args["_timeout"] = timeout
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
              check_bundle: bool = True, remote_dir: str = PROBE_REMOTE_DIR
              ) -> tuple[dict[str, Any], dict[str, Any] | None, list[str]]:
    """Run the probe on a connected host (installing or updating it first where needed).

    Returns (probe document, NvidiaPciDevices fact or None, names of the files uploaded); raises ProbeFailed."""
    timeout = PROBE_TIMEOUT_S[bench]
    script = probe_script(bundle, python=python, bench=bench, remote_dir=remote_dir, check_bundle=check_bundle)
    ok, lines, stderr = _run(host, script, kwargs, timeout)
    out = parse_script_output(lines)
    uploaded: list[str] = []
    if out.probe_lines is None and check_bundle:
        if "sums" not in parse_sections(lines):
            raise ProbeFailed(f"the node's shell did not run verify's command: {(stderr or ' '.join(lines))[-300:]}")
        uploaded = install_probe(host, bundle.changed(out.remote_sums), kwargs, remote_dir)
        ok, lines, stderr = _run(host, section("probe", probe_command(python, bench, remote_dir)), kwargs, timeout)
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
    try:
        host.disconnect()
        client = getattr(host.connector, "client", None)
        if client is not None:
            client.close()
    except Exception:  # noqa: BLE001 - closing a connection of a finished run; nothing to do about it
        pass


# ------------------------------------------------------------------------------------------ inventory


def split_limit(limit: Iterable[str] | str | None) -> list[str]:
    if limit is None:
        return []
    items = [limit] if isinstance(limit, str) else list(limit)
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def match_limit(inventory: Any, patterns: list[str]) -> tuple[list[Any], list[str]]:
    """(hosts matching any pattern: a group name, a host name or a glob over host names, as pyinfra's --limit;
    patterns that matched nothing)."""
    chosen: list[Any] = []
    unmatched = []
    for pattern in patterns:
        try:
            hosts = list(inventory.get_group(pattern))
        except NoGroupError:
            hosts = [h for h in inventory if fnmatch(h.name, pattern)]
        if not hosts:
            unmatched.append(pattern)
        chosen.extend(h for h in hosts if h not in chosen)
    return chosen, unmatched


def _describe(exc: BaseException) -> str:
    """``SyntaxError: ... (in group_data/a100.py)`` for an exception raised by the user's inventory files."""
    inner = getattr(exc, "exception", None)  # pyinfra_cli's UnexpectedExternalError wraps the user's exception
    where = getattr(exc, "filename", None) if inner is not None else None
    error = inner if isinstance(inner, BaseException) else exc
    text = f"{type(error).__name__}: {error}".rstrip(": ")
    return f"{text} (in {where})" if where and str(where) not in text else text


def load_inventory(inventory_arg: str, limit: Iterable[str] | str | None = None, *, cwd: str | None = None
                   ) -> tuple[Any, list[Any]]:
    """(pyinfra State with the inventory, hosts to verify). Raises VerifyError (exit 2) on a bad inventory."""
    cwd = cwd or os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # as pyinfra's CLI: inventories and group_data may import modules beside them
    looks_like_file = inventory_arg.endswith(".py") or os.sep in inventory_arg
    if looks_like_file and not Path(inventory_arg).exists():
        raise VerifyError(f"inventory {inventory_arg}: no such file")
    state = State(check_for_changes=False)
    state.cwd = cwd
    config = Config()
    config_file = Path(cwd) / "config.py"  # pyinfra's optional config file (SUDO, PARALLEL, ...)
    try:
        with ctx_state.use(state), ctx_config.use(config):
            if config_file.exists():
                exec_file(str(config_file))
            inventory = make_inventory(inventory_arg, cwd=cwd)
    except Exception as exc:  # noqa: BLE001 - any error in the user's inventory or group_data files
        raise VerifyError(f"inventory {inventory_arg} could not be loaded: {_describe(exc)}") from None
    patterns = split_limit(limit)
    chosen = None
    if patterns:
        chosen, unmatched = match_limit(inventory, patterns)
        if unmatched:
            raise VerifyError(f"--limit {','.join(unmatched)}: no host or group of {inventory_arg} matches; "
                              f"hosts: {', '.join(h.name for h in inventory)}")
    state.init(inventory, config, initial_limit=chosen)
    hosts = [h for h in inventory if state.is_host_in_limit(h)]
    if not hosts:
        raise VerifyError(f"inventory {inventory_arg} has no hosts")
    return state, hosts


# ------------------------------------------------------------------------------------------ the run


@dataclass
class HostRun:
    """One host's part of the run."""

    name: str
    result: HostResult
    seconds: float = 0.0
    uploaded: list[str] = field(default_factory=list)
    textfile: str | None = None  # where the node's textfile was written
    textfile_error: str | None = None
    connected: bool = False


@dataclass
class VerifyRun:
    fleet: FleetResult
    hosts: list[HostRun]
    paths: dict[str, Path]
    skipped: dict[str, str]
    seconds: float

    @property
    def exit_code(self) -> int:
        return exit_code(self.fleet)


def verify_host(host: Any, config: NodeConfig, settings: VerifySettings, bundle: ProbeBundle, bench: str
                ) -> HostRun:
    """Connect, run the probe (installing it where needed) and evaluate the checks of one host. Never raises: an
    unreachable host or a failed probe is a result like any other."""
    start = time.monotonic()
    run = HostRun(name=host.name, result=unreachable_host(host.name, "not contacted"))
    try:
        connection.connect(host, show_errors=False, raise_exceptions=True)  # bounded: a dying host fails in ~30 s
    except ConnectError as exc:
        run.result = unreachable_host(host.name, str(exc.args[0] if exc.args else exc))
        run.seconds = time.monotonic() - start
        return run
    except Exception as exc:  # noqa: BLE001 - a connector failing in any other way is still "cannot reach"
        run.result = unreachable_host(host.name, f"{type(exc).__name__}: {exc}")
        run.seconds = time.monotonic() - start
        return run
    run.connected = True
    try:
        kwargs = connector_kwargs(host)
        probe, pci, run.uploaded = run_probe(host, bundle, python=settings.python, bench=bench, kwargs=kwargs)
        run.result = evaluate_host(host.name, probe, expected_state(config, probe, pci=pci))
    except ProbeFailed as exc:
        run.result = probe_failed_host(host.name, str(exc))
    except (OSError, EOFError, TimeoutError) as exc:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            text = f"no answer within {PROBE_TIMEOUT_S[bench]} s"
        run.result = probe_failed_host(host.name, f"connection or command failed during the probe: {text}")
    except Exception as exc:  # noqa: BLE001 - one host's surprise must not stop the fleet's verify
        run.result = probe_failed_host(host.name, f"{type(exc).__name__}: {exc}")
    run.seconds = time.monotonic() - start
    return run


def _write_textfiles(state: Any, runs: list[HostRun], settings: Mapping[str, VerifySettings], fleet: FleetResult,
                     hosts: Mapping[str, Any]) -> None:
    data = fleet.to_dict()

    def one(run: HostRun) -> None:
        directory = settings[run.name].textfile_dir
        if directory is None:
            return
        try:
            host = hosts[run.name]
            write_node_textfile(host, render_prometheus(data, host=run.name), directory, connector_kwargs(host))
            run.textfile = f"{directory}/{TEXTFILE_NAME}"
        except Exception as exc:  # noqa: BLE001 - the report is written anyway; say what went wrong
            run.textfile_error = str(exc) or type(exc).__name__

    greenlets = [state.pool.spawn(one, run) for run in runs if run.connected]
    gevent.joinall(greenlets)


def _progress_line(run: HostRun, done: int, total: int) -> str:
    r = run.result
    width = len(str(total))
    head = f"[{done:>{width}}/{total}] {run.name}"
    if r.status == "unreachable":
        return f"{head}  UNREACHABLE  {r.error}"
    if r.status == "error":
        return f"{head}  PROBE FAILED  {r.error}"
    counts = Counter(c.verdict for c in r.checks)
    parts = [f"{len(r.gpus)} GPU(s)", f"{counts.get('pass', 0)} pass"]
    parts += [f"{counts[v]} {v}" for v in ("warn", "fail", "skip") if counts.get(v)]
    extra = f", probe updated ({len(run.uploaded)} file(s))" if run.uploaded else ""
    return f"{head}  {r.verdict.upper()}  {', '.join(parts)}, {run.seconds:.1f} s{extra}"


def run_verify(inventory_arg: str, *, limit: Iterable[str] | str | None = None, bench: str = "none",
               out: str | Path = DEFAULT_OUT, progress: TextIO | None = None, cwd: str | None = None,
               write_textfiles: bool = True) -> VerifyRun:
    """The whole ``gpufleet verify``; raises VerifyError when it cannot run (exit 2)."""
    start = time.monotonic()
    if bench not in BENCH_PROFILES:
        raise VerifyError(f"--bench {bench}: allowed: {', '.join(BENCH_PROFILES)}")
    progress = progress if progress is not None else sys.stderr
    state, hosts = load_inventory(inventory_arg, limit, cwd=cwd)
    with ctx_state.use(state), ctx_config.use(state.config), ctx_inventory.use(state.inventory):
        return _run_verify(state, hosts, inventory_arg, limit=limit, bench=bench, out=out, progress=progress,
                           write_textfiles=write_textfiles, start=start)


def _run_verify(state: Any, hosts: list[Any], inventory_arg: str, *, limit: Iterable[str] | str | None, bench: str,
                out: str | Path, progress: TextIO, write_textfiles: bool, start: float) -> VerifyRun:
    try:
        configs = validate_pyinfra_inventory(state.inventory)
        settings = validate_verify_inventory((h.name, h.data.dict()) for h in state.inventory)
    except ConfigErrors as error:
        raise VerifyError(f"invalid configuration, no host was contacted:\n{error}") from None
    bundle = probe_bundle()
    skipped = {h.name: "no gpufleet stages (gpufleet_stages is empty): not a GPU node" for h in hosts
               if not configs[h.name].stages}
    targets = [h for h in hosts if h.name not in skipped]
    if not targets:
        raise VerifyError(f"no GPU node to verify among {', '.join(h.name for h in hosts)} (every host has an "
                          "empty gpufleet_stages)")
    runs = _verify_all(state, targets, configs, settings, bundle, bench, progress)
    by_name = {run.name: run for run in runs}
    runs = [by_name[h.name] for h in targets]
    meta = {"inventory": inventory_arg, "limit": split_limit(limit), "skipped_hosts": skipped,
            "probe_bundle": {"files": {f.name: f.sha256 for f in bundle.files},
                             "nvidia_ml_py": bundle.nvml_py_version},
            "host_seconds": {r.name: round(r.seconds, 3) for r in runs}}
    try:
        meta["gpufleet_version"] = metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        pass
    fleet = build_fleet_result([r.result for r in runs], bench_profile=bench, meta=meta)
    fleet.meta["duration_s"] = round(time.monotonic() - start, 3)
    paths = write_reports(fleet, out)
    if write_textfiles:
        _write_textfiles(state, runs, settings, fleet, {h.name: h for h in targets})
    for run in runs:
        if run.textfile_error:
            progress.write(f"warning: {run.name}: node textfile not written: {run.textfile_error}\n")
    for host in targets:
        _disconnect(host)
    progress.flush()
    return VerifyRun(fleet=fleet, hosts=runs, paths=paths, skipped=skipped, seconds=time.monotonic() - start)


def _verify_all(state: Any, hosts: list[Any], configs: Mapping[str, NodeConfig],
                settings: Mapping[str, VerifySettings], bundle: ProbeBundle, bench: str, progress: TextIO
                ) -> list[HostRun]:
    progress.write(f"gpufleet verify: {len(hosts)} host(s), bench {bench}\n")
    progress.flush()
    greenlets = {state.pool.spawn(verify_host, h, configs[h.name], settings[h.name], bundle, bench): h
                 for h in hosts}
    runs = []
    for done, greenlet in enumerate(gevent.iwait(list(greenlets)), start=1):
        run = greenlet.get()
        runs.append(run)
        progress.write(_progress_line(run, done, len(hosts)) + "\n")
        progress.flush()
    return runs


# ------------------------------------------------------------------------------------------ summary


def summary_text(run: VerifyRun, out: str | Path) -> str:
    """The short summary printed at the end: counts per verdict, each failure with host / GPU / hint, reports."""
    fleet = run.fleet
    s = fleet.summary()
    counts = s["checks"]
    lines = [f"gpufleet verify: {s['hosts']} host(s) ({s['hosts_ok']} verified, {s['hosts_unreachable']} unreachable, "
             f"{s['hosts_error']} probe failed), {s['gpus']} GPU(s), bench {fleet.bench_profile}, "
             f"{run.seconds:.1f} s",
             "checks: " + ", ".join(f"{counts[v]} {v}" for v in ("pass", "warn", "fail", "skip", "unreachable"))]
    if run.skipped:
        lines.append("not verified: " + "; ".join(f"{h} ({why})" for h, why in sorted(run.skipped.items())))
    problems = [c for c in fleet.checks if c.verdict in (FAIL, UNREACHABLE)]
    warnings = [c for c in fleet.checks if c.verdict == WARN]
    if problems:
        lines.append("failures:")
        for c in sorted(problems, key=lambda c: (c.host, -1 if c.gpu_index is None else c.gpu_index, c.check)):
            where = c.host + (f" gpu{c.gpu_index}" if c.gpu_index is not None else "")
            lines.append(f"  {where}  {c.check}: {c.message}")
            if c.remediation:
                lines.append(f"      -> {c.remediation}")
    if warnings:
        lines.append(f"warnings: {len(warnings)} (see the report)")
    if fleet.regressions:
        lines.append(f"regressions since the previous report: {len(fleet.regressions)} (see the report)")
    html = Path(run.paths.get("html", Path(out) / REPORT_FILES["html"])).resolve()
    lines.append(f"report: {html}")
    lines.append(f"        (also {', '.join(REPORT_FILES[k] for k in ('markdown', 'json', 'junit', 'prometheus'))} "
                 f"in {html.parent})")
    written = [r for r in run.hosts if r.textfile]
    if written:
        lines.append(f"node textfiles: {written[0].textfile} on {len(written)} host(s)")
    verdict = {0: "PASS", 1: "FAIL"}.get(run.exit_code, "COULD NOT RUN")
    lines.append(f"result: {verdict} (exit code {run.exit_code})")
    return "\n".join(lines)


def main(inventory_arg: str, *, limit: Iterable[str] | str | None = None, bench: str = "none",
         out: str | Path = DEFAULT_OUT, echo: Callable[[str], Any] = print, progress: TextIO | None = None) -> int:
    """``gpufleet verify``: run, print the summary, return the exit code (0, 1 or 2)."""
    progress = progress if progress is not None else sys.stderr
    try:
        run = run_verify(inventory_arg, limit=limit, bench=bench, out=out, progress=progress)
    except VerifyError as error:
        progress.write(f"gpufleet verify: {error}\n")
        progress.flush()
        return EXIT_COULD_NOT_RUN
    echo(summary_text(run, out))
    return run.exit_code


# ------------------------------------------------------------------------------------------ pyinfra entry


class DeployVerify:
    """The state of ``pyinfra INVENTORY verify/gpu_node.py`` (one per pyinfra State, see :func:`deploy_verify`).

    The deploy file installs the probe with ``files.put`` (pyinfra compares checksums) and adds two ``python.call``
    operations per GPU node: :meth:`probe_host` (probe, checks; the host whose probe finishes LAST — every other
    active GPU node has a result — builds the fleet result and writes the reports, adding the hosts pyinfra could
    not connect to as unreachable and those that failed an earlier operation as probe failed), then
    :meth:`textfile_host` (the node's textfile; the operation fails for a host whose verify failed, so pyinfra's
    exit code says it too).
    """

    def __init__(self, state: Any, inventory: Any):
        from gpufleet.deploys._inputs import InputError  # noqa: PLC0415 - pyinfra-entry only

        try:
            self.configs = validate_pyinfra_inventory(inventory)
            self.settings = validate_verify_inventory((h.name, h.data.dict()) for h in inventory)
        except ConfigErrors as error:
            raise InputError(f"invalid configuration, no host was changed:\n{error}") from None
        hosts = [h for h in inventory if state.is_host_in_limit(h)]
        for key, attr in (("gpufleet_verify_out", "out"), ("gpufleet_verify_bench", "bench")):
            values = {getattr(self.settings[h.name], attr) for h in hosts}
            if len(values) > 1:
                shown = ", ".join(f"{h.name}={getattr(self.settings[h.name], attr)!r}" for h in hosts)
                raise InputError(f"{key} differs between hosts ({shown}); allowed: one value for the whole run")
        first = self.settings[hosts[0].name] if hosts else VerifySettings()
        self.out = Path(first.out) if os.path.isabs(first.out) else Path(state.cwd or os.getcwd()) / first.out
        self.bench = first.bench
        self.bundle = probe_bundle()
        self.runs: dict[str, HostRun] = {}
        self.fleet: FleetResult | None = None
        self.paths: dict[str, Path] = {}
        self.started = time.monotonic()

    def is_gpu_node(self, name: str) -> bool:
        return bool(self.configs[name].stages)

    def probe_host(self, state: Any, host: Any) -> bool:
        start = time.monotonic()
        run = HostRun(name=host.name, result=unreachable_host(host.name, "not probed"), connected=True)
        settings = self.settings[host.name]
        try:
            probe, pci, _ = run_probe(host, self.bundle, python=settings.python, bench=self.bench,
                                      kwargs=connector_kwargs(host), check_bundle=False)
            run.result = evaluate_host(host.name, probe, expected_state(self.configs[host.name], probe, pci=pci))
        except ProbeFailed as exc:
            run.result = probe_failed_host(host.name, str(exc))
        except Exception as exc:  # noqa: BLE001 - recorded in the report; the other hosts go on
            run.result = probe_failed_host(host.name, f"{type(exc).__name__}: {exc}")
        run.seconds = time.monotonic() - start
        self.runs[host.name] = run
        pending = {h.name for h in state.active_hosts if self.is_gpu_node(h.name)} - set(self.runs)
        if not pending and self.fleet is None:
            self.finish(state)
        return True

    def finish(self, state: Any) -> None:
        from pyinfra import logger  # noqa: PLC0415

        results = []
        for h in state.inventory:
            if not state.is_host_in_limit(h) or not self.is_gpu_node(h.name):
                continue
            if h.name in self.runs:
                results.append(self.runs[h.name].result)
            elif h not in state.activated_hosts:
                results.append(unreachable_host(h.name, "pyinfra could not connect (see its output above)"))
            else:
                results.append(probe_failed_host(h.name, "an earlier operation failed on this host (installing "
                                                         "the probe; see pyinfra's output above)"))
        meta = {"entry": "pyinfra verify/gpu_node.py", "probe_bundle": {f.name: f.sha256 for f in self.bundle.files},
                "duration_s": round(time.monotonic() - self.started, 3)}
        self.fleet = build_fleet_result(results, bench_profile=self.bench, meta=meta)
        self.paths = write_reports(self.fleet, self.out)
        run = VerifyRun(fleet=self.fleet, hosts=list(self.runs.values()), paths=self.paths, skipped={},
                        seconds=time.monotonic() - self.started)
        for line in summary_text(run, self.out).splitlines():
            logger.info(line)

    def textfile_host(self, state: Any, host: Any) -> bool:
        from pyinfra import logger  # noqa: PLC0415

        if self.fleet is None:
            host.log_styled("gpufleet verify: no fleet result (the probe operation did not finish)", fg="red",
                            log_func=logger.error)
            return False
        result = next((h for h in self.fleet.hosts if h.host == host.name), None)
        directory = self.settings[host.name].textfile_dir
        if directory is not None:
            try:
                write_node_textfile(host, render_prometheus(self.fleet.to_dict(), host=host.name), directory,
                                    connector_kwargs(host))
            except Exception as exc:  # noqa: BLE001
                host.log_styled(f"gpufleet verify: node textfile not written: {exc}", fg="yellow",
                                log_func=logger.warning)
        if result is None or result.verdict in (FAIL, UNREACHABLE):
            failed = [c for c in (result.checks if result else []) if c.verdict in (FAIL, UNREACHABLE)]
            shown = "; ".join(f"{c.check}" + (f" gpu{c.gpu_index}" if c.gpu_index is not None else "")
                              for c in failed[:6]) + (" ..." if len(failed) > 6 else "")
            host.log_styled(f"gpufleet verify failed: {len(failed)} check(s): {shown}", fg="red",
                            log_func=logger.error)
            return False
        return True


def deploy_verify(state: Any, inventory: Any) -> DeployVerify:
    """The run's :class:`DeployVerify`, created (and every host validated) when the first host is prepared."""
    found = getattr(state, "_gpufleet_deploy_verify", None)
    if found is None:
        connection.install(state)  # bounded waits: a host dying during the probe fails within ~30 s
        found = DeployVerify(state, inventory)
        state._gpufleet_deploy_verify = found
    return found


__all__ = [
    "BENCH_PROFILES", "DEFAULT_OUT", "DEFAULT_TEXTFILE_DIR", "PROBE_REMOTE_DIR", "TEXTFILE_NAME", "VERIFY_KEYS",
    "BundleFile", "DeployVerify", "HostRun", "ProbeBundle", "ProbeFailed", "ScriptOutput", "VerifyError", "VerifyRun",
    "VerifySettings", "connector_kwargs", "deploy_verify", "install_probe", "load_inventory", "load_verify_settings",
    "main", "match_limit", "nvml_module_path", "parse_script_output", "probe_bundle", "probe_command",
    "probe_document", "probe_script", "run_probe", "run_verify", "split_limit", "summary_text",
    "validate_verify_inventory", "verify_host", "write_node_textfile",
]
