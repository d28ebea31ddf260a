"""The fleet CA (gpufleet/fleet_ca.py): created once on the control machine, private, host certificates reissued only
when their names change or they near their end, and what the deploys make of it."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpufleet import fleet_ca
from gpufleet.config import FLEET_CA_FILE, FLEET_TLS, load_node_config
from gpufleet.monitoring import render
from gpufleet.monitoring.config import MonitoringSettings, TargetSettings


@pytest.fixture(autouse=True)
def credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CREDENTIALS_DIR", str(tmp_path / "credentials"))
    return tmp_path / "credentials"


def test_the_ca_is_created_once_and_kept_private(credentials):
    cert, key = fleet_ca.ca()
    assert fleet_ca.ca() == (cert, key)
    assert oct((credentials / "fleet-ca").stat().st_mode & 0o777) == "0o700"
    assert oct((credentials / "fleet-ca" / "ca.key").stat().st_mode & 0o777) == "0o600"
    ca = x509.load_pem_x509_certificate(cert.encode())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_host_certificate_is_signed_by_the_ca_for_its_names_and_kept_until_they_change():
    cert, key = fleet_ca.host_certificate("gpu01", ["10.0.0.5", "127.0.0.1"], ["localhost"])
    parsed = x509.load_pem_x509_certificate(cert.encode())
    ca = x509.load_pem_x509_certificate(fleet_ca.ca()[0].encode())
    parsed.verify_directly_issued_by(ca)
    san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("10.0.0.5"),
                                                            ipaddress.ip_address("127.0.0.1")}
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    # the same names: the same files (a converged host's files do not change)
    assert fleet_ca.host_certificate("gpu01", ["127.0.0.1", "10.0.0.5"], ["localhost"]) == (cert, key)
    assert fleet_ca.host_certificate("gpu01", ["10.0.0.6", "127.0.0.1"], ["localhost"])[0] != cert


def test_a_certificate_without_its_key_or_of_another_ca_is_issued_again(credentials):
    cert, key = fleet_ca.host_certificate("gpu01", ["10.0.0.5"], [])
    hosts = credentials / "fleet-ca" / "hosts"
    # a run stopped between the two writes: a new key beside the old certificate
    (hosts / "gpu01.key").write_text(fleet_ca.host_certificate("gpu02", ["10.0.0.6"], [])[1])
    again, again_key = fleet_ca.host_certificate("gpu01", ["10.0.0.5"], [])
    assert again != cert
    assert x509.load_pem_x509_certificate(again.encode()).public_key() == \
        serialization.load_pem_private_key(again_key.encode(), password=None).public_key()
    # the CA made again (its files removed): certificates of the old one are not handed out
    for name in ("ca.crt", "ca.key"):
        (credentials / "fleet-ca" / name).unlink()
    renewed_ca = x509.load_pem_x509_certificate(fleet_ca.ca()[0].encode())
    third, _ = fleet_ca.host_certificate("gpu01", ["10.0.0.5"], [])
    assert third != again
    x509.load_pem_x509_certificate(third.encode()).verify_directly_issued_by(renewed_ca)


def test_a_certificate_near_its_end_is_issued_again(monkeypatch):
    cert, _ = fleet_ca.host_certificate("gpu01", ["10.0.0.5"], [])
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=fleet_ca.HOST_DAYS - 10)
    monkeypatch.setattr(fleet_ca, "_now", lambda: later)
    assert fleet_ca.host_certificate("gpu01", ["10.0.0.5"], [])[0] != cert


def test_the_fleet_ca_turns_the_listeners_to_https_against_it():
    from gpufleet.deploys.monitoring import with_fleet_ca
    from gpufleet.monitoring.render import Target, scrape_targets

    config = load_node_config("n1", {"ssh_hostname": "10.0.0.5", "gpufleet_exporters_tls_fleet_ca": True})
    target = Target("n1", "10.0.0.5", (), config, TargetSettings())
    assert {job: groups[0]["labels"]["__scheme__"] for job, groups in scrape_targets([target]).items()} == {
        "gpu": "https", "node": "https"}
    settings = with_fleet_ca(MonitoringSettings(), [target])  # the targets need the CA, the services stay HTTP
    assert (settings.tls_ca_file, settings.prometheus_tls, settings.alertmanager_tls) == (FLEET_CA_FILE, {}, {})
    settings = with_fleet_ca(MonitoringSettings(tls_fleet_ca=True, alertmanager_tls={"cert_file": "/a",
                                                                                     "key_file": "/b"}), [])
    assert (settings.prometheus_tls, settings.alertmanager_tls["cert_file"]) == (FLEET_TLS, "/a")
    prometheus = yaml.safe_load(render.prometheus_config(settings))
    assert prometheus["scrape_configs"][0]["scheme"] == "https"
    assert prometheus["scrape_configs"][0]["tls_config"] == {"ca_file": FLEET_CA_FILE}
    assert with_fleet_ca(MonitoringSettings(), []) == MonitoringSettings()
    datasource = yaml.safe_load(render.grafana_datasource("https://10.0.0.9:9090", "pw", "CA PEM"))["datasources"][0]
    assert datasource["jsonData"] == {"tlsAuthWithCACert": True}
    assert datasource["secureJsonData"] == {"basicAuthPassword": "pw", "tlsCACert": "CA PEM"}


@pytest.mark.parametrize("address, ips, names", [
    ("10.0.0.5", {"10.0.0.5", "127.0.0.1"}, {"localhost"}),
    ("gpu01.example.org", {"127.0.0.1"}, {"gpu01.example.org", "localhost"}),
])
def test_an_address_certificate_names_the_address_as_ip_or_dns_and_loopback(address, ips, names):
    cert, _ = fleet_ca.address_certificate("gpu01", address)
    san = x509.load_pem_x509_certificate(cert.encode()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == ips
    assert set(san.get_values_for_type(x509.DNSName)) == names


_FIRST_USE = """
import json, os, sys, time
from pathlib import Path
here = Path(sys.argv[1])
(here / f"ready.{os.getpid()}").touch()
while not (here / "go").exists():
    time.sleep(0.001)
from gpufleet import fleet_ca, web_auth
print(json.dumps([fleet_ca.ca(), fleet_ca.host_certificate("gpu01", ["10.0.0.5"], []), web_auth.password("exporters")]))
"""


def test_workers_asking_at_the_same_moment_get_one_ca_one_certificate_one_password(credentials, tmp_path):
    """``gpufleet apply --jobs N``: every worker creates what its first host needs at the same moment (6 processes
    released together)."""
    import json
    import os
    import subprocess
    import sys
    import time

    gate = tmp_path / "gate"
    gate.mkdir()
    environ = {**os.environ, "GPUFLEET_CREDENTIALS_DIR": str(credentials)}
    workers = [subprocess.Popen([sys.executable, "-c", _FIRST_USE, str(gate)], env=environ, stdout=subprocess.PIPE,
                                text=True) for _ in range(6)]
    deadline = time.monotonic() + 60
    while len(list(gate.glob("ready.*"))) < len(workers):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.01)
    (gate / "go").touch()
    found = [json.loads(worker.communicate(timeout=60)[0]) for worker in workers]
    assert all(result == found[0] for result in found), [r[2] for r in found]
    (ca_cert, _), (cert, _), _ = found[0]
    x509.load_pem_x509_certificate(cert.encode()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca_cert.encode()))
