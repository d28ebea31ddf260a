"""``gpufleet-healthcheck``: Slurm's ``HealthCheckProgram`` on a GPU node.

:mod:`.node` runs on the node (verify's fast checks against the node's own plan, then a drain or a resume through
``scontrol``); :mod:`.bundle` packs it with what it imports into one zip application the ``slurm`` stage installs.
"""
