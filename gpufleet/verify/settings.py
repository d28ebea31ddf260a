"""The ``gpufleet_verify_*`` settings: what verify reads from each host's data besides the converge settings.

Validated strictly, like :mod:`gpufleet.config` (an unknown ``gpufleet_verify_*`` key is an error with a
did-you-mean); both entry points (``gpufleet verify`` and ``pyinfra INVENTORY verify/gpu_node.py``) use them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet import config
from gpufleet.config import ConfigError, did_you_mean, register_namespace

DEFAULT_TEXTFILE_DIR = config.DEFAULT_TEXTFILE_DIR  # Debian/Ubuntu node_exporter's; gpufleet_exporters_textfile_dir
DEFAULT_OUT = "gpufleet-verify"
BENCH_PROFILES = ("none", "quick", "full")

VERIFY_PREFIX = "gpufleet_verify_"
register_namespace(VERIFY_PREFIX)

_ABS_PATH_RE = re.compile(r"^/[^\x00\n\r]*\Z")
_COMMAND_RE = re.compile(r"^[A-Za-z0-9_.+/-]+\Z")
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
    # node_exporter's textfile directory (stage exporters) is where the textfile goes unless verify says otherwise
    exporters_dir = data.get("gpufleet_exporters_textfile_dir")
    if isinstance(exporters_dir, str) and _ABS_PATH_RE.match(exporters_dir):
        values["textfile_dir"] = exporters_dir.rstrip("/") or "/"
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
    return config.validate_hosts(hosts, load_verify_settings)
