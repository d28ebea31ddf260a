"""
NCCL's system-wide configuration file, ``/etc/nccl.conf``.
"""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.api import OperationValueError, operation

from gpufleet.facts.files import check_path

from .managed_files import put_file, remove_file, render
from .reads import get_state, read_together

DEFAULT_PATH = "/etc/nccl.conf"  # NCCL's own, read for every user
read_together(files=(DEFAULT_PATH,))

# NCCL (src/misc/param.cc) reads "NAME=value" lines into setenv(NAME, value): the name is everything before
# the first "=", nothing is trimmed or unquoted, a line is at most 1023 characters of name or value.
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_LEN = 1023
_FORBIDDEN = {'"': "a double quote", "'": "a single quote"}


def _value_text(key: str, value) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise OperationValueError(f"nccl_conf: {key}: {value!r} is not a string or an integer (booleans: 0 or 1)")
    text = str(value)
    if not text:
        raise OperationValueError(f"nccl_conf: {key}: empty value (leave the key out instead)")
    for char in text:
        if char.isspace():
            what = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}.get(char, "a space")
            raise OperationValueError(f"nccl_conf: {key}={text!r} contains {what}: NCCL keeps it as part of the "
                                      "value (no spaces, no quotes in nccl.conf)")
        if char in _FORBIDDEN:
            raise OperationValueError(f"nccl_conf: {key}={text!r} contains {_FORBIDDEN[char]}: NCCL keeps quotes "
                                      "as part of the value (write the value bare)")
        if not char.isprintable():
            raise OperationValueError(f"nccl_conf: {key}={text!r} contains a control character")
    if len(text) > _MAX_LEN:
        raise OperationValueError(f"nccl_conf: {key}: value longer than {_MAX_LEN} characters (NCCL cuts it)")
    return text


def conf_text(settings: dict, path: str = DEFAULT_PATH) -> str:
    """The file's text: a header comment, then ``KEY=VALUE`` lines sorted by key (validated)."""
    if not isinstance(settings, dict):
        raise OperationValueError(f"nccl_conf: settings must be a dict {{NAME: value}}, not {settings!r}")
    lines = []
    for key, value in settings.items():
        if not isinstance(key, str) or not _KEY_RE.match(key) or len(key) > _MAX_LEN:
            raise OperationValueError(f"nccl_conf: {key!r} is not a variable name (letters, digits and _, "
                                      "e.g. NCCL_SOCKET_IFNAME)")
        lines.append((key, _value_text(key, value)))
    return render("nccl.conf.j2", settings=sorted(lines), path=path)


@operation()
def nccl_conf(settings: dict[str, str | int], path: str = DEFAULT_PATH):
    """
    Write NCCL's configuration file: ``KEY=VALUE`` lines, sorted, mode 0644, owned by root.

    + settings: NCCL variables, ``{"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_DISABLE": 1}``; empty: no file
    + path: the file; NCCL reads ``/etc/nccl.conf`` for every user (``$NCCL_CONF_FILE`` or
      ``~/.nccl.conf`` and the environment take precedence)

    NCCL's parser takes everything before the first ``=`` as the name and the rest of the line as the value,
    with no trimming and no unquoting: a value with whitespace, a quote, a newline or a control character
    is refused with an error naming the key, as are names that are not variable names, empty values and
    booleans (write ``0``/``1``). Which keys and values NCCL knows is checked by gpufleet's configuration
    layer, not here. With ``settings={}`` the file is removed.

    **Example:**

    .. code:: python

        from gpufleet.operations import nccl

        nccl.nccl_conf(
            name="NCCL over the two InfiniBand HCAs",
            settings={"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "WARN"},
        )
    """
    check_path(path)
    text = conf_text(settings, path) if settings else None
    current = get_state(paths=(path,))["files"][path]
    commands = list(put_file(current, path, text) if text is not None else remove_file(current, path))
    if not commands:
        host.noop(f"{path} has {len(settings)} setting(s)" if settings else f"{path} absent")
    yield from commands
