"""The simulated Grafana's stand-in: configuration read as Grafana reads it (defaults, cfg:default.* arguments, the
ini file, GF_* overrides, then $__file{} expansion), the admin user created once from the first start's
configuration, the password reset by the CLI, provisioned dashboards and datasources answered with basic auth."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from gpufleet.monitoring import render
from gpufleet.sim import repo

STANDIN = repo.GRAFANA_DIR / "standin.py"
sys.path.insert(0, str(repo.GRAFANA_DIR))
import standin  # noqa: E402


def test_config_layers_as_grafana(tmp_path, monkeypatch):
    (tmp_path / "secret").write_text("from-a-file-123\n")
    (tmp_path / "grafana.ini").write_text("[server]\nhttp_port = 3001\n[security]\nadmin_user = root-user\n")
    monkeypatch.setenv("GF_SERVER_HTTP_PORT", "3002")
    monkeypatch.setenv("GF_SECURITY_ADMIN_PASSWORD", f"$__file{{{tmp_path / 'secret'}}}")
    cfg = standin.load_config(str(tmp_path / "grafana.ini"), "/usr/share/grafana",
                              ["cfg:default.paths.data=/var/lib/grafana"])
    assert cfg["server"]["http_port"] == "3002"  # the environment over the ini file
    assert cfg["security"] == {"admin_user": "root-user", "admin_password": "from-a-file-123"}
    assert cfg["paths"]["data"] == "/var/lib/grafana"
    assert cfg["paths"]["provisioning"] == "/usr/share/grafana/conf/provisioning"  # relative to the home path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, password: str | None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"admin:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, None


@pytest.fixture
def grafana_server(tmp_path):
    prov, dashboards = tmp_path / "prov", tmp_path / "dashboards"
    (prov / "datasources").mkdir(parents=True)
    (prov / "dashboards").mkdir()
    dashboards.mkdir()
    (prov / "datasources/gpufleet.yml").write_text(render.grafana_datasource("http://localhost:9090"))
    (prov / "dashboards/gpufleet.yml").write_text(
        render.grafana_dashboard_provider().replace(render.GRAFANA_DASHBOARD_DIR, str(dashboards)))
    for name in render.DASHBOARDS:
        (dashboards / name).write_text(render.dashboard(name))
    port = _free_port()
    env = {"GF_SERVER_HTTP_ADDR": "127.0.0.1", "GF_SERVER_HTTP_PORT": str(port),
           "GF_SECURITY_ADMIN_PASSWORD": "first-start-pw", "PATH": "/usr/bin:/bin"}
    args = [f"cfg:default.paths.data={tmp_path / 'data'}", f"cfg:default.paths.provisioning={prov}"]
    proc = subprocess.Popen([sys.executable, "-S", str(STANDIN), "server", f"--homepath={tmp_path}", *args], env=env)
    deadline = time.monotonic() + 10
    while True:
        try:
            if _get(port, "/api/health", None)[0] == 200:
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield port, tmp_path, args
    proc.terminate()
    proc.wait()


def test_server_answers_provisioned_dashboards_and_datasource_with_basic_auth(grafana_server):
    port, _tmp, _args = grafana_server
    status, found = _get(port, "/api/search", "first-start-pw")
    assert status == 200
    assert sorted(d["title"] for d in found) == ["GPU fleet health", "Training"]
    assert _get(port, "/api/datasources", "first-start-pw")[1][0]["url"] == "http://localhost:9090"
    assert _get(port, "/api/search", None)[0] == 401
    assert _get(port, "/api/search", "admin")[0] == 401


def test_cli_resets_the_admin_password_from_stdin(grafana_server):
    port, tmp, args = grafana_server
    result = subprocess.run([sys.executable, "-S", str(STANDIN), "cli", "--homepath", str(tmp),
                             "--configOverrides", " ".join(args), "admin", "reset-admin-password",
                             "--password-from-stdin"], input="a-new-password-1\n", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "a-new-password-1" not in result.stdout + result.stderr
    assert _get(port, "/api/search", "a-new-password-1")[0] == 200
    assert _get(port, "/api/search", "first-start-pw")[0] == 401
