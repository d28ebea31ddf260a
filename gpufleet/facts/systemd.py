"""systemd unit state from ``systemctl show`` (one command per unit): parse, never decide."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from ._sections import parse_sections, section

PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "FragmentPath",
    "DropInPaths",
    "NeedDaemonReload",
    "ExecStart",
)
PERSISTENCED_UNIT = "nvidia-persistenced.service"
_EXEC_RE = re.compile(r"\{\s*path=(?P<path>[^;]*?)\s*;\s*argv\[\]=(?P<argv>.*?)\s*(?:;\s*[a-z_]+=|\})")
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.@\\-]+$")


def parse_exec(value: str) -> list[dict]:
    """``ExecStart={ path=/usr/bin/x ; argv[]=/usr/bin/x --a b ; ignore_errors=no ; … }`` -> [{path, argv}]."""
    commands = []
    for m in _EXEC_RE.finditer(value):
        argv_text = m["argv"].strip()
        try:
            argv = shlex.split(argv_text)
        except ValueError:
            argv = argv_text.split()
        commands.append({"path": m["path"].strip(), "argv": argv})
    return commands


def parse_show(lines: list[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and re.match(r"^[A-Za-z]+$", key):
            props[key] = value
    return props


class SystemdUnit(FactBase):
    """
    State of one systemd unit, as ``systemctl show`` prints it.

    .. code:: python

        host.get_fact(SystemdUnit, unit="nvidia-persistenced.service")
        {
            "systemd": True,                 # False: no systemctl, or systemd is not running (see error)
            "exists": True,                  # LoadState is not "not-found"
            "load_state": "loaded", "active_state": "active", "sub_state": "running",
            "unit_file_state": "enabled",    # enabled | disabled | static | masked | "" …
            "active": True, "enabled": True,
            "fragment_path": "/lib/systemd/system/nvidia-persistenced.service",
            "drop_in_paths": ["/etc/systemd/system/nvidia-persistenced.service.d/override.conf"],
            "need_daemon_reload": False,
            "exec_start": [{"path": "/usr/bin/nvidia-persistenced",
                            "argv": ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced",
                                     "--no-persistence-mode", "--verbose"]}],
            "exec_start_raw": "{ path=/usr/bin/nvidia-persistenced ; argv[]=… }",
            "error": None,
        }
    """

    @staticmethod
    def default():
        return {
            "systemd": False,
            "exists": False,
            "load_state": None,
            "active_state": None,
            "sub_state": None,
            "unit_file_state": None,
            "active": False,
            "enabled": False,
            "fragment_path": None,
            "drop_in_paths": [],
            "need_daemon_reload": False,
            "exec_start": [],
            "exec_start_raw": "",
            "error": "systemctl not found",
        }

    def command(self, unit: str) -> str:
        if not _UNIT_RE.match(unit):
            raise ValueError(f"not a systemd unit name: {unit!r}")
        props = " ".join(f"-p {p}" for p in PROPERTIES)
        return section("show", f"systemctl show --no-pager {props} {shlex.quote(unit)}", requires="systemctl")

    def process(self, output):
        sec = parse_sections(output).get("show")
        result = self.default()
        if sec is None:
            return {**result, "error": "no output from systemctl show"}
        if not sec.present:
            return result
        props = parse_show(sec.lines)
        if sec.rc != 0 or "LoadState" not in props:
            return {**result, "error": sec.text or f"systemctl exited {sec.rc}"}
        load = props.get("LoadState", "")
        unit_file_state = props.get("UnitFileState", "")
        active_state = props.get("ActiveState", "")
        result.update(
            systemd=True,
            exists=load not in ("not-found", ""),
            load_state=load,
            active_state=active_state,
            sub_state=props.get("SubState") or None,
            unit_file_state=unit_file_state,
            active=active_state in ("active", "reloading"),
            enabled=unit_file_state in ("enabled", "enabled-runtime"),
            fragment_path=props.get("FragmentPath") or None,
            drop_in_paths=props.get("DropInPaths", "").split(),
            need_daemon_reload=props.get("NeedDaemonReload") == "yes",
            exec_start=parse_exec(props.get("ExecStart", "")),
            exec_start_raw=props.get("ExecStart", ""),
            error=None,
        )
        return result


class NvidiaPersistenced(SystemdUnit):
    """``SystemdUnit`` of ``nvidia-persistenced.service``, plus the persistence flag its ExecStart passes.

    Extra keys: ``persistence_flag``: ``"--persistence-mode"``, ``"--no-persistence-mode"`` or None (neither:
    the daemon's default). Whether the GPUs really are in persistence mode is ``GpuInventory``'s
    ``persistence_mode``.
    """

    @staticmethod
    def default():
        return {**SystemdUnit.default(), "persistence_flag": None}

    def command(self) -> str:
        return super().command(PERSISTENCED_UNIT)

    def process(self, output):
        result = super().process(output)
        flag = None
        for cmd in result["exec_start"]:
            for arg in cmd["argv"]:
                if arg in ("--persistence-mode", "--no-persistence-mode"):
                    flag = arg
        result["persistence_flag"] = flag
        return result
