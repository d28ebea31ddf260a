"""The user's own models: gpufleet_catalog_dir (validated like every setting) adds model files read by the same
strict loader; a user model with a packaged key replaces it, with a note printed once; one directory per run."""

from __future__ import annotations

import json
from importlib import resources

import pytest

import gpufleet.catalog as catalog_module
from gpufleet.catalog import load_catalog, load_package_catalog
from gpufleet.config import ConfigErrors, load_node_config, validate_inventory


@pytest.fixture(autouse=True)
def no_user_models(monkeypatch):
    """Each test starts (and leaves the process) with the packaged catalog only."""
    monkeypatch.setattr(catalog_module, "_USER_DIRECTORY", [])


def _model_file(directory, key="l4", **changes) -> dict:
    doc = json.loads((resources.files("gpufleet.catalog") / "models" / "l4.json").read_text())
    doc["key"] = key
    for field, value in changes.items():
        doc[field]["value"] = value
    directory.mkdir(exist_ok=True)
    (directory / f"{key}.json").write_text(json.dumps(doc))
    return doc


def test_a_user_model_with_a_packaged_key_replaces_it_with_one_note(tmp_path, capsys):
    _model_file(tmp_path / "cat", memory_mib=23000)
    _model_file(tmp_path / "cat", key="l4-lab", name="NVIDIA L4 (lab)", pci_device_id="0xFFFE10DE")
    for host in ("n1", "n2"):
        load_node_config(host, {"gpufleet_catalog_dir": str(tmp_path / "cat")})
    assert load_catalog().get("l4").memory_mib == 23000 and load_package_catalog().get("l4").memory_mib == 23034
    assert load_catalog().by_name("NVIDIA L4 (lab)").key == "l4-lab"
    assert load_catalog().get("h100-sxm") == load_package_catalog().get("h100-sxm")
    load_catalog()
    assert capsys.readouterr().err.splitlines() == [
        f"gpufleet: catalog: {tmp_path / 'cat'}/l4.json replaces the packaged model 'l4'"]


def test_bad_model_file_is_a_configuration_error_naming_host_key_and_file(tmp_path):
    _model_file(tmp_path / "cat", power_limits_w=[{"default_w": 72.0, "min_w": 90.0, "max_w": 72.0,
                                                   "source": "real: x"}])
    with pytest.raises(ConfigErrors) as err:
        load_node_config("n1", {"gpufleet_catalog_dir": str(tmp_path / "cat")})
    assert str(err.value).splitlines()[1] == (
        f"  - n1: gpufleet_catalog_dir='{tmp_path / 'cat'}': l4.json: power_limits_w[0]: expected min_w <= default_w "
        "<= max_w, got 90.0, 72.0, 72.0; allowed: model files the catalog's strict loader accepts, one directory "
        "for the whole fleet")
    assert catalog_module._USER_DIRECTORY == []


def test_one_directory_for_the_fleet_and_not_a_file(tmp_path):
    _model_file(tmp_path / "a")
    _model_file(tmp_path / "b")
    with pytest.raises(ConfigErrors) as err:
        validate_inventory([("n1", {"gpufleet_catalog_dir": str(tmp_path / "a")}),
                            ("n2", {"gpufleet_catalog_dir": str(tmp_path / "b")})])
    assert "n2: gpufleet_catalog_dir=" in str(err.value) and "one directory for the whole fleet" in str(err.value)
    with pytest.raises(ConfigErrors, match="not a directory"):
        load_node_config("n1", {"gpufleet_catalog_dir": str(tmp_path / "a" / "l4.json")})


def test_a_user_model_name_is_a_power_limit_key(tmp_path):
    _model_file(tmp_path / "cat", key="l4-lab", name="NVIDIA L4 (lab)", pci_device_id="0xFFFE10DE")
    config = load_node_config("n1", {"gpufleet_catalog_dir": str(tmp_path / "cat"),
                                     "gpufleet_power_limit_by_model": {"l4-lab": 60}})
    assert list(config.power.by_model) == ["l4-lab"]
