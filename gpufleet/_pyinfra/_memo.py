"""Fast fact reads for the gpufleet deploy: one SSH round trip per distinct read, the reads known in advance run
concurrently, and a converged host's reads read ahead in one remote command.

pyinfra 3 has no fact cache: every ``host.get_fact`` is a remote command, some 30 per converged host, one after
another. The memo keeps a read's output until anything else touches the host; the prefetch and the read-ahead
(of what the previous run read, remembered as data, never as commands) fill it. pyinfra parses, logs and fails
hosts on every read as it would without it. The rules: docs/design.md, "The fact memo".
"""

from __future__ import annotations

import atexit
import importlib
import inspect
import json
import os
import re
import shlex
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import gevent
from gevent.event import Event
from gevent.lock import BoundedSemaphore
from pyinfra import logger
from pyinfra.api import FactBase
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import PyinfraError

try:  # an internal: where it moved, supported() says so and the memo stays off
    from pyinfra.api.facts import get_fact
except ImportError:  # pragma: no cover - depends on the installed pyinfra
    get_fact = None
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput, OutputLine

from gpufleet.control_files import UnsafePath, private_dir, read_private, write_atomic

from . import _connector
from ._guard import FACT_MEMO, plain_path, pyinfra_version, say_plain_path

PER_HOST_CHANNELS = 4  # concurrent prefetch commands per host (sshd allows 10 sessions per connection)
_ACTIVE_STAGES = (StateStage.Prepare, StateStage.Execute)
# Host methods after which earlier reads are stale (besides run_shell_command and connect), and those of them that
# change the host (besides an operation's command): what the next run reads ahead depends on the changes
_STALING_METHODS = ("put_file", "get_file", "rsync", "disconnect")
_CHANGING_METHODS = ("put_file", "rsync")

FactCall = tuple[type, tuple, dict]  # (fact class, args, kwargs) as given to host.get_fact
BATCH_MARK = "@@gpufleet-read-ahead"  # separates the outputs of one read-ahead command's reads
MAX_LEARNED = 96  # reads remembered per host for the next run's read-ahead
# The facts a remembered read may name (the cache holds fact names and arguments, never commands): any fact class of
# gpufleet's own fact modules, and the pyinfra facts the gpu_node deploy reads (directly or through the pyinfra
# operations it calls). Not pyinfra's facts at large: some run what their argument says (server.Command).
FACT_PACKAGE = "gpufleet.facts"
PYINFRA_FACTS = frozenset({
    "pyinfra.facts.server.Arch", "pyinfra.facts.server.KernelVersion", "pyinfra.facts.server.LinuxDistribution",
    "pyinfra.facts.server.RebootRequired", "pyinfra.facts.server.Which", "pyinfra.facts.server.Os",
    "pyinfra.facts.files.File", "pyinfra.facts.files.FileContents", "pyinfra.facts.files.Directory",
    "pyinfra.facts.files.Link", "pyinfra.facts.files.Sha1File", "pyinfra.facts.files.Sha256File",
    "pyinfra.facts.apt.DebPackages", "pyinfra.facts.deb.DebPackages", "pyinfra.facts.dnf.DnfEnabledModules",
    "pyinfra.facts.rpm.RpmPackages", "pyinfra.facts.systemd.SystemdStatus", "pyinfra.facts.systemd.SystemdEnabled",
})
# A remembered argument's strings: no whitespace, quote, $, `, ;, |, &, <, >, (, ), \ or newline, so that even a
# fact that puts an argument into its command unquoted cannot be made to run anything by a cache file
_PLAIN_RE = re.compile(r"^[A-Za-z0-9_./:@%+=,*~^-]*\Z")


class UnsafeCache(PyinfraError):
    """The fact cache directory (or a file in it) could have been written by another user: the run stops."""


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
    # the deploy's reads this run, in order: key -> the fact read (fact_entry); saved for the next run
    learned: dict[tuple, dict] = field(default_factory=dict)
    remembered: list | None = None  # the fact reads the cache held for this host when this run read it (None: not read)
    remembered_keys: set = field(default_factory=set)  # the keys of their commands, as generated this run
    changed: bool = False  # an operation's command or an upload ran on the host during this run
    changed_by: str | None = None  # the operation (hash) whose command or upload last changed the host
    read_after_change: set = field(default_factory=set)  # keys of the deploy's reads made once the host changed
    # keys of the reads made while the operation reading (if any) had not changed the host itself
    read_before_own_change: set = field(default_factory=set)


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
        self.executed = False  # the run reached execution: what it read is worth remembering
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

    def read_ahead(self, hosts: Iterable, calls: Sequence[FactCall], cache_dir: Path | None = None
                   ) -> list[gevent.Greenlet]:
        """Read ``calls`` and the reads the deploy made on the same host in its last run (remembered in
        ``cache_dir``, see :meth:`save`) on each of ``hosts`` (active, connected ones) in ONE remote command per
        host: the first of them alone, the others concurrently on the host (:func:`read_ahead_script`).
        Outputs are stored like a prefetch's; a read that failed or did not come back is simply read again
        when the deploy asks for it. Returns the greenlets."""
        if not self._sync():
            return []
        started = []
        for host in hosts:
            if host in self.state.active_hosts and host.connected:
                # claimed before this returns: a deploy that asks for one of these reads right away waits for it
                claimed = self._claim(host, self._plan_reads(host, calls, cache_dir))
                started += [gevent.spawn(self._read_ahead_group, host, self._memo(host).epoch, group)
                            for group in claimed]
        self.greenlets += started
        return started

    def save(self, cache_dir: Path) -> None:
        """Remember each host's reads of this run (fact name and arguments, never a command nor an output) for the
        next run's :meth:`read_ahead`; only when the run reached execution (a run stopped by preflight read
        less than the next one will)."""
        if not self.executed:
            return
        for host, memo in self.hosts.items():
            if memo.learned:
                reads = [entry for key, entry in memo.learned.items() if _remember(memo, key)][:MAX_LEARNED]
                if reads != memo.remembered:  # a converged host's run reads what the last one did: nothing to write
                    _write_json(_learned_path(cache_dir, host), reads)

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
        return self._change(host, run)

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
            return self._change(host, original, *args, **kwargs)  # an operation's command, not a fact read
        key = _cache_key(args, kwargs) if self._sync() else None
        if key is None:
            if prefetching:
                raise _Prefetched()
            return original(*args, **kwargs)
        if not prefetching:
            self._learn(host, key, args[0], kwargs, self._reading[(current, host)][-1])
        return self._read(host, key, prefetching, lambda: original(*args, **kwargs))

    def _change(self, host, original, *args, **kwargs):
        """An operation's command or upload: it changes the host (what the next run remembers depends on it)."""
        if gevent.getcurrent() not in self._prefetchers:
            memo = self._memo(host)
            memo.changed = True
            memo.changed_by = host.current_op_hash if host.in_op else None
        return self._stale(host, original, *args, **kwargs)

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

    def _learn(self, host, key: tuple, command, kwargs: dict, call: FactCall) -> None:
        """Note a read of the deploy (``call``, the fact read that ran ``command``) for the next run, unless it
        carries a secret (a masked part, a password, an environment) that must not be written to disk, or cannot be
        remembered as data (:func:`fact_entry`)."""
        memo = self._memo(host)
        if memo.changed:
            memo.read_after_change.add(key)
        if not (host.in_op and memo.changed_by is not None and memo.changed_by == host.current_op_hash):
            memo.read_before_own_change.add(key)
        if key in memo.learned or len(memo.learned) >= MAX_LEARNED:
            return
        arguments = _connector_kwargs(kwargs)
        if isinstance(command, StringCommand) and command.get_raw_value() != command.get_masked_value():
            return
        if any(value for name, value in (*arguments.items(), *call[2].items()) if "password" in name or name == "_env"):
            return
        entry = fact_entry(*call)
        if entry is not None:
            memo.learned[key] = entry

    def _collect(self, host, call: FactCall) -> _Collected | None:
        """The command (and connector arguments) pyinfra runs for ``call`` on ``host``, without running it."""
        cls, args, kwargs = call
        current = gevent.getcurrent()
        self._collecting.add(current)
        try:
            get_fact(self.state, host, cls, args=args, kwargs=kwargs)
        except _Collected as collected:
            return collected if collected.key is not None else None
        except Exception as error:  # the deploy's own read meets it again, where it should
            logger.debug(f"{host.name}: no read-ahead of {cls.__name__}: {error!r}")
        finally:
            self._collecting.discard(current)
        return None

    def _plan_reads(self, host, calls: Sequence[FactCall], cache_dir: Path | None) -> dict[tuple, tuple[str, dict]]:
        """key -> (command, connector arguments) of ``calls`` and of the reads remembered for ``host``: each
        command generated by its fact class now, never taken from the cache."""
        memo = self._memo(host)
        remembered = _load_learned(cache_dir, host) if cache_dir is not None else []
        memo.remembered = [entry for entry, _ in remembered]
        reads: dict[tuple, tuple[str, dict]] = {}
        for call, was_remembered in [*((call, False) for call in calls), *((call, True) for _, call in remembered)]:
            collected = self._collect(host, call)
            if collected is not None:
                reads.setdefault(collected.key, (collected.text, collected.kwargs))
                if was_remembered:
                    memo.remembered_keys.add(collected.key)
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
        except Exception as error:  # each read is made again by the deploy, which meets the error
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
            self.executed = self.executed or stage == StateStage.Execute
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


def _remember(memo: _HostMemo, key: tuple) -> bool:
    """Whether the next run reads ``read`` ahead.

    * A read an operation made only after its own command (a driver install's package policy once the repository is
      set up, the initramfs tool once the blacklist is written) happens only when that operation changes the host:
      never in a converged host's run, so it is not remembered.
    * A read the deploy made only before this run first changed the host described the host before the change (a
      bare node's: which driver versions the repository offers, whether kernel headers are installed): it is
      remembered only if the run before this one needed it too.
    * Every other read is: the deploy made it on the host as this run leaves it, or the host did not change."""
    return key in memo.read_before_own_change and (
        not memo.changed or key in memo.read_after_change or key in memo.remembered_keys)


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


def default_cache_dir() -> Path:
    """Where gpufleet remembers each host's reads between runs: ``$GPUFLEET_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/gpufleet``, else ``~/.cache/gpufleet``."""
    if os.environ.get("GPUFLEET_CACHE_DIR"):
        return Path(os.environ["GPUFLEET_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpufleet"


def _learned_path(cache_dir: Path, host) -> Path:
    """Per inventory name and SSH address (two fleets may both have a ``node01``)."""
    address = host.data.get("ssh_hostname") if hasattr(host, "data") else None
    name = f"{host.name}@{address}" if isinstance(address, str) and address != host.name else host.name
    return cache_dir / "reads" / f"{quote(name, safe='')}.json"


def _load_learned(cache_dir: Path, host) -> list[tuple[dict, FactCall]]:
    """(entry, fact call) of each read remembered for ``host`` that names a known fact (:func:`fact_call`); the
    others are dropped. Raises :class:`~gpufleet.control_files.UnsafePath` where the cache is not private."""
    text = read_private(_learned_path(cache_dir, host))
    try:
        reads = json.loads(text) if text is not None else []
    except ValueError:
        return []  # unreadable: this run reads as it goes and writes a new one
    found = []
    for entry in reads[:MAX_LEARNED] if isinstance(reads, list) else ():
        call = fact_call(entry)
        if call is None:
            logger.debug(f"gpufleet: dropped a remembered read that names no known fact: {str(entry)[:200]}")
        else:
            found.append((entry, call))
    return found


def _write_json(path: Path, data) -> None:
    """Write ``data`` to ``path`` in the private cache directory (0700; the file 0600, atomically)."""
    try:
        private_dir(path.parent)
        write_atomic(path, json.dumps(data, indent=1), mode=0o600)  # concurrent runs never read half a file
    except (OSError, UnsafePath) as error:
        logger.debug(f"gpufleet: could not remember the reads in {path}: {error}")


def _fact_name(cls) -> str | None:
    """``module.Class`` of a fact class a remembered read may name, or None."""
    module, name = getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "")
    full = f"{module}.{name}"
    if not (isinstance(cls, type) and issubclass(cls, FactBase)) or not name.isidentifier():
        return None
    return full if full in PYINFRA_FACTS or module == FACT_PACKAGE or module.startswith(FACT_PACKAGE + ".") \
        else None


def _encode(value: Any) -> Any:
    """A fact argument as JSON that gives back the same Python value (tuples and dicts tagged); TypeError or
    ValueError where it cannot be remembered (another type, a string that is not plain)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        if not _PLAIN_RE.match(value):
            raise ValueError("not a plain string")
        return value
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) and _PLAIN_RE.match(k) for k in value):
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    raise TypeError(type(value).__name__)


def _decode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        if not _PLAIN_RE.match(value):
            raise ValueError("not a plain string")
        return value
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (tag, inner), = value.items()
        if tag == "tuple" and isinstance(inner, list):
            return tuple(_decode(v) for v in inner)
        if tag == "dict" and isinstance(inner, dict):
            return {_decode(k): _decode(v) for k, v in inner.items()}
    raise ValueError("not an encoded argument")


def fact_entry(cls, args: tuple, kwargs: dict) -> dict | None:
    """What the cache remembers of a fact read: ``{"fact": "module.Class", "args": [...], "kwargs": {...}}``, or
    None where it cannot be remembered as data (a fact not allowed, an argument JSON cannot give back exactly, a
    string with anything but letters, digits and ``_./:@%+=,*~^-``)."""
    name = _fact_name(cls)
    if name is None:
        return None
    try:
        entry = {"fact": name, "args": _encode(list(args)), "kwargs": _encode(dict(kwargs))["dict"]}
        json.dumps(entry, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return entry if fact_call(entry) == (cls, tuple(args), dict(kwargs)) else None


def fact_call(entry: Any) -> FactCall | None:
    """The fact read (class, args, kwargs) a remembered entry names, or None where it does not name an allowed
    fact class (imported only from gpufleet's fact modules or :data:`PYINFRA_FACTS`) with plain arguments."""
    if not isinstance(entry, dict) or set(entry) != {"fact", "args", "kwargs"} or not isinstance(entry["fact"], str):
        return None
    module, _, name = entry["fact"].rpartition(".")
    if not name.isidentifier() or not (entry["fact"] in PYINFRA_FACTS or module == FACT_PACKAGE
                                       or module.startswith(FACT_PACKAGE + ".")):
        return None
    try:
        cls = getattr(importlib.import_module(module), name, None)
        args = _decode(entry["args"])
        kwargs = _decode({"dict": entry["kwargs"]})
    except (ImportError, ValueError, TypeError):
        return None
    if _fact_name(cls) != entry["fact"] or not isinstance(args, list):
        return None
    return cls, tuple(args), kwargs


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


def trim_pyinfra_overhead(state) -> None:
    """Three costs pyinfra pays on every operation call and fact read, made cheaper without changing any result
    (on ``state``'s run, where :func:`supported` says yes): ``all_global_arguments`` computed once, call stacks
    read without source context, and global arguments looked up only among the keys the host's data holds
    (:func:`_present_keys_view`). Each replacement answers as pyinfra's own outside such a run."""
    # Scoped to gpufleet's runs: each replacement answers as pyinfra's own function (it calls it) unless the run in
    # progress (pyinfra's context state, or the state passed) is one the memo is installed on.
    arguments = sys.modules.get("pyinfra.api.arguments")
    computed = getattr(arguments, "all_global_arguments", None)
    if computed is not None and not hasattr(computed, "_gpufleet_once"):
        found = tuple(computed())

        def all_global_arguments() -> list:
            return list(found) if _in_gpufleet_run() else computed()

        all_global_arguments._gpufleet_once = True  # type: ignore[attr-defined]
        arguments.all_global_arguments = all_global_arguments
    util = sys.modules.get("pyinfra.api.util")
    if util is not None and getattr(util, "stack", None) is inspect.stack:

        def stack(context: int = 1) -> list:
            # from its caller, as inspect.stack() called there
            return inspect.stack(0 if _in_gpufleet_run() else context)[1:]

        def getframeinfo(frame, context: int = 1):
            return inspect.getframeinfo(frame, 0 if _in_gpufleet_run() else context)

        util.stack, util.getframeinfo = stack, getframeinfo
    pop = getattr(arguments, "pop_global_arguments", None)
    if pop is not None and not hasattr(pop, "_gpufleet_view"):

        def pop_global_arguments(state, host, kwargs, *args, **more):
            return pop(state, _present_keys_view(host) if state in _memos else host, kwargs, *args, **more)

        pop_global_arguments._gpufleet_view = True  # type: ignore[attr-defined]
        pop_global_arguments.__wrapped__ = pop  # type: ignore[attr-defined]
        for name in ("pyinfra.api.arguments", "pyinfra.api.facts", "pyinfra.api.operation", "pyinfra.api.deploy"):
            module = sys.modules.get(name)
            if getattr(module, "pop_global_arguments", None) is pop:  # where pyinfra imported it by name
                module.pop_global_arguments = pop_global_arguments


def _in_gpufleet_run() -> bool:
    """Whether pyinfra's context state (the run in progress) is one the memo is installed on."""
    from pyinfra.context import ctx_state

    try:
        return ctx_state.isset() and ctx_state.get() in _memos
    except Exception:  # no context: not a gpufleet run
        return False


class _PresentKeys:
    """``host.data`` that knows which keys its layers hold: an absent key raises AttributeError at once."""

    __slots__ = ("_data", "_present")

    def __init__(self, data, present: set):
        self._data, self._present = data, present

    def __getattr__(self, key: str):
        if key in self._present:
            return getattr(self._data, key)
        raise AttributeError(key)


class _HostView:
    """The host as ``pop_global_arguments`` sees it, with :class:`_PresentKeys` as its data."""

    def __init__(self, host, data: _PresentKeys):
        self._host, self.data = host, data

    def __getattr__(self, name: str):
        return getattr(self._host, name)


def _present_keys_view(host):
    """``host`` with data that answers absent keys at once, or ``host`` itself where its data layers (pyinfra's
    ``HostData.datas``: dicts, or callables returning dicts) are not all mappings."""
    try:
        present: set = set()
        for layer in host.data.datas:
            present.update((layer() if callable(layer) else layer).keys())  # as HostData.__getattr__ walks them
    except (AttributeError, TypeError):
        return host
    return _HostView(host, _PresentKeys(host.data, present))


def install(state, facts: Sequence[type] = (), cache_dir: Path | None = None) -> FactMemo | None:
    """Install the memo on ``state``'s hosts (once per state; pass the real ``State``, e.g. ``host.state``);
    the first call also sets TCP_NODELAY and reads ahead ``facts`` (no arguments, in this order) on every active
    host, in one remote command per host (:meth:`FactMemo.read_ahead`). With ``cache_dir``
    (:func:`default_cache_dir`) that command also reads what the deploy read on the same host in its last run,
    and this run's reads are remembered there when the process exits.

    Returns None, and installs nothing, where :func:`supported` says no: fact reads are then pyinfra's own."""
    memo = _memos.get(state)
    if memo is None:
        reason = supported()
        if reason is not None:
            say_plain_path(FACT_MEMO, reason)
            return None
        if cache_dir is not None:
            try:
                for directory in (cache_dir, cache_dir / "reads"):
                    if directory == cache_dir or directory.exists():
                        private_dir(directory)
            except UnsafePath as error:
                raise UnsafeCache(f"gpufleet fact cache: {error}") from None
        memo = _memos[state] = FactMemo(state)
        trim_pyinfra_overhead(state)
        for host in state.inventory:
            if host.connected:
                _connector.set_nodelay(host.connector)
        try:
            memo.read_ahead(state.inventory.get_active_hosts(), [(cls, (), {}) for cls in facts], cache_dir)
        except UnsafePath as error:
            raise UnsafeCache(f"gpufleet fact cache: {error}") from None
        gevent.sleep(0)  # the read-ahead's requests leave now, not once the deploy has validated its inputs
        if cache_dir is not None:
            atexit.register(memo.save, cache_dir)
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
