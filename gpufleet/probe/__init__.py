"""Node-side programs: the probe (``probe.py``; its NVML part ``probe_nvml.py``) and the benchmarks (``bench.py``).

Everything in this directory runs on a GPU node with only the Python standard library (>= 3.9) and
nvidia-ml-py; it imports nothing else from gpufleet, so the directory can be copied to a node as it is
(``PROBE_DIR``) and run as ``python3 probe.py [--bench quick]``; it prints one JSON document.
"""

from __future__ import annotations

import os

from .probe import PROBE_VERSION, SCHEMA, SCHEMA_VERSION, collect, main

PROBE_DIR = os.path.dirname(os.path.abspath(__file__))
PROBE_FILES = ("__init__.py", "__main__.py", "probe.py", "probe_nvml.py", "bench.py", "exporters.py")

__all__ = ["PROBE_DIR", "PROBE_FILES", "PROBE_VERSION", "SCHEMA", "SCHEMA_VERSION", "collect", "main"]
