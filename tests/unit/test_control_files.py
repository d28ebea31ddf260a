"""gpufleet.control_files and the report/state writers that use it: random temporary names beside the target, no
symlink followed; the Markdown report shows names literally (no raw HTML, no links from data)."""

from __future__ import annotations

import os

import pytest

from gpufleet import control_files
from gpufleet.report import markdown
from gpufleet.rollout import state as rollout_state


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text("untouched\n")
    return path


def test_a_symlink_at_the_old_fixed_temporary_names_is_not_followed(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    for name in (".report.json.tmp", f".state.json.{os.getpid()}.tmp", ".rollout.json.tmp"):
        (out / name).symlink_to(victim)
    control_files.write_atomic(out / "report.json", "{}\n")
    rollout_state.save(rollout_state.RolloutState.new("r1", "inv.py", "deploy.py", {}, ["n1"]), out / "state.json")
    assert victim.read_text() == "untouched\n"
    assert (out / "report.json").read_text() == "{}\n" and not (out / "report.json").is_symlink()
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()] == []


def test_a_symlink_at_the_target_is_replaced_not_written_through(tmp_path, victim):
    target = tmp_path / "report.md"
    target.symlink_to(victim)
    control_files.write_atomic(target, "# report\n", mode=0o640)
    assert victim.read_text() == "untouched\n"
    assert not target.is_symlink() and target.read_text() == "# report\n"
    assert target.stat().st_mode & 0o777 == 0o640


def test_markdown_cells_show_html_and_links_literally():
    cell = markdown._cell('<img src=x onerror="alert(1)"> & [click](javascript:alert(1)) | x')
    assert "<" not in cell and ">" not in cell and "](" not in cell.replace("\\](", "")
    assert cell == ('&lt;img src=x onerror="alert(1)"&gt; &amp; \\[click\\](javascript:alert(1)) \\| x')


def test_a_private_directory_is_created_0700_and_refused_when_shared(tmp_path):
    made = control_files.private_dir(tmp_path / "a" / "cache")
    assert made.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)
    with pytest.raises(control_files.UnsafePath, match=r"shared: refused: .* writable by group or others \(mode 1777"):
        control_files.private_dir(shared)
