"""What the simulated driver package's maintainer scripts do to the 'kernel': load the module.

``python3 -m simgpu.driver load``: if no NVIDIA module is loaded, load this package's version. If another
version is loaded, it stays loaded until reboot (as a real kernel module does) and a reboot is flagged in
``/var/run/reboot-required`` like Ubuntu's driver packages do.
"""

from __future__ import annotations

import os
import sys

from . import daemon, state

REBOOT_REQUIRED = "/var/run/reboot-required"


def load() -> int:
    path = state.state_path()
    if not os.path.exists(path):
        return 0  # not booted (image build in a chroot): the module loads at first boot
    version = daemon.own_driver_version()
    with state.locked(path) as gpus:
        if gpus.get("driver.loaded") == "1" and gpus.get("driver.version") not in ("", version):
            print(f"NVIDIA driver {gpus['driver.version']} is loaded; {version} will be used after a reboot")
            with open(REBOOT_REQUIRED, "w", encoding="utf-8") as handle:
                handle.write("*** System restart required ***\n")
            with open(REBOOT_REQUIRED + ".pkgs", "a", encoding="utf-8") as handle:
                handle.write(f"nvidia-driver {version}\n")
            return 0
        state.load_driver(gpus, version, state.installed_cuda_version())
        if int(gpus.get("nvswitch.count", "0")):
            gpus.setdefault("fabric.state", "not_started")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["load"]:
        print("usage: python3 -m simgpu.driver load", file=sys.stderr)
        sys.exit(2)
    sys.exit(load())
