"""gpufleet._pyinfra._memo: the fact memo and prefetch, on a real pyinfra State whose hosts run a fake connector.

Each fake host holds a ``value``; ``read value`` (a fact) prints it, ``write N`` (an operation's command) sets it.
No test sleeps to order events: a command named in the connector's ``gates`` announces that it started
(``started[command]``) and waits until the test opens its gate, and tests join the memo's greenlets.
"""

from __future__ import annotations

import inspect
import json
import re
import shlex
import socket
import subprocess
import typing
from collections import defaultdict

import gevent
import pytest
from gevent.event import Event
from pyinfra.api import Config, FactBase, Inventory, State, StringCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import StateStage
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

from gpufleet._pyinfra import _connector, _guard
from gpufleet._pyinfra import _memo as prefetch


class FakeConnector(BaseConnector):
    handles_execution = True

    def __init__(self, state, host):
        super().__init__(state, host)
        self.value = 0
        self.log: list[str] = []  # commands run, in order
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail: set[str] = set()  # commands that exit non-zero
        self.raise_on: set[str] = set()  # commands whose channel breaks (OSError)
        self.overlaps = 0  # writes started while something else ran
        self.gates: dict[str, Event] = {}  # commands that wait for the test to open their gate
        self.started: defaultdict[str, Event] = defaultdict(Event)

    @staticmethod
    def make_names_data(name):
        yield name, {}, []

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        text = command.get_raw_value() if isinstance(command, StringCommand) else str(command)
        self.log.append(text)
        if text.startswith("_gf_dir=$(mktemp -d)"):  # a read-ahead (its script is run by a real sh in another test)
            return True, CommandOutput([OutputLine("stdout", line) for line in self.read_ahead(text)])
        if text.startswith("write ") and self.in_flight:
            self.overlaps += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started[text].set()
        try:
            if text in self.gates:
                self.gates[text].wait()
        finally:
            self.in_flight -= 1
        if text in self.raise_on:
            raise OSError("channel closed")
        if text.startswith("write "):
            self.value = int(text.split()[1])
            return True, CommandOutput([])
        lines = {"read value": [str(self.value)], "read name": [self.host.name], "read bad": ["x"]}.get(text, [])
        return text not in self.fail, CommandOutput([OutputLine("stdout", line) for line in lines])

    def read_ahead(self, script: str) -> list[str]:
        """What prefetch.read_ahead_script prints, each command answered as if run alone."""
        commands = [shlex.split(line)[2] for line in script.splitlines() if re.match(r"^r \d+ ", line)]
        out = []
        for index, command in enumerate(commands):
            ok, output = self.answer(command)
            out += [f"{prefetch.BATCH_MARK} {index} rc={0 if ok else 1}", *output.stdout_lines,
                    f"{prefetch.BATCH_MARK} {index} stderr", *output.stderr_lines]
        return out

    def answer(self, text: str):
        lines = {"read value": [str(self.value)], "read name": [self.host.name], "read bad": ["x"]}.get(text, [])
        stderr = ["no such thing"] if text in self.fail else []
        return text not in self.fail, CommandOutput([OutputLine("stdout", line) for line in lines]
                                                    + [OutputLine("stderr", line) for line in stderr])

    def put_file(self, *args, **kwargs):
        self.value = -1
        return True

    def get_file(self, *args, **kwargs):
        return True


class Value(FactBase):
    def command(self):
        return "read value"

    def process(self, output):
        return int(output[0])


class Name(FactBase):
    def command(self):
        return "read name"


class Word(FactBase):
    def command(self, word):
        return f"read {word}"


class Bad(FactBase):
    """Output the parser rejects with a plain exception (a bug, not a FactProcessError)."""

    def command(self):
        return "read bad"

    def process(self, output):
        return int(output[0])


@pytest.fixture(autouse=True)
def test_facts_may_be_remembered(monkeypatch):
    """This module's fact classes may be named in the cache, as gpufleet's and the allowed pyinfra facts are."""
    monkeypatch.setattr(prefetch, "PYINFRA_FACTS", prefetch.PYINFRA_FACTS | {
        f"{cls.__module__}.{cls.__qualname__}" for cls in (Value, Name, Word, Bad)})


@pytest.fixture
def state():
    inventory = Inventory((["h1", "h2", "h3"], {}))
    for host in inventory:
        host.connector_cls = FakeConnector
    state = State(inventory, Config())
    for host in inventory:
        host.connected = True
        state.activate_host(host)
    state.set_stage(StateStage.Prepare)
    return state


def hosts(state):
    return [state.inventory.get_host(name) for name in ("h1", "h2", "h3")]


def log(host) -> list[str]:
    return host.connector.log


def gate(host, *commands: str) -> Event:
    """Hold ``commands`` on ``host`` until the returned event is set."""
    event = Event()
    for command in commands:
        host.connector.gates[command] = event
    return event


def write(host, value: int):
    """An operation's command (not a fact read)."""
    return host.run_shell_command(StringCommand(f"write {value}"), print_output=False, print_input=False)


def test_repeated_reads_while_preparing_cost_one_command(state):
    h1, _, _ = hosts(state)
    prefetch.install(state)
    assert [h1.get_fact(Value) for _ in range(5)] == [0] * 5
    assert log(h1) == ["read value"]


def test_without_install_every_read_is_a_command(state):
    h1, _, _ = hosts(state)
    h1.get_fact(Value)
    h1.get_fact(Value)
    assert log(h1) == ["read value", "read value"]


def test_install_is_per_state_and_idempotent(state):
    other = State(Inventory((["x"], {})), Config())
    assert prefetch.install(state) is prefetch.install(state)
    assert "get_fact" in vars(hosts(state)[0])
    assert "get_fact" not in vars(other.inventory.get_host("x"))


def test_switching_to_execute_forgets_what_was_read_while_preparing(state):
    h1, _, _ = hosts(state)
    prefetch.install(state)
    h1.get_fact(Value)
    h1.connector.value = 7  # e.g. changed by someone while pyinfra asked for confirmation
    state.set_stage(StateStage.Execute)
    assert h1.get_fact(Value) == 7
    assert log(h1) == ["read value", "read value"]


def test_with_yes_what_was_read_while_preparing_is_kept_into_execution(state):
    h1, _, _ = hosts(state)
    state.check_for_changes = False  # pyinfra -y: execution follows preparation at once
    prefetch.install(state)
    h1.get_fact(Value)
    state.set_stage(StateStage.Execute)
    h1.get_fact(Value)
    assert log(h1) == ["read value"]


def test_a_command_makes_later_reads_fresh(state):
    h1, h2, _ = hosts(state)
    prefetch.install(state)
    state.set_stage(StateStage.Execute)
    assert h1.get_fact(Value) == 0
    assert h2.get_fact(Value) == 0
    write(h1, 5)
    assert h1.get_fact(Value) == 5  # read again, after the command
    assert h1.get_fact(Value) == 5  # shared until the next command
    assert h2.get_fact(Value) == 0  # other hosts keep theirs
    assert log(h1) == ["read value", "write 5", "read value"]
    assert log(h2) == ["read value"]


@pytest.mark.parametrize("change", [
    lambda host: host.put_file("local", "/remote"),
    lambda host: host.get_file("/remote", "local"),
    lambda host: host.disconnect(),
    lambda host: prefetch.invalidate(host.state, host),
])
def test_uploads_downloads_disconnects_and_invalidate_make_reads_fresh(state, change):
    h1, _, _ = hosts(state)
    prefetch.install(state)
    h1.get_fact(Value)
    change(h1)
    h1.get_fact(Value)
    assert log(h1).count("read value") == 2


def test_a_read_overlapping_a_command_is_not_kept(state):
    h1, _, _ = hosts(state)
    prefetch.install(state)
    state.set_stage(StateStage.Execute)
    opened = gate(h1, "read value")
    reader = gevent.spawn(h1.get_fact, Value)
    h1.connector.started["read value"].wait()  # the read is in flight
    del h1.connector.gates["read value"]
    write(h1, 3)
    opened.set()
    reader.get()
    assert h1.get_fact(Value) == 3
    assert log(h1) == ["read value", "write 3", "read value"]


def test_other_arguments_are_another_read(state):
    h1, _, _ = hosts(state)
    prefetch.install(state)
    h1.get_fact(Value)
    h1.get_fact(Value, _sudo=True)
    h1.get_fact(Value, _sudo=True)
    assert log(h1) == ["read value", "read value"]


def test_printing_fact_output_bypasses_the_memo(state):
    h1, _, _ = hosts(state)
    prefetch.install(state)
    state.print_fact_output = True
    h1.get_fact(Value)
    h1.get_fact(Value)
    assert log(h1) == ["read value", "read value"]


def test_prefetch_reads_every_host_concurrently_and_the_deploy_reuses_it(state):
    words = [(Word, (word,), {}) for word in "abc"]
    gates = {host: (gate(host, "read value"), gate(host, "read a", "read b", "read c")) for host in hosts(state)}
    greenlets = prefetch.install(state).prefetch(hosts(state), [(Value, (), {}), *words])
    for host in gates:  # every host: "read value" alone
        host.connector.started["read value"].wait()
        assert host.connector.in_flight == 1
    for first, _ in gates.values():
        first.set()
    for host, (_, others) in gates.items():  # then the three others at once
        for word in "abc":
            host.connector.started[f"read {word}"].wait()
        assert host.connector.in_flight == 3
        others.set()
    gevent.joinall(greenlets, raise_error=True)
    for host in hosts(state):
        assert host.get_fact(Value) == 0
        for word in "abc":
            host.get_fact(Word, word)
        assert log(host) == ["read value", "read a", "read b", "read c"]


def test_a_host_whose_first_read_fails_is_not_prefetched_further(state):
    h1, _, _ = hosts(state)
    h1.connector.fail.add("read value")
    for greenlet in prefetch.install(state).prefetch([h1], [(Value, (), {}), (Name, (), {})]):
        greenlet.get()
    assert log(h1) == ["read value"]


def test_a_read_in_flight_is_awaited_not_repeated(state):
    h1, _, _ = hosts(state)
    opened = gate(h1, "read value")
    memo = prefetch.install(state)
    memo.prefetch([h1], [(Value, (), {})])
    h1.connector.started["read value"].wait()
    reader = gevent.spawn(h1.get_fact, Value)
    gevent.joinall([reader], timeout=0)  # the deploy's read is waiting for the prefetch, not running its own
    assert not reader.ready() and log(h1) == ["read value"]
    opened.set()
    assert reader.get() == 0
    assert log(h1) == ["read value"]


def test_a_command_waits_for_running_prefetches_and_drops_the_others(state):
    h1, _, _ = hosts(state)
    state.set_stage(StateStage.Execute)
    words = "abcdef"
    opened = gate(h1, *(f"read {w}" for w in words[1:]))
    greenlets = prefetch.install(state).prefetch([h1], [(Word, (word,), {}) for word in words])
    for word in words[1:5]:  # "read a" done; b-e running (PER_HOST_CHANNELS), f waits for a channel
        h1.connector.started[f"read {word}"].wait()
    assert h1.connector.in_flight == prefetch.PER_HOST_CHANNELS == 4
    writer = gevent.spawn(write, h1, 1)
    gevent.joinall([writer], timeout=0)  # the writer runs until it waits for the prefetches
    assert not writer.ready() and "write 1" not in log(h1)
    opened.set()
    writer.get()
    gevent.joinall(greenlets, raise_error=True)
    assert h1.connector.overlaps == 0
    assert log(h1) == [f"read {w}" for w in words[:5]] + ["write 1"]
    h1.get_fact(Word, "a")
    assert log(h1)[-1] == "read a"  # read before the write: read again


def test_prefetch_does_not_connect_nor_read_inactive_hosts(state):
    h1, h2, _ = hosts(state)
    h1.connected = False
    state.fail_hosts({h2})
    for greenlet in prefetch.install(state, [Value]).prefetch([h1, h2], [(Value, (), {})]):
        greenlet.get()
    assert log(h1) == log(h2) == []


def test_a_failed_prefetch_fails_the_host_only_when_the_deploy_reads_it(state):
    h1, _, _ = hosts(state)
    h1.connector.fail.add("read value")
    for greenlet in prefetch.install(state).prefetch([h1], [(Value, (), {})]):
        greenlet.get()
    assert h1 not in state.failed_hosts
    assert h1.get_fact(Value) is None  # pyinfra's default for a fact that could not be read
    assert h1 in state.failed_hosts
    assert log(h1) == ["read value", "read value"]  # a failure is never reused


def test_a_broken_channel_during_prefetch_surfaces_at_the_deploys_read(state, caplog):
    h1, _, _ = hosts(state)
    h1.connector.raise_on.add("read value")
    for greenlet in prefetch.install(state).prefetch([h1], [(Value, (), {})]):
        greenlet.get()
    assert h1 not in state.failed_hosts
    assert "channel closed" not in caplog.text
    h1.get_fact(Value)
    assert "channel closed" in caplog.text
    assert h1 in state.failed_hosts


def test_a_parser_error_is_raised_where_the_deploy_reads_the_fact(state):
    h1, _, _ = hosts(state)
    for greenlet in prefetch.install(state).prefetch([h1], [(Bad, (), {})]):
        greenlet.get()  # stored, not parsed
    with pytest.raises(ValueError):
        h1.get_fact(Bad)
    assert log(h1) == ["read bad"]


def test_last_host_failing_still_raises_as_without_prefetch(state):
    h1, h2, h3 = hosts(state)
    state.fail_hosts({h2, h3})
    h1.connector.fail.add("read value")
    gevent.joinall(prefetch.install(state, [Value]).greenlets, raise_error=True)
    with pytest.raises(PyinfraError, match="No hosts remaining"):
        h1.get_fact(Value)


def test_reads_of_operations_prepared_with_change_detection_are_prefetched_when_execution_starts(state):
    h1, h2, _ = hosts(state)
    prefetch.install(state)
    h1.in_op = True  # an operation's body, run by pyinfra to detect changes
    h1.get_fact(Value)
    h1.in_op = False
    h1.get_fact(Name)  # deploy code, not an operation: not replayed
    state.set_stage(StateStage.Execute)
    h2.get_fact(Name)  # any read notices the new stage
    gevent.joinall(prefetch.install(state).greenlets, raise_error=True)
    assert log(h1) == ["read value", "read name", "read value"]
    assert h1.get_fact(Value) == 0
    assert log(h1)[-1] == "read value" and len(log(h1)) == 3


def test_nodelay_is_set_on_an_ssh_transport():
    server = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(server.getsockname())
    try:
        transport = type("Transport", (), {"sock": sock})()
        client = type("Client", (), {"get_transport": lambda self: transport})()
        _connector.set_nodelay(type("Connector", (), {"client": client})())
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        _connector.set_nodelay(object())  # not SSH: nothing to do
    finally:
        sock.close()
        server.close()


def test_the_deploy_prefetches_exactly_what_preflight_reads():
    from gpufleet import preflight
    from gpufleet.deploys.gpu_node import PREFLIGHT_FACTS

    class Recorder:
        def __init__(self):
            self.calls = []

        def get_fact(self, cls, *args, **kwargs):
            self.calls.append((cls, args, kwargs))
            return cls.default()

    recorder = Recorder()
    preflight.gather_facts(recorder)
    assert recorder.calls == [(cls, (), {}) for cls in PREFLIGHT_FACTS]


def test_an_unsupported_pyinfra_gets_plain_fact_reads(state, monkeypatch, caplog):
    h1, _, _ = hosts(state)
    monkeypatch.setattr(_guard, "pyinfra_version", lambda: "3.11.0")
    monkeypatch.setattr(_guard, "_said", set())
    assert prefetch.supported() == "pyinfra 3.11.0 is not a version CI ran (3.10.x)"
    assert prefetch.install(state, [Value]) is None
    assert prefetch.install(state, [Value]) is None
    said = [r.getMessage() for r in caplog.records if "plain path" in r.getMessage()]
    assert said == ["gpufleet: plain path (pyinfra 3.11.0 is not a version CI ran (3.10.x)): every fact read is a "
                    "remote command"]  # one line
    h1.get_fact(Value)
    h1.get_fact(Value)
    prefetch.invalidate(state, h1)  # nothing to forget: no error
    assert log(h1) == ["read value", "read value"] and "get_fact" not in vars(h1)


def test_the_memo_can_be_switched_off(state, monkeypatch):
    monkeypatch.setenv("GPUFLEET_FACT_MEMO", "off")
    assert prefetch.supported() == "GPUFLEET_FACT_MEMO is off"
    assert prefetch.install(state) is None


def test_the_installed_pyinfra_is_supported():
    assert prefetch.supported() is None


# ------------------------------------------------------------------------------------------------ read-ahead


def test_the_read_ahead_script_gives_each_command_its_own_output_and_status():
    commands = ["printf 'a\\nb'", "echo out; echo err >&2", "exit 3", "cat; echo stdin-empty", "echo '@@x'",
                "echo \"$# ${1:-none}\"; d=x; cd /; set -e; false; echo not-reached",  # its own shell state
                "echo \"still $# ${d:-unset} $(pwd)\"", "if then", "for"]
    script = prefetch.read_ahead_script(commands)
    run = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=True, cwd="/tmp")
    output = CommandOutput([OutputLine("stdout", line) for line in run.stdout.splitlines()])
    results = prefetch.split_read_ahead(output, len(commands))
    assert [(ok, out.stdout_lines, out.stderr_lines) for ok, out in (results[i] for i in range(7))] == [
        (True, ["a", "b"], []),
        (True, ["out"], ["err"]),
        (False, [], []),
        (True, ["stdin-empty"], []),
        (True, ["@@x"], []),
        (False, ["0 none"], []),
        (True, ["still 0 unset /tmp"], []),
    ]
    assert [results[i][0] for i in (7, 8)] == [False, False]  # a syntax error fails that read only
    assert prefetch.split_read_ahead(output, len(commands) + 1) == {}  # not the expected shape: nothing is kept
    assert prefetch.split_read_ahead(CommandOutput([OutputLine("stdout", "stray")]), 1) == {}


def test_read_ahead_is_one_command_per_host_and_serves_the_deploys_reads(state):
    memo = prefetch.install(state)
    gevent.joinall(memo.read_ahead(hosts(state), [(Value, (), {}), (Name, (), {})]), raise_error=True)
    for host in hosts(state):
        assert host.get_fact(Value) == 0 and host.get_fact(Name) == host.name
        assert len(log(host)) == 1 and log(host)[0].startswith("_gf_dir=$(mktemp -d)")
        write(host, 5)
        assert host.get_fact(Value) == 5  # a change: read again
        assert log(host)[-1] == "read value"


def test_a_read_that_failed_in_the_read_ahead_is_made_again_by_the_deploy(state):
    h1, _, _ = hosts(state)
    h1.connector.fail.add("read value")
    memo = prefetch.install(state)
    gevent.joinall(memo.read_ahead([h1], [(Name, (), {}), (Value, (), {})]), raise_error=True)
    assert h1.get_fact(Name) == "h1"
    assert h1 not in state.failed_hosts
    assert h1.get_fact(Value) is None  # fails where the deploy reads it, as without the read-ahead
    assert h1 in state.failed_hosts
    assert log(h1)[1:] == ["read value"]


def test_the_reads_of_a_run_are_read_ahead_by_the_next_run_on_the_same_host(state, tmp_path):
    h1, h2, _ = hosts(state)
    state.check_for_changes = False
    memo = prefetch.install(state, [Value], cache_dir=tmp_path)
    gevent.joinall(memo.greenlets, raise_error=True)
    state.set_stage(StateStage.Execute)
    h1.get_fact(Word, "x")
    h1.get_fact(Word, "y")
    memo.save(tmp_path)

    inventory = Inventory((["h1", "h2"], {}))
    for host in inventory:
        host.connector_cls = FakeConnector
    state2 = State(inventory, Config())
    for host in state2.inventory:
        host.connected = True
        state2.activate_host(host)
    state2.set_stage(StateStage.Prepare)
    memo2 = prefetch.FactMemo(state2)
    gevent.joinall(memo2.read_ahead(list(state2.inventory), [(Value, (), {})], tmp_path), raise_error=True)
    new_h1, new_h2 = state2.inventory.get_host("h1"), state2.inventory.get_host("h2")
    assert [new_h1.get_fact(Value), new_h1.get_fact(Word, "x"), new_h1.get_fact(Word, "y")] == [0, None, None]
    assert len(log(new_h1)) == 1 and "read x" in log(new_h1)[0] and "read y" in log(new_h1)[0]
    assert "read x" not in log(new_h2)[0]  # remembered per host
    assert all("read value" in line for line in (log(new_h1)[0], log(new_h2)[0]))


def test_a_run_stopped_before_execution_remembers_nothing(state, tmp_path):
    h1, _, _ = hosts(state)
    memo = prefetch.install(state, cache_dir=tmp_path)
    h1.get_fact(Word, "x")
    memo.save(tmp_path)
    assert not (tmp_path / "reads").exists()


def test_reads_with_secrets_are_not_remembered(state, tmp_path):
    h1, _, _ = hosts(state)
    state.check_for_changes = False
    memo = prefetch.install(state, cache_dir=tmp_path)
    state.set_stage(StateStage.Execute)
    h1.get_fact(Word, "x", _sudo=True, _sudo_password="hunter2")
    h1.get_fact(Word, "y", _env={"TOKEN": "s3cret"})
    h1.get_fact(Word, "z")
    memo.save(tmp_path)
    saved = json.loads((tmp_path / "reads" / "h1.json").read_text())
    assert [read["args"] for read in saved] == [["z"]]
    assert "hunter2" not in str(saved) and "s3cret" not in str(saved)


def test_pyinfra_overheads_are_trimmed_without_changing_what_pyinfra_sees(state, tmp_path, monkeypatch):
    """all_global_arguments answers as pyinfra's own (a fresh list each call); pyinfra's operation order from the
    stack of a deploy file it executes is the same, and is found without reading any source, in the run the memo is
    installed on; any other run (another state in pyinfra's context, or none) gets pyinfra's own behaviour."""
    from pyinfra.api import arguments, util
    from pyinfra.context import ctx_state

    expected = list(typing.get_type_hints(arguments.AllArguments).items())
    deploy = tmp_path / "deploy.py"
    deploy.write_text("from pyinfra.api import util\n\ndef op(state):\n    return inner(state)\n\n"
                      "def inner(state):\n    return util.get_operation_order_from_stack(state), "
                      "util.get_caller_frameinfo()\n")
    scope = {"__file__": str(deploy)}
    exec(compile(deploy.read_text(), str(deploy), "exec"), scope)  # as pyinfra_cli.util.exec_file does
    state.current_deploy_filename = str(deploy)
    monkeypatch.setattr(util, "stack", inspect.stack)
    monkeypatch.setattr(util, "getframeinfo", inspect.getframeinfo)
    order, caller = scope["op"](state)
    prefetch.install(state)
    assert arguments.all_global_arguments() == expected
    assert arguments.all_global_arguments() is not arguments.all_global_arguments()
    read = []
    findsource = inspect.findsource
    monkeypatch.setattr(inspect, "findsource", lambda obj: read.append(obj) or findsource(obj))
    with ctx_state.use(state):
        trimmed_order, trimmed_caller = scope["op"](state)
    assert read == []
    with ctx_state.use(State(Inventory((["x"], {})), Config())):  # not a run of the memo: pyinfra's own stack look-up
        assert scope["op"](state)[0] == order
    assert read != []
    monkeypatch.undo()
    assert trimmed_order == order == [4, 7]
    assert (trimmed_caller.filename, trimmed_caller.lineno, trimmed_caller.function) == (
        caller.filename, caller.lineno, caller.function) == (str(deploy), 4, "op")


def test_global_arguments_are_found_in_host_data_as_pyinfra_finds_them(monkeypatch):
    """pop_global_arguments answers the same through the trimmed host-data look-up: arguments set in group, host,
    override, inventory-wide and deploy data, or given to the call, each in pyinfra's order of precedence."""
    import importlib

    from pyinfra.api import arguments

    # pyinfra's own function (an earlier install in this process may have trimmed it), restored after the test
    original = getattr(arguments.pop_global_arguments, "__wrapped__", arguments.pop_global_arguments)
    modules = [importlib.import_module(f"pyinfra.api.{name}") for name in ("arguments", "facts", "operation", "deploy")]
    for module in modules:
        monkeypatch.setattr(module, "pop_global_arguments", original)
    inventory = Inventory(
        (["h1", ("h2", {"_su_user": "ops", "_timeout": 30}), "h3"], {"_shell_executable": "bash"}),
        gpus=(["h1", "h2"], {"_sudo": True, "_retries": 2}),
        big=(["h2"], {"_retries": 3, "_sudo_user": "gpu"}),
    )
    state = State(inventory, Config())
    h1, h2, h3 = (inventory.get_host(name) for name in ("h1", "h2", "h3"))
    h3.data._chdir = "/srv"  # override data
    h2.current_deploy_kwargs = {"_env": {"A": "1"}, "_retries": 5}
    calls = [(h, kwargs) for h in (h1, h2, h3)
             for kwargs in ({}, {"_sudo": False, "path": "/x"}, {"_timeout": 5, "_su_user": "root"})]
    expected = []
    for h, kwargs in calls:
        given = dict(kwargs)
        expected.append((original(state, h, given), given))
    monkeypatch.setitem(prefetch._memos, state, None)  # a run the memo is installed on (the trim is scoped to those)
    prefetch.trim_pyinfra_overhead(state)
    trimmed = arguments.pop_global_arguments
    assert trimmed is not original and all(module.pop_global_arguments is trimmed for module in modules)
    looked_up = []
    getattr_ = type(h1.data).__getattr__
    monkeypatch.setattr(type(h1.data), "__getattr__", lambda data, key: looked_up.append(key) or getattr_(data, key))
    for (h, kwargs), (result, left) in zip(calls, expected, strict=True):
        given = dict(kwargs)
        assert (trimmed(state, h, given), given) == (result, left)
    # only keys some layer holds are looked up in host.data (the ~30 absent ones are answered by the view)
    assert set(looked_up) == {"_sudo", "_sudo_user", "_su_user", "_timeout", "_chdir", "_retries", "_shell_executable"}
    looked_up.clear()
    other = State(Inventory((["x"], {})), Config())  # not a run of the memo: pyinfra's own look-up of every key
    assert trimmed(other, h1, {}) == original(other, h1, {})
    assert len(set(looked_up)) > 20
    assert expected[3][0][0]["_retries"] == 5 and expected[3][0][0]["_sudo_user"] == "gpu"


def _run_reading(tmp_path, *words: str) -> None:
    """One run on a new State of h1: executes, reads ``words`` (Word facts), remembers them in ``tmp_path``."""
    _run_steps(tmp_path, *(f"read {word}" for word in words))


def _run_steps(tmp_path, *steps: str) -> list[str]:
    """One run on a new State of h1 that executes ``steps`` (``read WORD`` a Word fact, ``write N`` a command that
    changes the host, ``get FILE`` a download, ``op NAME`` what follows is operation NAME's, ``op -`` no
    operation's), disconnects and remembers its reads in ``tmp_path`` (as pyinfra's
    CLI ends a run); returns the commands remembered."""
    inventory = Inventory((["h1"], {}))
    for host in inventory:
        host.connector_cls = FakeConnector
    state = State(inventory, Config())
    state.check_for_changes = False
    host = state.inventory.get_host("h1")
    host.connected = True
    state.activate_host(host)
    state.set_stage(StateStage.Prepare)
    memo = prefetch.install(state, cache_dir=tmp_path)
    gevent.joinall(memo.greenlets, raise_error=True)
    state.set_stage(StateStage.Execute)
    for step in steps:
        verb, word = step.split()
        if verb == "read":
            host.get_fact(Word, word)
        elif verb == "get":
            host.get_file(word, "/dev/null")
        elif verb == "op":
            host.in_op, host.current_op_hash = word != "-", None if word == "-" else word
        else:
            host.run_shell_command(StringCommand(step))
    host.disconnect()
    memo.save(tmp_path)
    return [f"read {read['args'][0]}" for read in json.loads((tmp_path / "reads" / "h1.json").read_text())]


def test_reads_made_only_before_the_host_changed_are_not_read_ahead_next_time(tmp_path):
    """A converging run's reads of the host it found (a bare node's) are not read ahead by the next run, which finds
    the host converged; unless the run before needed them too (a converged host's one drifted setting)."""
    assert _run_steps(tmp_path, "read x", "write 1", "read y", "read x") == ["read x", "read y"]  # x: again after
    assert _run_steps(tmp_path, "read a", "read x", "write 2", "read y") == ["read x", "read y"]  # a: before only
    assert _run_steps(tmp_path, "read a", "read x", "get f", "read y") == ["read a", "read x", "read y"]  # no change
    assert _run_steps(tmp_path, "read a", "read x", "write 3", "read y") == ["read a", "read x", "read y"]


def test_reads_an_operation_made_after_its_own_command_are_not_read_ahead_next_time(tmp_path):
    """Only an operation that changes the host reads after its own command (a driver install's package policy once
    the repository is set up): a converged host's next run does not make those reads. Reads an operation made before
    its own command, or after another operation's, are remembered, and so is a read made both ways."""
    assert _run_steps(tmp_path, "op repo", "read a", "write 1", "op driver", "read b", "write 2", "read c",
                      "op power", "read d", "write 3", "read e", "op -", "read f") == [
        "read b", "read d", "read f"]  # a: only before the host first changed; c, e: after their own command
    assert _run_steps(tmp_path, "op repo", "read a", "op driver", "read b", "write 1", "read c", "read b",
                      "op power", "read c") == ["read b", "read c"]  # c: also before power's command


def test_reads_are_written_again_only_when_they_changed(tmp_path, monkeypatch):
    written = []
    write_json = prefetch._write_json
    monkeypatch.setattr(prefetch, "_write_json", lambda path, data: written.append(path) or write_json(path, data))
    _run_reading(tmp_path, "x", "y")
    _run_reading(tmp_path, "x", "y")  # a converged host: the same reads, nothing to write
    assert written == [tmp_path / "reads" / "h1.json"]
    _run_reading(tmp_path, "x", "z")
    assert len(written) == 2
    saved = [read["args"] for read in json.loads((tmp_path / "reads" / "h1.json").read_text())]
    assert ["z"] in saved and ["y"] not in saved


def _seed(tmp_path, reads) -> None:
    (tmp_path / "reads").mkdir(mode=0o700, exist_ok=True)
    path = tmp_path / "reads" / "h1.json"
    path.write_text(json.dumps(reads))
    path.chmod(0o600)


def test_the_cache_holds_fact_names_and_arguments_never_commands(state, tmp_path):
    _run_reading(tmp_path, "x")
    saved = json.loads((tmp_path / "reads" / "h1.json").read_text())
    assert saved == [{"fact": f"{Word.__module__}.Word", "args": ["x"], "kwargs": {}}]
    assert "read x" not in (tmp_path / "reads" / "h1.json").read_text()
    assert (tmp_path.stat().st_mode & 0o777, (tmp_path / "reads").stat().st_mode & 0o777,
            (tmp_path / "reads" / "h1.json").stat().st_mode & 0o777) == (0o700, 0o700, 0o600)


def test_a_command_added_to_the_cache_is_never_run(state, tmp_path):
    """Only entries naming an allowed fact class with plain arguments are read ahead, their command generated by
    the class: a raw command (the old format), a fact that runs its argument, a name outside the allowed modules and
    an argument with shell syntax are all dropped."""
    _seed(tmp_path, [
        {"command": "touch /tmp/pwned", "arguments": {}},
        {"fact": "pyinfra.facts.server.Command", "args": ["touch /tmp/pwned"], "kwargs": {}},
        {"fact": "os.system", "args": ["touch /tmp/pwned"], "kwargs": {}},
        {"fact": f"{Word.__module__}.Word", "args": ["x; touch /tmp/pwned"], "kwargs": {}},
        {"fact": f"{Word.__module__}.Word", "args": ["x"], "kwargs": {"_shell_executable": "sh -c 'touch /tmp/p'"}},
        {"fact": f"{Word.__module__}.Word", "args": ["y"], "kwargs": {}},
    ])
    h1 = state.inventory.get_host("h1")
    memo = prefetch.FactMemo(state)
    gevent.joinall(memo.read_ahead([h1], [(Value, (), {})], tmp_path), raise_error=True)
    assert len(log(h1)) == 1 and "pwned" not in log(h1)[0] and "touch" not in log(h1)[0]
    assert "read y" in log(h1)[0] and "read value" in log(h1)[0]
    assert h1.get_fact(Word, "y") is None and len(log(h1)) == 1  # served by the read-ahead


@pytest.mark.parametrize("target", ["dir", "reads", "file"])
def test_a_cache_others_can_write_is_refused(state, tmp_path, target):
    _seed(tmp_path, [{"fact": f"{Word.__module__}.Word", "args": ["y"], "kwargs": {}}])
    path = {"dir": tmp_path, "reads": tmp_path / "reads", "file": tmp_path / "reads" / "h1.json"}[target]
    path.chmod(0o777 if target != "file" else 0o666)
    with pytest.raises(prefetch.UnsafeCache, match=rf"{re.escape(str(path))}: refused: .*writable by group or "
                                                   rf"others \(mode 0[67][67][67], owner root \(uid 0\)\)"):
        prefetch.install(state, [Value], cache_dir=tmp_path)
    assert all(log(h) == [] for h in hosts(state))  # nothing read, nothing run


def test_a_cache_of_another_user_is_refused(state, tmp_path):
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    _seed(tmp_path, [{"fact": f"{Word.__module__}.Word", "args": ["y"], "kwargs": {}}])
    os.chown(tmp_path / "reads" / "h1.json", 65534, 65534)
    with pytest.raises(prefetch.UnsafeCache, match=r"h1\.json: refused: .*owned by .*uid 65534"):
        prefetch.install(state, [Value], cache_dir=tmp_path)


def test_an_argument_with_a_trailing_line_feed_is_not_plain():
    assert prefetch.fact_call({"fact": f"{Word.__module__}.Word", "args": ["x\n"], "kwargs": {}}) is None
    assert prefetch.fact_entry(Word, ("x\n",), {}) is None
    assert prefetch.fact_call({"fact": f"{Word.__module__}.Word", "args": ["x"], "kwargs": {}}) == (Word, ("x",), {})
