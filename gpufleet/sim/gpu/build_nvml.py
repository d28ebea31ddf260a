"""Build the simulated NVML (``libnvidia-ml.so.1``) from ``libnvidia-ml.c`` with gcc.

``python -m gpufleet.sim.gpu.build_nvml OUTDIR`` or ``build(out_dir)`` from Python.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("libnvidia-ml.c")
SONAME = "libnvidia-ml.so.1"
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-shared", "-fPIC", "-O2", f"-Wl,-soname,{SONAME}"]


class BuildError(RuntimeError):
    pass


def build(out_dir: str | Path, cc: str = "gcc") -> Path:
    """Compile the library into ``out_dir/libnvidia-ml.so.1`` and return its path."""
    compiler = shutil.which(cc)
    if compiler is None:
        raise BuildError(f"{cc} not found: a C compiler is needed to build the simulated NVML")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / SONAME
    tmp = out / f".{SONAME}.tmp"
    result = subprocess.run([compiler, *CFLAGS, "-o", str(tmp), str(SOURCE)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"building {SONAME} failed:\n{result.stderr}")
    tmp.replace(target)  # atomic: a process that has the old library mapped keeps it
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpufleet.sim.gpu.build_nvml OUTDIR", file=sys.stderr)
        return 2
    try:
        print(build(argv[0]))
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
