"""``nvidia-smi -q`` (the NVSMI LOG) parsed into a tree: what a GPU prints about itself, every label kept.

Each line is ``<indent>Label : value`` or a bare ``<indent>Label`` that opens a block; blocks nest by indentation
(four spaces a level in every driver since 470). The log's header (``Driver Version``...) is ``header``; each
``GPU <bus id>`` block is one entry of ``gpus``. Labels are kept as printed, values as strings (``300.00 W``);
:func:`number` reads the leading number of one. Used by ``gpufleet catalog learn`` and the tests that hold the
catalog and the simulator to the real captures.
"""

from __future__ import annotations

import re
from typing import Any

_GPU_RE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")

Tree = dict[str, Any]


def parse_q(text: str) -> tuple[Tree, list[Tree]]:
    """``(header, gpus)``: the NVSMI LOG header and one tree per GPU (``{"Bus Id": ..., label: value | tree}``)."""
    header: Tree = {}
    gpus: list[Tree] = []
    stack: list[tuple[int, Tree]] = [(-1, header)]
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        match = _GPU_RE.match(raw)
        if match:
            gpu: Tree = {"Bus Id": match.group(1)}
            gpus.append(gpu)
            stack = [(-1, gpu)]
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        label, colon, value = raw.strip().partition(":")
        label = label.strip()
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if colon and value.strip():
            parent.setdefault(label, value.strip())
        else:
            block: Tree = {}
            parent.setdefault(label, block)
            stack.append((indent, block))
    return header, gpus


def get(tree: Tree, *path: str) -> Any:
    """The value at ``path`` (labels), or None when any step is missing."""
    node: Any = tree
    for step in path:
        if not isinstance(node, dict) or step not in node:
            return None
        node = node[step]
    return node


def number(value: Any) -> float | None:
    """The leading number of a printed value (``300.00 W`` -> 300.0, ``16x`` -> 16.0); None for N/A and blocks."""
    if not isinstance(value, str):
        return None
    match = _NUMBER_RE.match(value)
    return float(match.group(1)) if match else None
