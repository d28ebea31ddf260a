"""The simulator's dcgm-exporter releases (gpufleet/sim/repo_dcgm.py): generated from the record of each release's
field map, at least one before 4.5.1-4.8.0 and the newest, and a stand-in that refuses, as the real exporter does, a
counters file naming a field its release does not know."""

from __future__ import annotations

import pytest

from gpufleet.operations.exporters import counters_csv
from gpufleet.plan.dcgm_counters import exporter_release
from gpufleet.sim import repo, repo_dcgm
from gpufleet.sim.gpu import dcgm
from tests import upstream


def test_the_published_releases_are_the_records_field_maps():
    releases = repo_dcgm.releases()
    assert {tag: frozenset(names) for tag, names in releases.items()} == {
        tag: upstream.dcgm_exporter_field_names(tag) for tag in releases}, (
        "regenerate gpufleet/sim/dcgm_exporter_fields.json from tests/reference/upstream/go-dcgm/facts.json")
    assert list(releases)[-1] == upstream.dcgm_exporter_releases()[-1]
    assert any(exporter_release(tag) < (4, 8, 0) for tag in releases)  # one before 4.5.1-4.8.0
    offered = [(p, v) for p, v, _r, _k in repo.packages() if p == "datacenter-gpu-manager-exporter"]
    assert offered == [("datacenter-gpu-manager-exporter", tag) for tag in releases]


@pytest.mark.parametrize("tag", list(repo_dcgm.releases()))
def test_each_release_starts_with_the_counters_gpufleet_writes_for_it_and_refuses_any_other(tmp_path, tag):
    known = frozenset(repo_dcgm.releases()[tag])
    ours = tmp_path / "counters.csv"
    text, left_out = counters_csv(True, exporter_release(tag))
    ours.write_text(text)
    assert [row[0] for row in dcgm.read_counters(str(ours), known)] == [
        line.split(",")[0] for line in text.splitlines() if not line.startswith("#")]
    full = tmp_path / "full.csv"
    full.write_text(counters_csv(True)[0])
    if left_out:
        with pytest.raises(dcgm.Refused, match=f"^could not find DCGM field; err: .*'{left_out[0]}'"):
            dcgm.read_counters(str(full), known)
    else:
        assert len(dcgm.read_counters(str(full), known)) == len(full.read_text().splitlines()) - 1


def test_the_package_installs_its_release_field_map(tmp_path):
    tag = list(repo_dcgm.releases())[0]
    tree = repo._dcgm_tree(tmp_path, "datacenter-gpu-manager-exporter", tag, "1")
    release, known = dcgm.field_map(str(tree / repo_dcgm.FIELD_MAP_RELPATH))
    assert (release, known) == (tag, frozenset(repo_dcgm.releases()[tag]))
    control = (tree / "DEBIAN/control").read_text()
    assert f"Version: 1:{tag}-1\n" in control
    assert f"Depends: datacenter-gpu-manager-4-core (>= 1:{tag.split('-')[0]})" in control
