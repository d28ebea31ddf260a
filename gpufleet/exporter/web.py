"""The web configuration file of Prometheus' exporter-toolkit (``--web-config-file``), served the way it serves it.

Node-side, standard library only (it ships in the exporter's zip and in the simulator's dcgm-exporter stand-in).
Format and behaviour follow prometheus/exporter-toolkit (facts in ``tests/reference/upstream/exporter-toolkit/``):
unknown keys are errors, users mean basic auth, no ``cert_file`` means plain HTTP, and the file is read again when
it changes. Passwords are checked with the ``bcrypt`` module where installed, else with the system's libcrypt, so a
node needs no extra package; without either, a file with users is refused rather than served open.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import hmac
import json
import os
import ssl
import threading

TOP_LEVEL = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
            "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
            "curve_preferences")
# what this implementation supports of them; the others are refused by name rather than ignored
SUPPORTED_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version")
CLIENT_AUTH_TYPES = ("NoClientCert", "RequireAndVerifyClientCert")
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class WebConfigError(ValueError):
    """The web configuration file cannot be served as written (the message names the file and the key)."""


def _parse(text: str, path: str) -> dict:
    try:  # gpufleet writes the file as JSON (which is YAML) after comment lines
        data = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    except ValueError:
        try:
            import yaml  # a file written by hand: YAML where PyYAML is installed
        except ImportError:
            raise WebConfigError(f"{path}: not JSON, and PyYAML is not installed to read it as YAML") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise WebConfigError(f"{path}: not YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: not a mapping")
    return data


class _Crypt:
    """bcrypt hash checks: the ``bcrypt`` module, else libxcrypt's ``crypt()`` (not reentrant: one call at a time)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.backend = None
        try:
            import bcrypt
            self.bcrypt = bcrypt
            self.backend = "bcrypt"
        except ImportError:
            name = ctypes.util.find_library("crypt") or "libcrypt.so.1"
            try:
                lib = ctypes.CDLL(name)
                lib.crypt.restype = ctypes.c_char_p
                lib.crypt.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
                self.lib = lib
                self.backend = "libcrypt"
            except (OSError, AttributeError):
                pass

    def check(self, password: bytes, hashed: bytes) -> bool:
        with self.lock:
            if self.backend == "bcrypt":
                try:
                    return self.bcrypt.checkpw(password, hashed)
                except ValueError:
                    return False
            if self.backend == "libcrypt":
                if b"\0" in password:
                    return False
                result = self.lib.crypt(password, hashed)
                return bool(result) and not result.startswith(b"*") and hmac.compare_digest(result, hashed)
        return False


_CRYPT = None
# the toolkit checks an unknown user against a fixed hash (no timing difference between unknown user and wrong
# password): the same idea, with a hash of our own
_UNKNOWN_USER_HASH = b"$2b$10$iq/gRniJEeHMfUE9q/Uyaezx9PHjAqj/l5kUdwZF.cIGri1S6EwlC"


def crypt_backend() -> _Crypt:
    global _CRYPT
    if _CRYPT is None:
        _CRYPT = _Crypt()
    return _CRYPT


class WebConfig:
    """One web configuration file, re-read when it changes."""

    def __init__(self, path: str | None):
        self.path = path
        self._stamp = None
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str, str], bool] = {}
        self.users: dict[str, str] = {}
        self.tls: dict = {}
        self.headers: dict[str, str] = {}
        if path:
            self.reload()

    def reload(self) -> None:
        if not self.path:
            return
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
            if stamp == self._stamp:
                return
            with open(self.path, encoding="utf-8") as handle:
                data = _parse(handle.read(), self.path)
        except OSError as error:
            raise WebConfigError(f"{self.path}: cannot read the web configuration: {error}") from None
        unknown = sorted(set(data) - set(TOP_LEVEL))
        if unknown:
            raise WebConfigError(f"{self.path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(TOP_LEVEL)}")
        users = data.get("basic_auth_users") or {}
        if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
            raise WebConfigError(f"{self.path}: basic_auth_users: not a mapping of user name to bcrypt hash")
        if users and crypt_backend().backend is None:
            raise WebConfigError(f"{self.path}: basic_auth_users set but neither the bcrypt module nor libcrypt.so.1 "
                                 "is available to check passwords (install python3-bcrypt)")
        tls = data.get("tls_server_config") or {}
        if not isinstance(tls, dict):
            raise WebConfigError(f"{self.path}: tls_server_config: not a mapping")
        for key in sorted(set(tls) - set(SUPPORTED_TLS_KEYS)):
            where = "an exporter-toolkit key this exporter does not support" if key in TLS_KEYS else "unknown key"
            raise WebConfigError(f"{self.path}: tls_server_config.{key}: {where}; supported: "
                                 + ", ".join(SUPPORTED_TLS_KEYS))
        http = data.get("http_server_config") or {}
        headers = http.get("headers") or {} if isinstance(http, dict) else None
        if not isinstance(headers, dict):
            raise WebConfigError(f"{self.path}: http_server_config.headers: not a mapping")
        with self._lock:
            self.users, self.tls, self.headers = dict(users), dict(tls), {str(k): str(v) for k, v in headers.items()}
            self._cache.clear()
            self._stamp = stamp

    def _file(self, key: str) -> str:
        value = self.tls.get(key) or ""
        if not isinstance(value, str):
            raise WebConfigError(f"{self.path}: tls_server_config.{key}: not a file name")
        return value if not value or os.path.isabs(value) else os.path.join(os.path.dirname(self.path), value)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of ``tls_server_config`` (None: plain HTTP, as without ``cert_file``/``key_file``)."""
        cert, key = self._file("cert_file"), self._file("key_file")
        if not cert and not key:
            return None
        if not cert or not key:
            raise WebConfigError(f"{self.path}: tls_server_config needs both cert_file and key_file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        for bound, attribute, default in (("min_version", "minimum_version", "TLS12"),
                                          ("max_version", "maximum_version", "TLS13")):
            version = self.tls.get(bound, default)
            if version not in TLS_VERSIONS:
                raise WebConfigError(f"{self.path}: tls_server_config.{bound}: {version!r}; allowed: "
                                     + ", ".join(TLS_VERSIONS))
            setattr(context, attribute, TLS_VERSIONS[version])
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as error:
            raise WebConfigError(f"{self.path}: tls_server_config cert_file/key_file: {error}") from None
        client_auth = self.tls.get("client_auth_type", "NoClientCert")
        if client_auth not in CLIENT_AUTH_TYPES:
            raise WebConfigError(f"{self.path}: tls_server_config.client_auth_type: {client_auth!r}; supported: "
                                 + ", ".join(CLIENT_AUTH_TYPES))
        if client_auth == "RequireAndVerifyClientCert":
            ca = self._file("client_ca_file")
            if not ca:
                raise WebConfigError(f"{self.path}: client_auth_type RequireAndVerifyClientCert needs client_ca_file")
            try:
                context.load_verify_locations(ca)
            except (OSError, ssl.SSLError) as error:
                raise WebConfigError(f"{self.path}: tls_server_config.client_ca_file: {error}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may pass (always, without users)."""
        with self._lock:
            users = self.users
        if not users:
            return True
        if not authorization or not authorization[:6].lower() == "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(authorization[6:].strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = users.get(user)
        key = (user, hashed or "", hashlib.sha256(password.encode()).hexdigest())
        with self._lock:
            known = self._cache.get(key)
        if known is None:
            known = crypt_backend().check(password.encode(), (hashed or "").encode() or _UNKNOWN_USER_HASH)
            known = known and hashed is not None
            with self._lock:
                self._cache[key] = known
        return known


def guard(handler, config: WebConfig) -> bool:
    """In a ``BaseHTTPRequestHandler``'s ``do_GET``: True when the request may be served; otherwise the answer
    (``401`` with ``WWW-Authenticate: Basic``, or ``500`` when the file became unreadable) is sent and False
    returned. The file's headers (``http_server_config.headers``) are the caller's to add (:func:`add_headers`)."""
    try:
        config.reload()
    except WebConfigError as error:
        print(f"web configuration: {error}", flush=True)
        handler.send_error(500)
        return False
    if config.authorized(handler.headers.get("Authorization")):
        return True
    body = b"Unauthorized\n"
    handler.send_response(401)
    handler.send_header("WWW-Authenticate", "Basic")
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("Content-Length", str(len(body)))
    add_headers(handler, config)
    handler.end_headers()
    handler.wfile.write(body)
    return False


def add_headers(handler, config: WebConfig) -> None:
    for name, value in config.headers.items():
        handler.send_header(name, value)


def wrap_tls(server, config: WebConfig) -> None:
    """Serve TLS on ``server`` (an ``http.server`` server) when the file says so."""
    context = config.ssl_context()
    if context is not None:
        # the handshake in the request's thread, not in the accepting one (a silent client must not stall the rest)
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
