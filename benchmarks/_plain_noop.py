"""A plain pyinfra deploy for benchmarks/scale.py: $GPUFLEET_PLAIN_OPS operations that together read
$GPUFLEET_PLAIN_READS facts (default: one each; spread evenly), each read the File fact of an absent file, and
change nothing: pyinfra's own cost for that many operations and fact reads (its API only: ``@operation``,
``host.get_fact``, ``host.noop``)."""

import os

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import File


@operation()
def absent_files(paths: list):
    """No-op unless one of ``paths`` exists (none does)."""
    present = [path for path in paths if host.get_fact(File, path=path) is not None]
    if present:
        yield f"rm -f {' '.join(present)}"
    else:
        host.noop(f"{len(paths)} files absent")


_ops = int(os.environ["GPUFLEET_PLAIN_OPS"])
_reads = max(_ops, int(os.environ.get("GPUFLEET_PLAIN_READS", _ops)))
_read = 0
for number in range(_ops):
    count = _reads // _ops + (1 if number < _reads % _ops else 0)
    absent_files(name=f"absent files {number}",
                 paths=[f"/var/tmp/gpufleet-scale/absent-{_read + i}" for i in range(count)])
    _read += count
