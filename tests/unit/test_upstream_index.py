"""The upstream truth stays what was collected: every file indexed with its provenance and unchanged (sha256), fetched
GitHub content recorded only as facts (never kept verbatim), and the accessors other tests use read those files and
facts as systemd and a shell would."""

from __future__ import annotations

import json
import shutil

import pytest

from tests import upstream


def test_directory_and_index_agree():
    assert upstream.index_problems() == []


@pytest.fixture
def copy(tmp_path):
    """A scratch copy of the upstream directory to tamper with."""
    root = tmp_path / "upstream"
    shutil.copytree(upstream.ROOT, root)
    assert upstream.index_problems(root) == []
    return root


EXPORTER_UNIT = "dcgm-exporter/packaging/config-files/systemd/nvidia-dcgm-exporter.service"
DCGM_UNIT = "dcgm/config-files/systemd/nvidia-dcgm.service.in"


def test_a_changed_file_is_caught(copy):
    default = copy / "debian/bookworm/prometheus/etc/default/prometheus"
    default.write_text(default.read_text().replace('ARGS=""', 'ARGS="--web.listen-address=:9091"'))
    assert upstream.index_problems(copy) == [
        "debian/bookworm/prometheus/etc/default/prometheus: sha256 differs from the index "
        "(the file changed; upstream files are never edited)"]


def test_a_changed_recorded_fact_is_caught(copy):
    facts = copy / "dcgm-exporter/facts.json"
    facts.write_text(facts.read_text().replace('"on-abort"', '"on-failure"'))
    assert upstream.index_problems(copy) == [
        "dcgm-exporter/facts.json: sha256 differs from the index (the file changed; upstream files are never edited)"]


def test_an_unlisted_file_and_a_missing_file_are_caught(copy):
    (copy / "dcgm/extra.service").write_text("[Unit]\n")
    (copy / "xid/catalog.json").unlink()
    assert upstream.index_problems(copy) == [
        "xid/catalog.json: listed but missing",
        "xid/NVSentinel/xiderrorsmapping.csv: its facts file 'xid/catalog.json' is not an indexed file",
        "dcgm/extra.service: in the directory but not in INDEX.json"]


@pytest.mark.parametrize("field", ["repo", "commit", "path"])
def test_git_provenance_is_required(copy, field):
    index = json.loads((copy / "INDEX.json").read_text())
    entry = next(e for e in index["recorded"] if e["upstream"] == DCGM_UNIT)
    del entry["source"][field]
    (copy / "INDEX.json").write_text(json.dumps(index))
    assert f"{DCGM_UNIT}: git source without {field!r}" in upstream.index_problems(copy)


def test_no_git_content_is_kept_verbatim():
    """The workplace's rule: content fetched from GitHub (index kind 'git') is never committed; it is recorded as
    facts. Every git entry of the index is a recorded one, with no file at its path."""
    document = json.loads(upstream.INDEX.read_text())
    assert [e["path"] for e in document["files"] if e["source"]["kind"] not in upstream.VERBATIM_KINDS] == []
    recorded = [e for e in document["recorded"] if e["source"]["kind"] == "git"]
    assert len(recorded) == len(document["recorded"]) > 0
    assert [e["upstream"] for e in recorded if (upstream.ROOT / e["upstream"]).exists()] == []


def test_a_verbatim_copy_of_git_content_is_caught(copy):
    unit = copy / EXPORTER_UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\n")
    assert upstream.index_problems(copy) == [f"{EXPORTER_UNIT}: recorded as facts but a verbatim copy is kept"]


def test_a_git_file_listed_as_kept_is_caught(copy):
    index = json.loads((copy / "INDEX.json").read_text())
    recorded = next(e for e in index["recorded"] if e["upstream"] == DCGM_UNIT)
    index["recorded"].remove(recorded)
    (copy / DCGM_UNIT).parent.mkdir(parents=True)
    (copy / DCGM_UNIT).write_text("[Unit]\n")
    index["files"].append({"path": DCGM_UNIT, "component": "dcgm", "what": recorded["what"],
                           "source": recorded["source"], "sha256": upstream.hashlib.sha256(b"[Unit]\n").hexdigest()})
    (copy / "INDEX.json").write_text(json.dumps(index))
    assert upstream.index_problems(copy) == [
        f"{DCGM_UNIT}: kept verbatim, but git content may not be committed (record its facts with provenance instead)"]


def test_facts_that_disagree_with_the_index_are_caught(copy):
    index = json.loads((copy / "INDEX.json").read_text())
    next(e for e in index["recorded"] if e["upstream"] == DCGM_UNIT)["upstream_sha256"] = "0" * 64
    (copy / "INDEX.json").write_text(json.dumps(index))
    assert upstream.index_problems(copy) == [
        f"{DCGM_UNIT}: dcgm/facts.json records another source or upstream_sha256 than INDEX.json"]


def test_a_recorded_file_needs_its_facts(copy):
    facts = json.loads((copy / "dcgm/facts.json").read_text())
    del facts["files"][DCGM_UNIT]
    (copy / "dcgm/facts.json").write_text(json.dumps(facts))
    index = json.loads((copy / "INDEX.json").read_text())
    next(e for e in index["files"] if e["path"] == "dcgm/facts.json")["sha256"] = upstream.hashlib.sha256(
        (copy / "dcgm/facts.json").read_bytes()).hexdigest()
    (copy / "INDEX.json").write_text(json.dumps(index))
    assert upstream.index_problems(copy) == [f"{DCGM_UNIT}: not recorded under 'files' in dcgm/facts.json"]


def test_deb_provenance_names_package_version_and_suite(copy):
    index = json.loads((copy / "INDEX.json").read_text())
    entry = next(e for e in index["files"] if e["path"] == "debian/bookworm/prometheus/etc/default/prometheus")
    del entry["source"]["version"]
    entry["what"] = ""
    (copy / "INDEX.json").write_text(json.dumps(index))
    where = "debian/bookworm/prometheus/etc/default/prometheus"
    assert upstream.index_problems(copy) == [f"{where}: no 'what'", f"{where}: deb source without 'version'"]


def test_only_indexed_files_can_be_read():
    with pytest.raises(KeyError, match="not in tests/reference/upstream/INDEX.json"):
        upstream.read("dcgm-exporter/nothing.service")
    with pytest.raises(KeyError, match="not kept verbatim .* its facts are in dcgm-exporter/facts.json"):
        upstream.read(EXPORTER_UNIT)


def test_recorded_files_keep_their_provenance_and_sha256():
    assert upstream.provenance(EXPORTER_UNIT) == {
        "kind": "git", "repo": "NVIDIA/dcgm-exporter", "commit": "691c92762eb551313c825f6efe4ceeee20982801",
        "tag": "4.5.3-4.8.2", "path": "packaging/config-files/systemd/nvidia-dcgm-exporter.service"}
    assert upstream.upstream_sha256(EXPORTER_UNIT) == \
        "99466203545ab0b8f5076a26579a2ea45a0602b3933fe92d363cf63cdfe1b2d6"
    assert upstream.upstream_sha256("debian/bookworm/prometheus/etc/default/prometheus") == \
        upstream.index()["debian/bookworm/prometheus/etc/default/prometheus"]["sha256"]
    with pytest.raises(KeyError, match="not a recorded upstream file"):
        upstream.recorded("debian/bookworm/prometheus/etc/default/prometheus")


def test_recorded_units_are_served_as_systemd_reads_them():
    assert upstream.systemd_unit(EXPORTER_UNIT) == {
        "Unit": [("Wants", "nvidia-dcgm.service"), ("After", "nvidia-dcgm.service")],
        "Service": [("User", "root"), ("PrivateTmp", "false"), ("StandardOutput", "append:/var/log/dcgm-exporter.log"),
                    ("StandardError", "append:/var/log/dcgm-exporter.log"),
                    ("ExecStart", "/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv"),
                    ("Restart", "on-abort")],
        "Install": [("WantedBy", "multi-user.target")]}
    assert upstream.unit_values(DCGM_UNIT, "Install", "Alias") == ["dcgm.service"]
    assert upstream.recorded(EXPORTER_UNIT)["installed_as"]["path"] == \
        "/lib/systemd/system/nvidia-dcgm-exporter.service"
    with pytest.raises(ValueError, match="recorded as 'env-file', not a systemd unit"):
        upstream.systemd_unit("grafana/stale/packaging/deb/default/grafana-server")


def test_systemd_unit_keeps_repeated_keys_and_joins_continuations():
    unit = upstream.systemd_unit("grafana/stale/packaging/deb/systemd/grafana-server.service")
    assert [v for k, v in unit["Service"] if k == "Restart"] == ["on-failure", "on-failure"]
    (exec_start,) = upstream.unit_values("grafana/stale/packaging/deb/systemd/grafana-server.service",
                                         "Service", "ExecStart")
    assert exec_start.split() == ["/usr/sbin/grafana-server", "--config=${CONF_FILE}", "--pidfile=${PID_FILE}",
                                  "cfg:default.paths.logs=${LOG_DIR}", "cfg:default.paths.data=${DATA_DIR}",
                                  "cfg:default.paths.plugins=${PLUGINS_DIR}"]


def test_env_file_reads_values_as_a_shell_does():
    assert upstream.env_file("debian/bookworm/prometheus/etc/default/prometheus") == {"ARGS": ""}
    assert upstream.env_file("grafana/stale/packaging/deb/default/grafana-server")["CONF_FILE"] == \
        "/etc/grafana/grafana.ini"


def test_accessors_read_the_recorded_facts():
    assert upstream.dcgm_exporter_label_facts("4.5.3-4.8.2")["hostname_label"] == "Hostname"
    assert upstream.dcgm_exporter_label_facts("HEAD")["hostname_label"] == "hostname"
    assert upstream.dcgm_exporter_label_facts("3.3.5-3.4.1")["xid_err_labels"] == []
    assert upstream.dcgm_exporter_label_facts("3.3.6-3.4.2")["xid_err_labels"] == ["err_code", "err_msg"]
    assert upstream.dcgm_exporter_label_facts("4.5.3-4.8.2")["hostname_from_remote_hostengine_address"]
    assert not upstream.dcgm_exporter_label_facts("3.3.9-3.6.1")["hostname_from_remote_hostengine_address"]
    assert upstream.dcgm_exporter_counters()["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    rows = {r["line"]: r for r in upstream.dcgm_exporter_counter_rows()}
    assert rows[18] == {"field": "DCGM_FI_PROF_PCIE_TX_BYTES", "type": "counter", "enabled": False, "line": 18}
    assert rows[20] == {"field": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "type": "counter", "enabled": True, "line": 20}
    assert upstream.dcgm_field_ids()["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == 1523
    assert upstream.xid_catalog()[79] == {"mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
                                          "resolution": "RESTART_BM", "fatal": True}
    assert upstream.debian_unit_path("trixie", "prometheus", "prometheus.service") == \
        "debian/trixie/prometheus/usr/lib/systemd/system/prometheus.service"
    assert upstream.debian_control("bookworm", "prometheus")["Package"] == "prometheus"
