"""
The per-host lock of gpufleet runs that change a host: one converge (or boot-time MIG apply, or rollout) at a time.

A pyinfra run's commands are separate SSH sessions, so the lock is held by a remote process: :func:`host_lock` opens
one more channel on the host's connection and runs :func:`hold_script` there, which takes ``flock`` on
``/run/gpufleet/host.lock``, names its holder in the file and waits for its standard input, the channel, to end.
It ends with the run, the controller (even killed) or a dead connection; the holder then waits for the commands of
the same SSH connection to end, clears the file and exits. There is no lease to renew and no clock to trust; a
file naming a holder while the lock is free is stale and taken over, and ``/run`` does not survive a reboot.
Node-side users take the same lock with :func:`node_lock_command`; read-only runs take none.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from pyinfra import host, logger, state
from pyinfra.api import operation
from pyinfra.api.exceptions import PyinfraError

from gpufleet import _pyinfra
from gpufleet.facts.lock import LOCK_DIR, LOCK_FILE, PRINT_BOOT_ID, HostLock, describe_holder, parse_holder
from gpufleet.masking import mask_urls

from .errors import refuse

HELD = "gpufleet-lock: held"
BUSY = "gpufleet-lock: busy"
# A run that has just ended releases its hosts' locks a moment later (its holder sees the connection close): a run
# started right after it waits that long instead of being refused.
GRACE_S = 5
DRAIN_MAX_S = 3600  # a command of a killed run still running after an hour is not waited for any longer


# Every taker of the lock counts up the generation kept in the lock file (it survives the release, not a reboot):
# a run that finds the generation it read before changing anything knows nobody changed the host in between.
# Read with shell builtins: the lock is taken at the start of every run, on every host at once.


def _read_previous(lock_file: str) -> str:
    """sh: from the lock file (quoted), ``generation``: the next generation, and ``stale``: its other non-empty lines
    (a holder that is gone), each as ``stale LINE``."""
    return ("generation=0; stale=''\n"
            'while IFS= read -r line || [ -n "$line" ]; do\n'
            '  case $line in\n'
            '    generation=*) g=${line#generation=}; case $g in "" | *[!0-9]*) ;; *) generation=$g ;; esac ;;\n'
            '    ?*) stale="${stale}stale $line\n" ;;\n'
            '  esac\n'
            f'done < {lock_file}\n'
            "generation=$((generation + 1))")


def hold_script(info: str, lock_file: str = LOCK_FILE, wait_s: int = GRACE_S) -> str:
    """sh: take the lock, waiting up to ``wait_s`` seconds (else print who holds it and exit 1), hold it until stdin
    ends and the connection's other processes are gone, then clear the holder and release."""
    lock_dir, lock_file = shlex.quote(os.path.dirname(lock_file)), shlex.quote(lock_file)
    return f"""set -u
[ -d {lock_dir} ] || mkdir -p {lock_dir} || exit 3
exec 9<>{lock_file}
if ! flock -w {int(wait_s)} 9; then echo '{BUSY}'; cat {lock_file}; exit 1; fi
{_read_previous(lock_file)}
printf '%s\\nremote_pid=%s\\ngeneration=%s\\n' {shlex.quote(info)} "$$" "$generation" > {lock_file}
echo '{HELD}'
echo "generation=$generation"
{PRINT_BOOT_ID}
printf '%s' "$stale"
echo '{HELD} end'
cat >/dev/null
waited=0
connection=${{SSH_CONNECTION:-}}
while [ -n "$connection" ] && [ "$waited" -lt {DRAIN_MAX_S} ]; do
  set --
  for environ in /proc/[0-9]*/environ; do
    [ "$environ" = "/proc/$$/environ" ] || set -- "$@" "$environ"
  done
  [ $# -gt 0 ] || break
  # one grep for all processes (not one per process); it runs without SSH_CONNECTION, so it never finds itself
  (unset SSH_CONNECTION; exec grep -qzxF "SSH_CONNECTION=$connection" "$@") 2>/dev/null || break
  sleep 1; waited=$((waited + 1))
done
echo "generation=$generation" > {lock_file}
"""


def shown_argv(argv: list[str]) -> list[str]:
    """``argv`` as a lock file (readable on the node) names it: a ``--drain command:CMD`` hook's command line (it may
    hold a token) as ``command:…``, and URLs without their credentials."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next and arg.startswith("command:"):
            arg = "command:…"
        elif arg.startswith("--drain=command:"):
            arg = "--drain=command:…"
        hide_next = arg == "--drain"
        shown.append(mask_urls(arg))
    return shown


def holder_info(command: str | None = None) -> str:
    """This run's holder lines (``key=value``): controller host, pid, start time (UTC), command line."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_process_start()))
    command = command or " ".join(shown_argv(sys.argv))
    return "\n".join([f"controller={socket.gethostname()}", f"pid={os.getpid()}", f"started={started}",
                      f"command={' '.join(command.split())}"])


def _process_start() -> float:
    try:
        import psutil  # optional: the time the run started rather than when the lock was taken

        return psutil.Process().create_time()
    except Exception:  # psutil missing or unusable: the time the lock is taken is close enough
        return time.time()


@dataclass
class Acquired:
    held: bool
    holder: dict  # the other run's holder (busy) or the stale one taken over ({} if none)
    seen: tuple[str, int] | None = None  # (boot id, generation) before this run took it; None if not taken
    keeper: object | None = None  # keeps the holding channel/process alive
    error: str | None = None


def _read_reply(lines) -> Acquired:
    reply, rest = None, []
    for line in lines:
        line = line.rstrip("\n")
        if reply is None:
            if line in (HELD, BUSY):
                reply = line
            continue
        if line == f"{HELD} end":
            break
        rest.append(line)
    if reply is None:
        return Acquired(False, {}, error="the lock holder did not start (is flock installed?)")
    if reply == BUSY:
        return Acquired(False, parse_holder(rest))
    stale = [line[len("stale "):] for line in rest if line.startswith("stale ")]
    own = parse_holder([line for line in rest if not line.startswith("stale ")])
    seen = (own.get("boot_id", ""), int(own.get("generation", "1")) - 1)
    return Acquired(True, parse_holder(stale), seen=seen)


def acquire(target, info: str, timeout: float = 30.0, wait_s: int = GRACE_S) -> Acquired:
    """Take ``target``'s lock for as long as this process keeps the returned ``keeper`` (SSH: a channel on the
    host's connection; local connector: a child process)."""
    script = hold_script(info, wait_s=wait_s)
    session = _pyinfra.hold_lock(target, script, timeout, GRACE_S)
    if session is not None:
        channel, output = session
        reply = _read_reply(output)
        channel.settimeout(None)
        if not reply.held:
            channel.close()
            return reply
        reply.keeper = channel
        return reply
    if _pyinfra.runs_locally(target):
        # not an SSH session: the controller's own SSH_CONNECTION (if any) must not keep the lock held
        return acquire_local(script, {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"})
    return Acquired(False, {}, error=f"the {_pyinfra.connector_name(target)} connector cannot hold a lock")


def acquire_local(script: str, env: dict | None = None) -> Acquired:
    """Run the hold script as a child process of this one (the local connector; tests)."""
    process = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=env)
    reply = _read_reply(process.stdout)
    if not reply.held:
        process.wait()
        return reply
    reply.keeper = process
    return reply


_keepers: dict[tuple[int, str], object] = {}  # (id(state), host name) -> keeper, for the run's lifetime


@operation()
def host_lock(command: str | None = None, seen: tuple[str, int] | None = None):
    """
    Take this host's gpufleet lock for the rest of the run; refuse the host if another run holds it.

    + command: the command line named in the lock (default: this process's)
    + seen: ``(boot_id, generation)`` of the lock when this run read the host's facts (``HostLock``); if the lock
      shows the same when taken, nobody changed the host in between and those reads stay valid

    Taken when the run executes (``--dry`` and change detection only read who holds it) and held until the run
    ends (see the module documentation for how). A host locked by another gpufleet run fails with a message naming
    the holder (controller, pid, start time, command) and nothing else is done on it; the other hosts go on. A
    lock whose holder is gone is taken over. Changes nothing on the host but ``/run/gpufleet/host.lock``, so it
    never counts as a change.

    **Example:**

    .. code:: python

        from gpufleet.operations import lock

        lock.host_lock(name="gpufleet lock")
    """
    if not state.is_executing:
        holder = host.get_fact(HostLock)
        if holder.get("held"):
            host.noop(f"locked now by another run ({describe_holder(holder)}); this run is refused here unless "
                      "that run ends first")
        else:
            host.noop("gpufleet lock free (taken when the run executes)")
        return
    key = (id(host.state), host.name)
    if key in _keepers:
        host.noop("gpufleet lock held by this run")
        return
    target = _pyinfra.inventory_host(state, host)
    if _pyinfra.runs_nothing(target):
        # pyinfra's @fake hosts (demos, benchmarks/scale.py) run nothing: there is nothing to lock
        host.noop("no gpufleet lock on a @fake host: nothing runs there")
        return
    try:
        info = holder_info(command)
        result = acquire(target, info)
    except Exception as error:  # a connection that fails now fails this host, not the run
        yield from refuse(f"could not take the gpufleet lock of {host.name}: {type(error).__name__}: {error}")
        return
    if not result.held:
        why = result.error or f"locked by another gpufleet run: {describe_holder(result.holder)}"
        yield from refuse(f"{host.name} is {why}; nothing was changed on this host" if not result.error
                          else f"{host.name}: {why}")
        return
    _keepers[key] = result.keeper
    _retake_on_reconnect(target, key, info)
    if result.holder:
        logger.warning(f"{host.print_prefix}took over a stale gpufleet lock ({describe_holder(result.holder)}; "
                       "that run is gone)")
    if result.seen != seen:
        _pyinfra.forget_reads(state, target)  # another run (or a reboot) came between: read the facts again
    host.noop("gpufleet lock taken by this run")


class LockLost(PyinfraError):
    """The host came back from a reboot (or reconnected) locked by another run: this host fails."""


def _retake_on_reconnect(target, key: tuple, info: str) -> None:
    """A reboot within the run (``allow_reboot``) ends the connection and with it the lock: take it again whenever
    the host is connected anew, before anything else runs there; fail the host if another run has it."""
    ours = parse_holder(info.splitlines())

    def retake(connected) -> None:
        if key in _keepers:
            retaken = acquire(connected, info, wait_s=0)
            if retaken.held:
                _keepers[key] = retaken.keeper
            elif not (ours.items() <= retaken.holder.items()):  # ours: the old connection still holds it
                raise LockLost(f"{connected.name}: reconnected, and the gpufleet lock is now held by another run "
                               f"({describe_holder(retaken.holder) if not retaken.error else retaken.error}); "
                               "nothing more is done on this host")

    _pyinfra.after_reconnect(target, retake)


def node_lock_command(argv: list[str], what: str, wait_s: int = 600) -> list[str]:
    """``argv`` wrapped to run under the host lock on the node (boot units: ExecStart), naming ``what`` as the
    holder; waits up to ``wait_s`` seconds for a run that holds it."""
    path = shlex.quote(LOCK_FILE)
    record = (f'{_read_previous(path)}; '
              f'printf "controller=%s\\npid=%s\\nstarted=%s\\ncommand=%s\\ngeneration=%s\\n" "$(hostname)" "$$" '
              f'"$(date -u +%Y-%m-%dT%H:%M:%SZ)" {shlex.quote(what)} "$generation" > {path}; "$@"; rc=$?; '
              f'echo "generation=$generation" > {path}; exit $rc')
    return ["sh", "-c", f"mkdir -p {shlex.quote(LOCK_DIR)} && exec flock -w {int(wait_s)} {path} sh -c "
            f"{shlex.quote(record)} sh \"$@\"", "gpufleet-lock", *argv]
