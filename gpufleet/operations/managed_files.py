"""The one file writer of gpufleet's operations (:func:`put_file`, :func:`remove_file`), the templates and node
scripts they write, and :func:`all_of` (commands joined into one round trip)."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from io import BytesIO, StringIO

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, OperationValueError, StringCommand
from pyinfra.api.output import format_text
from pyinfra.context import ctx_host
from pyinfra.facts.files import FileContents
from pyinfra.operations.util.files import generate_color_diff

from gpufleet import resources

SETTINGS_DIR = "/etc/gpufleet"


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


def put_bytes(current: dict | None, path: str, data: bytes, mode: str = "644"):
    """Commands that make ``path`` a root-owned regular file holding ``data`` (a binary: no diff shown)."""
    if current is None or current.get("sha1") != hashlib.sha1(data).hexdigest():
        yield StringCommand("mkdir", "-p", shlex.quote(posixpath.dirname(path)))
        yield FileUploadCommand(BytesIO(data), path, remote_temp_filename=host.get_temp_filename(path))
    if current is None or (current["user"], current["group"], current["mode"]) != ("root", "root", mode):
        yield StringCommand("chown", "root:root", shlex.quote(path), "&&", "chmod", mode, shlex.quote(path))


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
