"""NVIDIA's apt driver packaging as tests/reference/upstream records it (``nvidia-driver-guide/facts.json``): the
names the simulated NVIDIA repository publishes are read from the record, never from the product's constants, so
a product that strays from NVIDIA's names or key file meets a repository that does not have them."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

RECORD = Path(__file__).resolve().parents[2] / "tests/reference/upstream/nvidia-driver-guide/facts.json"


@cache
def record() -> dict:
    return json.loads(RECORD.read_text())


def metapackage(flavour: str) -> str:
    """The driver metapackage NVIDIA's guide installs for ``flavour`` (``open`` / ``proprietary``)."""
    return record()["apt_driver_install"]["metapackage"][flavour]


def pinning_package(branch: str) -> str:
    """NVIDIA's package that tracks ``branch``."""
    return record()["apt_driver_install"]["pinning_package"].format(branch=branch)


def unsuffixed_from() -> int:
    """The branch from which NVIDIA's Ubuntu packages carry no branch in their names ("Starting with branch 590")."""
    statements = record()["documents"]["recent_updates"]["statements"]
    return int(next(m.group(1) for s in statements if (m := re.search(r"Starting with branch (\d+)", s))))


def kernel_module_package(branch: str, flavour: str) -> str:
    """The DKMS kernel module package of ``branch`` and ``flavour``: ``nvidia-dkms-<branch>[-open]`` before the
    renames, ``nvidia-dkms[-open]`` from them on (the guide's Ubuntu 590 renames table)."""
    renamed = record()["documents"]["recent_updates"]["ubuntu_590_renames"]["renamed"]
    old, new = next((o, n) for o, n in renamed.items() if o.startswith("nvidia-dkms-")
                    and o.endswith("-open") == (flavour == "open"))
    if int(branch) >= unsuffixed_from():
        return new
    return old.replace(re.search(r"-(\d{3,})", old).group(1), branch, 1)


def key_files() -> list[str]:
    """The signing key file names NVIDIA's repository directories publish (Debian 13's from third parties)."""
    return sorted({entry["value"] for entry in record()["apt_key_files"].values()})
