"""gpufleet._pyinfra's version guard: the fast paths on exactly the pyinfra series CI ran, the plain path (said in
one line) on any other version or with their switch off."""

from __future__ import annotations

import pytest

from gpufleet import _pyinfra
from gpufleet._pyinfra import _guard


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for switch in (_pyinfra.FACT_MEMO, _pyinfra.ROLLOUT_INPROCESS):
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setattr(_guard, "_said", set())


@pytest.mark.parametrize("switch", [_pyinfra.FACT_MEMO, _pyinfra.ROLLOUT_INPROCESS])
def test_the_series_ci_ran_takes_the_fast_path(switch):
    assert _pyinfra.TESTED_PYINFRA == ((3, 10),)
    for version in ("3.10.0", "3.10.1", "3.10.12", "3.10.0.post1"):
        assert _pyinfra.plain_path(switch, version) is None, version


@pytest.mark.parametrize("switch", [_pyinfra.FACT_MEMO, _pyinfra.ROLLOUT_INPROCESS])
def test_any_other_version_takes_the_plain_path(switch):
    for version in ("3.9.2", "3.11.0", "3.1.0", "4.0.0", "2.10.0"):
        assert _pyinfra.plain_path(switch, version) == f"pyinfra {version} is not a version CI ran (3.10.x)"


def test_the_installed_pyinfra_is_one_ci_ran():
    """CI runs the pinned pyinfra: where this fails, the fast paths are off in CI and TESTED_PYINFRA needs a look."""
    assert _pyinfra.version_tested(), _pyinfra.pyinfra_version()
    assert _pyinfra.plain_path(_pyinfra.FACT_MEMO) is None


@pytest.mark.parametrize("value", ["off", "OFF", "0", "no", "false"])
def test_a_switch_off_takes_the_plain_path(monkeypatch, value):
    monkeypatch.setenv(_pyinfra.FACT_MEMO, value)
    assert _pyinfra.plain_path(_pyinfra.FACT_MEMO, "3.10.0") == "GPUFLEET_FACT_MEMO is off"
    assert _pyinfra.plain_path(_pyinfra.ROLLOUT_INPROCESS, "3.10.0") is None  # each switch its own


def test_the_plain_path_is_said_in_one_line_per_switch():
    said: list[str] = []
    for _ in range(3):
        _pyinfra.say_plain_path(_pyinfra.FACT_MEMO, "pyinfra 3.11.0 is not a version CI ran (3.10.x)", said.append)
    _pyinfra.say_plain_path(_pyinfra.ROLLOUT_INPROCESS, "GPUFLEET_ROLLOUT_INPROCESS is off", said.append)
    assert said == [
        "gpufleet: plain path (pyinfra 3.11.0 is not a version CI ran (3.10.x)): every fact read is a remote command",
        "gpufleet: plain path (GPUFLEET_ROLLOUT_INPROCESS is off): the rollout runs one pyinfra process per pass and "
        "wave",
    ]


def test_the_connector_is_found_through_pyinfras_entry_point():
    """``@gpufleet/HOST``: pyinfra's SSH connector with gpufleet's hooks, registered in pyproject.toml's
    ``pyinfra.connectors`` entry points and found by pyinfra's own inventory."""
    from pyinfra.api import Inventory
    from pyinfra.api.connectors import get_all_connectors
    from pyinfra.connectors.ssh import SSHConnector

    from gpufleet._pyinfra import _connector

    assert get_all_connectors()["gpufleet"] is _connector.SSHConnector
    host = Inventory((["@gpufleet/node01"], {})).get_host("@gpufleet/node01")
    assert host.connector_cls is _connector.SSHConnector and issubclass(host.connector_cls, SSHConnector)
    assert host.data.ssh_hostname == "node01"
