"""Run a pyinfra operation's body against given facts and collect the commands it yields.

    commands, noops = run_operation(power.limits, facts={GpuInventory: {...}}, limits={...})

Facts are keyed by fact class, or by ``(fact class, frozenset(kwargs.items()))`` for facts taking
arguments (e.g. ``(File, frozenset({"path": "/etc/nccl.conf"}.items()))``); a fact that is not given is
an error, so a test states every fact the operation reads.

Also: builders of the gpufleet facts operations read (``gpu_inventory``, ``managed_state``), and the output
of a fact's command for its ``process()`` (``fixture``, ``wrap``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pyinfra.api import Config, FunctionCommand, State, StringCommand
from pyinfra.api.command import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state

from gpufleet.facts.files import ManagedState
from gpufleet.facts.systemd import UnitStates


class MissingFact(LookupError):
    pass


class FakeHost:
    def __init__(self, name: str, facts: dict, data: dict | None = None):
        self.name = name
        self.facts = facts
        self.data = type("Data", (), dict(data or {}))()
        self.noops: list[str] = []
        self.fact_calls: list = []
        self.current_op_global_arguments: dict = {}

    def get_fact(self, fact_cls, *args, **kwargs) -> Any:
        key = (fact_cls, frozenset(kwargs.items())) if kwargs else fact_cls
        self.fact_calls.append(key)
        if key in self.facts:
            return self.facts[key]
        if kwargs and fact_cls in self.facts and callable(self.facts[fact_cls]):
            return self.facts[fact_cls](**kwargs)
        raise MissingFact(f"test gives no fact {fact_cls.__name__} {kwargs or ''}")

    def get_temp_filename(self, hash_key: str | None = None, **_kwargs) -> str:
        return f"/tmp/pyinfra-{abs(hash(hash_key)) % 10**8}"

    def noop(self, description: str) -> None:
        self.noops.append(description)


def render(command) -> str:
    if isinstance(command, str):
        return command
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        src = command.src
        content = src.getvalue() if hasattr(src, "getvalue") else str(src)
        return f"upload {command.dest}\n{content}"
    if isinstance(command, FunctionCommand):
        return f"function {command.function.__name__}"
    return repr(command)


def run_operation(operation, facts: dict, data: dict | None = None, **kwargs) -> tuple[list[str], list[str]]:
    """Without a ``UnitStates`` fact, units are answered by the ``ManagedState`` fact's builder
    (``managed_state(units=...)``), which states a test's files and units in one place."""
    if UnitStates not in facts and callable(facts.get(ManagedState)):
        facts = {**facts, UnitStates: lambda units: facts[ManagedState](units=units)["units"]}
    host = FakeHost("testhost", facts, data)
    state = State()
    state.config = Config()
    with ctx_state.use(state), ctx_host.use(host):
        commands = [render(c) for c in operation._inner(**kwargs)]
    return commands, host.noops


# ------------------------------------------------------------------------------------------------ fact values


def gpu_inventory(gpus: list[dict], status: str = "ok", error: str | None = None, lost: tuple | list = ()) -> dict:
    """A GpuInventory fact of a host with driver 580.95.05 and ``gpus``."""
    return {"status": status, "error": error, "exit_code": 0, "driver_version": "580.95.05", "lost_gpus": list(lost),
            "gpus": list(gpus)}


def managed_state(files: dict | None = None, units: dict | None = None, executables: tuple = (),
                  contents: dict | None = None):
    """A ManagedState fact: ``files`` {path: text} are regular files of root, mode 755 for the paths in
    ``executables``, else 644; ``contents`` {path: text}: more that reads return (without a file entry); called
    with ``units`` it answers their ``UnitStates`` (``run_operation`` asks it so): ``units`` {unit: overrides} of a
    loaded, disabled, inactive unit."""
    files = files or {}
    unit_states = units or {}
    readable = {**files, **(contents or {})}

    def fact(paths=(), read=(), units=()):
        def entry(path):
            if files.get(path) is None:
                return None
            mode = "755" if path in executables else "644"
            return {"type": "file", "mode": mode, "user": "root", "group": "root", "target": None,
                    "sha1": hashlib.sha1(files[path].encode()).hexdigest()}

        return {
            "files": {p: entry(p) for p in paths},
            "contents": {p: readable.get(p) for p in read},
            "units": {u: {"load_state": "loaded", "active_state": "inactive", "sub_state": "dead",
                          "unit_file_state": "disabled", "need_daemon_reload": False, **unit_states.get(u, {})}
                      for u in units},
        }

    return fact


# ------------------------------------------------------------------------------------------------ fact output

FACT_FIXTURES = Path(__file__).parents[1] / "fixtures" / "facts"


def fixture(name: str) -> str:
    """A captured command output from tests/fixtures/facts."""
    return (FACT_FIXTURES / name).read_text(encoding="utf-8")


def wrap(name: str, text: str | None, rc: int = 0) -> list[str]:
    """The output a section of a fact command produces (see gpufleet/facts/sections.py); None: absent."""
    if text is None:
        return [f"@@gpufleet absent {name}"]
    return [f"@@gpufleet begin {name}", *text.splitlines(), f"@@gpufleet end {name} rc={rc}"]
