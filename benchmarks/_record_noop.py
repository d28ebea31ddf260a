"""A deploy file for benchmarks/scale.py: deploys/gpu_node.py, recording every command the hosts answer (the
command as pyinfra's @fake connector sees it, and the host's real answer) into $GPUFLEET_RECORD_OUT (JSON)."""

import atexit
import json
import os

from pyinfra import host

from gpufleet.deploys.gpu_node import gpu_node

_recorded: dict[str, dict[str, dict]] = {}


def _record(target) -> None:
    """Record at the connector class's own ``run_shell_command`` (this recording process only): below gpufleet's
    connector subclass (gpufleet._pyinfra._connector), which the fact memo's reads and its read-ahead go through,
    so what is recorded is what the host was really sent."""
    cls = type(target.connector)
    if getattr(cls, "_gpufleet_recording", False):
        return
    original = cls.run_shell_command

    def run(self, command, *args, **kwargs):
        ok, output = original(self, command, *args, **kwargs)
        text = command if isinstance(command, str) else command.get_masked_value()
        _recorded.setdefault(self.host.name, {})[text] = {
            "success": bool(ok), "stdout": list(output.stdout_lines), "stderr": list(output.stderr_lines)}
        return ok, output

    cls.run_shell_command = run
    cls._gpufleet_recording = True


def _dump() -> None:
    with open(os.environ["GPUFLEET_RECORD_OUT"], "w") as out:
        json.dump(_recorded, out, indent=1, sort_keys=True)


if not _recorded and not getattr(host.state, "_gpufleet_recording", False):
    host.state._gpufleet_recording = True
    for each in host.state.inventory:
        _record(each)
    atexit.register(_dump)

gpu_node()
