"""A plain pyinfra deploy for benchmarks/scale.py: $GPUFLEET_PLAIN_OPS operations, each reading one fact (the File
fact of an absent file) and changing nothing; pyinfra's own cost per operation."""

import os

from pyinfra.operations import files

for number in range(int(os.environ["GPUFLEET_PLAIN_OPS"])):
    files.file(name=f"absent file {number}", path=f"/var/tmp/gpufleet-scale/absent-{number}", present=False)
