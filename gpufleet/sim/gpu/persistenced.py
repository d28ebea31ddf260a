"""Simulated nvidia-persistenced: keeps the GPUs initialised; with persistence mode on, sets it on every GPU.

Command line as the real daemon: ``nvidia-persistenced [--user USER|-u USER|--user=USER] [--persistence-mode |
--no-persistence-mode] [--verbose]``. It forks (systemd ``Type=forking``) and writes
``/var/run/nvidia-persistenced/nvidia-persistenced.pid``. When it stops, persistence mode goes off on the
GPUs it enabled it on, as with the real daemon. A ``--user`` that does not exist fails the start, as the real
daemon's change to that user would.
"""

from __future__ import annotations

import os
import pwd
import sys

from . import daemon, state

PID_FILE = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
NAME = "nvidia-persistenced"


def main(argv: list[str]) -> int:
    persistence = True
    user = None
    for position, arg in enumerate(argv):
        if arg == "--persistence-mode":
            persistence = True
        elif arg == "--no-persistence-mode":
            persistence = False
        elif arg in ("--user", "-u") and position + 1 < len(argv):
            user = argv[position + 1]
        elif arg.startswith("--user="):
            user = arg.partition("=")[2]
    if user is not None:
        # the real daemon changes to that user (it stays root here): one that does not exist is a failed start
        try:
            pwd.getpwnam(user)
        except KeyError:
            print(f"nvidia-persistenced failed to initialize: no user {user!r}. Check syslog for more details.",
                  file=sys.stderr)
            return 1
    if os.geteuid() != 0:
        print("nvidia-persistenced failed to initialize. Check syslog for more details.", file=sys.stderr)
        return 1
    gpus = state.read_state()
    if gpus.get("driver.loaded") != "1" or gpus.get("driver.version") != daemon.own_driver_version():
        print("nvidia-persistenced failed to initialize. Check syslog for more details.", file=sys.stderr)
        return 1

    def set_persistence(value: str):
        def apply(current: dict[str, str]) -> None:
            for index in range(state.gpu_count(current)):
                if current.get(f"gpu.{index}.lost") != "1":
                    current[f"gpu.{index}.persistence"] = value
        return apply

    if persistence:
        daemon.run(NAME, PID_FILE, set_persistence("1"), set_persistence("0"))
    else:
        daemon.run(NAME, PID_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
