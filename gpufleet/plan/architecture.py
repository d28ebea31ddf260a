"""A GPU's architecture from the hardware, for any NVIDIA GPU: what decides the kernel module flavour and the newest
driver branch it can take.

Three sources, best first: the catalog model; ``compute_cap`` from nvidia-smi once a driver answers; the chip code of
the PCI ID database (``/usr/share/misc/pci.ids``, Debian's ``pci.ids``: ``GV100GL [Tesla V100 SXM2 16GB]``) before
one exists. The chip prefixes and compute capabilities are NVIDIA's (recorded in
``tests/reference/upstream/nvidia-architectures/facts.json``), as are the branches that end an architecture's support.
"""

from __future__ import annotations

import re

# NVIDIA chip code prefix -> architecture (the directories of NVIDIA's open-gpu-kernel-modules
# ``src/common/inc/swref/published/<architecture>/<chip>``; GK: NVIDIA's legacy release list "GKxxx Kepler")
CHIP_ARCHITECTURES = {"GK": "Kepler", "GM": "Maxwell", "GP": "Pascal", "GV": "Volta", "TU": "Turing",
                      "GA": "Ampere", "AD": "Ada Lovelace", "GH": "Hopper", "GB": "Blackwell"}
# compute capability major (or major.minor) -> architecture (CUDA C++ Programming Guide; CUDA GPUs page)
COMPUTE_CAP_ARCHITECTURES = {"3": "Kepler", "5": "Maxwell", "6": "Pascal", "7": "Volta", "7.5": "Turing",
                             "8": "Ampere", "8.9": "Ada Lovelace", "9": "Hopper", "10": "Blackwell",
                             "11": "Blackwell", "12": "Blackwell"}
# the last driver branch that supports an architecture (NVIDIA's Unix driver deprecation schedule)
LAST_BRANCH = {"Kepler": 470, "Maxwell": 580, "Pascal": 580, "Volta": 580}
_CHIP_RE = re.compile(r"^([A-Z]{2})(\d{2,3})[A-Z]*")


def chip_of(pci_name: str | None) -> str | None:
    """The chip code of a pci.ids device name (``GV100GL [Tesla V100 SXM2 16GB]`` -> ``GV100GL``), if it has one."""
    m = _CHIP_RE.match(pci_name or "")
    return m.group(0) if m and m.group(1) in CHIP_ARCHITECTURES else None


def architecture_of_chip(chip: str | None) -> str | None:
    return CHIP_ARCHITECTURES.get((chip or "")[:2])


def architecture_of_compute_cap(compute_cap: str | None) -> str | None:
    """``7.0`` -> Volta, ``7.5`` -> Turing, ``8.9`` -> Ada Lovelace, ``12.0`` -> Blackwell; None when unknown."""
    text = str(compute_cap or "").strip()
    major, _, minor = text.partition(".")
    return COMPUTE_CAP_ARCHITECTURES.get(f"{major}.{minor}") or COMPUTE_CAP_ARCHITECTURES.get(major)


def branch_supported(architecture: str | None, branch: str) -> bool:
    """Whether driver ``branch`` (``590``) still supports ``architecture`` (unknown: assumed so)."""
    last = LAST_BRANCH.get(architecture or "")
    try:
        return last is None or int(str(branch).split(".")[0]) <= last
    except ValueError:
        return True
