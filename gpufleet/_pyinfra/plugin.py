"""gpufleet's ``pyinfra.connectors`` entry point (pyproject.toml): ``@gpufleet/HOST`` is pyinfra's SSH connector
with gpufleet's hooks, the class gpufleet's runs give their SSH hosts.

pyinfra imports every connector entry point when it builds an inventory, before it connects: that is where a
pyinfra CLI run first loads gpufleet, so the CLI's SIGINT handler (exit 0) is replaced here by one that exits 130
(:func:`gpufleet._pyinfra._signals.install_early`), also for a Ctrl-C while the hosts connect.
"""

from __future__ import annotations

from pyinfra.connectors.ssh import SSHConnector

from ._connector import gpufleet_class
from ._signals import install_early

GpufleetSSHConnector = gpufleet_class(SSHConnector)

install_early()
