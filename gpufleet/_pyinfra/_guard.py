"""The version guard of gpufleet's fast paths (see :mod:`gpufleet._pyinfra`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from importlib import metadata
from typing import Any

# The pyinfra release series CI ran gpufleet's fast paths with (``make test``; pyproject's pin allows >=3.10,<4).
# Add a series here only after CI ran it, both paths (fast and plain: tests/sim/conftest.py, PLAIN_PATH_MODULES).
TESTED_PYINFRA: tuple[tuple[int, int], ...] = ((3, 10),)
FACT_MEMO = "GPUFLEET_FACT_MEMO"
ROLLOUT_INPROCESS = "GPUFLEET_ROLLOUT_INPROCESS"
OFF = ("0", "off", "no", "false")

_said: set[str] = set()  # the switches whose plain path was announced in this process


def pyinfra_version() -> str:
    return metadata.version("pyinfra")


def _series(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def version_tested(version: str | None = None) -> bool:
    """Whether ``version`` (the installed pyinfra's) is of a series CI ran (:data:`TESTED_PYINFRA`)."""
    return _series(version or pyinfra_version()) in TESTED_PYINFRA


def switched_off(switch: str) -> bool:
    return os.environ.get(switch, "").strip().lower() in OFF


def plain_path(switch: str, version: str | None = None) -> str | None:
    """Why the fast path ``switch`` (:data:`FACT_MEMO`, :data:`ROLLOUT_INPROCESS`) is not taken here (its switch
    is off, or the installed pyinfra is not a version CI ran), or None where it is."""
    if switched_off(switch):
        return f"{switch} is off"
    version = version or pyinfra_version()
    if not version_tested(version):
        tested = ", ".join(f"{major}.{minor}.x" for major, minor in TESTED_PYINFRA)
        return f"pyinfra {version} is not a version CI ran ({tested})"
    return None


def say_plain_path(switch: str, reason: str, write: Callable[[str], Any] | None = None) -> None:
    """The one line saying that gpufleet takes the plain path for ``switch`` (once per process and switch)."""
    if switch in _said:
        return
    _said.add(switch)
    what = {FACT_MEMO: "every fact read is a remote command",
            ROLLOUT_INPROCESS: "the rollout runs one pyinfra process per pass and wave"}.get(switch, "plain path")
    line = f"gpufleet: plain path ({reason}): {what}"
    if write is None:
        from pyinfra import logger

        logger.warning(line)
    else:
        write(line)
