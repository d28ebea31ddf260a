"""NCCL's settings file: the ``KEY=VALUE`` pairs ``/etc/nccl.conf`` holds, and how a file read back differs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NcclDiff:
    """How the ``KEY=VALUE`` pairs of a file differ from the plan's: keys missing, keys with another value
    ({key: value found}), keys the plan does not set (unmanaged)."""

    missing: tuple[str, ...] = ()
    wrong: Mapping[str, str] = field(default_factory=dict)
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class NcclPlan:
    """``settings``: the pairs of ``/etc/nccl.conf`` (none: no file, the operation removes it)."""

    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def expected(self) -> dict[str, str]:
        """The pairs as the file holds them (values as text)."""
        return {str(k): str(v) for k, v in self.settings.items()}

    def diff(self, values: Mapping[str, str]) -> NcclDiff:
        """How ``values`` (the pairs of the file on the node) differ from the plan's."""
        want = self.expected
        return NcclDiff(tuple(sorted(k for k in want if k not in values)),
                        {k: values[k] for k in sorted(want) if k in values and values[k] != want[k]},
                        tuple(sorted(k for k in values if k not in want)))
