"""Shared plumbing of the simulated NVIDIA daemons: fork like the real ones, hold the GPUs open."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from . import state


def own_driver_version() -> str:
    with open(state.own_driver_version_path(), encoding="utf-8") as handle:
        return handle.read().strip()


def register(name: str, pid: int, extra: Callable[[dict[str, str]], None] | None = None) -> None:
    """Open every GPU like the real daemon does: it then counts as a client holding them."""
    with state.locked() as gpus:
        for index in range(state.gpu_count(gpus)):
            gpus[f"gpu.{index}.client.{pid}"] = name
        if extra:
            extra(gpus)


def unregister(pid: int, extra: Callable[[dict[str, str]], None] | None = None) -> None:
    with state.locked() as gpus:
        for key in [k for k in gpus if k.endswith(f".client.{pid}")]:
            del gpus[key]
        if extra:
            extra(gpus)


def daemonize(pid_file: str | None) -> None:
    """Double fork (systemd Type=forking); the parent returns only in the daemon."""
    if os.fork():
        # Wait until the daemon wrote its pid file, as systemd reads it right after we exit.
        for _ in range(100):
            if pid_file is None or os.path.exists(pid_file):
                break
            time.sleep(0.02)
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    if pid_file:
        os.makedirs(os.path.dirname(pid_file), exist_ok=True)
        with open(pid_file + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
        os.rename(pid_file + ".tmp", pid_file)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def run(
    name: str,
    pid_file: str,
    on_start: Callable[[dict[str, str]], None] | None = None,
    on_stop: Callable[[dict[str, str]], None] | None = None,
) -> None:
    """Become the daemon ``name``: fork, hold every GPU open (then ``on_start(state)``), and when terminated let
    go of them (then ``on_stop(state)``)."""
    daemonize(pid_file)
    pid = os.getpid()
    register(name, pid, on_start)
    serve_until_terminated(lambda: unregister(pid, on_stop))


def serve_until_terminated(on_exit: Callable[[], None]) -> None:
    def stop(_signum, _frame):
        on_exit()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        signal.pause()
