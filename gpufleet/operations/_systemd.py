"""Shared by gpufleet's operations: the read of the files and units an operation manages (the
:class:`~gpufleet.facts.files.ManagedState` and :class:`~gpufleet.facts.systemd.UnitStates` facts), the commands
that converge a managed file, and the oneshot boot units that reapply GPU settings after a reboot.

GPU settings (power limits, clock locks, persistence, MIG instances) are volatile: they are gone after a
reboot or a driver reload. An operation that sets one live also writes the desired values to a file under
``/etc/gpufleet/`` and installs a ``Type=oneshot`` ``RemainAfterExit=yes`` unit that reapplies them at boot
through ``gpufleet-gpu-settings`` (``gpufleet/node/gpu-settings.sh``).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Iterable
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import OperationError, OperationValueError, StringCommand
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.output import format_text
from pyinfra.context import ctx_host
from pyinfra.facts.files import FileContents
from pyinfra.operations.util.files import generate_color_diff

from gpufleet import resources
from gpufleet.facts.files import ManagedState, check_path
from gpufleet.facts.systemd import UnitStates, check_unit, unknown_unit

SETTINGS_DIR = "/etc/gpufleet"
UNIT_DIR = "/etc/systemd/system"
GPU_SETTINGS_SCRIPT = "/usr/local/sbin/gpufleet-gpu-settings"
# Units a GPU-settings unit runs after: the driver's daemons first, then the MIG layout (a GPU reset by the
# MIG stage would drop settings applied before it). Absent units are ignored by systemd.
GPU_SETTINGS_AFTER = ("nvidia-persistenced.service", "nvidia-fabricmanager.service", "gpufleet-mig.service")
GPU_SETTINGS_WANTS = ("nvidia-persistenced.service",)


# The units, files and file contents gpufleet's operation modules read (declared by each module,
# :func:`read_together`). Every read of units asks systemd for all of them, every read of files (:func:`get_state`)
# stats all of them: a run costs one ``systemctl show`` and one ``ManagedState`` per host, and one more of each
# after a change, instead of one per operation. A unit a host does not have answers "not-found", a file "absent".
_UNITS_READ_TOGETHER: set[str] = set()
_FILES_READ_TOGETHER: set[str] = set()
_CONTENTS_READ_TOGETHER: set[str] = set()


def read_together(*units: str, files: Iterable[str] = (), contents: Iterable[str] = ()) -> None:
    """Declare the units, files (stat, sha1) and file contents an operation module reads, so that every read of
    units (:func:`unit_states`) and of files (:func:`get_state`) asks for them too."""
    _UNITS_READ_TOGETHER.update(check_unit(unit) for unit in units)
    _FILES_READ_TOGETHER.update(check_path(path) for path in files)
    _CONTENTS_READ_TOGETHER.update(check_path(path) for path in contents)


def unit_states(units) -> dict[str, dict]:
    """``{unit: state}`` of ``units`` (``unknown_unit()`` where systemd does not answer), read in one
    ``UnitStates`` with every unit declared by :func:`read_together`."""
    units = tuple(units)
    if not units:
        return {}
    known = host.get_fact(UnitStates, units=tuple(sorted(_UNITS_READ_TOGETHER.union(units)))) or {}
    return {u: known.get(u) or unknown_unit() for u in units}


def is_running(status: dict) -> bool:
    """Whether systemd runs the unit or is bringing it up (``activating``: its start, or a restart after it
    exited, e.g. an exporter that found no DCGM host engine yet). Starting such a unit again changes nothing."""
    return status["active_state"] in ("active", "activating", "reloading")


def get_state(paths=(), read=(), units=()) -> dict:
    """``ManagedState`` of these paths (with these contents) and :func:`unit_states` of these units, with every
    asked-for key present (absent files -> None); the files are read in one ``ManagedState`` with every file and
    content declared by :func:`read_together`."""
    paths, read = tuple(paths), tuple(read)
    state = host.get_fact(ManagedState, paths=tuple(sorted(_FILES_READ_TOGETHER.union(paths))),
                          read=tuple(sorted(_CONTENTS_READ_TOGETHER.union(read)))) if paths or read else {}
    files = (state or {}).get("files", {})
    contents = (state or {}).get("contents", {})
    return {
        "files": {p: files.get(p) for p in paths},
        "contents": {p: contents.get(p) for p in read},
        "units": unit_states(units),
    }


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def render(template: str, **values) -> str:
    """``template`` rendered; the host's ``gpufleet_templates_dir`` (when set) overrides gpufleet's own."""
    override = getattr(host.data, resources.TEMPLATES_SETTING, None) if ctx_host.isset() else None
    return resources.render_template(template, override, **values)


def node_script(name: str) -> str:
    return resources.node_script(name)


def _temp_dir() -> str | None:
    return (host.current_op_global_arguments or {}).get("_temp_dir")


def _show_diff(path: str, content: str, current: dict | None) -> None:
    """``--diff``: what pyinfra's ``files.put`` shows (same words, same coloured unified diff)."""
    if current is None:
        host.log(f"Will create {format_text(path, bold=True)}", logger.info)
        current_lines: list[str] = []
    else:
        host.log(f"Will modify {format_text(path, bold=True)}", logger.info)
        current_lines = [line + "\n" for line in host.get_fact(FileContents, path=path) or []]
    for line in generate_color_diff(current_lines, content.splitlines(keepends=True)):
        logger.info("  %s", line)
    logger.info("")


def put_file(current: dict | None, path: str, content: str, mode: str = "644", user: str = "root",
             group: str = "root", secret: bool = False):
    """Commands that make ``path`` a regular file with ``content``, mode and owner (given its ``ManagedState``
    entry). Yields nothing when it already is.

    The one file writer of gpufleet's operations. It behaves as ``files.put`` with a ``StringIO``, ``mode``,
    ``user`` and ``group`` does, for the pyinfra options that matter: ``--diff`` shows the same "Will create" /
    "Will modify" unified diff (and mode/owner changes), ``_temp_dir`` chooses where the upload lands before
    it is moved into place. It differs in what it reads: the file's state comes from the ``ManagedState`` the
    operation already read (ONE remote command for all its files and units) instead of ``files.put``'s three
    or four facts per file; the current text is read only under ``--diff`` and only when it differs.

    ``secret``: the file holds secrets (:func:`_put_secret`): ``--diff`` says that it changes, never its text, and
    the text reaches the host only on a command's stdin, written with ``mode`` from the start."""
    if current is not None and current["type"] != "file":
        raise OperationValueError(f"{path} exists and is not a regular file ({current['type']})")
    if secret and (current is None or current["sha1"] != sha1(content)):
        yield from _put_secret(current, path, content, mode, user, group)
        return
    if current is None or current["sha1"] != sha1(content):
        if state.config.DIFF:
            _show_diff(path, content, current)
        if current is None:
            yield StringCommand("mkdir", "-p", shlex.quote(posixpath.dirname(path)))
        # a random upload name (pyinfra's default for no key): a name derived from ``path``, as files.put uses, is
        # known in advance, and a symlink another user of the host left there would be written through as root
        yield FileUploadCommand(StringIO(content), path,
                                remote_temp_filename=host.get_temp_filename(temp_directory=_temp_dir()))
    chown = current is None or (current["user"], current["group"]) != (user, group)
    chmod = current is None or current["mode"] != mode
    if state.config.DIFF and current is not None:
        if chmod:
            logger.info("mode %s", format_text(str(current["mode"]), "red"))
            logger.info("mode %s", format_text(mode, "green"))
        if chown:
            logger.info("user/group %s", format_text(f"{current['user']}:{current['group']}", "red"))
            logger.info("user/group %s", format_text(f"{user}:{group}", "green"))
    owner = ["chown", shlex.quote(f"{user}:{group}"), shlex.quote(path)]
    perms = ["chmod", mode, shlex.quote(path)]
    if chown or chmod:
        yield StringCommand(*(owner if chown else []), *(["&&"] if chown and chmod else []), *(perms if chmod else []))


def _put_secret(current: dict | None, path: str, content: str, mode: str, user: str, group: str):
    """Write a file that holds secrets: its text on the command's stdin (never in a command line, which other users
    of the host can see in ``ps``, nor in pyinfra's output, nor in an upload's temporary file), into a temporary
    file beside ``path`` created under ``umask 077``, given its owner and mode, then renamed over ``path``: at no
    moment readable by anyone else than root."""
    if not content.endswith("\n"):
        raise OperationValueError(f"{path}: a secret file's text must end with a line feed (stdin gets one)")
    if state.config.DIFF:
        host.log(f"Will {'create' if current is None else 'modify'} {format_text(path, bold=True)} "
                 "(it holds secrets: its text is not shown)", logger.info)
    directory, name = posixpath.split(path)
    temp = shlex.quote(f"{directory}/.{name}.gpufleet-XXXXXX")
    yield StringCommand(
        f"mkdir -p {shlex.quote(directory)} && umask 077 && tmp=$(mktemp {temp}) && "
        f"{{ cat > \"$tmp\" && chown {shlex.quote(f'{user}:{group}')} \"$tmp\" && chmod {shlex.quote(mode)} \"$tmp\" "
        f"&& mv -f \"$tmp\" {shlex.quote(path)}; }} || {{ rm -f \"$tmp\"; exit 1; }}", _stdin=content)


def remove_file(current: dict | None, path: str):
    if current is not None:
        if state.config.DIFF:
            host.log(f"Will remove {format_text(path, bold=True)}", logger.info)
        yield StringCommand("rm", "-f", shlex.quote(path))


def all_of(commands: list[StringCommand]) -> list[StringCommand]:
    """``commands`` as ONE remote command (``a && b && …``: one round trip, stops at the first failure)."""
    if len(commands) < 2:
        return commands
    parts: list = []
    for command in commands:
        parts += [*(["&&"] if parts else []), *command.bits]
    return [StringCommand(*parts)]


def fail(message: str) -> StringCommand:
    """A command that fails this host with ``message`` (a host-state problem found while executing: unlike an
    exception, which stops the whole run, the other hosts go on)."""
    return StringCommand("echo", shlex.quote(f"gpufleet: error: {message}"), ">&2;", "exit", "1")


def refuse(message: str):
    """Stop on a host-state problem: while planning (change detection, ``--dry``) raise ``OperationError``
    (pyinfra stops before any change on any host); while executing, fail only this host with ``message``
    (an exception then would stop the run with other hosts half done). Use as ``yield from refuse(...)``
    followed by ``return``."""
    if not state.is_executing:
        raise OperationError(message)
    yield fail(message)


def systemctl(*args: str) -> StringCommand:
    return StringCommand("systemctl", *(shlex.quote(a) for a in args))


def gpu_settings_unit(unit: str, description: str, kind: str, conf: str) -> str:
    """Text of the oneshot unit that runs ``gpufleet-gpu-settings KIND CONF`` at boot."""
    return render(
        "systemd/gpufleet-gpu-settings.service.j2",
        unit=unit,
        description=description,
        after=GPU_SETTINGS_AFTER,
        wants=GPU_SETTINGS_WANTS,
        exec_start=" ".join(shlex.quote(a) for a in (GPU_SETTINGS_SCRIPT, kind, conf)),
        conf=conf,
    )


def gpu_settings_paths(unit: str, conf: str) -> tuple[str, ...]:
    return (conf, GPU_SETTINGS_SCRIPT, posixpath.join(UNIT_DIR, unit))


def install_gpu_settings(state: dict, unit: str, description: str, kind: str, conf: str, conf_text: str,
                         start: bool):
    """Commands: desired values file, node script, oneshot unit (daemon-reload when it changed), enabled at
    boot, and started when ``start`` (it then shows ``active (exited)`` until the next boot, as after one).

    ``state`` is ``get_state(paths=gpu_settings_paths(unit, conf), units=(unit,))``.
    """
    files = state["files"]
    unit_path = posixpath.join(UNIT_DIR, unit)
    yield from put_file(files[conf], conf, conf_text)
    yield from put_file(files[GPU_SETTINGS_SCRIPT], GPU_SETTINGS_SCRIPT, node_script("gpu-settings.sh"), "755")
    unit_cmds = list(put_file(files[unit_path], unit_path, gpu_settings_unit(unit, description, kind, conf)))
    yield from unit_cmds
    status = state["units"][unit]
    if unit_cmds or status["need_daemon_reload"]:
        yield systemctl("daemon-reload")
    if status["unit_file_state"] != "enabled":
        yield systemctl("enable", unit)
    if start and status["active_state"] != "active":
        yield systemctl("start", unit)


def remove_gpu_settings(state: dict, unit: str, conf: str):
    """Commands: the unit stopped, disabled and removed, the values file removed (the node script stays: the
    other settings unit may use it)."""
    files = state["files"]
    unit_path = posixpath.join(UNIT_DIR, unit)
    status = state["units"][unit]
    if is_running(status):
        yield systemctl("stop", unit)
    if status["unit_file_state"] == "enabled":
        yield systemctl("disable", unit)
    if files[unit_path] is not None:
        yield from remove_file(files[unit_path], unit_path)
        yield systemctl("daemon-reload")
    yield from remove_file(files[conf], conf)
