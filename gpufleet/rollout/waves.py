"""Wave arithmetic of a rollout: counts like ``5`` or ``20%``, the wave sizes, the failure and unavailability
thresholds. Pure functions, no host access.

Waves are taken in inventory order (the order ``pyinfra INVENTORY debug-inventory`` lists the hosts): first the
canary (``--canary N`` hosts), then one wave per ``--waves`` entry; the last entry repeats until every host is
done (as Ansible's ``serial: [1, 5, "20%"]``). A percentage is of the whole fleet the rollout covers, rounded up,
and never less than one host.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_COUNT = re.compile(r"^\s*(\d+)\s*(%?)\s*$")


class BadCount(ValueError):
    """A count or percentage that cannot be read."""


@dataclass(frozen=True)
class Count:
    """``5`` (hosts) or ``20%`` (of a total)."""

    value: int
    percent: bool = False

    @classmethod
    def parse(cls, text: str, *, option: str, allow_zero: bool = True) -> Count:
        match = _COUNT.match(str(text))
        if not match:
            raise BadCount(f"{option} {text!r}: expected a number of hosts (e.g. 5) or a percentage (e.g. 20%)")
        count = cls(int(match.group(1)), bool(match.group(2)))
        if count.percent and count.value > 100:
            raise BadCount(f"{option} {text!r}: a percentage must be between 0% and 100%")
        if not allow_zero and count.value == 0:
            raise BadCount(f"{option} {text!r}: must be at least 1 host (or 1%)")
        return count

    def of(self, total: int, *, at_least_one: bool = False) -> int:
        """The number of hosts this count means out of ``total`` (a percentage rounds up)."""
        n = math.ceil(self.value * total / 100) if self.percent else self.value
        return max(n, 1) if at_least_one and total else n

    def __str__(self) -> str:
        return f"{self.value}{'%' if self.percent else ''}"


def parse_waves(text: str) -> list[Count]:
    """``1,5,20%`` -> [Count(1), Count(5), Count(20, percent)]; every entry at least one host."""
    parts = [p for p in str(text).split(",")]
    if not parts or any(not p.strip() for p in parts):
        raise BadCount(f"--waves {text!r}: expected comma-separated sizes, e.g. 1,5,20%")
    return [Count.parse(p, option="--waves", allow_zero=False) for p in parts]


def wave_sizes(total: int, waves: list[Count]) -> list[int]:
    """The sizes of the waves for ``total`` hosts: one per entry, the last repeated; sums to ``total``."""
    sizes, left, i = [], total, 0
    while left > 0:
        size = min(waves[min(i, len(waves) - 1)].of(total, at_least_one=True), left)
        sizes.append(size)
        left -= size
        i += 1
    return sizes


def plan_waves(hosts: list[str], *, canary: int, waves: list[Count]) -> list[list[str]]:
    """Hosts (in inventory order) cut into the canary wave and the following waves."""
    out: list[list[str]] = []
    if canary > 0 and hosts:
        out.append(hosts[:canary])
        hosts = hosts[canary:]
    total = len(hosts)
    start = 0
    for size in wave_sizes(total, waves):
        out.append(hosts[start:start + size])
        start += size
    return out


def too_many_failures(failed: int, total: int, max_failures: Count) -> bool:
    """True when ``failed`` exceeds ``--max-failures`` (of ``total`` hosts for a percentage)."""
    return failed > max_failures.of(total)


def capacity(max_unavailable: Count | None, total: int, unavailable: int) -> int | None:
    """How many more hosts may be taken out of service now (None: no limit)."""
    if max_unavailable is None:
        return None
    return max(max_unavailable.of(total, at_least_one=True) - unavailable, 0)
