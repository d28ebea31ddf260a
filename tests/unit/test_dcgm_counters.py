"""The counters file per dcgm-exporter release (gpufleet/plan/dcgm_counters.py, operations/exporters.py) held to
the field map each release pins (tests/reference/upstream/go-dcgm/facts.json): a release is never given a field it
does not know (it would refuse the whole file and stay down), and loses none it knows."""

from __future__ import annotations

import re

import pytest

from gpufleet.operations import exporters
from gpufleet.operations.dcgm_package import of_release, pin_text
from gpufleet.plan import dcgm_counters
from tests import upstream

RELEASES = upstream.dcgm_exporter_releases()
OURS = [field for field, _, _ in (*exporters.HEALTH_COUNTERS, *exporters.PROFILING_COUNTERS)]


def release(tag: str) -> dcgm_counters.Release:
    found = dcgm_counters.exporter_release(tag)
    assert found is not None
    return found


def test_the_record_spans_3_3_to_the_newest_release_and_each_names_how_the_exporter_looks_names_up():
    assert RELEASES[0].startswith("3.3.") and RELEASES[-1] == "4.5.3-4.8.2"
    assert [release(t) for t in RELEASES] == sorted(release(t) for t in RELEASES)
    for tag in RELEASES:
        fact = upstream.facts("go-dcgm")["releases"][tag]
        assert fact["exporter_version"] == dcgm_counters.release_text(release(tag))
        assert fact["lookup"]["uses"] in (["DCGM_FI", "OLD_DCGM_FI"], ["GetFieldID", "IsLegacyField"])
        # "Could not find DCGM field NAME" up to 3.3.3-3.3.1, "could not find DCGM field; err: ..." since
        assert fact["lookup"]["refusal_prefix"].lower() == "could not find dcgm field"
        assert fact["go_mod"]["require"].endswith(fact["go_dcgm_commit"][:12])


def test_the_product_table_is_the_records_first_release_of_each_field():
    first = {}
    for field in OURS:
        knowing = [tag for tag in RELEASES if field in upstream.dcgm_exporter_field_names(tag)]
        assert knowing, f"{field}: no recorded dcgm-exporter release knows it"
        # once known, known by every later release (the table has no "until")
        assert knowing == RELEASES[RELEASES.index(knowing[0]):], field
        first[field] = release(knowing[0])
    assert dcgm_counters.OLDEST_RECORDED == release(RELEASES[0])
    assert dcgm_counters.FIELD_SINCE == {f: r for f, r in first.items() if r != dcgm_counters.OLDEST_RECORDED}
    # the three: the recovery action from 4.5.1-4.8.0, the clock event reasons from 4.0.0-4.0.1, the slowdown
    # threshold in every recorded release
    assert first["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == (4, 8, 0)
    assert first["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == (4, 0, 1)
    assert first["DCGM_FI_DEV_SLOWDOWN_TEMP"] == dcgm_counters.OLDEST_RECORDED


@pytest.mark.parametrize("tag", RELEASES)
@pytest.mark.parametrize("profiling", [False, True])
def test_each_release_gets_every_counter_it_knows_and_no_other(tag, profiling):
    text, left_out = exporters.counters_csv(profiling, release(tag))
    written = [line.split(",")[0] for line in text.splitlines() if not line.startswith("#")]
    known = upstream.dcgm_exporter_field_names(tag)
    wanted = OURS if profiling else [f for f, _, _ in exporters.HEALTH_COUNTERS]
    assert written == [f for f in wanted if f in known]
    assert left_out == [f for f in wanted if f not in known]


def test_the_versions_apt_and_the_setting_name_are_the_release():
    assert dcgm_counters.exporter_release("1:4.2.3-4.1.3-1") == (4, 1, 3)
    assert dcgm_counters.exporter_release("4.2.3-4.1.3") == (4, 1, 3)
    assert dcgm_counters.exporter_release("4.8.2-1") == (4, 8, 2)
    assert dcgm_counters.exporter_release("") is None


def test_the_pin_admits_the_release_only():
    assert "Pin: version /^([0-9]+:)?4\\.2\\.3-4\\.1\\.3(-|$)/\nPin-Priority: 1000" in pin_text("4.2.3-4.1.3")
    assert re.search(r"Package: datacenter-gpu-manager-exporter\nPin: version \*\nPin-Priority: -1\n$",
                     pin_text("4.2.3-4.1.3"))
    assert of_release("1:4.2.3-4.1.3-1", "4.2.3-4.1.3") and of_release("4.2.3-4.1.3", "4.2.3-4.1.3")
    assert not of_release("1:4.2.3-4.1.30-1", "4.2.3-4.1.3") and not of_release("1:4.5.3-4.8.2-1", "4.2.3-4.1.3")
    assert of_release("4.1.3-1", "4.1.3") and of_release("1:4.2.3-4.1.3-1", "4.1.3")
    assert not of_release(None, "4.1.3")
