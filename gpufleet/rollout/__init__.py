"""``gpufleet rollout``: change a fleet in ordered waves with a canary, a verify gate after each wave, drain and
return around the change, a stop when too many nodes fail, and a state file to resume from.

Modules: :mod:`.waves` (counts, wave sizes, thresholds: pure), :mod:`.state` (per-node state machine, atomic state
file), :mod:`.converge` (pyinfra as a subprocess, its ``--json`` per-host result), :mod:`.drain` (none /
command hook / Slurm), :mod:`.run` (the controller), :mod:`.report` (summary, rollout JSON, JUnit and HTML).
"""
