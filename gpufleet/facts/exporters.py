"""What the package repositories offer for the monitoring exporters: parse, never decide."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


class AptCandidate(FactBase):
    """
    The version apt would install of a package (``apt-cache policy``), or None when no configured repository
    offers it (or the host has no apt).

    .. code:: python

        host.get_fact(AptCandidate, package="datacenter-gpu-manager-exporter")
        "1:4.2.3-4.1.3-1"
    """

    def command(self, package: str) -> str:
        return (f"LC_ALL=C apt-cache policy {shlex.quote(package)} 2>/dev/null "
                "| sed -n 's/^ *Candidate: *//p'; true")

    def process(self, output):
        for line in output:
            value = line.strip()
            if value and value != "(none)":
                return value
        return None
