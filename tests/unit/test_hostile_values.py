"""Hostile strings in every string setting that reaches a generated file: each is refused by validation (with the
key named) or comes back exactly from the file, parsed by the file format's own rules.

A hand-made corpus (quotes, line breaks, command substitution, backticks, Go/Jinja template syntax, unicode, the
matcher-splitting ``",host=~".+",x!="``, NUL, a lone surrogate, ...) goes into every position of every
``gpufleet_*`` setting of :func:`gpufleet.settings.table` that holds a string: the setting itself, list items, mapping
keys and values. :data:`NOT_IN_A_FILE` names the settings whose strings never reach a generated file (and why);
a setting in neither that table nor :data:`POSITIONS` fails the test, so a new setting cannot skip it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet import settings, web_auth
from gpufleet.config import ConfigErrors, load_node_config
from gpufleet.monitoring import config as monitoring_config
from gpufleet.monitoring import render
from gpufleet.operations import driver, nccl

HOSTILE = [
    '"', "'", "a\nb", "a\r\nb", "line\n", "$(touch /tmp/gpufleet-pwned)", "`touch /tmp/gpufleet-pwned`",
    "{{ .CommonLabels }}", "{{", "}}", "{% raw %}", "ünïcødé ✓ 日本", '",host=~".+",x!="', 'a",b="c', "\\", "\\n",
    "\\\"", "a b", "${HOME}", "; reboot", "# comment", "x=y", "key: value", "- item", "\t", "\x00", "\x7f", "\u2028",
    "\ud800", "", "a,b", "*", "&anchor", "!!python/object:os.system", "%(x)s", "<b>&amp;</b>",
]

# Settings whose strings never reach a generated file on a host, and why.
NOT_IN_A_FILE = {
    "gpufleet_templates_dir": "a directory on the control machine",
    "gpufleet_catalog_dir": "a directory on the control machine (model files read by the strict loader)",
    "gpufleet_mig_config_file": "a file on the control machine, read and validated as the inline layout",
    "gpufleet_mig_config": "a label of that file",
    "gpufleet_verify_textfile_dir": "a directory in verify's shell command (shlex-quoted), not in a file",
    "gpufleet_verify_python": "a command name in verify's shell command",
    "gpufleet_verify_out": "a directory on the control machine",
    "gpufleet_verify_bench": "a choice of verify's (none, quick, full)",
    "gpufleet_ssh_connect_timeout": "a number", "gpufleet_ssh_keepalive_interval": "a number",
    "gpufleet_ssh_dead_after": "a number", "gpufleet_config_version": "a number",
    "gpufleet_allow_reboot": "a boolean", "gpufleet_driver_secure_boot_signing": "a boolean",
    "gpufleet_exporters_node": "a boolean", "gpufleet_exporters_gpu_count": "a number",
    "gpufleet_monitoring_grafana": "a boolean",
    "gpufleet_exporters_tls_fleet_ca": "a boolean", "gpufleet_monitoring_tls_fleet_ca": "a boolean",
    # the Grafana settings are the grafana step's (its own change covers their files)
    "gpufleet_monitoring_grafana_admin_password": "Grafana's (the grafana step's own tests)",
}


# --------------------------------------------------------------------------------- format rules (parse back)

_GO_SPACE = "[\t\n\f\r ]"  # RE2's \s
_MATCHER_RE = re.compile(rf"^{_GO_SPACE}*([a-zA-Z_:][a-zA-Z0-9_:]*){_GO_SPACE}*(=~|=|!=|!~){_GO_SPACE}*(.*?)"
                         rf"{_GO_SPACE}*\Z", re.S)


def parse_matchers(text: str) -> list[tuple[str, str, str]]:
    """prometheus/alertmanager pkg/labels/parse.go ParseMatchers + ParseMatcher, ported line by line (the classic
    parser of Alertmanager 0.25, Debian 12's; later versions fall back to it): [(label, op, value)]."""
    text = text.removeprefix("{").removesuffix("}")
    tokens, token, inside, escaped = [], "", False, False
    for r in text:
        if r == "," and not inside:
            tokens.append(token)
            token = ""
            continue
        if r == '"':
            if not escaped:
                inside = not inside
            else:
                escaped = False
        elif r == "\\":
            escaped = not escaped
        else:
            escaped = False
        token += r
    if token.strip():
        tokens.append(token.strip())
    found = []
    for token in tokens:
        match = _MATCHER_RE.match(token)
        if match is None:
            raise ValueError(f"bad matcher format: {token}")
        raw = match[3]
        expect_trailing = raw.startswith('"')
        raw = raw[1:] if expect_trailing else raw
        data = raw.encode("utf-8")
        value, escaped, i = [], False, 0
        for r in raw:  # Go ranges over runes with their byte offset i
            size = len(r.encode("utf-8"))
            if escaped:
                escaped = False
                value.append({"n": "\n", '"': '"', "\\": "\\"}.get(r, "\\" + r))
            elif r == "\\":
                if i < len(data) - 1:
                    escaped = True
                else:
                    value.append("\\")
            elif r == '"':
                if not expect_trailing or i < len(data) - 1:
                    raise ValueError(f"matcher value contains unescaped double quote: {match[3]}")
                expect_trailing = False
            else:
                value.append(r)
            i += size
        if expect_trailing:
            raise ValueError(f"matcher value contains unescaped double quote: {match[3]}")
        found.append((match[1], match[2], "".join(value)))
    return found


def parse_nccl_conf(text: str) -> dict[str, str]:
    """NCCL's setEnvFile (src/misc/param.cc): each line up to its first '=' is the name, the rest the value, as
    is; a line without '=' is skipped."""
    found = {}
    for line in text.split("\n"):
        name, equals, value = line.partition("=")
        if equals:
            found[name] = value
    return found


def parse_apt_source(text: str) -> list[str]:
    """The URI of each one-line-style source (sources.list(5): ``deb [options] uri suite [component...]``)."""
    uris = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            fields = re.sub(r"\[[^\]]*\]", "", line).split()
            uris.append(fields[1])
    return uris


def parse_apt_source_words(text: str) -> list[str]:
    """The words of the one source line of ``text`` (options removed); refuses a second line."""
    lines = [line for line in text.splitlines() if line.split("#", 1)[0].strip()]
    assert len(lines) == 1, f"one source line expected: {text!r}"
    return re.sub(r"\[[^\]]*\]", "", lines[0]).split()


def grafana_source_line(settings_) -> str:
    return render.grafana_apt_source(settings_.grafana_repo_url, "/etc/apt/keyrings/grafana.asc")


# ------------------------------------------------------------------------------------------------ positions

WEBHOOK = {"name": "ops", "type": "webhook", "url": "http://hooks.example.internal/gpu"}
EMAIL = {"name": "mail", "type": "email", "to": "ops@example.com", "from": "am@example.com",
         "smarthost": "mail.example.com:587"}
SLACK = {"name": "chat", "type": "slack", "api_url": "https://hooks.slack.com/services/T0/B0/x", "channel": "#gpu"}
M = "gpufleet_monitoring_"


def _receivers(doc) -> dict:
    return {r["name"]: r for r in doc["receivers"]}


def _alertmanager(settings_) -> dict:
    return yaml.safe_load(render.alertmanager_config(settings_))


# (setting, data with the hostile value ``v`` in one position, what the generated file gives back for it)
MONITORING_POSITIONS = [
    (M + "receivers", lambda v: {M + "receivers": [{**WEBHOOK, "name": v}]},
     lambda s: _alertmanager(s)["receivers"][0]["name"]),
    (M + "receivers", lambda v: {M + "receivers": [{**WEBHOOK, "url": WEBHOOK["url"] + v}]},
     lambda s: _alertmanager(s)["receivers"][0]["webhook_configs"][0]["url"].removeprefix(WEBHOOK["url"])),
    *((M + "receivers", lambda v, f=f: {M + "receivers": [{**EMAIL, f: v}]},
       lambda s, f=f: _receivers(_alertmanager(s))["mail"]["email_configs"][0][f])
      for f in ("to", "from", "smarthost")),
    (M + "receivers", lambda v: {M + "receivers": [{**SLACK, "channel": v}]},
     lambda s: _receivers(_alertmanager(s))["chat"]["slack_configs"][0].get("channel", "")),
    (M + "receivers", lambda v: {M + "receivers": [{**SLACK, "api_url": SLACK["api_url"] + v}]},
     lambda s: _receivers(_alertmanager(s))["chat"]["slack_configs"][0]["api_url"].removeprefix(SLACK["api_url"])),
    (M + "routes", lambda v: {M + "receivers": [WEBHOOK], M + "routes": [{"receiver": "ops", "matchers": {"team": v}}]},
     lambda s: dict((k, val) for k, op, val in parse_matchers(
         ",".join(_alertmanager(s)["route"]["routes"][0]["matchers"])))["team"]),
    (M + "routes", lambda v: {M + "receivers": [WEBHOOK], M + "routes": [{"receiver": "ops", "matchers": {v: "x"}}]},
     lambda s: parse_matchers(",".join(_alertmanager(s)["route"]["routes"][0]["matchers"]))[0][0]),
    (M + "routes", lambda v: {M + "receivers": [WEBHOOK], M + "routes": [{"receiver": v, "matchers": {"a": "b"}}]},
     lambda s: _alertmanager(s)["route"]["routes"][0]["receiver"]),
    (M + "group_wait", lambda v: {M + "group_wait": v}, lambda s: _alertmanager(s)["route"]["group_wait"]),
    *((M + key, lambda v, key=key: {M + key: v},
       lambda s, key=key: yaml.safe_load(render.prometheus_config(s, "localhost:9093"))["global"][key])
      for key in ("scrape_interval", "evaluation_interval")),
    (M + "prometheus_listen", lambda v: {M + "prometheus_listen": v}, None),
    (M + "alertmanager_listen", lambda v: {M + "alertmanager_listen": v}, None),
    (M + "verify_max_age", lambda v: {M + "verify_max_age": v}, None),
    (M + "retention", lambda v: {M + "retention": v}, None),
    (M + "grafana_listen", lambda v: {M + "grafana_listen": v}, None),
    (M + "grafana_repo_key_fingerprint", lambda v: {M + "grafana_repo_key_fingerprint": v}, None),
    (M + "grafana_repo_url", lambda v: {M + "grafana_repo_url": "https://apt.grafana.com stable " + v},
     lambda s: " ".join(parse_apt_source_words(grafana_source_line(s))[3:])),
    (M + "alert_for", lambda v: {M + "alert_for": {"GpuOverheating": v}}, None),
    (M + "alert_for", lambda v: {M + "alert_for": {v: "5m"}}, None),
    (M + "gpu_model", lambda v: {M + "gpu_model": v}, None),
    *((M + f"{name}_tls_server_config", lambda v, name=name, key=key: {
        M + f"{name}_tls_server_config": {**TLS, key: TLS[key] + v}},
       lambda s, name=name, key=key: _web_tls(getattr(s, f"{name}_tls"))[key].removeprefix(TLS[key]))
      for name in ("prometheus", "alertmanager") for key in ("cert_file", "key_file")),
    *((M + f"{name}_tls_server_config", lambda v, name=name: {M + f"{name}_tls_server_config": {**TLS, v: "x"}},
       None) for name in ("prometheus", "alertmanager")),
    *((M + f"{name}_tls_server_config", lambda v, name=name: {M + f"{name}_tls_server_config": {
        **TLS, "min_version": v}}, lambda s, name=name: _web_tls(getattr(s, f"{name}_tls"))["min_version"])
      for name in ("prometheus", "alertmanager")),
    # people's accounts: user names and hashes both (every hostile string is refused: no user name or bcrypt hash)
    *((M + f"{name}_basic_auth_users", lambda v, name=name: {M + f"{name}_basic_auth_users": {v: BCRYPT}},
       lambda s, name=name: next(iter(_web_users(getattr(s, f"{name}_users")))))
      for name in ("prometheus", "alertmanager")),
    *((M + f"{name}_basic_auth_users", lambda v, name=name: {M + f"{name}_basic_auth_users": {"alice": BCRYPT + v}},
       lambda s, name=name: _web_users(getattr(s, f"{name}_users"))["alice"].removeprefix(BCRYPT))
      for name in ("prometheus", "alertmanager")),
    (M + "tls_ca_file", lambda v: {M + "tls_ca_file": "/etc/ssl/ca" + v},
     lambda s: yaml.safe_load(render.prometheus_config(s))["scrape_configs"][1]["tls_config"]["ca_file"]
     .removeprefix("/etc/ssl/ca")),
]
TLS = {"cert_file": "/etc/ssl/a.crt", "key_file": "/etc/ssl/a.key"}
BCRYPT = "$2b$04$" + "a" * 53


def _web_users(users) -> dict:
    """The people's accounts as the web configuration file on the host holds them, parsed back."""
    return yaml.safe_load(web_auth.web_config(dict(users)))["basic_auth_users"]


def _web_tls(tls) -> dict:
    """The tls_server_config as the web configuration file on the host holds it, parsed back."""
    return yaml.safe_load(web_auth.web_config({}, tls_server_config=dict(tls)))["tls_server_config"]


# the target labels (file_sd JSON): checked on the rendered scrape targets
TARGET_POSITIONS = [(M + "cluster", lambda v: {M + "cluster": v}, "cluster")]


def _nccl_back(cfg, key):
    return parse_nccl_conf(nccl.conf_text(dict(cfg.nccl.settings)))[key]


NODE_POSITIONS = [
    *(("gpufleet_nccl", lambda v, k=k, prefix=prefix: {"gpufleet_nccl": {k: prefix + v}},
       lambda c, k=k, prefix=prefix: _nccl_back(c, k).removeprefix(prefix))
      for k, prefix in (("NCCL_TOPO_FILE", "/etc/topo"), ("NCCL_DEBUG_FILE", "/tmp/nccl."),
                        ("NCCL_SOCKET_IFNAME", "eth"), ("NCCL_IB_HCA", "mlx5_0"), ("NCCL_NET", "IB"),
                        ("NCCL_DEBUG", ""), ("NCCL_ALGO", ""), ("NCCL_DEBUG_SUBSYS", ""),
                        ("NCCL_P2P_LEVEL", ""))),
    ("gpufleet_nccl", lambda v: {"gpufleet_nccl": {v: "1"}}, None),
    *((key, lambda v, key=key: {key: "http://mirror.example.internal/nvidia" + v},
       lambda c, key=key: parse_apt_source(driver.apt_source(
           "/etc/apt/keyrings/k.asc", c.driver.repo_url if key.endswith("repo_url") else c.driver.repo_keyring_url)
       )[0].removeprefix("http://mirror.example.internal/nvidia").removesuffix("/"))
      for key in ("gpufleet_driver_repo_url", "gpufleet_driver_repo_keyring_url")),
    *((key, lambda v, key=key: {key: v}, None)
      for key in ("gpufleet_driver_branch", "gpufleet_driver_flavour", "gpufleet_driver_packages_style",
                  "gpufleet_power_limit", "gpufleet_clocks", "gpufleet_slurm_gres", "gpufleet_exporters_gpu",
                  "gpufleet_exporters_gpu_listen", "gpufleet_exporters_node_listen",
                  "gpufleet_exporters_textfile_dir", "gpufleet_driver_repo_key_fingerprint",
                  "gpufleet_exporters_collect_interval", "gpufleet_dcgm_exporter_version")),
    ("gpufleet_stages", lambda v: {"gpufleet_stages": ["driver", v]}, None),
    ("gpufleet_health_interval", lambda v: {"gpufleet_health_interval": v}, None),
    *((key, lambda v, key=key: {key: [v]}, None) for key in ("gpufleet_health_checks", "gpufleet_health_node_state")),
    # the health check's plan file on the node is JSON (json.dumps), the prefix one of its strings
    ("gpufleet_health_reason_prefix", lambda v: {"gpufleet_health_reason_prefix": v},
     lambda c: json.loads(json.dumps({"prefix": c.health.reason_prefix}))["prefix"]),
    *((f"gpufleet_exporters_{name}_tls_server_config", lambda v, name=name, key=key: {
        f"gpufleet_exporters_{name}_tls_server_config": {**TLS, key: TLS[key] + v}},
       lambda c, name=name, key=key: _web_tls(getattr(c.exporters, f"{name}_tls"))[key].removeprefix(TLS[key]))
      for name in ("node", "gpu") for key in ("cert_file", "key_file")),
    *((f"gpufleet_exporters_{name}_tls_server_config", lambda v, name=name: {
        f"gpufleet_exporters_{name}_tls_server_config": {**TLS, v: "TLS12"}}, None) for name in ("node", "gpu")),
    ("gpufleet_power_limit_by_model", lambda v: {"gpufleet_power_limit_by_model": {v: 300}}, None),
    ("gpufleet_power_limit_by_model", lambda v: {"gpufleet_power_limit_by_model": {"h100-sxm": v}}, None),
    ("gpufleet_power_limit_by_uuid", lambda v: {"gpufleet_power_limit_by_uuid": {v: 300}}, None),
    ("gpufleet_power_limit_by_uuid", lambda v: {
        "gpufleet_power_limit_by_uuid": {"GPU-5e2a0000-0000-0000-0000-000000000000": v}}, None),
    ("gpufleet_clocks", lambda v: {"gpufleet_stages": ["clocks"], "gpufleet_clocks": {v: [1, 2]}}, None),
    ("gpufleet_mig", lambda v: {"gpufleet_mig": [{"devices": "all", "mig-enabled": True, "mig-devices": {v: 1}}]},
     None),
    ("gpufleet_mig", lambda v: {"gpufleet_mig": [{"devices": v, "mig-enabled": False}]}, None),
    ("gpufleet_mig", lambda v: {"gpufleet_mig": [{"devices": "all", "device-filter": v, "mig-enabled": False}]},
     None),
]


def test_every_string_setting_is_fed_hostile_strings():
    covered = {key for key, *_ in [*MONITORING_POSITIONS, *TARGET_POSITIONS, *NODE_POSITIONS]}
    known = {s.name for s in settings.table()}
    assert known - covered - set(NOT_IN_A_FILE) == set(), "a setting neither fed hostile strings nor explained"
    assert (covered | set(NOT_IN_A_FILE)) - known == set(), "stale names in this test"


@pytest.mark.parametrize("value", HOSTILE, ids=ascii)
@pytest.mark.parametrize("position", range(len(MONITORING_POSITIONS)))
def test_monitoring_settings_are_refused_or_come_back_exactly(position, value):
    key, data, back = MONITORING_POSITIONS[position]
    monitoring, _, errors = monitoring_config.load_monitoring_settings("mon", data(value))
    if errors:
        assert all(e.key.startswith(key) and e.host == "mon" for e in errors), errors
        return
    assert back is not None, f"{key} accepted {value!r} and this test has no parser for where it goes"
    assert back(monitoring) == value


@pytest.mark.parametrize("value", HOSTILE, ids=ascii)
def test_target_labels_are_refused_or_come_back_exactly_from_file_sd(value):
    for key, data, label in TARGET_POSITIONS:
        _, target, errors = monitoring_config.load_monitoring_settings("n1", data(value))
        if errors:
            assert all(e.key.startswith(key) for e in errors), errors
            continue
        node = load_node_config("n1", {})
        groups = render.scrape_targets([render.Target("n1", "n1", ("gpus",), node, target)])
        assert json.loads(render.file_sd_text(groups["gpu"]))[0]["labels"][label] == value


@pytest.mark.parametrize("value", HOSTILE, ids=ascii)
@pytest.mark.parametrize("position", range(len(NODE_POSITIONS)))
def test_node_settings_are_refused_or_come_back_exactly(position, value):
    key, data, back = NODE_POSITIONS[position]
    try:
        node = load_node_config("n1", data(value))
    except ConfigErrors as error:
        assert all(e.key.startswith(key) and e.host == "n1" for e in error.errors), error
        return
    assert back is not None, f"{key} accepted {value!r} and this test has no parser for where it goes"
    assert back(node) == value


def test_the_matcher_port_reads_alertmanagers_own_examples():
    """The port against the examples of parse.go's own documentation."""
    assert parse_matchers('{foo = "bar", dings != "bums", }') == [("foo", "=", "bar"), ("dings", "!=", "bums")]
    assert parse_matchers("foo=bar,dings!=bums") == [("foo", "=", "bar"), ("dings", "!=", "bums")]
    assert parse_matchers('{quote="She said: \\"Hi, ladies! That\'s gender-neutral…\\""}') == [
        ("quote", "=", 'She said: "Hi, ladies! That\'s gender-neutral…"')]
    assert parse_matchers('statuscode=~"5.."') == [("statuscode", "=~", "5..")]
    # what an unescaped value did before: one setting, three matchers
    assert len(parse_matchers('team="' + '",host=~".+",x!="' + '"')) == 3


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool (prometheus-alertmanager) not installed")
def test_amtool_accepts_the_escaped_matchers(tmp_path):
    data = {M + "receivers": [WEBHOOK], M + "routes": [
        {"receiver": "ops", "matchers": {"team": v}} for v in HOSTILE if not monitoring_config.text_problem(v)]}
    monitoring, _, errors = monitoring_config.load_monitoring_settings("mon", data)
    assert not errors
    path = Path(tmp_path) / "alertmanager.yml"
    path.write_text(render.alertmanager_config(monitoring))
    result = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
