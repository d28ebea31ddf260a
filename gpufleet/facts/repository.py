"""What a flat apt repository offers, asked from the node itself (it is the node that installs from it).

``AptRepositoryIndex(url)`` downloads ``<url>/Packages.gz`` (else ``<url>/Packages``) with
``/usr/lib/apt/apt-helper download-file`` (part of apt: honours the node's apt proxy settings, needs no curl)
and lists its ``Package``/``Version`` fields. NVIDIA's CUDA repositories and their mirrors are flat
(``deb URL /``). Parse, never decide: whether the branch is offered is preflight's call.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

from .sections import join, parse_sections, section

APT_HELPER = "/usr/lib/apt/apt-helper"


def index_script(url: str) -> str:
    """Shell that prints the repository's ``Package:``/``Version:`` lines (exit 1 with apt's error if it does
    not answer)."""
    base = url.rstrip("/")
    gz, plain = shlex.quote(f"{base}/Packages.gz"), shlex.quote(f"{base}/Packages")
    return (
        '(t=$(mktemp -d) && trap \'rm -rf "$t"\' EXIT && '
        f'if {APT_HELPER} download-file {gz} "$t/P.gz" >"$t/log" 2>&1; then gzip -dc "$t/P.gz" >"$t/P"; '
        f'elif {APT_HELPER} download-file {plain} "$t/P" >>"$t/log" 2>&1; then :; '
        'else cat "$t/log"; exit 1; fi && { grep -E "^(Package|Version):" "$t/P" || true; })'
    )


def parse_index(lines: list[str]) -> dict[str, list[str]]:
    """``Package:``/``Version:`` lines -> {package: [versions in index order]}."""
    offered: dict[str, list[str]] = {}
    name = None
    for raw in lines:
        key, _, value = raw.strip().partition(":")
        if key == "Package":
            name = value.strip()
            offered.setdefault(name, [])
        elif key == "Version" and name:
            offered[name].append(value.strip())
    return offered


class AptRepositoryIndex(FactBase):
    """
    The packages a flat apt repository offers, as the node sees it:

    .. code:: python

        {"packages": {"nvidia-open": ["570.172.08-1", "580.95.05-1"], ...}, "error": None}
        {"packages": {}, "error": "E: Failed to fetch http://mirror/nvidia/Packages.gz  404  Not Found"}
    """

    @staticmethod
    def default():
        return {"packages": {}, "error": "not read"}

    def command(self, url: str) -> str:
        return join(section("index", index_script(url), requires=APT_HELPER))

    def process(self, output):
        index = parse_sections(output).get("index")
        if index is None or not index.present:
            return {"packages": {}, "error": f"{APT_HELPER} is not installed (not an apt system)"}
        if index.rc != 0:
            errors = [line.strip() for line in index.lines if line.strip() and not line.startswith(("Package:",
                                                                                                    "Version:"))]
            return {"packages": {}, "error": (errors[-1] if errors else f"download failed (exit {index.rc})")}
        return {"packages": parse_index(index.lines), "error": None}


def fingerprints_script(path: str) -> str:
    """Shell printing the primary key fingerprint of every key in the key file ``path`` (armored or binary), one a
    line, with a throw-away GNUPGHOME."""
    return fingerprints_of(shlex.quote(path))


def fingerprints_of(word: str) -> str:
    """:func:`fingerprints_script` of the shell word ``word`` (e.g. ``"$tmp"``)."""
    return (f'h=$(mktemp -d) && GNUPGHOME="$h" gpg --batch --show-keys --with-colons {word} '
            "2>/dev/null | awk -F: '$1 == \"pub\" {want = 1; next} $1 == \"fpr\" && want {print $10; want = 0}'; "
            'rm -rf "$h"')


class KeyFingerprints(FactBase):
    """
    The primary key fingerprints of a repository key file on the node (``gpg --show-keys``, a throw-away
    GNUPGHOME):

    .. code:: python

        {"present": True, "gpg": True, "fingerprints": ["EB693B3035CD5710E231E123A4B469963BF863CC"]}
        {"present": False, "gpg": None, "fingerprints": []}
    """

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (f"if [ -e {quoted} ]; then if command -v gpg >/dev/null 2>&1; then echo gpg=yes; "
                f"{fingerprints_script(path)}; else echo gpg=no; fi; else echo absent; fi")

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        if not lines or lines[0] == "absent":
            return {"present": False, "gpg": None, "fingerprints": []}
        return {"present": True, "gpg": lines[0] == "gpg=yes", "fingerprints": lines[1:]}
