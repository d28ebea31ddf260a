"""The upstream truth in tests/reference/upstream/: third-party files kept verbatim, with their provenance.

Tests hold gpufleet's names, paths, flags, labels and formats to these files (``from tests.upstream import ...``),
never to a copy typed into a test. Every file is listed in ``INDEX.json`` with where it came from (repository +
commit + path, or Debian package + version + suite) and its sha256; ``index_problems()`` says where the directory
and the index disagree (tests/unit/test_upstream_index.py keeps them in step). README.md there says what each
component holds and docs/upstream.md what gpufleet verifies against it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "reference" / "upstream"
INDEX = ROOT / "INDEX.json"
# gpufleet's own pages in the directory, not upstream material
NOT_UPSTREAM = frozenset({"INDEX.json", "README.md"})

# What each kind of provenance must name
REQUIRED_SOURCE_FIELDS = {
    "git": ("repo", "commit", "path"),
    "deb": ("package", "version", "suite", "mirror", "path", "deb_sha256"),
    "deb-run": ("package", "version", "suite", "mirror", "path", "command"),
    "apt-cache": ("package", "suite", "mirror", "command"),
    "pypi": ("package", "version", "file", "how"),
    "derived": ("how",),
}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Source kinds whose files may be kept verbatim; anything else (kind "git": fetched GitHub content) is recorded as facts
VERBATIM_KINDS = frozenset({"deb", "deb-run", "apt-cache", "pypi", "derived"})
# The keys a recorded file's entry in its facts.json must carry, as the index does
RECORDED_FIELDS = ("upstream", "component", "what", "facts", "source", "upstream_sha256")


@cache
def index(root: Path = ROOT) -> dict[str, dict]:
    """The index entries of the files kept here, by path (relative to the upstream directory)."""
    return {entry["path"]: entry for entry in json.loads((root / "INDEX.json").read_text())["files"]}


@cache
def recorded_index(root: Path = ROOT) -> dict[str, dict]:
    """The index entries of the upstream files recorded only as facts, by their upstream relpath."""
    return {entry["upstream"]: entry for entry in json.loads((root / "INDEX.json").read_text()).get("recorded", [])}


def path(relpath: str) -> Path:
    """The file's path; only files the index lists (a test never leans on an unrecorded file) and that are kept."""
    if relpath in recorded_index():
        raise KeyError(f"{relpath!r} is not kept verbatim (fetched GitHub content): its facts are in "
                       f"{recorded_index()[relpath]['facts']} (use recorded(), systemd_unit(), env_file(), "
                       "dcgm_exporter_counters(); compare a copy with upstream_sha256())")
    if relpath not in index():
        raise KeyError(f"{relpath!r} is not in {INDEX.relative_to(ROOT.parents[2])}: add it with its provenance first")
    return ROOT / relpath


def read(relpath: str) -> str:
    """The file's text, verbatim (files kept here only)."""
    return path(relpath).read_text()


def provenance(relpath: str) -> dict:
    """Where the file came from (the index entry's ``source``), kept or recorded."""
    if relpath in recorded_index():
        return recorded_index()[relpath]["source"]
    path(relpath)
    return index()[relpath]["source"]


def upstream_sha256(relpath: str) -> str:
    """The sha256 of the upstream file as it was collected: a copy made elsewhere is byte for byte upstream's when its
    sha256 is this one (and a refetch tells whether upstream changed)."""
    if relpath in recorded_index():
        return recorded_index()[relpath]["upstream_sha256"]
    path(relpath)
    return index()[relpath]["sha256"]


def facts(component: str) -> dict:
    """A component's ``facts.json`` (facts read from upstream sources, with path and line)."""
    return json.loads(read(f"{component}/facts.json"))


def recorded(relpath: str) -> dict:
    """The facts recorded for an upstream file not kept verbatim (its entry under ``files`` in its facts file):
    ``source``, ``upstream_sha256``, ``format`` and the format's facts, each with its line in the upstream file."""
    if relpath not in recorded_index():
        raise KeyError(f"{relpath!r} is not a recorded upstream file; recorded: {', '.join(sorted(recorded_index()))}")
    return json.loads(read(recorded_index()[relpath]["facts"]))["files"][relpath]


def systemd_unit(relpath: str) -> dict[str, list[tuple[str, str]]]:
    """A unit file as systemd reads it: section -> [(key, value)] in file order, repeated keys kept (``ExecStart=``
    twice is a reset and a command), comment lines dropped, backslash-continued lines joined with a space. For a
    recorded unit: its recorded directives (Description/Documentation are not recorded)."""
    if relpath in recorded_index():
        unit = recorded(relpath)
        if unit.get("format") != "systemd-unit":
            raise ValueError(f"{relpath}: recorded as {unit.get('format')!r}, not a systemd unit")
        return {section: [(item["key"], item["value"]) for item in items]
                for section, items in unit["sections"].items()}
    return parse_systemd_unit(read(relpath), where=relpath)


def parse_systemd_unit(text: str, where: str = "unit") -> dict[str, list[tuple[str, str]]]:
    """section -> [(key, value)] of a unit file's text, as :func:`systemd_unit` reads a kept file (the simulator's
    and gpufleet's own units are compared with upstream's through it)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            logical += line[:-1].rstrip() + " "
            continue
        line = (logical + line).strip()
        logical = ""
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        if current is None or "=" not in line:
            raise ValueError(f"{where}: not a unit file line: {raw!r}")
        key, value = line.split("=", 1)
        sections[current].append((key.strip(), value.strip()))
    return sections


def unit_values(relpath: str, section: str, key: str) -> list[str]:
    """Every value of one key in one section, in order."""
    return [value for name, value in systemd_unit(relpath).get(section, []) if name == key]


def env_file(relpath: str) -> dict[str, str]:
    """A shell-style environment file (``/etc/default/*``): KEY=value lines, quotes and escapes as a shell reads
    them, comments and blank lines skipped."""
    if relpath in recorded_index():
        env = recorded(relpath)
        if env.get("format") != "env-file":
            raise ValueError(f"{relpath}: recorded as {env.get('format')!r}, not an environment file")
        # as a shell reads the assignment (quotes removed)
        return {key: shlex.split(f"{key}={fact['value']}")[0].split("=", 1)[1]
                for key, fact in env["variables"].items()}
    values: dict[str, str] = {}
    for raw in read(relpath).splitlines():
        for word in shlex.split(raw, comments=True, posix=True):
            if "=" not in word:
                raise ValueError(f"{relpath}: not a KEY=value assignment: {raw!r}")
            key, value = word.split("=", 1)
            values[key] = value
    return values


def debian_unit_path(suite: str, package: str, unit: str) -> str:
    """The index path of a unit a Debian package ships (bookworm: lib/systemd/system, trixie: usr/lib/...)."""
    for prefix in ("lib/systemd/system", "usr/lib/systemd/system"):
        candidate = f"debian/{suite}/{package}/{prefix}/{unit}"
        if candidate in index():
            return candidate
    raise KeyError(f"no {unit} of {package} ({suite}) in the upstream truth")


def debian_control(suite: str, package: str) -> dict[str, str]:
    """A package's DEBIAN/control fields (continuation lines joined with newlines)."""
    fields: dict[str, str] = {}
    key = None
    for line in read(f"debian/{suite}/{package}/DEBIAN/control").splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields


def dcgm_exporter_counters(relpath: str = "dcgm-exporter/etc/default-counters.csv") -> dict[str, str]:
    """dcgm-exporter's counter file: DCGM field -> Prometheus type (gauge, counter, label), as the exporter reads
    it (lines starting with '#' are comments; fields are comma-separated with free spacing): the enabled rows."""
    return {row["field"]: row["type"] for row in dcgm_exporter_counter_rows(relpath) if row["enabled"]}


def dcgm_exporter_counter_rows(relpath: str = "dcgm-exporter/etc/default-counters.csv") -> list[dict]:
    """Every row of a dcgm-exporter counter file, commented out or not: {field, type, enabled, line} (the help
    messages are not recorded)."""
    counters = recorded(relpath)
    if counters.get("format") != "dcgm-exporter-counters":
        raise ValueError(f"{relpath}: recorded as {counters.get('format')!r}, not a dcgm-exporter counter file")
    return counters["rows"]


def dcgm_exporter_versions() -> list[str]:
    """The dcgm-exporter tags (and HEAD, unreleased main) whose label/flag facts are recorded."""
    return list(facts("dcgm-exporter")["versions"])


def dcgm_exporter_label_facts(version: str = "4.5.3-4.8.2") -> dict:
    """What a dcgm-exporter version puts on its series: ``hostname_label`` on GPU series ('Hostname' in every
    release, 'hostname' only on unreleased main), ``nvlink_hostname_label``, ``gpu_labels`` in order,
    ``xid_err_labels`` (err_code/err_msg on DCGM_FI_DEV_XID_ERRORS since 3.3.6-3.4.2), and its CLI ``flags``
    (long name -> {aliases, value, usage}), and whether ``-r`` turns the hostname label into the host engine's
    address (``hostname_from_remote_hostengine_address``)."""
    recorded = facts("dcgm-exporter")["versions"]
    if version not in recorded:
        raise KeyError(f"no facts for dcgm-exporter {version!r}; recorded: {', '.join(recorded)}")
    v = recorded[version]
    return {
        "commit": v["commit"],
        "hostname_label": v["gpu_metric_line"]["hostname_label"],
        "nvlink_hostname_label": v.get("nvlink_metric_line", {}).get("hostname_label"),
        "gpu_labels": v["gpu_metric_line"]["labels_in_order"],
        "xid_err_labels": sorted({w["label"] for w in v["xid_err_labels"]["where"]}),
        "flags": {f["name"]: {k: f.get(k) for k in ("aliases", "value", "usage")} for f in v["flags"].values()},
        "remote_hostengine_only_when_flag_set": bool(v["remote_hostengine_only_when_flag_set"]),
        "ships_packaging_unit": v["ships_packaging_unit"],
        # since 4.0.0: with -r the hostname label is the host part of -r ("localhost" for -r localhost:5555),
        # not the node's name (internal/pkg/hostname/hostname.go, outside Kubernetes mode)
        "hostname_from_remote_hostengine_address": bool(v["hostname_from_remote_hostengine_address"]),
    }


def dcgm_exporter_releases() -> list[str]:
    """The dcgm-exporter tags whose field map is recorded (go-dcgm/facts.json), oldest first."""
    return list(facts("go-dcgm")["releases"])


def dcgm_exporter_field_names(tag: str) -> frozenset[str]:
    """The DCGM field names a dcgm-exporter release accepts in its counters file: every name of the field maps
    (current and legacy) of the go-dcgm commit its go.mod pins."""
    release = facts("go-dcgm")["releases"][tag]
    maps = recorded(release["field_map"])["maps"]
    return frozenset(name for block in maps.values() for name in block["names"])


def dcgm_field_ids(tag: str = "v4.6.0") -> dict[str, int]:
    """DCGM field name -> numeric id as dcgm_fields.h of that DCGM tag defines it (aliases resolved)."""
    fields = facts("dcgm")["versions"][tag]["dcgm_fields_h"]["fields"]
    return {name: fact["id"] for name, fact in fields.items() if fact is not None}


def xid_catalog() -> dict[int, dict]:
    """NVIDIA's Xid table: xid -> {mnemonic, resolution (RESET_GPU, RESTART_BM, RESTART_APP, IGNORE, ...), fatal}."""
    table = json.loads(read("xid/catalog.json"))["xids"]
    return {int(xid): {k: row[k] for k in ("mnemonic", "resolution", "fatal")} for xid, row in table.items()}


def nvml_facts() -> dict:
    """NVML constants from nvidia-ml-py: temperature threshold ids, GPU recovery action values, field ids."""
    return json.loads(read("nvml/facts.json"))


GRAFANA_PROVISIONING_FILES = {
    "datasource_types": "grafana/pkg/services/provisioning/datasources/types.go",
    "datasource_reader": "grafana/pkg/services/provisioning/datasources/config_reader.go",
    "provider_types": "grafana/pkg/services/provisioning/dashboards/types.go",
    "provider_reader": "grafana/pkg/services/provisioning/dashboards/config_reader.go",
    "file_reader": "grafana/pkg/services/provisioning/dashboards/file_reader.go.head.excerpt.go",
    "provisioning": "grafana/pkg/services/provisioning/provisioning.go",
    "values": "grafana/pkg/services/provisioning/values/values.go",
    "prometheus_plugin": "grafana/public/app/plugins/datasource/prometheus/plugin.json",
    "http_settings": "grafana/grafana-plugin-sdk-go/backend/http_settings.go",
    "sdk_common": "grafana/grafana-plugin-sdk-go/backend/common.go",
}


def grafana_provisioning() -> dict:
    """What Grafana reads from its provisioning files, as its source parses them (recorded facts): the keys of a
    datasource file (``datasource_file_keys``, each entry's ``datasource_keys``) and of a dashboard provider file
    (``provider_file_keys``, ``provider_keys``, a file provider's ``provider_option_keys``) at apiVersion 1 (go-yaml
    ignores any other key), the ``subdirectories`` of the provisioning path they are read from and the file
    ``suffixes``, the Prometheus plugin's id (a datasource's ``type``), the ``json_data_keys`` and
    ``secure_json_data_keys`` its HTTP client reads, which jsonData switches make it read ``tlsCACert``, its default
    access, the provider type Grafana defaults to, and the literal-dollar escape of interpolated values."""
    f = {name: recorded(relpath) for name, relpath in GRAFANA_PROVISIONING_FILES.items()}
    api_version = f["datasource_types"]["api_version_key"]["value"]
    suffixes = f["datasource_reader"]["file_suffixes"]["value"]
    if f["provider_reader"]["file_suffixes"]["value"] != suffixes:
        raise ValueError("datasource and dashboard provisioning files are read with different suffixes")
    return {
        "api_version_key": api_version,
        "datasource_file_keys": {api_version, *f["datasource_types"]["file_keys_v1"]["keys"]},
        "datasource_keys": set(f["datasource_types"]["datasource_keys_v1"]["keys"]),
        "provider_file_keys": {f["provider_types"]["api_version_key"]["value"],
                               *f["provider_types"]["file_keys_v1"]["keys"]},
        "provider_keys": set(f["provider_types"]["provider_keys_v1"]["keys"]),
        "provider_option_keys": set(f["file_reader"]["option_keys"]),
        "default_provider_type": f["provider_reader"]["default_type"]["value"],
        "subdirectories": set(f["provisioning"]["subdirectories"]),
        "suffixes": tuple(suffixes),
        "prometheus_type": f["prometheus_plugin"]["id"]["value"],
        "json_data_keys": set(f["http_settings"]["json_data_keys"]),
        "secure_json_data_keys": set(f["http_settings"]["secure_json_data_keys"]),
        "tls_ca_cert_only_with": set(f["http_settings"]["tls_ca_cert_only_with"]["value"]),
        "basic_auth_password_key": f["sdk_common"]["basic_auth_password"]["value"],
        "default_access": f["http_settings"]["default_access"]["value"],
        "literal_dollar": f["values"]["literal_dollar"]["value"],
    }


def _source_problems(where: str, source: dict) -> list[str]:
    problems = []
    kind = source.get("kind")
    if kind not in REQUIRED_SOURCE_FIELDS:
        problems.append(f"{where}: source kind {kind!r} is none of {', '.join(REQUIRED_SOURCE_FIELDS)}")
    else:
        problems += [f"{where}: {kind} source without {f!r}" for f in REQUIRED_SOURCE_FIELDS[kind] if not source.get(f)]
    if kind == "git" and not _COMMIT.match(source.get("commit", "")):
        problems.append(f"{where}: commit {source.get('commit')!r} is not a full sha")
    if kind == "derived" and not any(source.get(k) for k in ("repo", "repos", "commits", "from")):
        problems.append(f"{where}: derived without the sources it was derived from")
    return problems


def recorded_problems(root: Path, recorded_entries: list[dict], listed: dict[str, dict]) -> list[str]:
    """Where the upstream files recorded as facts disagree with the index: no provenance or upstream sha256, a
    verbatim copy kept after all, or a facts file that is not indexed or does not record the file as the index says."""
    problems: list[str] = []
    seen = set()
    for entry in recorded_entries:
        where = entry.get("upstream", "<no upstream>")
        if where in seen:
            problems.append(f"{where}: recorded twice")
        seen.add(where)
        problems += [f"{where}: recorded without {field!r}" for field in RECORDED_FIELDS if not entry.get(field)]
        problems += _source_problems(where, entry.get("source") or {})
        if not re.fullmatch(r"[0-9a-f]{64}", entry.get("upstream_sha256") or ""):
            problems.append(f"{where}: upstream_sha256 {entry.get('upstream_sha256')!r} is not a sha256")
        if (root / where).exists() or where in listed:
            problems.append(f"{where}: recorded as facts but a verbatim copy is kept")
        facts_file = entry.get("facts")
        if facts_file not in listed or not (root / facts_file).is_file():
            problems.append(f"{where}: its facts file {facts_file!r} is not an indexed file")
            continue
        try:
            fact = json.loads((root / facts_file).read_text()).get("files", {}).get(where)
        except ValueError as exc:
            problems.append(f"{where}: {facts_file} unreadable: {exc}")
            continue
        if fact is None:
            problems.append(f"{where}: not recorded under 'files' in {facts_file}")
        elif (fact.get("source"), fact.get("upstream_sha256")) != (entry.get("source"), entry.get("upstream_sha256")):
            problems.append(f"{where}: {facts_file} records another source or upstream_sha256 than INDEX.json")
    return problems


def index_problems(root: Path = ROOT) -> list[str]:
    """Where the directory and its index disagree: unlisted files, listed files missing or changed (sha256),
    entries without provenance, files kept verbatim from a
    source that may only be recorded as facts, recorded files whose facts or provenance are missing."""
    problems: list[str] = []
    try:
        document = json.loads((root / "INDEX.json").read_text())
        entries = document["files"]
        recorded_entries = document.get("recorded", [])
    except (OSError, ValueError, KeyError) as exc:
        return [f"INDEX.json unreadable: {exc}"]
    listed = {}
    for entry in entries:
        where = entry.get("path", "<no path>")
        if where in listed:
            problems.append(f"{where}: listed twice")
        listed[where] = entry
        for field in ("path", "component", "what", "sha256", "source"):
            if not entry.get(field):
                problems.append(f"{where}: no {field!r}")
        source = entry.get("source") or {}
        problems += _source_problems(where, source)
        if source.get("kind") in REQUIRED_SOURCE_FIELDS and source["kind"] not in VERBATIM_KINDS:
            problems.append(f"{where}: kept verbatim, but {source['kind']} content may not be committed "
                            "(record its facts with provenance instead)")
        file = root / where
        if not file.is_file():
            problems.append(f"{where}: listed but missing")
            continue
        data = file.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            problems.append(f"{where}: sha256 differs from the index "
                            "(the file changed; upstream files are never edited)")
    problems += recorded_problems(root, recorded_entries, listed)
    recorded_paths = {entry.get("upstream") for entry in recorded_entries}
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix()
        if rel not in listed and rel not in NOT_UPSTREAM and rel not in recorded_paths:
            problems.append(f"{rel}: in the directory but not in INDEX.json")
    return problems
