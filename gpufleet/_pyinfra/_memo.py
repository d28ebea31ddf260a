"""Fast fact reads for the gpufleet deploy: one SSH round trip per distinct read, and the reads known in advance
run concurrently.

Why: pyinfra 3 has no fact cache. Every ``host.get_fact`` is a remote command, so a converged node costs ~30
commands per host (GpuInventory alone 5 times: preflight, then the driver, persistence, MIG and power
operations), one after another within a host. And pyinfra's SSH connector leaves Nagle's algorithm on: each
command then waits ~40 ms for the server's delayed ACK, more than the command itself.

What, installed by the gpufleet deploy only (:func:`install`, through :func:`gpufleet._pyinfra.prepare_deploy_run`,
on the hosts of one pyinfra ``State``):

* **TCP_NODELAY** on every SSH connection (also after a reconnect, e.g. a reboot).
* **Memo.** A fact read's output is kept, per host and per exact command (with its sudo/env/... arguments),
  until anything else touches that host: any other command, upload, download, rsync, connect or disconnect
  (:func:`invalidate` does the same explicitly). During PREPARE nothing changes on the hosts, so every read
  stays valid; during EXECUTE a read made after an operation's command sees that command's effect, as without
  the memo, while reads between two commands (the no-op case) are shared. PREPARE's reads are kept into EXECUTE
  only with ``-y`` (pyinfra then executes at once; otherwise it waits for a confirmation, and the hosts may
  change meanwhile). What is kept is the command's output, not the fact: pyinfra parses, logs and fails hosts on
  every read exactly as it would without the memo. Only successful outputs are kept; a failed read or an
  exception is never replayed.
* **Prefetch.** :meth:`FactMemo.prefetch` starts given fact reads on every given host at once: on each host the
  first read alone (a sudo password prompt or askpass upload happens once), then the others on a few concurrent
  SSH channels. :func:`install` prefetches the preflight facts when the first host starts preparing; when
  pyinfra checks for changes (no ``-y``), the reads the operations made while being prepared are prefetched
  again, per host, when execution starts. A prefetch stops as soon as the command's output is stored: nothing is
  parsed, logged or failed until the deploy asks for that fact, and a prefetch that raised or failed is simply
  read again then, so errors surface where and as they would without it. A read that nobody prefetched (a
  host-specific argument) is an ordinary read. A prefetch never overlaps a change: before anything else runs on
  a host, the prefetches running there are awaited and those not started yet are dropped (a GPU reset, say,
  fails while an nvidia-smi query holds the GPU).

* **Read-ahead.** :meth:`FactMemo.read_ahead` (what :func:`install` uses) reads given facts in ONE remote command
  per host (:func:`read_ahead_script`: the first read alone, the lock's, then the others concurrently). Each output
  is stored as its own read would have been; one that failed, or that did not come back, is read again when the
  deploy asks for it.

**pyinfra internals** (docs/design.md, "pyinfra internals: gpufleet/_pyinfra"). The memo sees every command,
upload, download and (re)connect of the state's hosts through gpufleet's connector subclass
(:mod:`gpufleet._pyinfra._connector`, which also sets TCP_NODELAY); what remains a patch, on this state's hosts only,
is an instance attribute in front of ``Host.get_fact`` (the one point where pyinfra knows that a command is a fact
read). It calls ``pyinfra.api.facts.get_fact``, follows ``State.current_stage`` / ``should_check_for_changes()``,
``Host.in_op``. :func:`supported` applies the version guard (:func:`gpufleet._pyinfra.plain_path`: the pyinfra
series CI ran) and checks for each of those names; where it says no (or ``GPUFLEET_FACT_MEMO=off``),
:func:`install` installs nothing, says so in one line, and every fact read is pyinfra's own: slower, same results.
"""

from __future__ import annotations

import shlex
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gevent
from gevent.event import Event
from gevent.lock import BoundedSemaphore
from pyinfra import logger
from pyinfra.api.command import StringCommand

try:  # an internal: where it moved, supported() says so and the memo stays off
    from pyinfra.api.facts import get_fact
except ImportError:  # pragma: no cover - depends on the installed pyinfra
    get_fact = None
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine

from . import _connector
from ._guard import FACT_MEMO, plain_path, pyinfra_version, say_plain_path

PER_HOST_CHANNELS = 4  # concurrent prefetch commands per host (sshd allows 10 sessions per connection)
_ACTIVE_STAGES = (StateStage.Prepare, StateStage.Execute)
FactCall = tuple[type, tuple, dict]  # (fact class, args, kwargs) as given to host.get_fact
BATCH_MARK = "@@gpufleet-read-ahead"  # separates the outputs of one read-ahead command's reads


class _Prefetched(Exception):
    """Ends a prefetch greenlet's ``get_fact`` once the output is stored (or not needed), before pyinfra
    parses, logs or fails anything: that happens when the deploy itself asks for the fact."""

    def __init__(self, ok: bool = False):
        super().__init__()
        self.ok = ok  # the output is stored, or being read


@dataclass(eq=False)
class _Entry:
    epoch: int
    done: Event = field(default_factory=Event)
    result: tuple[bool, CommandOutput] | None = None  # set once read successfully


@dataclass(eq=False)
class _Collected(Exception):
    """Ends a read-ahead greenlet's ``get_fact`` with the command pyinfra would run for it (nothing is run)."""

    def __init__(self, key: tuple | None = None, text: str = "", kwargs: dict | None = None):
        super().__init__()
        self.key, self.text, self.kwargs = key, text, kwargs or {}


@dataclass(eq=False)
class _HostMemo:
    epoch: int = 0  # bumped by anything that may change the host: entries of an older epoch are stale
    entries: dict[tuple, _Entry] = field(default_factory=dict)
    prefetching: set = field(default_factory=set)  # prefetch greenlets running a read on this host
    op_reads: dict[str, FactCall] = field(default_factory=dict)  # reads made by operations while preparing
    channels: BoundedSemaphore = field(default_factory=lambda: BoundedSemaphore(PER_HOST_CHANNELS))


class FactMemo:
    """The memo and prefetcher of one pyinfra ``State`` (see the module docstring)."""

    def __init__(self, state) -> None:
        self.greenlets: list[gevent.Greenlet] = []  # every prefetch started (tests and debugging wait on them)
        self.state = state
        self.stage = state.current_stage
        self.hosts: dict[Any, _HostMemo] = {}
        self._reading: dict[tuple, list[FactCall]] = {}  # (greenlet, host) -> host.get_fact calls in progress
        self._prefetchers: set = set()  # greenlets running a prefetch
        self._collecting: set = set()  # read-ahead greenlets asking pyinfra for a fact's command
        for host in state.inventory:
            self._wrap(host)
        hooks = _connector.adopt(state)
        hooks.io, hooks.nodelay = self, True

    # ---------------------------------------------------------------------------------------- public

    def prefetch(self, hosts: Iterable, calls: Sequence[FactCall]) -> list[gevent.Greenlet]:
        """Start reading ``calls`` on ``hosts`` (active, connected ones) concurrently; return the greenlets."""
        if not self._sync() or not calls:
            return []
        started = [gevent.spawn(self._prefetch_host, host, self._memo(host).epoch, calls) for host in hosts]
        self.greenlets += started
        return started

    def read_ahead(self, hosts: Iterable, calls: Sequence[FactCall]) -> list[gevent.Greenlet]:
        """Read ``calls`` on each of ``hosts`` (active, connected ones) in ONE remote command per host: the first
        of them alone, the others concurrently on the host (:func:`read_ahead_script`).
        Outputs are stored like a prefetch's; a read that failed or did not come back is simply read again
        when the deploy asks for it. Returns the greenlets."""
        if not self._sync():
            return []
        started = []
        for host in hosts:
            if host in self.state.active_hosts and host.connected:
                # claimed before this returns: a deploy that asks for one of these reads right away waits for it
                claimed = self._claim(host, self._plan_reads(host, calls))
                started += [gevent.spawn(self._read_ahead_group, host, self._memo(host).epoch, group)
                            for group in claimed]
        self.greenlets += started
        return started

    def invalidate(self, host) -> None:
        """Forget every read of ``host``: from now on its facts are read again."""
        memo = self._memo(host)
        memo.epoch += 1
        memo.entries.clear()

    # ----------------------------------------------------------------------------------------- hooks

    def _wrap(self, host) -> None:
        """Follow the host's fact reads: ``Host.get_fact`` is the one point where pyinfra knows that a command is a
        fact read (below it, a read and an operation's command are the same ``run_shell_command``), so this
        state's hosts get an instance attribute in front of it (nothing else, no other host). Its commands,
        uploads, downloads and (re)connects reach the memo through gpufleet's connector subclass
        (:mod:`gpufleet._pyinfra._connector`)."""
        self._memo(host)
        original = host.get_fact
        host.get_fact = lambda *args, **kwargs: self._get_fact(host, original, *args, **kwargs)

    # the connector subclass's calls (gpufleet._pyinfra._connector.Hooks.io)

    def command(self, host, base, *args, **kwargs):
        return self._run_shell_command(host, base, *args, **kwargs)

    def connect(self, host, run):
        return self._stale(host, run)

    def touch(self, host, run):
        return self._stale(host, run)

    def change(self, host, run):
        return self._stale(host, run)

    def _plain_run(self, host, *args, **kwargs):
        """A command on ``host`` past the memo (the read-ahead's own command)."""
        connector = host.connector
        return _connector.base_class(connector).run_shell_command(connector, *args, **kwargs)

    def _get_fact(self, host, original, cls, *args, **kwargs):
        if self._sync() and self.stage == StateStage.Prepare and host.in_op:
            self._memo(host).op_reads.setdefault(repr((cls, args, sorted(kwargs.items()))), (cls, args, kwargs))
        key = (gevent.getcurrent(), host)
        self._reading.setdefault(key, []).append((cls, args, dict(kwargs)))
        try:
            return original(cls, *args, **kwargs)
        finally:
            self._reading[key].pop()
            if not self._reading[key]:
                del self._reading[key]

    def _run_shell_command(self, host, original, *args, **kwargs):
        current = gevent.getcurrent()
        if current in self._collecting:  # a read-ahead asking for the command only: nothing runs
            key = _cache_key(args, kwargs)
            raise _Collected(key, _command_text(args[0]) if key is not None else "", _connector_kwargs(kwargs))
        prefetching = current in self._prefetchers
        if not (prefetching or (current, host) in self._reading):
            return self._stale(host, original, *args, **kwargs)  # an operation's command, not a fact read
        key = _cache_key(args, kwargs) if self._sync() else None
        if key is None:
            if prefetching:
                raise _Prefetched()
            return original(*args, **kwargs)
        return self._read(host, key, prefetching, lambda: original(*args, **kwargs))

    def _stale(self, host, original, *args, **kwargs):
        """Anything but a fact read may change the host: what was read before (or during) it is stale."""
        if gevent.getcurrent() in self._prefetchers:
            raise _Prefetched()  # a prefetch never connects, nor does anything else
        self.invalidate(host)  # prefetches not started yet are dropped
        gevent.joinall(list(self._memo(host).prefetching))  # those running finish first
        try:
            return original(*args, **kwargs)
        finally:
            self.invalidate(host)

    # -------------------------------------------------------------------------------------- internals

    def _collect(self, host, call: FactCall) -> _Collected | None:
        """The command (and connector arguments) pyinfra runs for ``call`` on ``host``, without running it."""
        cls, args, kwargs = call
        current = gevent.getcurrent()
        self._collecting.add(current)
        try:
            get_fact(self.state, host, cls, args=args, kwargs=kwargs)
        except _Collected as collected:
            return collected if collected.key is not None else None
        except Exception as error:  # noqa: BLE001 - the deploy's own read meets it again, where it should
            logger.debug(f"{host.name}: no read-ahead of {cls.__name__}: {error!r}")
        finally:
            self._collecting.discard(current)
        return None

    def _plan_reads(self, host, calls: Sequence[FactCall]) -> dict[tuple, tuple[str, dict]]:
        """key -> (command, connector arguments) of ``calls``, each command generated by its fact class."""
        reads: dict[tuple, tuple[str, dict]] = {}
        for call in calls:
            collected = self._collect(host, call)
            if collected is not None:
                reads.setdefault(collected.key, (collected.text, collected.kwargs))
        return reads

    def _claim(self, host, reads: dict[tuple, tuple[str, dict]]) -> list[list[tuple[tuple, str, dict, _Entry]]]:
        """Entries for the reads not read (nor being read) since the host last changed, grouped by connector
        arguments (one remote command each)."""
        memo = self._memo(host)
        groups: dict[str, list] = {}
        for key, (text, kwargs) in reads.items():
            entry = memo.entries.get(key)
            if entry is None or entry.epoch != memo.epoch:
                memo.entries[key] = _Entry(memo.epoch)
                groups.setdefault(key[1], []).append((key, text, kwargs, memo.entries[key]))
        return list(groups.values())

    def _read_ahead_group(self, host, epoch: int, group: list[tuple[tuple, str, dict, _Entry]]) -> None:
        memo = self._memo(host)
        pending = [(key, text, entry) for key, text, _, entry in group]
        if memo.epoch != epoch:  # the host changed before this started: the deploy reads for itself
            for key, _, entry in pending:
                if memo.entries.get(key) is entry:
                    del memo.entries[key]
                entry.done.set()
            return
        kwargs = group[0][2]
        current = gevent.getcurrent()
        self._prefetchers.add(current)
        memo.prefetching.add(current)
        results: dict[int, tuple[bool, CommandOutput]] = {}
        try:
            script = read_ahead_script([text for _, text, _ in pending])
            ok, output = self._plain_run(host, StringCommand(script), print_output=False, print_input=False,
                                               **kwargs)
            results = split_read_ahead(output, len(pending)) if ok else {}
        except Exception as error:  # noqa: BLE001 - each read is made again by the deploy, which meets the error
            logger.debug(f"{host.name}: read-ahead failed: {error!r}")
        finally:
            self._prefetchers.discard(current)
            memo.prefetching.discard(current)
        for index, (key, _, entry) in enumerate(pending):
            result = results.get(index)
            if result is not None and result[0] and entry.epoch == memo.epoch:
                entry.result = result
            elif memo.entries.get(key) is entry:
                del memo.entries[key]  # read by the deploy itself, which meets the error where it should
            entry.done.set()

    def _memo(self, host) -> _HostMemo:
        if host not in self.hosts:
            self.hosts[host] = _HostMemo()
        return self.hosts[host]

    def _sync(self) -> bool:
        """Follow the state's stage (see the module docstring); True while the memo is in use."""
        stage = self.state.current_stage
        if stage != self.stage:
            keep = (self.stage, stage) == (StateStage.Prepare, StateStage.Execute) \
                and not self.state.should_check_for_changes()  # -y: no confirmation in between
            self.stage = stage
            for host in self.hosts if not keep else ():
                self.invalidate(host)
            if stage == StateStage.Execute and not keep:  # with -y, what operations read is still valid
                for host, memo in self.hosts.items():
                    if memo.op_reads:
                        self.prefetch([host], list(memo.op_reads.values()))
        return stage in _ACTIVE_STAGES

    def _read(self, host, key: tuple, prefetching: bool, run: Callable) -> tuple[bool, CommandOutput]:
        memo = self._memo(host)
        entry = memo.entries.get(key)
        if entry is not None and entry.epoch == memo.epoch:
            if prefetching:
                raise _Prefetched(ok=True)  # already read or being read
            entry.done.wait()
            if entry.result is not None and entry.epoch == memo.epoch:
                return _copy(entry.result)
        entry = memo.entries[key] = _Entry(memo.epoch)
        try:
            result = run()
            if result[0] and entry.epoch == memo.epoch:
                entry.result = _copy(result)
        except Exception:
            if prefetching:
                raise _Prefetched() from None  # the deploy's own read meets the error
            raise
        finally:
            if entry.result is None and memo.entries.get(key) is entry:
                del memo.entries[key]  # failed, raised or went stale: the next read goes to the host
            entry.done.set()
        if prefetching:
            raise _Prefetched(ok=entry.result is not None)
        return result

    def _prefetch_host(self, host, epoch: int, calls: Sequence[FactCall]) -> None:
        """The first read runs alone and the others only if it succeeded: a sudo password prompt or askpass
        upload happens once, as without prefetch, and a host that does not answer is not asked again."""
        if self._prefetch_one(host, epoch, calls[0]):
            gevent.joinall([gevent.spawn(self._prefetch_one, host, epoch, call) for call in calls[1:]])

    def _prefetch_one(self, host, epoch: int, call: FactCall) -> bool:
        cls, args, kwargs = call
        memo = self._memo(host)
        with memo.channels:
            if not self._sync() or memo.epoch != epoch or host not in self.state.active_hosts \
                    or not host.connected:
                return False
            current = gevent.getcurrent()
            self._prefetchers.add(current)
            memo.prefetching.add(current)
            try:
                get_fact(self.state, host, cls, args=args, kwargs=kwargs)
            except _Prefetched as done:
                return done.ok
            except Exception as error:  # the deploy's own read of this fact meets it again, where it should
                logger.debug(f"{host.name}: prefetch of {cls.__name__} failed: {error!r}")
            finally:
                self._prefetchers.discard(current)
                memo.prefetching.discard(current)
            return False


def _cache_key(args: tuple, kwargs: dict) -> tuple | None:
    """(command, connector arguments) of a fact read, or None where its output must not be reused."""
    if len(args) != 1 or kwargs.get("print_output") or kwargs.get("print_input") or kwargs.get("_stdin"):
        return None
    command = args[0]
    text = command.get_raw_value() if isinstance(command, StringCommand) else command
    if not isinstance(text, str):
        return None
    return text, repr(sorted((k, v) for k, v in kwargs.items() if k not in ("print_output", "print_input")))


def _command_text(command) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else command


def _connector_kwargs(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k not in ("print_output", "print_input")}


def read_ahead_script(commands: Sequence[str]) -> str:
    """A script running ``commands`` (each in a subshell of its own, no positional parameters, stdin empty; run by
    the shell that runs the script, as pyinfra runs each read): the first alone (the lock is read before
    anything else), then the others concurrently; then, in order, for each: a ``BATCH_MARK i rc=N`` line, its
    stdout, a ``BATCH_MARK i stderr`` line and its stderr (awk's ``getline``: a last line without newline is
    completed, as pyinfra reads it). A subshell, not a new shell per command: that would start a shell program
    per read (~0.7 ms each here, two thirds of the script's own cost). What a subshell shares with the script
    is named ``_gf_*`` (and the function ``r``); ``$$`` is the script's, which no fact's command uses."""
    run = ('r() { _gf_command=$2; (set --; eval "$_gf_command") >"$_gf_dir/$1.o" 2>"$_gf_dir/$1.e" </dev/null; '
           'echo $? >"$_gf_dir/$1.r"; }')
    lines = ["_gf_dir=$(mktemp -d) || exit 1", "trap 'rm -rf \"$_gf_dir\"' EXIT", run,
             f"r 0 {shlex.quote(commands[0])}"]
    lines += [f"r {index} {shlex.quote(command)} &" for index, command in enumerate(commands[1:], 1)]
    # one awk prints every output (a process per command would cost the host more than the commands themselves)
    show = (f'BEGIN {{ for (i = 0; i < {len(commands)}; i++) {{ rc = ""; f = d "/" i ".r"; getline rc < f; close(f); '
            f'print "{BATCH_MARK} " i " rc=" rc; f = d "/" i ".o"; while ((getline line < f) > 0) print line; '
            f'close(f); print "{BATCH_MARK} " i " stderr"; f = d "/" i ".e"; '
            'while ((getline line < f) > 0) print line; close(f) } }')
    lines += ["wait", f'awk -v d="$_gf_dir" {shlex.quote(show)}']
    return "\n".join(lines)


def split_read_ahead(output: CommandOutput, count: int) -> dict[int, tuple[bool, CommandOutput]]:
    """{index: (exit status 0, output)} of :func:`read_ahead_script`'s ``count`` commands; {} if the output
    does not have that shape (nothing is kept then)."""
    results: dict[int, tuple[bool, CommandOutput]] = {}
    index, rc, stream, lines = -1, None, "stdout", []

    def close():
        if index >= 0:
            results[index] = (rc == 0, CommandOutput(lines))

    for line in output.stdout_lines:
        if line.startswith(f"{BATCH_MARK} "):
            head = line[len(BATCH_MARK) + 1:].split(" ", 1)
            if len(head) == 2 and head[1] == "stderr" and head[0] == str(index):
                stream = "stderr"
                continue
            if len(head) == 2 and head[0] == str(index + 1) and head[1].startswith("rc="):
                close()
                index, stream, lines = index + 1, "stdout", []
                rc = int(head[1][3:]) if head[1][3:].isdigit() else None
                continue
            return {}
        if index < 0:
            return {}
        lines.append(OutputLine(stream, line))
    close()
    return results if len(results) == count else {}


def _copy(result: tuple[bool, CommandOutput]) -> tuple[bool, CommandOutput]:
    return result[0], CommandOutput(list(result[1].combined_lines))


_memos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def supported(version: str | None = None) -> str | None:
    """Why the memo cannot be used with this pyinfra (``version``: the installed one), or None when it can: the
    version guard (:func:`gpufleet._pyinfra.plain_path`), then the pyinfra names the memo relies on."""
    reason = plain_path(FACT_MEMO, version)
    if reason is not None:
        return reason
    from pyinfra.api import host, state

    needed = {"pyinfra.api.facts.get_fact": get_fact is not None,
              "Host.in_op": hasattr(host.Host, "in_op"),
              "Host.current_op_hash": hasattr(host.Host, "current_op_hash"),
              "State.should_check_for_changes": hasattr(state.State, "should_check_for_changes"),
              "Host.get_fact": hasattr(host.Host, "get_fact")}
    missing = [name for name, present in needed.items() if not present]
    return f"pyinfra {version or pyinfra_version()} lacks {', '.join(missing)}" if missing else None


def install(state, facts: Sequence[type] = ()) -> FactMemo | None:
    """Install the memo on ``state``'s hosts (once per state; pass the real ``State``, e.g. ``host.state``);
    the first call also sets TCP_NODELAY and reads ahead ``facts`` (no arguments, in this order) on every active
    host, in one remote command per host (:meth:`FactMemo.read_ahead`).

    Returns None, and installs nothing, where :func:`supported` says no: fact reads are then pyinfra's own."""
    memo = _memos.get(state)
    if memo is None:
        reason = supported()
        if reason is not None:
            say_plain_path(FACT_MEMO, reason)
            return None
        memo = _memos[state] = FactMemo(state)
        for host in state.inventory:
            if host.connected:
                _connector.set_nodelay(host.connector)
        memo.read_ahead(state.inventory.get_active_hosts(), [(cls, (), {}) for cls in facts])
        gevent.sleep(0)  # the read-ahead's requests leave now, not once the deploy has validated its inputs
    return memo


def invalidate(state, host) -> None:
    """Forget ``host``'s reads (where the memo is installed): the facts read next are fresh. ``host`` may be
    pyinfra's context ``host``."""
    memo = _memos.get(state)
    if memo is not None:
        memo.invalidate(state.inventory.get_host(host.name))


def refresh(state, hosts) -> None:
    """Forget ``hosts``' reads and read again now, in one remote command per host, what their operations read while
    being prepared (where the memo is installed; ``hosts`` active and connected). For a run that executes its
    prepared hosts in turns, long after preparing them (``gpufleet rollout --drain none`` executes its waves from
    one plan): each turn's operations then decide on what their hosts say at that time, at the cost of one round
    trip per host."""
    memo = _memos.get(state)
    if memo is None:
        return
    for host in hosts:
        memo.invalidate(host)
        memo.read_ahead([host], list(memo._memo(host).op_reads.values()))
