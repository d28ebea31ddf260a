"""Run a pyinfra operation's body against given facts and collect the commands it yields.

    commands, noops = run_operation(power.power_limits, facts={GpuInventory: {...}}, limits={...})

Facts are keyed by fact class, or by ``(fact class, frozenset(kwargs.items()))`` for facts taking
arguments (e.g. ``(File, frozenset({"path": "/etc/nccl.conf"}.items()))``); a fact that is not given is
an error, so a test states every fact the operation reads.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import Config, FunctionCommand, State, StringCommand
from pyinfra.api.command import FileUploadCommand
from pyinfra.context import ctx_host, ctx_state


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
    host = FakeHost("testhost", facts, data)
    state = State()
    state.config = Config()
    with ctx_state.use(state), ctx_host.use(host):
        commands = [render(c) for c in operation._inner(**kwargs)]
    return commands, host.noops
