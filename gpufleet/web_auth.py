"""The monitoring plane's credentials (control side): generated once, kept private on the control machine.

Every listener of the monitoring plane asks for HTTP basic auth through exporter-toolkit's web configuration file,
with one account per listener kind, user :data:`USER`: ``exporters`` (Prometheus scraping the exporters),
``prometheus`` (its API and UI) and ``alertmanager`` (its API and UI). The passwords are generated the first time a
deploy needs them and kept in :func:`credentials_dir`, private to the user (:mod:`gpufleet.control_files`); the
hosts get only bcrypt hashes, and the monitoring host the passwords Prometheus and Grafana send
(docs/security.md).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from gpufleet.control_files import UnsafePath, directory_lock, private_dir, read_private, write_atomic

USER = "gpufleet"
ACCOUNTS = ("exporters", "prometheus", "alertmanager")
# bcrypt's work factor slows the guessing of weak (human) passwords; these are 256-bit random ones, which no work
# factor strengthens, while every converge hashes once per host on the control machine: the cheap end of the
# range Go's x/crypto/bcrypt accepts (4..31).
BCRYPT_COST = 5
_PASSWORD_RE = re.compile(r"^[A-Za-z0-9_-]{32,}\Z")
# bcrypt's base64 alphabet (OpenBSD's, not RFC 4648's)
_BCRYPT_B64 = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_STD_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def credentials_dir() -> Path:
    if os.environ.get("GPUFLEET_CREDENTIALS_DIR"):
        return Path(os.environ["GPUFLEET_CREDENTIALS_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpufleet" / "credentials"


def password(account: str) -> str:
    """The password of ``account`` (one of :data:`ACCOUNTS`), generated and stored on first use. Raises
    :class:`~gpufleet.control_files.UnsafePath` when the directory or file is not private."""
    if account not in ACCOUNTS:
        raise ValueError(f"unknown monitoring account {account!r}; allowed: {', '.join(ACCOUNTS)}")
    directory = private_dir(credentials_dir(), "monitoring credentials directory")
    path = directory / f"{account}.password"
    if not path.exists():  # the lock only to create it (asked per host): a written file is whole (write_atomic)
        with directory_lock(directory):  # workers of one run (or two runs) asking at once: one password
            if not path.exists():
                write_atomic(path, secrets.token_urlsafe(32) + "\n", mode=0o600)
    if path.stat().st_mode & 0o077:
        raise UnsafePath(f"{path}: refused: the monitoring credential is readable by group or others (mode "
                         f"{path.stat().st_mode & 0o777:04o}): chmod 600 it (and change the password: others read it)")
    value = (read_private(path, "monitoring credential") or "").strip()
    if not _PASSWORD_RE.match(value):
        raise UnsafePath(f"{path}: not a password gpufleet wrote (32+ characters of A-Z a-z 0-9 _ -); remove it "
                         "to have a new one generated")
    return value


def _bcrypt_salt(seed: bytes) -> bytes:
    """22 characters of bcrypt's base64 (128 bits) from ``seed``."""
    std = base64.b64encode(seed[:16]).decode().rstrip("=")  # 22 characters
    return std.translate(str.maketrans(_STD_B64, _BCRYPT_B64)).encode()


@functools.lru_cache(maxsize=4096)
def bcrypt_hash(secret: str, context: str) -> str:
    """The bcrypt hash (``$2b$05$...``) of ``secret``, its salt derived from ``secret`` and ``context`` (the user):
    the same inputs give the same file on every run, so a converged host is not changed (the prometheus-community
    roles seed their salt with the host name; the host is left out here because every host holds the same
    generated password, so a per-host salt protects nothing, and identical hosts then have identical files, which
    the scale benchmark's fake hosts rely on). The salt reveals nothing the hash does not."""
    import bcrypt  # the pyca project's bcrypt (a gpufleet dependency): OpenBSD's algorithm, as Go's x/crypto/bcrypt

    seed = hmac.new(secret.encode(), context.encode(), hashlib.sha256).digest()
    salt = f"$2b${BCRYPT_COST:02d}$".encode() + _bcrypt_salt(seed)
    return bcrypt.hashpw(secret.encode(), salt).decode()


def web_config(users: Mapping[str, str], tls_server_config: Mapping | None = None,
               http_server_config: Mapping | None = None) -> str:
    """The text of a web configuration file (exporter-toolkit's format): ``basic_auth_users`` ``{user: bcrypt
    hash}``, and ``tls_server_config`` / ``http_server_config`` as given. Written as JSON, which is YAML: every value
    through the serializer, and gpufleet's exporter reads it without a YAML library."""
    data: dict = {}
    if tls_server_config:
        data["tls_server_config"] = dict(tls_server_config)
    if http_server_config:
        data["http_server_config"] = dict(http_server_config)
    data["basic_auth_users"] = dict(sorted(users.items()))
    return "# Managed by gpufleet: Prometheus' web configuration (basic auth, TLS)\n" + json.dumps(
        data, indent=2, sort_keys=True) + "\n"
