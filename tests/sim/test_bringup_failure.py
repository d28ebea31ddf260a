"""A bring-up that fails half way leaves nothing behind."""

from __future__ import annotations

import subprocess

import pytest
from conftest import _can_simulate

from gpufleet.sim import hosts


def test_failed_bring_up_tears_down_everything(monkeypatch):
    assert _can_simulate() is None
    hosts.down(log=lambda *_: None)

    def boot_never_finishes(host, timeout=0):
        raise hosts.SimError(f"{host.name}: injected boot failure")

    monkeypatch.setattr(hosts, "_wait_ready", boot_never_finishes)
    with pytest.raises(hosts.SimError, match="injected boot failure"):
        hosts.up(2, ["l40s-4"], log=lambda *_: None)
    assert hosts.leftovers() == []
    assert hosts.Fleet.load() is None
    nspawns = subprocess.run(["pgrep", "-f", f"systemd-nspawn.*{hosts.sim_dir()}"], capture_output=True, text=True)
    assert nspawns.stdout == ""
