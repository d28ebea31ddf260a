"""What a plan cannot apply (errors naming host, key, value, allowed), what the user must see, what was not checked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, Shown) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Shown(str):
    """A value already formatted for a message (e.g. ``800 W``): shown without quotes."""


@dataclass(frozen=True)
class Problem:
    """A setting that cannot be applied to this host: host, key, value, what is allowed, why, which GPUs."""

    host: str
    key: str
    value: Any
    allowed: str
    reason: str
    gpus: str | None = None  # e.g. "GPU 0 (NVIDIA H100 80GB HBM3)" / "GPUs 0-7 (NVIDIA H100 80GB HBM3)"

    @property
    def message(self) -> str:
        where = f" on {self.gpus}" if self.gpus else ""
        return f"{self.host}: {self.key}={_show(self.value)}{where}: {self.reason}; allowed: {self.allowed}"

    def __str__(self) -> str:
        return self.message


@dataclass
class Problems:
    """What a plan cannot apply (errors: nothing may change), what the user must see (warnings), and the checks
    that could not run (notes)."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def extend(self, other: Problems) -> None:
        self.errors += other.errors
        self.warnings += other.warnings
        self.notes += other.notes


def missing_gpu_warning(host: str, uuids: Iterable[str], lost: Iterable[str], what: str) -> str:
    return (f"{host}: GPU {', '.join(uuids)} is missing (nvidia-smi reports lost GPU(s) {', '.join(lost)}): its "
            f"desired {what} is kept and applied at boot when it is back")
