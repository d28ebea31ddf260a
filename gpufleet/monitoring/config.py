"""Validated settings of the monitoring deploy (``gpufleet_monitoring_*`` keys; this module owns the namespace).

Monitoring-host keys are read from the hosts of the inventory's ``monitoring`` group, target keys
(``gpufleet_monitoring_cluster``, ``gpufleet_monitoring_gpu_model``) from every GPU node. Every key is checked
before any host is changed; the table of keys, values and defaults is in docs/configuration.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet import web_auth
from gpufleet.config import (
    BASIC_AUTH_ALLOWED,
    TLS_ALLOWED,
    ConfigError,
    basic_auth_users,
    catalog_model,
    did_you_mean,
    listen_problem,
    management_address,
    register_namespace,
    tls_files,
    tls_server_config,
)
from gpufleet.masking import secret_url

from .rules import DURATION_RE, alert_names, alert_rules, duration, longest_lookback, recording_rules, seconds

PREFIX = "gpufleet_monitoring_"
register_namespace(PREFIX)

RECEIVER_TYPES = {"webhook": ("url",), "email": ("to", "from", "smarthost"), "slack": ("api_url",)}
_RECEIVER_OPTIONAL = {"webhook": (), "email": (), "slack": ("channel",)}
DEFAULT_GRAFANA_REPO = "https://apt.grafana.com stable main"
# an OpenPGP v4 fingerprint (40 hex digits), checked only when the inventory sets it
_FINGERPRINT_RE = re.compile(r"^[0-9A-F]{40}$")
DEFAULT_PASSWORDS = {"admin", "password", "grafana", "changeme", "prom-operator", "deepops", "secret"}
_LISTEN_RE = re.compile(r"^(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:]+\])?:(\d{1,5})\Z")
# a path of RFC 3986 characters that mean nothing to a shell, YAML, INI or apt source line (no quotes, $, `, {}, \)
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-]+(?::\d{1,5})?(?:/[A-Za-z0-9\-._~:/?#@!&()*+,;=%]*)?\Z")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+\Z")
_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_APT_WORD_RE = re.compile(r"^[A-Za-z0-9._/-]+\Z")  # an apt source line's suite and components
_SMARTHOST_RE = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):\d{1,5}\Z")
# Alertmanager fields it expands as Go templates (its configuration docs: <tmpl_string>): {{ }} would run there
_TEMPLATED = {"to", "from", "channel"}

KEYS: dict[str, str] = {
    "gpufleet_monitoring_scrape_interval": "a Prometheus duration between 1s and 1h, e.g. \"15s\"",
    "gpufleet_monitoring_evaluation_interval": "a Prometheus duration between 1s and 1h, e.g. \"15s\"",
    "gpufleet_monitoring_alert_for": "{alert name: duration}, alerts: " + ", ".join(alert_names()),
    "gpufleet_monitoring_verify_max_age": "a Prometheus duration, e.g. \"8d\"",
    "gpufleet_monitoring_retention": "a Prometheus duration at least as long as the longest range any alert or "
                                     "recording rule reads, e.g. \"35d\"",
    "gpufleet_monitoring_prometheus_listen": "ADDRESS:PORT, e.g. \"0.0.0.0:9090\"",
    "gpufleet_monitoring_alertmanager_listen": "ADDRESS:PORT, e.g. \"0.0.0.0:9093\"",
    "gpufleet_monitoring_receivers": "a list of {name, type: webhook|email|slack, ...}",
    "gpufleet_monitoring_routes": "a list of {receiver: NAME, matchers: {label: value}}",
    "gpufleet_monitoring_group_wait": "a Prometheus duration, e.g. \"30s\"",
    "gpufleet_monitoring_grafana": "true or false",
    "gpufleet_monitoring_grafana_admin_password": "a password of at least 12 characters that is not a default one",
    "gpufleet_monitoring_grafana_repo_url": "an apt source line: URL SUITE COMPONENT, e.g. " + DEFAULT_GRAFANA_REPO,
    "gpufleet_monitoring_grafana_listen": "ADDRESS:PORT, e.g. \"0.0.0.0:3000\"",
    "gpufleet_monitoring_grafana_repo_key_fingerprint": "the OpenPGP fingerprint of the repository key: 40 hex "
                                                        "digits (spaces allowed)",
    "gpufleet_monitoring_prometheus_tls_server_config": TLS_ALLOWED,
    "gpufleet_monitoring_alertmanager_tls_server_config": TLS_ALLOWED,
    "gpufleet_monitoring_prometheus_basic_auth_users": BASIC_AUTH_ALLOWED,
    "gpufleet_monitoring_alertmanager_basic_auth_users": BASIC_AUTH_ALLOWED,
    "gpufleet_monitoring_tls_fleet_ca": "true or false",
    "gpufleet_monitoring_tls_ca_file": "an absolute path of a PEM file on the monitoring host (letters, digits, "
                                       ". _ - /)",
    "gpufleet_monitoring_cluster": "a name: letters, digits, . _ - (the cluster label of the host's targets)",
    "gpufleet_monitoring_gpu_model": "a catalog key or GPU name (the gpu_model label of the host's targets)",
}


# each listener's default port; its default address is the host's management address
LISTEN_PORTS = {"prometheus_listen": 9090, "alertmanager_listen": 9093, "grafana_listen": 3000}


@dataclass(frozen=True)
class MonitoringSettings:
    scrape_interval: str = "15s"
    evaluation_interval: str = "15s"
    alert_for: Mapping[str, str] = field(default_factory=dict)
    verify_max_age: str = "8d"
    retention: str = "35d"  # Prometheus's --storage.tsdb.retention.time: BenchmarkRegression reads 30 days back
    prometheus_listen: str = "0.0.0.0:9090"
    alertmanager_listen: str = "0.0.0.0:9093"
    receivers: tuple[dict, ...] = ()
    routes: tuple[dict, ...] = ()
    group_wait: str = "30s"
    grafana: bool = True
    grafana_admin_password: str | None = None
    grafana_repo_url: str = DEFAULT_GRAFANA_REPO
    grafana_listen: str = "0.0.0.0:3000"
    grafana_repo_key_fingerprint: str | None = None
    prometheus_tls: Mapping[str, str] = field(default_factory=dict)  # tls_server_config; empty: HTTP
    alertmanager_tls: Mapping[str, str] = field(default_factory=dict)
    prometheus_users: Mapping[str, str] = field(default_factory=dict)  # people's accounts beside gpufleet's
    alertmanager_users: Mapping[str, str] = field(default_factory=dict)
    tls_ca_file: str | None = None  # what Prometheus checks HTTPS targets against (None: the system's CAs)
    tls_fleet_ca: bool = False  # Prometheus/Alertmanager without their own tls_server_config: the fleet CA's


@dataclass(frozen=True)
class TargetSettings:
    cluster: str = "default"
    gpu_model: str = ""


def text_problem(value: str, templated: bool = False) -> str | None:
    """Why ``value`` cannot go into a generated file as it is (control characters, text that is not UTF-8, template
    syntax in a field Alertmanager expands as a template), or None."""
    if any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in value):
        return "contains a control character (line feed, tab, ...)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8 text"
    if templated and ("{{" in value or "}}" in value):
        return "contains template syntax ({{ or }}), which Alertmanager would expand"
    return None


def _port(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


class _Errors:
    def __init__(self, host: str):
        self.host = host
        self.errors: list[ConfigError] = []

    def add(self, key: str, value: Any, reason: str, allowed: str | None = None) -> None:
        self.errors.append(ConfigError(self.host, key, value, allowed or KEYS[key.split("[")[0].split(".")[0]],
                                       reason))


def _duration(err: _Errors, key: str, value: Any, low: float = 0.0, high: float | None = None) -> str | None:
    if not isinstance(value, str) or not DURATION_RE.fullmatch(value):
        err.add(key, value, "not a Prometheus duration")
        return None
    if seconds(value) < low or (high is not None and seconds(value) > high):
        err.add(key, value, "duration out of range")
        return None
    return value


def _boolean(err: _Errors, ours: Mapping[str, Any], values: dict[str, Any], key: str) -> None:
    """``values[key]`` from the setting ``PREFIX + key`` where it is given, a boolean."""
    raw = ours.get(PREFIX + key)
    if raw is None:
        return
    if isinstance(raw, bool):
        values[key] = raw
    else:
        err.add(PREFIX + key, raw, "not a boolean")


def _listen(err: _Errors, key: str, value: Any) -> str | None:
    m = _LISTEN_RE.match(value) if isinstance(value, str) else None
    if m is None or not 1 <= int(m.group(1)) <= 65535:
        err.add(key, value, "not a listen address")
        return None
    return value if not value.startswith(":") else "0.0.0.0" + value


def _receiver(err: _Errors, index: int, value: Any) -> dict | None:
    key = f"gpufleet_monitoring_receivers[{index}]"
    if not isinstance(value, Mapping):
        err.add(key, value, "not a mapping")
        return None
    kind = value.get("type")
    if kind not in RECEIVER_TYPES:
        err.add(f"{key}.type", kind, "unknown receiver type",
                ", ".join(RECEIVER_TYPES) + did_you_mean(kind, RECEIVER_TYPES))
        return None
    name = value.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        err.add(f"{key}.name", name, "not a receiver name", "letters, digits, . _ - (1..64)")
        return None
    allowed = {"name", "type", *RECEIVER_TYPES[kind], *_RECEIVER_OPTIONAL[kind]}
    ok = True
    for extra in sorted(set(value) - allowed):
        err.add(f"{key}.{extra}", value[extra], f"unknown key for a {kind} receiver", ", ".join(sorted(allowed)))
        ok = False
    for required in RECEIVER_TYPES[kind]:
        field_value = value.get(required)
        if not isinstance(field_value, str) or not field_value or any(c in field_value for c in "\n\r"):
            shown = secret_url(field_value) if required in ("url", "api_url") and field_value else field_value
            err.add(f"{key}.{required}", shown, f"missing or not a string ({kind} receivers need it)",
                    ", ".join(RECEIVER_TYPES[kind]))
            ok = False
        elif required in ("url", "api_url") and not _URL_RE.match(field_value):
            # the URL holds the receiver's token (user:token@, query, Slack's path): never echoed
            err.add(f"{key}.{required}", secret_url(field_value), "not a URL", "an http:// or https:// URL")
            ok = False
        elif required == "smarthost" and not _SMARTHOST_RE.match(field_value):
            err.add(f"{key}.{required}", field_value, "not HOST:PORT", "HOST:PORT, e.g. mail.example.com:587")
            ok = False
        elif text_problem(field_value, required in _TEMPLATED):
            err.add(f"{key}.{required}", field_value, text_problem(field_value, required in _TEMPLATED),
                    "text without control characters or {{ }}")
            ok = False
    for optional in _RECEIVER_OPTIONAL[kind]:
        field_value = value.get(optional)
        if field_value is not None and (not isinstance(field_value, str)
                                        or text_problem(field_value, optional in _TEMPLATED)):
            err.add(f"{key}.{optional}", field_value, "not a string" if not isinstance(field_value, str)
                    else text_problem(field_value, optional in _TEMPLATED), "text without control characters or {{ }}")
            ok = False
    return dict(value) if ok else None


def load_monitoring_settings(host: str, data: Mapping[str, Any]) -> tuple[MonitoringSettings | None,
                                                                         TargetSettings | None, list[ConfigError]]:
    """(monitoring-host settings, target settings, errors) of one host's data; strict about unknown keys."""
    err = _Errors(host)
    ours = {k: v for k, v in data.items() if isinstance(k, str) and k.startswith(PREFIX)}
    for key in ours:
        if key not in KEYS:
            err.add(key, ours[key], "unknown gpufleet monitoring setting", "one of " + ", ".join(KEYS)
                    + did_you_mean(key, KEYS))
    values: dict[str, Any] = {}
    for key in ("scrape_interval", "evaluation_interval"):
        raw = ours.get(PREFIX + key)
        if raw is not None:
            values[key] = _duration(err, PREFIX + key, raw, 1, 3600)
    for key in ("verify_max_age", "group_wait", "retention"):
        raw = ours.get(PREFIX + key)
        if raw is not None:
            values[key] = _duration(err, PREFIX + key, raw)
    for key, port in LISTEN_PORTS.items():
        raw = ours.get(PREFIX + key)
        values[key] = _listen(err, PREFIX + key, raw) if raw is not None else f"{management_address(data)}:{port}"
    for key, field_name in (("prometheus_tls_server_config", "prometheus_tls"),
                            ("alertmanager_tls_server_config", "alertmanager_tls")):
        raw = ours.get(PREFIX + key)
        if raw is not None:
            tls, reason = tls_server_config(raw)
            if tls is None:
                err.add(PREFIX + key, raw, reason)
            else:
                values[field_name] = tls
    for key, field_name in (("prometheus_basic_auth_users", "prometheus_users"),
                            ("alertmanager_basic_auth_users", "alertmanager_users")):
        raw = ours.get(PREFIX + key)
        if raw is not None:
            users, reason = basic_auth_users(raw, web_auth.USER)
            if users is None:  # the hashes are not shown: only the user names
                shown = {u: "<hash>" for u in raw} if isinstance(raw, Mapping) else raw
                err.add(PREFIX + key, shown, reason)
            else:
                values[field_name] = users
    _boolean(err, ours, values, "tls_fleet_ca")
    raw = ours.get(PREFIX + "tls_ca_file")
    if raw is not None:
        if not isinstance(raw, str) or not _PATH_RE.match(raw) or ".." in raw.split("/"):
            err.add(PREFIX + "tls_ca_file", raw, "not an absolute path")
        else:
            values["tls_ca_file"] = raw
    raw = ours.get(PREFIX + "alert_for")
    if raw is not None:
        if not isinstance(raw, Mapping):
            err.add(PREFIX + "alert_for", raw, "not a mapping")
        else:
            overrides = {}
            for name, duration in raw.items():
                if name not in alert_names():
                    err.add(f"{PREFIX}alert_for[{name!r}]", duration, "unknown alert",
                            ", ".join(alert_names()) + did_you_mean(name, alert_names()))
                elif _duration(err, f"{PREFIX}alert_for[{name!r}]", duration) is not None:
                    overrides[name] = duration
            values["alert_for"] = overrides
    raw = ours.get(PREFIX + "receivers")
    if raw is not None:
        if not isinstance(raw, (list, tuple)):
            err.add(PREFIX + "receivers", raw, "not a list")
        else:
            receivers = [_receiver(err, i, r) for i, r in enumerate(raw)]
            names = [r["name"] for r in receivers if r]
            for name in {n for n in names if names.count(n) > 1}:
                err.add(PREFIX + "receivers", name, "receiver name used twice", "unique names")
            values["receivers"] = tuple(r for r in receivers if r)
    raw = ours.get(PREFIX + "routes")
    if raw is not None:
        known = {r["name"] for r in values.get("receivers", ())}
        routes = []
        for i, route in enumerate(raw if isinstance(raw, (list, tuple)) else [raw]):
            key = f"{PREFIX}routes[{i}]"
            if not isinstance(route, Mapping) or route.get("receiver") not in known:
                err.add(key, route, "not a route to a defined receiver",
                        "{receiver: one of " + (", ".join(sorted(known)) or "(no receiver defined)")
                        + ", matchers: {label: value}}")
                continue
            matchers = route.get("matchers") or {}
            if not isinstance(matchers, Mapping) or not all(isinstance(k, str) and _LABEL_RE.match(k)
                                                            and isinstance(v, str) for k, v in matchers.items()):
                err.add(f"{key}.matchers", matchers, "not a label matcher mapping", "{label: value}")
                continue
            bad = {k: text_problem(v) for k, v in matchers.items() if text_problem(v)}
            for label, problem in sorted(bad.items()):
                err.add(f"{key}.matchers.{label}", matchers[label], problem, "a label value without control characters")
            if not bad:
                routes.append({"receiver": route["receiver"], "matchers": dict(matchers)})
        values["routes"] = tuple(routes)
    _boolean(err, ours, values, "grafana")
    raw = ours.get(PREFIX + "grafana_admin_password")
    if raw is not None:
        if not isinstance(raw, str) or len(raw) < 12 or raw.lower() in DEFAULT_PASSWORDS:
            err.add(PREFIX + "grafana_admin_password", "***", "too short or a default password")
        elif any(c in raw for c in "\n\r\0"):
            # grafana cli reads the password from stdin up to the line's end: a newline would cut it
            err.add(PREFIX + "grafana_admin_password", "***", "contains a line break or NUL")
        else:
            values["grafana_admin_password"] = raw
    raw = ours.get(PREFIX + "grafana_repo_url")
    if raw is not None:
        parts = raw.split(" ") if isinstance(raw, str) else []
        # one line of single-space-separated words: a line break would add a source line of its own
        if (len(parts) < 2 or not _URL_RE.match(parts[0])
                or not all(_APT_WORD_RE.match(part) for part in parts[1:])):
            err.add(PREFIX + "grafana_repo_url", raw, "not an apt source line (URL SUITE [COMPONENT...])")
        else:
            values["grafana_repo_url"] = raw
    raw = ours.get(PREFIX + "grafana_repo_key_fingerprint")
    if raw is not None:
        fingerprint = raw.replace(" ", "").upper() if isinstance(raw, str) else ""
        if not _FINGERPRINT_RE.match(fingerprint):
            err.add(PREFIX + "grafana_repo_key_fingerprint", raw, "not a key fingerprint")
        else:
            values["grafana_repo_key_fingerprint"] = fingerprint
    target: dict[str, Any] = {}
    raw = ours.get(PREFIX + "cluster")
    if raw is not None:
        if not isinstance(raw, str) or not _NAME_RE.match(raw):
            err.add(PREFIX + "cluster", raw, "not a cluster name")
        else:
            target["cluster"] = raw
    raw = ours.get(PREFIX + "gpu_model")
    if raw is not None:
        model = catalog_model(raw)
        if model is None:
            err.add(PREFIX + "gpu_model", raw, "unknown GPU model")
        else:
            target["gpu_model"] = model.key
    if err.errors:
        return None, None, err.errors
    return MonitoringSettings(**values), TargetSettings(**target), []


def tls_files_of(settings: MonitoringSettings) -> list[tuple[str, str]]:
    """(setting, path) of every file the monitoring host's TLS settings name."""
    out = [(f"{PREFIX}{name}_tls_server_config.{key}", path)
           for name, tls in (("prometheus", settings.prometheus_tls), ("alertmanager", settings.alertmanager_tls))
           for key, path in tls_files(tls)]
    return out + ([(PREFIX + "tls_ca_file", settings.tls_ca_file)] if settings.tls_ca_file else [])


def check_monitoring_host(host: str, settings: MonitoringSettings, data: Mapping[str, Any],
                          addresses: Iterable[str] = (), files: Mapping[str, Any] | None = None) -> list[ConfigError]:
    """What only matters on a monitoring host: Grafana's password, port clashes between its services, listen
    addresses that are the host's (``addresses``: its ``hostname -I``; empty: not checked), the TLS files its
    settings name exist (``files``: ManagedState's ``files`` of :func:`tls_files_of`; None: not checked)."""
    err = _Errors(host)
    for key, path in tls_files_of(settings) if files is not None else []:
        if (files.get(path) or {}).get("type") != "file":
            err.add(key, path, "no such file on the host" if files.get(path) is None else "not a regular file",
                    "a PEM file that exists on the monitoring host")
    addresses = sorted(addresses)
    for key in LISTEN_PORTS:
        if key == "grafana_listen" and not settings.grafana:
            continue
        reason = listen_problem(getattr(settings, key), addresses)
        if reason:
            err.add(PREFIX + key, getattr(settings, key), reason,
                    f"ADDRESS:PORT with an address of this host ({', '.join(addresses)}), 0.0.0.0, [::] or 127.0.0.1 "
                    "(unset, it is ssh_hostname's: set it where ssh reaches the host through another address)")
    if settings.grafana and settings.grafana_admin_password is None:
        err.add(PREFIX + "grafana_admin_password", None,
                "Grafana is enabled but has no admin password (gpufleet never deploys Grafana's default admin/admin)",
                KEYS[PREFIX + "grafana_admin_password"] + f", or {PREFIX}grafana: false")
    lookback_s, rule, selector = longest_lookback(
        recording_rules(verify_max_age_s=int(seconds(settings.verify_max_age))), alert_rules(settings.alert_for))
    if seconds(settings.retention) < lookback_s:
        err.add(PREFIX + "retention", settings.retention,
                f"Prometheus would drop data that {rule} reads ({selector}: {duration(lookback_s)} back)",
                f"a Prometheus duration of at least {duration(lookback_s)}")
    ports: dict[int, str] = {}
    services = [("prometheus_listen", settings.prometheus_listen),
                ("alertmanager_listen", settings.alertmanager_listen)]
    if settings.grafana:
        services.append(("grafana_listen", settings.grafana_listen))
    for key, listen in services:
        port = _port(listen)
        if port in ports:
            err.add(PREFIX + key, listen, f"port clash with {PREFIX}{ports[port]}", "a port no other service uses")
        ports[port] = key
    return err.errors
