"""The node-side health check as one zip application (``python3 gpufleet-healthcheck.pyz``), control side.

The node has Python 3 and the NVIDIA driver, no gpufleet: the zip holds the gpufleet modules the check imports
(verify's checks and thresholds, the catalog, the probe, the Slurm client: standard library only) and the control
machine's nvidia-ml-py ``pynvml.py``. Reproducible (fixed timestamps, sorted entries): an unchanged bundle is an
unchanged file on the node.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from gpufleet.exporter import reproducible_zip

BUNDLE_NAME = "gpufleet-healthcheck.pyz"
PACKAGE = Path(__file__).resolve().parent  # gpufleet/
# what gpufleet.healthcheck.node imports, transitively (tests/unit/test_healthcheck.py runs the zip alone)
MODULES = ("__init__.py", "config.py", "control_files.py", "masking.py", "web_auth.py", "slurm.py",
           "interruption.py", "healthcheck/__init__.py", "healthcheck/node.py",
           "verify/__init__.py", "verify/checks.py", "verify/exporter_checks.py", "verify/expected.py",
           "results.py", "verify/recovery.py", "verify/thresholds.py", "verify/xid.py", "verify/thresholds.json",
           "verify/xid_catalog.json", "probe/__init__.py", "probe/probe.py", "probe/probe_nvml.py")
PACKAGES = ("catalog", "node", "plan")  # every .py and .json under them
_MAIN = b"import sys\nfrom gpufleet.healthcheck.node import main\nsys.exit(main())\n"


def bundle_files() -> list[tuple[str, bytes]]:
    """(archive name, content) of every file of the bundle, sorted by name."""
    paths = [PACKAGE / name for name in MODULES]
    for package in PACKAGES:
        paths += [p for p in (PACKAGE / package).rglob("*") if p.suffix in (".py", ".json")]
    files = [("__main__.py", _MAIN)]
    # zipimport finds no namespace package (gpufleet/node has no __init__.py): an empty one stands in for it
    files += [(f"gpufleet/{package}/__init__.py", b"") for package in PACKAGES
              if not (PACKAGE / package / "__init__.py").exists()]
    files += [(f"gpufleet/{p.relative_to(PACKAGE).as_posix()}", p.read_bytes()) for p in paths]
    spec = importlib.util.find_spec("pynvml")
    if spec is None or not spec.origin:
        raise RuntimeError("pynvml (nvidia-ml-py) is not installed on the control machine: the health check ships "
                           "it to the nodes")
    files.append(("pynvml.py", Path(spec.origin).read_bytes()))
    return sorted(files)


@functools.cache
def bundle() -> bytes:
    """The zip application, reproducible; built once per process."""
    return reproducible_zip(bundle_files())
