"""``nvidia-smi -q`` (the NVSMI LOG) parsed into a tree: what a GPU prints about itself, every label kept.

Each line is ``<indent>Label : value`` or a bare ``<indent>Label`` that opens a block; blocks nest by indentation
(four spaces a level in every driver since 470). The log's header (``Driver Version``...) is ``header``; each
``GPU <bus id>`` block is one entry of ``gpus``. Labels are kept as printed, values as strings (``300.00 W``);
:func:`number` reads the leading number of one. Used by ``gpufleet catalog learn`` and the tests that hold the
catalog and the simulator to the real captures; :class:`NvidiaSmiReport` reads it (and the rest ``learn``
needs) from a host.
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from .sections import join, parse_sections, section

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


class NvidiaSmiReport(FactBase):
    """
    What the GPUs of a host report about themselves, for ``gpufleet catalog learn``: one remote command, read-only.

    .. code:: python

        {
            "status": "ok",          # ok | absent (no nvidia-smi) | error (nvidia-smi -q failed: the message)
            "error": None,
            "q": "...",              # nvidia-smi -q (parse_q)
            "compute_cap": "...",    # --query-gpu=index,compute_cap --format=csv,noheader
            "nvlink": "...",         # nvidia-smi nvlink -s -i 0
            "lgip": "...",           # nvidia-smi mig -lgip (profiles only while MIG is enabled; else its message)
            "lgipp": "...",          # nvidia-smi mig -lgipp
        }
    """

    _SECTIONS = {"q": "nvidia-smi -q", "compute_cap": "nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader",
                 "nvlink": "nvidia-smi nvlink -s -i 0", "lgip": "nvidia-smi mig -lgip",
                 "lgipp": "nvidia-smi mig -lgipp"}

    @staticmethod
    def default():
        return {"status": "absent", "error": "nvidia-smi not found"}

    def command(self) -> str:
        return join(*(section(name, script, requires="nvidia-smi") for name, script in self._SECTIONS.items()))

    def process(self, output):
        sections = parse_sections(output)
        q = sections.get("q")
        if q is None:
            return {"status": "error", "error": "no output from nvidia-smi"}
        if not q.present:
            return self.default()
        if not q.ok:
            return {"status": "error", "error": q.text or f"nvidia-smi -q exited {q.rc}"}
        out = {"status": "ok", "error": None}
        for name in self._SECTIONS:
            sec = sections.get(name)
            out[name] = "\n".join(sec.lines) if sec is not None and sec.ok else ""
        return out
