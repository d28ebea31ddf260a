"""Power-on of a simulated host: what the GPUs and the driver look like when the machine boots.

Run by boot_loop.sh outside the host, while it is down: ``python -m gpufleet.sim.boot HOSTDIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .gpu import state


def power_on(host_dir: Path) -> None:
    state_file = host_dir / "hw" / "gpus.state"
    root = str(host_dir / "root")
    with state.locked(str(state_file)) as gpus:
        state.reset_for_boot(gpus, state.installed_driver_version(root), state.installed_cuda_version(root))


if __name__ == "__main__":
    power_on(Path(sys.argv[1]))
