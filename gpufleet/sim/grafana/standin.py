"""The simulated Grafana package's program (``/usr/share/grafana/bin/grafana``): a stand-in for Grafana's server
and its ``cli admin reset-admin-password``, Python standard library only.

It reads its configuration as Grafana does (pkg/setting: built-in defaults, ``cfg:default.*`` arguments, the
``--config`` ini file, ``GF_<SECTION>_<KEY>`` environment overrides, then ``$__file{}`` / ``$__env{}``
expansion), keeps its admin user in ``<paths.data>/grafana.db`` (SQLite, password hashed as Grafana does:
PBKDF2-SHA256, 10000 rounds, 50 bytes), reads the provisioning directory (datasources, dashboard providers and
their dashboard JSON files) and answers ``/api/health``, ``/api/datasources`` and ``/api/search`` (both with basic
auth, as with Grafana's anonymous access off). Provisioning files are YAML; the stand-in reads those whose
content is JSON (a subset of YAML), which is how gpufleet writes them.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import sqlite3
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "11.6.0-sim"
DEFAULTS = {
    "paths": {"data": "data", "logs": "data/log", "plugins": "data/plugins", "provisioning": "conf/provisioning"},
    "server": {"http_addr": "", "http_port": "3000"},
    "security": {"admin_user": "admin", "admin_password": "admin"},
}
_EXPAND_RE = re.compile(r"\$__(file|env)\{([^}]*)\}")


def _expand(value: str) -> str:
    def one(match):
        kind, arg = match.groups()
        if kind == "env":
            return os.environ.get(arg, "")
        return Path(arg).read_text().strip()
    return _EXPAND_RE.sub(one, value)


def load_config(config_file: str | None, homepath: str, overrides: list[str]) -> dict[str, dict[str, str]]:
    cfg = {section: dict(values) for section, values in DEFAULTS.items()}
    for arg in overrides:  # cfg:default.paths.data=/var/lib/grafana
        if arg.startswith("cfg:default.") and "=" in arg:
            key, value = arg[len("cfg:default."):].split("=", 1)
            section, _, name = key.rpartition(".")
            cfg.setdefault(section, {})[name] = value
    if config_file:
        parser = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
        parser.read(config_file)
        for section in parser.sections():
            cfg.setdefault(section, {}).update(parser[section])
    for section, values in cfg.items():
        for name in list(values):
            env = f"GF_{section.upper().replace('.', '_').replace('-', '_')}_{name.upper()}"
            if os.environ.get(env):
                values[name] = os.environ[env]
    for values in cfg.values():
        for name, value in values.items():
            values[name] = _expand(value)
    for name, value in cfg["paths"].items():
        if not os.path.isabs(value):
            cfg["paths"][name] = os.path.join(homepath, value)
    return cfg


def _hash(password: str, salt: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), 10000, 50).hex()


def open_db(cfg) -> sqlite3.Connection:
    path = Path(cfg["paths"]["data"]) / "grafana.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE IF NOT EXISTS user (id INTEGER PRIMARY KEY, login TEXT, password TEXT, salt TEXT)")
    if db.execute("SELECT COUNT(*) FROM user").fetchone()[0] == 0:
        # the admin user is created once, from the configuration of the first start (admin_password)
        salt = secrets.token_hex(5)
        db.execute("INSERT INTO user (id, login, password, salt) VALUES (1, ?, ?, ?)",
                   (cfg["security"]["admin_user"], _hash(cfg["security"]["admin_password"], salt), salt))
        db.commit()
    return db


def _read_yaml_json(path: Path):
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    return json.loads(text) if text.strip() else {}


def provisioned(cfg) -> tuple[list[dict], list[dict]]:
    """(datasources, dashboards) of the provisioning directory."""
    root = Path(cfg["paths"]["provisioning"])
    datasources, dashboards = [], []
    for path in sorted([*root.glob("datasources/*.yml"), *root.glob("datasources/*.yaml")]):
        datasources += _read_yaml_json(path).get("datasources") or []
    for path in sorted([*root.glob("dashboards/*.yml"), *root.glob("dashboards/*.yaml")]):
        for provider in _read_yaml_json(path).get("providers") or []:
            folder = provider.get("folder", "")
            for file in sorted(Path(provider["options"]["path"]).glob("*.json")):
                data = json.loads(file.read_text())
                dashboards.append({"uid": data.get("uid"), "title": data.get("title"), "folderTitle": folder,
                                   "panels": len(data.get("panels", []))})
    return datasources, dashboards


def datasource_answer(number: int, entry: dict) -> dict:
    """One provisioned datasource as /api/datasources lists it, from the keys Grafana's provisioning reads
    (upsertDataSourceFromConfigV1's yaml keys; tests/unit/test_grafana_provisioning_upstream.py holds them to it).
    Provisioned datasources are read-only unless ``editable`` (createInsertCommand: ReadOnly = !Editable)."""
    return {"id": number, "uid": entry.get("uid"), "name": entry.get("name"), "type": entry.get("type"),
            "url": entry.get("url"), "access": entry.get("access"), "isDefault": entry.get("isDefault", False),
            "readOnly": not entry.get("editable", False)}


class Handler(BaseHTTPRequestHandler):
    cfg: dict = {}

    def log_message(self, *args):
        pass

    def _send(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            login, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        db = open_db(self.cfg)
        try:
            row = db.execute("SELECT password, salt FROM user WHERE login = ?", (login,)).fetchone()
        finally:
            db.close()
        return row is not None and hmac.compare_digest(row[0], _hash(password, row[1]))

    def do_GET(self):  # (http.server's name)
        path = self.path.split("?", 1)[0]
        if path == "/api/health":
            self._send(200, {"database": "ok", "version": VERSION, "commit": "gpufleet-sim"})
            return
        if path not in ("/api/datasources", "/api/search"):
            self._send(404, {"message": "Not found"})
            return
        if not self._authorized():
            self._send(401, {"message": "Unauthorized"})
            return
        datasources, dashboards = provisioned(self.cfg)
        if path == "/api/datasources":
            self._send(200, [datasource_answer(i + 1, entry) for i, entry in enumerate(datasources)])
        else:
            self._send(200, [{"id": i + 1, "uid": d["uid"], "title": d["title"], "type": "dash-db",
                              "folderTitle": d["folderTitle"], "tags": []} for i, d in enumerate(dashboards)])


def _notify_ready() -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"READY=1", address)


def _options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """``--name=value`` / ``--name value`` options and the other arguments, as Grafana's urfave/cli takes them."""
    options, rest, i = {}, [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and arg != "--password-from-stdin":
            name, eq, value = arg[2:].partition("=")
            if not eq:
                i += 1
                value = args[i] if i < len(args) else ""
            options[name] = value
        else:
            rest.append(arg)
        i += 1
    return options, rest


def server(args: list[str]) -> int:
    options, rest = _options(args)
    homepath = options.get("homepath") or os.getcwd()
    cfg = load_config(options.get("config"), homepath, rest)
    open_db(cfg).close()
    if options.get("pidfile"):
        Path(options["pidfile"]).write_text(f"{os.getpid()}\n")
    Handler.cfg = cfg
    httpd = ThreadingHTTPServer((cfg["server"]["http_addr"], int(cfg["server"]["http_port"])), Handler)
    print(f"HTTP Server Listen address={cfg['server']['http_addr']}:{cfg['server']['http_port']}", flush=True)
    _notify_ready()
    httpd.serve_forever()
    return 0


def cli(args: list[str]) -> int:
    options, rest = _options(args)
    if rest[:2] != ["admin", "reset-admin-password"]:
        print(f"unsupported command: {' '.join(rest)}", file=sys.stderr)
        return 1
    if "--password-from-stdin" in args:
        print("New Password: ", end="")
        # the first line without its ending, as Go's bufio.Scanner reads it (ScanLines drops "\n" and a "\r")
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    else:
        password = rest[2] if len(rest) > 2 else ""
    if len(password) < 4:
        print("Error: new password is too short", file=sys.stderr)
        return 1
    homepath = options.get("homepath") or os.getcwd()
    overrides = options.get("configOverrides", "").split()
    cfg = load_config(options.get("config"), homepath, overrides)
    db = open_db(cfg)
    salt = db.execute("SELECT salt FROM user WHERE id = 1").fetchone()[0]
    db.execute("UPDATE user SET password = ? WHERE id = 1", (_hash(password, salt),))
    db.commit()
    db.close()
    print("\nAdmin password changed successfully ✔")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "server":
        return server(argv[1:])
    if argv and argv[0] == "cli":
        return cli(argv[1:])
    print("usage: grafana server|cli ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
