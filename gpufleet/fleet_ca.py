"""A small fleet CA on the control machine (``gpufleet_*_tls_fleet_ca``): gpufleet's own certificates for the
monitoring plane's listeners, for sites that have no PKI of their own.

The CA (EC P-256, ten years) and each host's certificate (its addresses as IP SANs, its name as DNS SAN, one year)
are created with the ``cryptography`` library (pyca, already a dependency of pyinfra's SSH stack: no ``openssl``
command line with key material in arguments or temporary files) and kept beside the monitoring credentials
(:func:`gpufleet.web_auth.credentials_dir` ``/fleet-ca``, 0700, keys 0600). A host's certificate is issued again
only when its names change or less than 30 days are left, so a converged host's files do not change. The hosts get
their certificate and key and the CA certificate; the CA's key never leaves the control machine.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from pathlib import Path

from gpufleet.control_files import directory_lock, private_dir, read_private, write_atomic
from gpufleet.web_auth import credentials_dir

CA_DAYS = 3650
HOST_DAYS = 365
RENEW_DAYS = 30
_HOST_FILE_RE = re.compile(r"[^A-Za-z0-9._-]")


def _directory() -> Path:
    return private_dir(credentials_dir() / "fleet-ca", "fleet CA directory")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _key_pem(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert) -> str:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM).decode()


def ca() -> tuple[str, str]:
    """(CA certificate PEM, CA key PEM), created on first use (again where the key is not the certificate's: a
    run stopped between the two writes)."""
    directory = _directory()
    with directory_lock(directory):  # the workers of one run asking at once: one CA
        return _stored_or_new_ca(directory)


def _stored_or_new_ca(directory: Path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert, key = read_private(directory / "ca.crt", "fleet CA certificate"), read_private(directory / "ca.key",
                                                                                         "fleet CA key")
    if cert and key and _pair(x509.load_pem_x509_certificate(cert.encode()), key):
        return cert, key
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet fleet CA")])
    now = _now()
    ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True)
               .sign(ca_key, hashes.SHA256()))
    write_atomic(directory / "ca.key", _key_pem(ca_key), mode=0o600)
    write_atomic(directory / "ca.crt", _cert_pem(ca_cert), mode=0o600)
    return _cert_pem(ca_cert), _key_pem(ca_key)


def _names(cert) -> tuple[set[str], set[str]]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return ({str(a) for a in san.get_values_for_type(x509.IPAddress)},
            set(san.get_values_for_type(x509.DNSName)))


def _pair(cert, key_pem: str) -> bool:
    """The stored key is the certificate's (a run stopped between writing the two leaves a new key beside the old
    certificate)."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError):  # not a PEM key, or one with a password
        return False
    return key.public_key() == cert.public_key()


def _issued_by(cert, ca_cert) -> bool:
    """Signed by the CA now in use (after the CA was made again, the old CA's certificates fail every check)."""
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError):  # another signature, or another issuer name or key type
        return False
    return True


def host_certificate(host: str, addresses: list[str], dns_names: list[str]) -> tuple[str, str]:
    """(certificate PEM, key PEM) of ``host`` for these IP addresses and DNS names, signed by the fleet CA; the
    stored one while its names match and more than 30 days are left."""
    ca_cert_pem, ca_key_pem = ca()
    directory = private_dir(_directory() / "hosts", "fleet CA directory")
    with directory_lock(directory):  # one certificate per host, whoever asks at the same moment
        return _stored_or_new_host(directory, host, addresses, dns_names, ca_cert_pem, ca_key_pem)


def _stored_or_new_host(directory: Path, host: str, addresses: list[str], dns_names: list[str], ca_cert_pem: str,
                        ca_key_pem: str) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    base = _HOST_FILE_RE.sub("_", host)
    ips = {str(ipaddress.ip_address(a)) for a in addresses}
    names = set(dns_names)
    cert_pem = read_private(directory / f"{base}.crt", "fleet CA host certificate")
    key_pem = read_private(directory / f"{base}.key", "fleet CA host key")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    if cert_pem and key_pem:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        left = cert.not_valid_after_utc - _now()
        if (_names(cert) == (ips, names) and left > datetime.timedelta(days=RENEW_DAYS)
                and _pair(cert, key_pem) and _issued_by(cert, ca_cert)):
            return cert_pem, key_pem
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    san = [*(x509.IPAddress(ipaddress.ip_address(a)) for a in sorted(ips)), *(x509.DNSName(n) for n in sorted(names))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=HOST_DAYS))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_pem, key_pem = _cert_pem(cert), _key_pem(key)
    write_atomic(directory / f"{base}.key", key_pem, mode=0o600)
    write_atomic(directory / f"{base}.crt", cert_pem, mode=0o600)
    return cert_pem, key_pem


def address_certificate(host: str, address: str) -> tuple[str, str]:
    """:func:`host_certificate` for the address the host is reached at (an IP address or a DNS name) and for
    loopback (127.0.0.1, localhost)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return host_certificate(host, ["127.0.0.1"], [address, "localhost"])
    return host_certificate(host, [address, "127.0.0.1"], ["localhost"])
