"""``nvidia-smi mig -lgip`` and ``-lgipp`` parsed: the GPU instance profiles a MIG-enabled GPU offers, as its driver
lists them (name, -cgi ID, instances, memory, P2P, SM, DEC, ENC, CE, JPEG, OFA; placements).

Both the 17-character name column of drivers before 580 and the 19-character one since parse (the columns are
split on whitespace). Rows of every GPU are returned, keyed by the GPU index printed in the first column.
"""

from __future__ import annotations

import re

_ROW1 = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(Yes|No)"
                   r"\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$")
_ROW2 = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$")
_LGIPP = re.compile(r"^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]*)\}:(\d+)\s*$")


def parse_lgip(text: str) -> dict[int, list[dict]]:
    """``{gpu index: [profile, ...]}`` in printed order; each profile ``{"name": "1g.10gb", "id": 19, "free": 7,
    "total": 7, "memory_gib": "9.75", "p2p": False, "sm": 16, "dec": 1, "enc": 0, "ce": 1, "jpeg": 1, "ofa": 0}``."""
    out: dict[int, list[dict]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        first = _ROW1.match(line.rstrip())
        second = _ROW2.match(lines[i + 1].rstrip()) if first and i + 1 < len(lines) else None
        if not (first and second):
            continue
        gpu, name, pid, free, total, gib, p2p, sm, dec, enc = first.groups()
        ce, jpeg, ofa = (int(x) for x in second.groups())
        out.setdefault(int(gpu), []).append({
            "name": name, "id": int(pid), "free": int(free), "total": int(total), "memory_gib": gib,
            "p2p": p2p == "Yes", "sm": int(sm), "dec": int(dec), "enc": int(enc), "ce": ce, "jpeg": jpeg, "ofa": ofa})
    return out


def parse_lgipp(text: str) -> dict[int, dict[int, list[tuple[int, int]]]]:
    """``{gpu index: {profile id: [(start, size), ...]}}`` from ``GPU  0 Profile ID 19 Placements: {0,1}:1``."""
    out: dict[int, dict[int, list[tuple[int, int]]]] = {}
    for line in text.splitlines():
        match = _LGIPP.match(line.strip())
        if match:
            gpu, pid, starts, size = match.groups()
            out.setdefault(int(gpu), {})[int(pid)] = [(int(s), int(size)) for s in starts.split(",") if s]
    return out
