"""
Grafana on the monitoring host, done the way Grafana's Debian package expects: its repository key as Grafana's
instructions install it (``/etc/apt/keyrings/grafana.asc``, checked against a fingerprint when given), its
``/etc/default/grafana-server`` left as packaged, and an admin password that is applied to an existing Grafana too
and never printed.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import secrets
import shlex

from pyinfra import host
from pyinfra.api import FileUploadCommand, HiddenValue, StringCommand, operation
from pyinfra.facts.deb import DebPackages

from gpufleet.facts.grafana import GrafanaHostState, RepositoryKeyFingerprints

from .errors import refuse

KEYRING = "/etc/apt/keyrings/grafana.asc"  # Grafana's installation instructions: the armored key, this name
DEFAULTS = "/etc/default/grafana-server"  # the packaged unit's EnvironmentFile
PASSWORD_FILE = "/etc/grafana/gpufleet-admin-password"
PASSWORD_MARKER = "/var/lib/gpufleet/grafana-admin-password.applied"
GROUP = "grafana"
MANAGED_MARK = "# Managed by gpufleet"  # the first line of the file gpufleet < this version wrote over DEFAULTS
PBKDF2_ROUNDS = 200_000


def _state():
    return host.get_fact(GrafanaHostState, keyring=KEYRING, defaults=DEFAULTS, password_file=PASSWORD_FILE,
                         marker=PASSWORD_MARKER)


def password_marker(password: str, salt: str | None = None) -> str:
    """``pbkdf2_sha256$ROUNDS$SALT$HEX``: tells whether a password was applied without keeping it."""
    salt = salt or secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), PBKDF2_ROUNDS).hex()
    return f"pbkdf2_sha256${PBKDF2_ROUNDS}${salt}${digest}"


def marker_matches(marker: str | None, password: str) -> bool:
    parts = (marker or "").split("$")
    if len(parts) != 4 or parts[0] != "pbkdf2_sha256" or parts[1] != str(PBKDF2_ROUNDS):
        return False
    return hmac.compare_digest(password_marker(password, parts[2]), marker)


ARMORED = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


def install_key_script(url: str, keyring: str, sha256: str | None) -> str:
    """Download the key as apt would and install it as Grafana's instructions do (armored, 0644); with
    ``sha256``, only those bytes (the key whose fingerprint was checked); nothing is installed on failure."""
    check = ""
    if sha256:
        check = (f'{{ echo "{sha256}  $t/key" | sha256sum -c --quiet >/dev/null 2>&1 || {{ echo "the key at '
                 f'{shlex.quote(url)} changed since its fingerprint was checked" >&2; exit 1; }}; }} && ')
    return (f"(t=$(mktemp -d) && trap 'rm -rf \"$t\"' EXIT && "
            f"/usr/lib/apt/apt-helper download-file {shlex.quote(url)} \"$t/key\" && {check}"
            f"{{ grep -q -- '{ARMORED}' \"$t/key\" || {{ echo 'not an armored OpenPGP key: {shlex.quote(url)}' >&2; "
            "exit 1; }; } && "
            f"install -D -m 0644 -o root -g root \"$t/key\" {shlex.quote(keyring)})")


@operation()
def repository_key(url: str, fingerprint: str | None = None, setting: str = "fingerprint"):
    """
    Grafana's apt repository key in ``/etc/apt/keyrings/grafana.asc``, armored, as Grafana's installation
    instructions put it (apt reads armored keys from ``*.asc`` files named by ``signed-by=``).

    + url: where the key is published (Grafana: ``https://apt.grafana.com/gpg-full.key``)
    + fingerprint: 40 hex digits; when given, the key is trusted only with this fingerprint (the run is refused
      before any change otherwise), exactly the bytes checked are installed, and an installed key without it is
      replaced
    + setting: the inventory key named in a refusal

    **Example:**

    .. code:: python

        grafana.repository_key(url="https://apt.grafana.com/gpg-full.key",
                               fingerprint="B53AE77BADB630A683046005963FA27710458545")
    """
    have = _state()["keyring_fingerprints"]
    if have and (fingerprint is None or fingerprint in have):
        host.noop(f"{KEYRING} holds the repository key" + (f" {fingerprint}" if fingerprint else ""))
        return
    sha256 = None
    if fingerprint:
        remote = host.get_fact(RepositoryKeyFingerprints, url=url)
        if remote["error"]:
            yield from refuse(f"{host.name}: {setting}={fingerprint!r}: cannot check the key at {url}: "
                              f"{remote['error']}; nothing was changed")
            return
        if fingerprint not in remote["fingerprints"]:
            yield from refuse(f"{host.name}: {setting}={fingerprint!r}: the key at {url} has fingerprint "
                              f"{', '.join(remote['fingerprints']) or '(none)'}; not trusted, nothing was changed")
            return
        sha256 = remote["sha256"]
    yield StringCommand(install_key_script(url, KEYRING, sha256))


@operation()
def packaged_defaults():
    """
    ``/etc/default/grafana-server`` as Grafana's package ships it (the unit's ``EnvironmentFile``: ``CONF_FILE``,
    ``DATA_DIR``, ``PROVISIONING_CFG_DIR``… used in ``ExecStart``). gpufleet before this version replaced it;
    such a file (or a missing one) is restored from the package, dpkg's way for a conffile:
    ``apt-get install --reinstall -o Dpkg::Options::=--force-confmiss grafana``. A file the user edited is
    left alone.
    """
    if "grafana" not in host.get_fact(DebPackages):
        host.noop("grafana is not installed yet: its package installs the file")
        return
    line = _state()["defaults_first_line"]
    if line is not None and not line.startswith(MANAGED_MARK):
        host.noop(f"{DEFAULTS} is the package's (or the user's) file")
        return
    yield (f"rm -f {DEFAULTS} && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall "
           "-o Dpkg::Options::=--force-confmiss -o Dpkg::Options::=--force-confold grafana")


def _reset_command(password_file: str) -> str:
    """``grafana cli admin reset-admin-password`` as the packaged unit would run Grafana (same user, config file
    and paths from the package's environment file), the password on stdin: never on a command line."""
    overrides = ("cfg:default.paths.data=$DATA_DIR cfg:default.paths.logs=$LOG_DIR "
                 "cfg:default.paths.plugins=$PLUGINS_DIR cfg:default.paths.provisioning=$PROVISIONING_CFG_DIR")
    return (f"( . {DEFAULTS} && cd \"$GRAFANA_HOME\" && runuser -u \"$GRAFANA_USER\" -- \"$GRAFANA_HOME/bin/grafana\" "
            f"cli --homepath \"$GRAFANA_HOME\" --config \"$CONF_FILE\" --configOverrides \"{overrides}\" "
            f"admin reset-admin-password --password-from-stdin < {password_file} )")


@operation()
def admin_password(password: str):
    """
    The Grafana admin password: in ``/etc/grafana/gpufleet-admin-password`` (0640 root:grafana, created with
    that mode; Grafana reads it at its first start through ``$__file{}``) and applied to the running Grafana
    with ``grafana cli admin reset-admin-password --password-from-stdin``, so that an existing Grafana gets it
    too. A root-only marker (salted PBKDF2 of the applied password) tells a later run that nothing changed. The
    password never appears in a command, a diff or a log.

    + password: the admin password

    **Example:**

    .. code:: python

        grafana.admin_password(password=host.data.gpufleet_monitoring_grafana_admin_password)
    """
    state = _state()
    wanted_file = {"mode": "640", "user": "root", "group": GROUP, "size": len(password.encode())}
    if state["password_file"] == wanted_file and marker_matches(state["password_marker"], password):
        host.noop("the Grafana admin password is applied")
        return
    tmp = f"{PASSWORD_FILE}.gpufleet-new"
    # created empty at 0640 root:grafana first: the upload then fills a file that never had a wider mode
    yield f"umask 0137 && rm -f {tmp} && : > {tmp} && chgrp {GROUP} {tmp}"
    yield FileUploadCommand(io.BytesIO(password.encode()), tmp)
    yield f"chmod 0640 {tmp} && chown root:{GROUP} {tmp} && mv -f {tmp} {PASSWORD_FILE}"
    yield _reset_command(PASSWORD_FILE)
    marker = HiddenValue(shlex.quote(password_marker(password)))
    yield StringCommand(f"umask 0077 && mkdir -p {PASSWORD_MARKER.rsplit('/', 1)[0]} && printf '%s\\n'", marker,
                        f"> {PASSWORD_MARKER}.new && mv -f {PASSWORD_MARKER}.new {PASSWORD_MARKER}")
