"""gpufleet.resources: the templates, node scripts and probe files found through importlib.resources."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import resources
from gpufleet.config import ConfigErrors, load_node_config

REPO = Path(__file__).resolve().parents[2]


def test_every_template_of_the_checkout_is_a_package_resource():
    on_disk = sorted(str(p.relative_to(REPO / "templates")) for p in (REPO / "templates").rglob("*.j2"))
    assert on_disk and resources.template_names() == on_disk


def test_node_scripts_and_probe_files_are_the_package_files():
    assert resources.node_script("gpu-settings.sh") == (REPO / "gpufleet/node/gpu-settings.sh").read_text()
    names = [name for name, _ in resources.probe_paths()]
    assert names == ["__init__.py", "__main__.py", "probe.py", "probe_nvml.py", "bench.py", "exporters.py"]
    assert all(path.read_bytes() == (REPO / "gpufleet/probe" / name).read_bytes()
               for name, path in resources.probe_paths())


def test_a_template_in_the_override_directory_wins_by_name_and_the_others_stay(tmp_path):
    (tmp_path / "nccl.conf.j2").write_text("# site header\n{% for k, v in settings %}{{ k }}={{ v }}\n{% endfor %}")
    text = resources.render_template("nccl.conf.j2", str(tmp_path), settings=[("NCCL_DEBUG", "WARN")], path="x")
    assert text == "# site header\nNCCL_DEBUG=WARN\n"
    unit = resources.render_template("systemd/nvidia-persistenced-gpufleet.conf.j2", str(tmp_path),
                                     command="/usr/bin/nvidia-persistenced --user u --persistence-mode",
                                     flag="--persistence-mode")
    assert "ExecStart=/usr/bin/nvidia-persistenced --user u --persistence-mode" in unit


def test_templates_dir_setting_must_be_a_directory(tmp_path):
    assert load_node_config("n1", {"gpufleet_templates_dir": str(tmp_path)}) is not None
    with pytest.raises(ConfigErrors) as error:
        load_node_config("n1", {"gpufleet_templates_dir": str(tmp_path / "missing")})
    assert str(error.value).endswith(f"n1: gpufleet_templates_dir={str(tmp_path / 'missing')!r}: not a directory; "
                                     "allowed: a directory on the control machine holding templates named as "
                                     "gpufleet's (e.g. nccl.conf.j2, systemd/...)")
