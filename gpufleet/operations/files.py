"""Files whose text is a secret (receiver tokens, passwords): never shown, never readable by others on the way."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from gpufleet.facts.files import check_path

from .managed_files import put_file
from .reads import get_state


@operation()
def secret_file(path: str, content: str, mode: str = "640", user: str = "root", group: str = "root"):
    """
    Write a file that holds secrets: ``--diff``, ``--json`` and logs say only that it changes, never its text.

    + path: the file (absolute)
    + content: its text (ending with a line feed)
    + mode: its mode, e.g. ``"640"`` (root writes, the service's group reads)
    + user: its owner
    + group: its group, e.g. the service's (which must exist: install the package first)

    The text reaches the host on a command's stdin (never in a command line, which other users can see in
    ``ps``), is written under ``umask 077`` to a temporary file beside ``path``, given its owner and mode, and
    renamed over ``path``: no moment at a wider mode. A converged file (same text, owner, mode) is left alone.

    **Example:**

    .. code:: python

        from gpufleet.operations import files

        files.secret_file(
            name="Alertmanager configuration (receiver tokens)",
            path="/etc/prometheus/alertmanager.yml", content=text, mode="640", group="prometheus",
        )
    """
    check_path(path)
    current = get_state(paths=(path,))["files"][path]
    commands = list(put_file(current, path, content, mode, user, group, secret=True))
    if not commands:
        host.noop(f"{path} is up to date (mode {mode}, {user}:{group})")
    yield from commands


@operation()
def managed_file(path: str, content: str, mode: str = "644", user: str = "root", group: str = "root"):
    """
    Write a file from a string, as ``files.put`` with a ``StringIO`` does (same ``--diff``), uploaded under a random
    temporary name.

    + path: the file (absolute)
    + content: its text
    + mode: its mode, e.g. ``"644"``
    + user: its owner
    + group: its group

    ``files.put`` uploads to ``/tmp/pyinfra-<sha1 of the destination>``: a name known in advance, where a
    symlink left by another user of the host would be written through as root. This writer uploads under a random
    name and reads the file's state in one ``ManagedState`` with every file gpufleet manages.

    **Example:**

    .. code:: python

        from gpufleet.operations import files

        files.managed_file(name="Prometheus configuration", path="/etc/prometheus/prometheus.yml", content=text)
    """
    check_path(path)
    current = get_state(paths=(path,))["files"][path]
    commands = list(put_file(current, path, content, mode, user, group))
    if not commands:
        host.noop(f"{path} is up to date")
    yield from commands
