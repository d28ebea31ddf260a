"""Repository signing keys checked against the fingerprint the user gives (pure: no host access).

A key fetched over plain HTTP (NVIDIA's CUDA repositories, most mirrors) is only as trustworthy as the network it
crossed. With a fingerprint setting (``gpufleet_driver_repo_key_fingerprint``; the Grafana step can use the same
helpers), the key is downloaded to a temporary file beside its destination, its primary key fingerprints are read
with ``gpg --show-keys`` (an empty, throw-away GNUPGHOME: root's keyring is never touched), and it replaces the
destination only when one of them is the expected one; otherwise the host fails naming both fingerprints. A key
file already in place is kept when the :class:`~gpufleet.facts.repository.KeyFingerprints` fact finds the
fingerprint in it, and fetched again (and checked) when not.

NVIDIA's keys, as NVIDIA documents them (NVIDIA/cuda-repo-management, SIGNATURES.md, commit
ee8303dff360b1523307eb18c45a6a5b987512ce): apt ``3bf863cc.pub`` EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC,
rpm ``D42D0685.pub`` 610C 7B14 E068 A878 070D A4E9 9CD0 A493 D42D 0685.
"""

from __future__ import annotations

import posixpath
import shlex

from pyinfra.api import StringCommand

from gpufleet.config import normalise_fingerprint
from gpufleet.facts.repository import fingerprints_of, fingerprints_script
from gpufleet.masking import mask_urls

NVIDIA_APT_KEY_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"
NVIDIA_RPM_KEY_FINGERPRINT = "610C7B14E068A878070DA4E99CD0A493D42D0685"
__all__ = ["fetch_checked_key", "fingerprints_script", "key_is_trusted", "normalise_fingerprint"]


def key_is_trusted(found: dict | None, fingerprint: str) -> bool:
    """Whether the key file the ``KeyFingerprints`` fact read holds a key with ``fingerprint``."""
    return bool(found and fingerprint in (found.get("fingerprints") or ()))


def fetch_checked_key(src: str, dest: str, fingerprint: str, mode: str = "644",
                      setting: str = "the key fingerprint") -> StringCommand:
    """One command: download ``src`` (curl, else wget) to a temporary file beside ``dest``, and move it over
    ``dest`` with ``mode`` only when one of its primary keys has ``fingerprint``; otherwise fail naming the
    fingerprints found, the one expected and ``setting`` (the key is never installed)."""
    directory, name = posixpath.split(dest)
    url, temp = shlex.quote(src), shlex.quote(f"{directory}/.{name}.gpufleet-XXXXXX")
    shown = shlex.quote(mask_urls(src))
    read_temp = fingerprints_of('"$tmp"')
    script = (
        "command -v gpg >/dev/null 2>&1 || { echo 'gpufleet: error: gpg is needed to check the repository key "
        "fingerprint (install gnupg, or leave the fingerprint setting out)' >&2; exit 1; }; "
        f"mkdir -p {shlex.quote(directory)} && tmp=$(mktemp {temp}) && trap 'rm -f \"$tmp\"' EXIT && "
        f"{{ curl -sSLf {url} -o \"$tmp\" 2>/dev/null || wget -q -O \"$tmp\" {url}; }} && "
        f"found=$({read_temp}) && "
        f"if printf '%s\\n' \"$found\" | grep -qx {fingerprint}; then "
        f"chmod {shlex.quote(mode)} \"$tmp\" && mv -f \"$tmp\" {shlex.quote(dest)}; "
        f"else echo \"gpufleet: error: the key at \"{shown}\" has the fingerprint(s) $(echo ${{found:-none}}), "
        f"not {fingerprint} ({setting}): not installed\" >&2; exit 1; fi"
    )
    return StringCommand(script)
