"""gpufleet.settings: every key in one table, and the documentation generated from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpufleet import config, connection, settings
from gpufleet.monitoring import config as monitoring_config
from gpufleet.verify import settings as verify_settings

REPO = Path(__file__).resolve().parents[2]


def test_the_documentation_tables_are_the_generated_ones():
    assert settings.stale(REPO) == [], "run: python -m gpufleet.settings --write"
    assert settings.main(["--check", "--root", str(REPO)]) == 0


def test_a_stale_table_is_found(tmp_path):
    for name in settings.DOCS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO / name).read_text().replace("gpufleet_nccl`", "gpufleet_ncl`", 1))
    assert settings.stale(tmp_path) == list(settings.DOCS)
    assert settings.main(["--check", "--root", str(tmp_path)]) == 1
    settings.main(["--write", "--root", str(tmp_path)])
    assert settings.stale(tmp_path) == []


def test_every_validated_key_is_in_the_table_once_with_the_validators_default():
    rows = settings.table()
    names = [s.name for s in rows]
    assert len(names) == len(set(names))
    assert set(names) == (set(config.KNOWN_KEYS) | set(verify_settings.VERIFY_KEYS) | set(monitoring_config.KEYS)
                          | set(connection.SETTINGS))
    by_name = {s.name: s for s in rows}
    for key, (parser, default) in config._KEYS.items():
        assert (by_name[key].parser, by_name[key].default) == (parser, default)
    assert by_name["gpufleet_verify_bench"].default == verify_settings.VerifySettings().bench


def test_a_key_the_validators_know_and_the_table_does_not_is_an_error(monkeypatch):
    monkeypatch.setattr(config, "_KEYS", {**config._KEYS, "gpufleet_new_thing": (config._bool, False)})
    monkeypatch.setattr(config, "KNOWN_KEYS", (*config.KNOWN_KEYS, "gpufleet_new_thing"))
    with pytest.raises(LookupError, match=r"undocumented \['gpufleet_new_thing'\]"):
        settings.table()


# examples that need something beyond the table (a UUID of a real GPU, a mig-parted file, a directory)
_CONTEXTUAL = {"gpufleet_power_limit_by_uuid", "gpufleet_mig_config_file", "gpufleet_mig_config",
               "gpufleet_templates_dir", "gpufleet_catalog_dir",
               "gpufleet_monitoring_routes"}  # routes: to a receiver defined beside


@pytest.mark.parametrize("setting", [s for s in settings.table() if s.name not in _CONTEXTUAL], ids=lambda s: s.name)
def test_each_example_is_valid(setting):
    value = ast.literal_eval(setting.example)
    if setting.name.startswith(verify_settings.VERIFY_PREFIX):
        found, errors = verify_settings.load_verify_settings("n", {setting.name: value})
        assert errors == [], errors
    elif setting.name.startswith(connection.PREFIX):
        _bounds, errors = connection.load_bounds("n", {setting.name: value})
        assert errors == [], errors
    elif setting.name.startswith(monitoring_config.PREFIX):
        *_found, errors = monitoring_config.load_monitoring_settings("n", {setting.name: value})
        assert errors == [], errors
    else:
        assert config.load_node_config("n", {setting.name: value})


def test_markdown_rows_escape_nothing_that_breaks_the_table():
    for kind in ("summary", "reference"):
        columns = {len(re.split(r"(?<!\\)\|", line)) for line in settings.markdown(kind).splitlines()}
        assert len(columns) == 1, kind
