"""The oneshot boot units that reapply GPU settings after a reboot, shared by the power and clocks operations.

GPU settings (power limits, clock locks, persistence, MIG instances) are volatile: they are gone after a
reboot or a driver reload. An operation that sets one live also writes the desired values to a file under
``/etc/gpufleet/`` and installs a ``Type=oneshot`` ``RemainAfterExit=yes`` unit that reapplies them at boot
through ``gpufleet-gpu-settings`` (``gpufleet/node/gpu-settings.sh``).
"""

from __future__ import annotations

import posixpath
import shlex

from .managed_files import node_script, put_file, remove_file, render
from .units import UNIT_DIR, is_running, systemctl

GPU_SETTINGS_SCRIPT = "/usr/local/sbin/gpufleet-gpu-settings"
# Units a GPU-settings unit runs after: the driver's daemons first, then the MIG layout (a GPU reset by the
# MIG stage would drop settings applied before it). Absent units are ignored by systemd.
GPU_SETTINGS_AFTER = ("nvidia-persistenced.service", "nvidia-fabricmanager.service", "gpufleet-mig.service")
GPU_SETTINGS_WANTS = ("nvidia-persistenced.service",)


def gpu_settings_unit(unit: str, description: str, kind: str, conf: str) -> str:
    """Text of the oneshot unit that runs ``gpufleet-gpu-settings KIND CONF`` at boot."""
    return render(
        "systemd/gpufleet-gpu-settings.service.j2",
        unit=unit,
        description=description,
        after=GPU_SETTINGS_AFTER,
        wants=GPU_SETTINGS_WANTS,
        exec_start=" ".join(shlex.quote(a) for a in (GPU_SETTINGS_SCRIPT, kind, conf)),
        conf=conf,
    )


def gpu_settings_paths(unit: str, conf: str) -> tuple[str, ...]:
    return (conf, GPU_SETTINGS_SCRIPT, posixpath.join(UNIT_DIR, unit))


def install_gpu_settings(state: dict, unit: str, description: str, kind: str, conf: str, conf_text: str,
                         start: bool):
    """Commands: desired values file, node script, oneshot unit (daemon-reload when it changed), enabled at
    boot, and started when ``start`` (it then shows ``active (exited)`` until the next boot, as after one).

    ``state`` is ``get_state(paths=gpu_settings_paths(unit, conf), units=(unit,))``.
    """
    files = state["files"]
    unit_path = posixpath.join(UNIT_DIR, unit)
    yield from put_file(files[conf], conf, conf_text)
    yield from put_file(files[GPU_SETTINGS_SCRIPT], GPU_SETTINGS_SCRIPT, node_script("gpu-settings.sh"), "755")
    unit_cmds = list(put_file(files[unit_path], unit_path, gpu_settings_unit(unit, description, kind, conf)))
    yield from unit_cmds
    status = state["units"][unit]
    if unit_cmds or status["need_daemon_reload"]:
        yield systemctl("daemon-reload")
    if status["unit_file_state"] != "enabled":
        yield systemctl("enable", unit)
    if start and status["active_state"] != "active":
        yield systemctl("start", unit)


def remove_gpu_settings(state: dict, unit: str, conf: str):
    """Commands: the unit stopped, disabled and removed, the values file removed (the node script stays: the
    other settings unit may use it)."""
    files = state["files"]
    unit_path = posixpath.join(UNIT_DIR, unit)
    status = state["units"][unit]
    if is_running(status):
        yield systemctl("stop", unit)
    if status["unit_file_state"] == "enabled":
        yield systemctl("disable", unit)
    if files[unit_path] is not None:
        yield from remove_file(files[unit_path], unit_path)
        yield systemctl("daemon-reload")
    yield from remove_file(files[conf], conf)
