"""What the monitoring host's Grafana has, read in one command: the apt keyring's fingerprints, whether the
packaged ``/etc/default/grafana-server`` was replaced by an earlier gpufleet, and the state of the admin
password gpufleet manages (the password file's mode and owner, the marker of the applied password). Never the
password itself: the marker holds a salted PBKDF2 hash, the file is only ``stat``-ed.

``RepositoryKeyFingerprints(url)`` downloads a repository key on the node (``apt-helper download-file``, as apt
would fetch) and lists its fingerprints; read only when a key is about to be trusted. Fingerprints are computed
here from the key's bytes (the node needs no gpg to be asked).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import shlex

from pyinfra.api import FactBase

from .sections import first_line, join, parse_sections, print_file, section

APT_HELPER = "/usr/lib/apt/apt-helper"
_PUBLIC_KEY_TAG = 6  # RFC 9580 5.5.1.1: the primary key packet


def _dearmor(data: bytes) -> bytes:
    text = data.decode("ascii", "replace")
    if "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in text:
        return data
    body = text.split("-----BEGIN PGP PUBLIC KEY BLOCK-----", 1)[1].split("-----END PGP", 1)[0]
    lines = body.strip().splitlines()
    while lines and ":" in lines[0]:  # armor headers (Version: …, Comment: …) up to the blank line
        lines.pop(0)
    payload = "".join(line.strip() for line in lines if line.strip() and not line.startswith("="))
    return base64.b64decode(payload)


def openpgp_fingerprints(data: bytes) -> list[str]:
    """Fingerprints (upper-case hex) of the primary public keys in an OpenPGP key file, armored or binary
    (RFC 9580 5.5.4: v4 = SHA-1 over 0x99, 2-byte length, key packet; v6 = SHA-256 over 0x9B, 4-byte length;
    v5 alike with 0x9A). Parsed here so that the node needs no gpg to be asked."""
    raw, out, i = _dearmor(data), [], 0
    while i < len(raw):
        first = raw[i]
        if not first & 0x80:
            raise ValueError("not an OpenPGP packet")
        if first & 0x40:  # new format
            tag, octet = first & 0x3F, raw[i + 1]
            if octet < 192:
                length, header = octet, 2
            elif octet < 224:
                length, header = ((octet - 192) << 8) + raw[i + 2] + 192, 3
            elif octet == 255:
                length, header = int.from_bytes(raw[i + 2:i + 6], "big"), 6
            else:
                raise ValueError("partial body length in a key file")
        else:  # old format
            tag, kind = (first >> 2) & 0x0F, first & 0x03
            if kind == 3:
                raise ValueError("indeterminate length in a key file")
            size = (1, 2, 4)[kind]
            length, header = int.from_bytes(raw[i + 1:i + 1 + size], "big"), 1 + size
        body = raw[i + header:i + header + length]
        if len(body) != length:
            raise ValueError("truncated OpenPGP packet")
        if tag == _PUBLIC_KEY_TAG and body:
            if body[0] == 4:
                out.append(hashlib.sha1(b"\x99" + length.to_bytes(2, "big") + body).hexdigest().upper())
            elif body[0] in (5, 6):
                prefix = b"\x9a" if body[0] == 5 else b"\x9b"
                out.append(hashlib.sha256(prefix + length.to_bytes(4, "big") + body).hexdigest().upper())
        i += header + length
    return out


def _decode(lines: list[str]) -> bytes | None:
    try:
        return base64.b64decode("".join(line.strip() for line in lines))
    except binascii.Error:
        return None


def _fingerprints(data: bytes | None) -> list[str] | None:
    try:
        return None if data is None else openpgp_fingerprints(data)
    except (ValueError, IndexError, binascii.Error):
        return None


class GrafanaHostState(FactBase):
    """
    .. code:: python

        {
            "keyring_fingerprints": ["…40 hex…"],  # None: no keyring file
            "defaults_first_line": "GRAFANA_USER=grafana",  # None: no /etc/default/grafana-server
            "password_file": {"mode": "640", "user": "root", "group": "grafana", "size": 20},  # None: absent
            "password_marker": "pbkdf2_sha256$…",  # None: absent
        }
    """

    @staticmethod
    def default():
        return {"keyring_fingerprints": None, "defaults_first_line": None, "password_file": None,
                "password_marker": None}

    def command(self, keyring: str, defaults: str, password_file: str, marker: str) -> str:
        k, d, p, m = (shlex.quote(x) for x in (keyring, defaults, password_file, marker))
        return join(
            section("keyring", f"[ -e {k} ] && base64 < {k}"),
            section("defaults", f"[ -e {d} ] && {print_file(d)}"),
            section("password", f"[ -e {p} ] && stat -c '%a %U %G %s' {p}"),
            section("marker", f"[ -e {m} ] && {print_file(m)}"),
        )

    def process(self, output):
        sections = parse_sections(output)
        result = self.default()
        keyring = sections.get("keyring")
        if keyring is not None and keyring.ok:
            # an unreadable file counts as no key: it is replaced
            result["keyring_fingerprints"] = _fingerprints(_decode(keyring.lines))
        defaults = sections.get("defaults")
        if defaults is not None and defaults.rc == 0:
            result["defaults_first_line"] = first_line(defaults.lines)
        password = sections.get("password")
        if password is not None and password.rc == 0:
            parts = first_line(password.lines).split()
            if len(parts) == 4 and parts[3].isdigit():
                result["password_file"] = {"mode": parts[0], "user": parts[1], "group": parts[2],
                                           "size": int(parts[3])}
        marker = sections.get("marker")
        if marker is not None and marker.rc == 0:
            result["password_marker"] = first_line(marker.lines) or None
        return result


class RepositoryKeyFingerprints(FactBase):
    """
    The fingerprints of the key at ``url`` as the node downloads it, and the SHA-256 of those bytes (the install
    installs exactly them):
    ``{"fingerprints": ["…"], "sha256": "…", "error": None}`` or
    ``{"fingerprints": [], "sha256": None, "error": "…apt-helper's message…"}``.
    """

    @staticmethod
    def default():
        return {"fingerprints": [], "sha256": None, "error": "not read"}

    def command(self, url: str) -> str:
        return section("key", f'(t=$(mktemp -d) && trap \'rm -rf "$t"\' EXIT && '
                              f'{APT_HELPER} download-file {shlex.quote(url)} "$t/key" >"$t/log" 2>&1 '
                              f'|| {{ cat "$t/log"; exit 1; }}; base64 < "$t/key")')

    def process(self, output):
        sec = parse_sections(output).get("key")
        if sec is None:
            return {**self.default(), "error": "no output"}
        if sec.rc != 0:
            return {**self.default(), "error": sec.text or f"exit status {sec.rc}"}
        data = _decode(sec.lines)
        found = _fingerprints(data)
        if found is None:
            return {**self.default(), "error": "not an OpenPGP key file"}
        return {"fingerprints": found, "sha256": hashlib.sha256(data).hexdigest(), "error": None}
