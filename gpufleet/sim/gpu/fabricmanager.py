"""Simulated nv-fabricmanager: trains the NVSwitch fabric; refuses a driver of another version.

``nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg``; forks like the real one.
"""

from __future__ import annotations

import os
import sys

from . import daemon, state

PID_FILE = "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
NAME = "nv-fabricmanager"
VERSION_FILE = "/usr/lib/gpufleet-sim/fabricmanager-version"


def main(argv: list[str]) -> int:
    with open(os.environ.get("GPUFLEET_SIM_FM_VERSION_FILE", VERSION_FILE), encoding="utf-8") as handle:
        own = handle.read().strip()
    gpus = state.read_state()
    driver = gpus.get("driver.version", "") if gpus.get("driver.loaded") == "1" else ""
    if driver != own:
        print(f"fabric manager NVIDIA GPU driver interface version {own} don't match with driver version "
              f"{driver or 'unknown'}. Please update with matching NVIDIA driver package.", file=sys.stderr)
        return 1
    if int(gpus.get("nvswitch.count", "0")) == 0:
        print("NVIDIA Fabric Manager: no NVSwitch devices found, nothing to manage", file=sys.stderr)
        return 1

    def fabric(value: str):
        def apply(current: dict[str, str]) -> None:
            current["fabric.state"] = value
        return apply

    daemon.run(NAME, PID_FILE, fabric("completed"), fabric("not_started"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
