"""The monitoring plane's credentials (gpufleet/web_auth.py), the web configuration file as gpufleet's exporter and the
simulator's dcgm-exporter serve it (gpufleet/exporter/web.py), checked against exporter-toolkit's recorded facts, and
the Prometheus side (prometheus.yml's basic_auth)."""

from __future__ import annotations

import base64
import ctypes
import datetime
import http.server
import ipaddress
import os
import ssl
import threading
import urllib.error
import urllib.request

import bcrypt
import pytest
import yaml

from gpufleet import web_auth
from gpufleet.config import load_node_config, management_address
from gpufleet.control_files import UnsafePath
from gpufleet.exporter import web
from gpufleet.monitoring import render
from gpufleet.monitoring.config import MonitoringSettings, load_monitoring_settings
from gpufleet.operations import exporters
from tests import upstream


@pytest.fixture
def credentials(tmp_path, monkeypatch):
    directory = tmp_path / "credentials"
    monkeypatch.setenv("GPUFLEET_CREDENTIALS_DIR", str(directory))
    return directory


def test_passwords_are_generated_once_and_kept_private(credentials):
    first = web_auth.password("exporters")
    assert web_auth.password("exporters") == first and len(first) >= 32
    assert web_auth.password("alertmanager") != first
    assert oct(credentials.stat().st_mode & 0o777) == "0o700"
    assert oct((credentials / "exporters.password").stat().st_mode & 0o777) == "0o600"
    (credentials / "exporters.password").chmod(0o640)
    with pytest.raises(UnsafePath, match="readable by group or others"):
        web_auth.password("exporters")
    (credentials / "exporters.password").chmod(0o600)
    credentials.chmod(0o777)
    with pytest.raises(UnsafePath, match="writable by group or others"):
        web_auth.password("exporters")
    with pytest.raises(ValueError, match="allowed: exporters, prometheus, alertmanager"):
        web_auth.password("grafana")


def test_a_hash_is_the_same_on_every_run_per_host_and_checks_with_bcrypt_and_libcrypt():
    first = web_auth.bcrypt_hash("pw-1", "node01/gpufleet")
    assert first == web_auth.bcrypt_hash("pw-1", "node01/gpufleet")  # a converged host's file does not change
    assert first != web_auth.bcrypt_hash("pw-1", "node02/gpufleet")
    assert first.startswith("$2b$05$") and bcrypt.checkpw(b"pw-1", first.encode())
    libcrypt = ctypes.CDLL("libcrypt.so.1")
    libcrypt.crypt.restype = ctypes.c_char_p
    libcrypt.crypt.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
    assert libcrypt.crypt(b"pw-1", first.encode()) == first.encode()


def test_the_management_address_is_the_ssh_address_when_it_is_an_ip():
    assert management_address({"ssh_hostname": "10.0.0.5"}) == "10.0.0.5"
    assert management_address({"ssh_hostname": "fd00::5"}) == "[fd00::5]"
    assert management_address({"ssh_hostname": "gpu01.example.com"}) == "0.0.0.0"
    assert management_address({}) == "0.0.0.0"
    config = load_node_config("n1", {"ssh_hostname": "10.0.0.5"})
    assert (config.exporters.node_listen, config.exporters.gpu_listen) == ("10.0.0.5:9100", "10.0.0.5:9400")
    settings, _, errors = load_monitoring_settings("mon", {"ssh_hostname": "10.0.0.9"})
    assert errors == [] and (settings.prometheus_listen, settings.alertmanager_listen, settings.grafana_listen) == (
        "10.0.0.9:9090", "10.0.0.9:9093", "10.0.0.9:3000")
    settings, _, _ = load_monitoring_settings("mon", {"ssh_hostname": "10.0.0.9",
                                                      "gpufleet_monitoring_alertmanager_listen": "127.0.0.1:9093"})
    assert settings.alertmanager_listen == "127.0.0.1:9093"


# ------------------------------------------------------------------------------------------------ upstream's format


def test_the_file_format_and_flags_are_upstreams():
    toolkit = upstream.facts("exporter-toolkit")["files"]
    statements = toolkit["exporter-toolkit/web/tls_config.go"]["statements"]
    assert set(web.TOP_LEVEL) == set(statements["top_level_keys"]["value"])
    assert set(web.TLS_KEYS) == set(statements["tls_keys"]["value"])
    assert set(web.SUPPORTED_TLS_KEYS) <= set(web.TLS_KEYS)
    # dcgm-exporter's flag in every recorded release; gpufleet's exporter takes the same name
    flags = {v["flags"]["CLIWebConfigFile"]["name"] for v in upstream.facts("dcgm-exporter")["versions"].values()}
    assert flags == {"web-config-file"}
    assert " --web-config-file /etc/dcgm-exporter/web-config.yml" in exporters.dcgm_drop_in_text(
        "10.0.0.5:9400", 15000, web_config=True)
    # Debian 12's packages take --web.config.file (the file format above)
    for package in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):
        assert "--web.config.file=" in upstream.read(f"debian/bookworm/{package}/help.txt"), package
    assert "--web.config.file=/etc/prometheus/node-exporter-web-config.yml" in exporters.node_exporter_defaults(
        "/var/lib/prometheus/node-exporter", "10.0.0.5:9100", web_config=True)


def test_the_generated_file_is_yaml_with_only_the_hashes():
    text = web_auth.web_config({"gpufleet": web_auth.bcrypt_hash("pw-2", "h/gpufleet")})
    assert yaml.safe_load(text) == {"basic_auth_users": {"gpufleet": web_auth.bcrypt_hash("pw-2", "h/gpufleet")}}
    assert "pw-2" not in text


# ------------------------------------------------------------------------------------------------ serving it


def _server(config: web.WebConfig):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if not web.guard(self, config):
                return
            self.send_response(200)
            self.send_header("Content-Length", "3")
            web.add_headers(self, config)
            self.end_headers()
            self.wfile.write(b"ok\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    web.wrap_tls(server, config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _status(url: str, user: str | None = None, password: str = "", context=None) -> tuple[int, str | None]:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, None
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("WWW-Authenticate")


@pytest.mark.parametrize("backend", ["bcrypt", "libcrypt"])
def test_basic_auth_answers_as_exporter_toolkit(tmp_path, monkeypatch, backend):
    crypt = web._Crypt()
    if backend == "libcrypt":  # what a node without python3-bcrypt uses
        lib = ctypes.CDLL("libcrypt.so.1")
        lib.crypt.restype = ctypes.c_char_p
        lib.crypt.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
        crypt.backend, crypt.lib = "libcrypt", lib
    monkeypatch.setattr(web, "_CRYPT", crypt)
    path = tmp_path / "web.yml"
    path.write_text(web_auth.web_config({"gpufleet": web_auth.bcrypt_hash("right-pw", "h/gpufleet")}))
    server = _server(web.WebConfig(str(path)))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        assert _status(url) == (401, "Basic")
        assert _status(url, "gpufleet", "wrong") == (401, "Basic")
        assert _status(url, "nobody", "right-pw") == (401, "Basic")
        assert _status(url, "gpufleet", "right-pw") == (200, None)
        # the file is read again when it changes (the toolkit reads it on every request): no users, no auth
        path.write_text('{"basic_auth_users": {}, "http_server_config": {"headers": {"X-Frame-Options": "deny"}}}\n')
        os.utime(path, ns=(1, 1))
        assert _status(url) == (200, None)
    finally:
        server.shutdown()


def _self_signed(directory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(key, hashes.SHA256()))
    (directory / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))


def test_tls_from_cert_and_key_files_relative_to_the_file(tmp_path):
    _self_signed(tmp_path)
    path = tmp_path / "web.yml"
    path.write_text(web_auth.web_config({"gpufleet": web_auth.bcrypt_hash("pw", "h/gpufleet")},
                                        tls_server_config={"cert_file": "server.crt", "key_file": "server.key"}))
    server = _server(web.WebConfig(str(path)))
    port = server.server_address[1]
    try:
        trusting = ssl.create_default_context(cafile=str(tmp_path / "server.crt"))
        assert _status(f"https://127.0.0.1:{port}/", context=trusting) == (401, "Basic")
        assert _status(f"https://127.0.0.1:{port}/", "gpufleet", "pw", context=trusting) == (200, None)
        with pytest.raises(urllib.error.URLError):  # a client that does not trust the certificate
            _status(f"https://127.0.0.1:{port}/", "gpufleet", "pw", context=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not served
            _status(f"http://127.0.0.1:{port}/", "gpufleet", "pw")
    finally:
        server.shutdown()


@pytest.mark.parametrize(("text", "message"), [
    ('{"basic_auth_user": {}}', "unknown key(s) basic_auth_user; allowed: tls_server_config"),
    ('{"tls_server_config": {"cipher_suites": ["x"]}}', "tls_server_config.cipher_suites: an exporter-toolkit key "
                                                       "this exporter does not support"),
    ('{"basic_auth_users": ["gpufleet"]}', "basic_auth_users: not a mapping"),
    ('{"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}', "cert_file/key_file"),
])
def test_a_file_that_cannot_be_served_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "web.yml"
    path.write_text(text + "\n")
    with pytest.raises(web.WebConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        web.WebConfig(str(path)).ssl_context()


# ------------------------------------------------------------------------------------------------ Prometheus' side


def test_prometheus_sends_each_accounts_password_from_its_file():
    settings = MonitoringSettings(prometheus_listen="10.0.0.9:9090", alertmanager_listen="0.0.0.0:9093")
    config = yaml.safe_load(render.prometheus_config(settings))
    auth = {job["job_name"]: job["basic_auth"] for job in config["scrape_configs"]}
    files = render.PASSWORD_FILES
    assert auth == {"prometheus": {"username": "gpufleet", "password_file": files["prometheus"]},
                    "gpu": {"username": "gpufleet", "password_file": files["exporters"]},
                    "node": {"username": "gpufleet", "password_file": files["exporters"]}}
    alerting = config["alerting"]["alertmanagers"][0]
    assert alerting["basic_auth"] == {"username": "gpufleet", "password_file": files["alertmanager"]}
    assert alerting["static_configs"] == [{"targets": ["localhost:9093"]}]  # 0.0.0.0: reached on localhost
    assert config["scrape_configs"][0]["static_configs"] == [{"targets": ["10.0.0.9:9090"]}]
    datasource = yaml.safe_load(render.grafana_datasource("http://10.0.0.9:9090", "pw-3"))["datasources"][0]
    assert (datasource["basicAuth"], datasource["basicAuthUser"], datasource["secureJsonData"]) == (
        True, "gpufleet", {"basicAuthPassword": "pw-3"})


def test_a_monitoring_listen_address_not_on_the_host_is_refused():
    from gpufleet.monitoring.config import check_monitoring_host

    settings, _, _ = load_monitoring_settings("mon", {"ssh_hostname": "203.0.113.9",
                                                      "gpufleet_monitoring_grafana": False,
                                                      "gpufleet_monitoring_alertmanager_listen": "127.0.0.1:9093"})
    errors = check_monitoring_host("mon", settings, {}, ["10.0.0.9"])
    assert [str(e).split("; allowed")[0] for e in errors] == [
        "mon: gpufleet_monitoring_prometheus_listen='203.0.113.9:9090': not an address of this host"]
    assert "(10.0.0.9), 0.0.0.0" in str(errors[0])
    assert check_monitoring_host("mon", settings, {}, []) == []  # addresses unknown: not checked


# ------------------------------------------------------------------------------------------------ TLS settings


TLS = {"cert_file": "/etc/ssl/gpu.crt", "key_file": "/etc/ssl/private/gpu.key"}


def test_tls_settings_are_validated_naming_the_key():
    config = load_node_config("n1", {"gpufleet_exporters_node_tls_server_config": {**TLS, "min_version": "TLS13"}})
    assert dict(config.exporters.node_tls) == {**TLS, "min_version": "TLS13"} and config.exporters.gpu_tls == ()
    for bad, reason in (({"cert_file": "/etc/ssl/gpu.crt"}, "key_file missing or not an absolute path"),
                        ({**TLS, "client_auth_type": "RequireAndVerifyClientCert"},
                         "unknown or unsupported key(s) client_auth_type"),
                        ({**TLS, "cert_file": "gpu.crt"}, "cert_file missing or not an absolute path"),
                        ({**TLS, "max_version": "TLS11"}, "max_version is not one of TLS12, TLS13")):
        with pytest.raises(Exception) as raised:
            load_node_config("n1", {"gpufleet_exporters_gpu_tls_server_config": bad})
        message = str(raised.value)
        assert "n1: gpufleet_exporters_gpu_tls_server_config={" in message and f": {reason}; allowed: " in message
    _, _, errors = load_monitoring_settings("mon", {"gpufleet_monitoring_tls_ca_file": "ca.crt"})
    assert [str(e).split("; allowed")[0] for e in errors] == [
        "mon: gpufleet_monitoring_tls_ca_file='ca.crt': not an absolute path"]


def test_an_exporter_with_a_certificate_is_scraped_over_https_against_the_ca():
    from gpufleet.monitoring.config import TargetSettings
    from gpufleet.monitoring.render import Target, scrape_targets

    config = load_node_config("n1", {"ssh_hostname": "10.0.0.5", "gpufleet_exporters_node_tls_server_config": TLS})
    groups = scrape_targets([Target("n1", "10.0.0.5", (), config, TargetSettings())])
    assert groups["node"][0]["labels"]["__scheme__"] == "https" and "__scheme__" not in groups["gpu"][0]["labels"]
    settings = MonitoringSettings(tls_ca_file="/etc/ssl/ca.crt", alertmanager_tls=TLS)
    config = yaml.safe_load(render.prometheus_config(settings))
    assert [job.get("tls_config") for job in config["scrape_configs"]] == [
        None, {"ca_file": "/etc/ssl/ca.crt"}, {"ca_file": "/etc/ssl/ca.crt"}]
    assert "scheme" not in config["scrape_configs"][0]  # Prometheus itself: HTTP
    alerting = config["alerting"]["alertmanagers"][0]
    assert (alerting["scheme"], alerting["tls_config"]) == ("https", {"ca_file": "/etc/ssl/ca.crt"})


def test_tls_files_that_are_not_on_the_host_are_refused_before_any_change():
    from gpufleet import preflight
    from gpufleet.monitoring.config import check_monitoring_host

    config = load_node_config("n1", {"gpufleet_exporters_gpu_tls_server_config": TLS})
    files = preflight.exporter_tls_files(config)
    assert files == [("gpufleet_exporters_gpu_tls_server_config", "cert_file", TLS["cert_file"]),
                     ("gpufleet_exporters_gpu_tls_server_config", "key_file", TLS["key_file"])]
    state = {TLS["cert_file"]: {"type": "file"}, TLS["key_file"]: None}
    assert [e.message for e in preflight.tls_file_problems("n1", files, state)] == [
        "n1: gpufleet_exporters_gpu_tls_server_config.key_file='/etc/ssl/private/gpu.key': no such file on the "
        "host; allowed: a PEM file that exists on the host"]
    settings = MonitoringSettings(grafana=False, prometheus_tls=TLS, tls_ca_file="/etc/ssl/ca.crt")
    errors = check_monitoring_host("mon", settings, {}, [], {TLS["cert_file"]: {"type": "file"},
                                                            TLS["key_file"]: {"type": "directory"}})
    assert [str(e).split("; allowed")[0] for e in errors] == [
        "mon: gpufleet_monitoring_prometheus_tls_server_config.key_file='/etc/ssl/private/gpu.key': not a regular "
        "file",
        "mon: gpufleet_monitoring_tls_ca_file='/etc/ssl/ca.crt': no such file on the host"]


def test_gpufleets_exporter_gets_its_certificate_as_systemd_credentials():
    unit = exporters.nvml_unit_text("10.0.0.5:9400", True, (("tls-cert.pem", TLS["cert_file"]),
                                                            ("tls-key.pem", TLS["key_file"])))
    assert "LoadCredential=web-config.yml:/etc/gpufleet/gpu-exporter-web-config.yml\n" in unit
    assert f"LoadCredential=tls-cert.pem:{TLS['cert_file']}\nLoadCredential=tls-key.pem:{TLS['key_file']}\n" in unit
    assert "--web-config-file ${CREDENTIALS_DIRECTORY}/web-config.yml\n" in unit
