"""The probe bundle verify ships to ``/opt/gpufleet/probe/`` on each node: gpufleet's ``probe/`` directory (found
through :mod:`gpufleet.resources`) and ``pynvml.py``, the single pure-Python module of the control machine's
nvidia-ml-py. The node needs Python 3.9+ and the NVIDIA driver, no pip, no internet."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from gpufleet.resources import probe_paths

PROBE_REMOTE_DIR = "/opt/gpufleet/probe"
NVML_MODULE = "pynvml"

@dataclass(frozen=True)
class BundleFile:
    name: str  # file name under the remote probe directory
    path: str  # local file
    sha256: str


@dataclass(frozen=True)
class ProbeBundle:
    """What is shipped to ``/opt/gpufleet/probe/``: gpufleet's probe directory and nvidia-ml-py's ``pynvml.py``."""

    files: tuple[BundleFile, ...]
    nvml_py_version: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    def changed(self, remote_sums: Mapping[str, str]) -> list[BundleFile]:
        return [f for f in self.files if remote_sums.get(f.name) != f.sha256]


class VerifyError(Exception):
    """Verify cannot run at all (exit code 2); the message says why."""


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def nvml_module_path() -> str:
    """The control machine's nvidia-ml-py ``pynvml.py`` (a single pure-Python module: shipped as is)."""
    spec = importlib.util.find_spec(NVML_MODULE)
    origin = spec.origin if spec else None
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        raise VerifyError("nvidia-ml-py's pynvml.py is not installed on the control machine (pip install "
                          "nvidia-ml-py): verify ships it to the nodes with the probe")
    return origin


@lru_cache(maxsize=1)
def probe_bundle() -> ProbeBundle:
    paths = [(name, str(path)) for name, path in probe_paths()]
    paths.append((f"{NVML_MODULE}.py", nvml_module_path()))
    try:
        version = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        version = None
    return ProbeBundle(files=tuple(BundleFile(name, path, _sha256(path)) for name, path in paths),
                       nvml_py_version=version)
