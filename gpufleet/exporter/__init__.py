"""gpufleet's GPU exporter (``gpu_exporter.py``, node side) and its bundle (control side).

The node needs Python 3.9+ and the NVIDIA driver, no pip and no internet: :func:`bundle` packs the exporter,
the control machine's nvidia-ml-py ``pynvml.py`` and its prometheus-client package into one zip application
(``python3 gpufleet-gpu-exporter.pyz``). The zip is byte-for-byte reproducible (fixed timestamps, sorted
entries), so an unchanged bundle is an unchanged file on the node and the deploy reports no change.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import zipfile
from pathlib import Path

EXPORTER_SOURCE = Path(__file__).with_name("gpu_exporter.py")
XID_ERR_MSG_SOURCE = Path(__file__).with_name("xid_err_msg.py")  # the err_msg label of each Xid
# "is this MIG layout applied": the comparison the MIG stage, its node-side applier and verify share
MIG_COMPARE_SOURCE = Path(__file__).parent.parent / "node" / "mig_compare.py"
WEB_SOURCE = Path(__file__).with_name("web.py")  # basic auth and TLS (exporter-toolkit's web configuration file)
BUNDLE_NAME = "gpufleet-gpu-exporter.pyz"
_MAIN = b"import sys\nfrom gpu_exporter import main\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


class BundleError(RuntimeError):
    """A library the exporter needs is missing on the control machine."""


def _module_origin(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise BundleError(f"{name} is not installed on the control machine (pip install gpufleet installs it): "
                          "the exporter ships it to the nodes")
    return Path(spec.origin)


def bundle_files() -> list[tuple[str, bytes]]:
    """(archive name, content) of every file of the bundle, sorted by name."""
    files = [("__main__.py", _MAIN), ("gpu_exporter.py", EXPORTER_SOURCE.read_bytes()),
             ("xid_err_msg.py", XID_ERR_MSG_SOURCE.read_bytes()), ("mig_compare.py", MIG_COMPARE_SOURCE.read_bytes()),
             ("web.py", WEB_SOURCE.read_bytes())]
    nvml = _module_origin("pynvml")
    files.append(("pynvml.py", nvml.read_bytes()))
    package = _module_origin("prometheus_client").parent
    for path in sorted(package.rglob("*.py")):
        files.append((f"prometheus_client/{path.relative_to(package).as_posix()}", path.read_bytes()))
    return sorted(files)


@functools.cache
def bundle() -> bytes:
    """The zip application, reproducible; built once per process, not once per host whose GPU exporter is ours."""
    return reproducible_zip(bundle_files())


def reproducible_zip(files: list[tuple[str, bytes]]) -> bytes:
    """A zip of ``files`` ((archive name, content), in that order) with fixed timestamps and modes: the same files
    make the same bytes (gpufleet's zip applications: this exporter, gpufleet.healthcheck_bundle)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return out.getvalue()


def write_bundle(directory: str | os.PathLike) -> Path:
    path = Path(directory) / BUNDLE_NAME
    path.write_bytes(bundle())
    return path
