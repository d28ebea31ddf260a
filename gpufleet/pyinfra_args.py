"""What gpufleet's commands take the way ``pyinfra``'s own CLI takes it: which hosts (``--limit``), their data
(``--data``, ``--user``/``--port``/``--key``), pyinfra's verbosity (``-v``), and which deploy (DEPLOY).

Meaning, as in pyinfra 3.10's ``pyinfra_cli/cli.py``:

* ``--limit`` (repeatable): host names, group names or glob patterns over host names (a group first, as pyinfra's
  ``_get_inventory_pattern_matches``). gpufleet also splits a value on commas (``--limit node01,a100``), as
  ``gpufleet verify`` always did. A pattern that matches no host is an error (pyinfra only warns): a typo must not
  narrow a change silently.
* ``--data KEY=VALUE`` (repeatable): host data for every host of the run, over the inventory's; the value parsed as
  pyinfra parses it (``pyinfra_cli.util.parse_cli_arg``: ``true``/``false``, numbers, JSON).
* ``--user``/``--port``/``--key`` (pyinfra's short names of ``--ssh-user``/``--ssh-port``/``--ssh-key``, both
  accepted): ``ssh_user``/``ssh_port``/``ssh_key`` for every host, over ``--data``.
* ``-v``/``-vv``/``-vvv``: pyinfra's log of each run shown, with facts and no-op operations (``-v``), the commands
  (``-vv``) and their output (``-vvv``).
* DEPLOY: a deploy file (``something.py``) or a module path to a deploy function (``package.module.function`` or
  ``package.module:function``), as ``pyinfra INVENTORY DEPLOY`` takes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Protocol

import click

from gpufleet import _pyinfra

DEFAULT_DEPLOY = "gpufleet.deploys.gpu_node.gpu_node"  # the package's own: found from an installed wheel too


class NamedHost(Protocol):
    name: str
    groups: Sequence[str]


def split_limit(limit: Iterable[str] | str | None) -> list[str]:
    """``--limit`` values as patterns: each value split on commas, blanks dropped."""
    if limit is None:
        return []
    items = [limit] if isinstance(limit, str) else list(limit)
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def match_limit(hosts: Iterable[NamedHost], patterns: list[str]) -> tuple[list[Any], list[str]]:
    """(hosts matching any pattern: a group name, else a glob over host names, as pyinfra's --limit; patterns that
    matched nothing). Hosts in pattern order, each once."""
    hosts = list(hosts)
    chosen: list[Any] = []
    unmatched = []
    for pattern in patterns:
        in_group = [h for h in hosts if pattern in h.groups]
        found = in_group or [h for h in hosts if fnmatch(h.name, pattern)]
        if not found:
            unmatched.append(pattern)
        chosen.extend(h for h in found if h not in chosen)
    return chosen, unmatched


def unmatched_error(unmatched: list[str], inventory: str, hosts: Iterable[NamedHost]) -> str:
    return (f"--limit {','.join(unmatched)}: no host or group of {inventory} matches; "
            f"hosts: {', '.join(h.name for h in hosts)}")


@dataclass(frozen=True)
class PyinfraArgs:
    """The values of the options above (empty: pyinfra's defaults)."""

    limit: tuple[str, ...] = ()
    data: tuple[str, ...] = ()
    verbosity: int = 0
    ssh_user: str | None = None
    ssh_port: int | None = None
    ssh_key: str | None = None

    @property
    def patterns(self) -> list[str]:
        return split_limit(self.limit)

    def override_data(self) -> dict[str, Any]:
        """Host data for every host, as pyinfra's CLI builds it (``--data`` parsed, then the SSH options)."""
        data: dict[str, Any] = {}
        for item in self.data:
            key, value = item.split("=", 1)
            data[key] = _pyinfra.parse_cli_arg(value)
        for key, value in (("ssh_user", self.ssh_user), ("ssh_key", self.ssh_key), ("ssh_port", self.ssh_port)):
            if value:
                data[key] = value
        return data

    def argv(self, *, verbose: bool = True) -> list[str]:
        """The same options for a ``pyinfra`` process (``--limit`` left to the caller, who names the hosts; ``-v``
        only where ``verbose``)."""
        out: list[str] = []
        for item in self.data:
            out += ["--data", item]
        if self.verbosity and verbose:
            out.append("-" + "v" * self.verbosity)
        for flag, value in (("--ssh-user", self.ssh_user), ("--ssh-port", self.ssh_port),
                            ("--ssh-key", self.ssh_key)):
            if value:
                out += [flag, str(value)]
        return out


def slice_hosts(hosts: Sequence[tuple[str, Iterable[str]]], jobs: int) -> list[list[str]]:
    """``hosts`` ((name, groups) in inventory order) cut into ``jobs`` slices that each hold a mix of the fleet:
    round robin over the hosts sorted by their groups (then name). A fleet of 40 HGX nodes and 40 workstations in
    2 slices gives each slice 20 of each, where contiguous blocks would give one slice all HGX nodes (the slow
    stages all in one worker). Each host is in exactly one slice; a slice may be empty when hosts < jobs."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, not {jobs}")
    ordered = sorted(hosts, key=lambda h: (tuple(sorted(h[1])), h[0]))
    slices: list[list[str]] = [[] for _ in range(jobs)]
    for i, (name, _groups) in enumerate(ordered):
        slices[i % jobs].append(name)
    return slices


def check_deploy(spec: str) -> str | None:
    """Why ``spec`` is no deploy pyinfra could run, or None: a ``.py`` file that exists, or a module path that
    imports to a callable."""
    if spec.endswith(".py"):
        return None if Path(spec).is_file() else f"deploy {spec}: no such file"
    if "." not in spec and ":" not in spec:
        return (f"deploy {spec}: neither a deploy file (FILE.py) nor a module path (package.module.function), "
                "as pyinfra takes it")
    try:
        found = deploy_function(spec)
    except Exception as error:  # pyinfra's CliError, or an error raised importing the module
        return f"deploy {spec}: {error}"
    return None if callable(found) else f"deploy {spec}: not a function"


def deploy_function(spec: str) -> Callable[..., Any]:
    """The function ``package.module.function`` (or ``package.module:function``) names, imported as pyinfra's CLI
    imports it: from the working directory too (pyinfra's ``main.py`` puts it on ``sys.path`` first thing)."""
    return _pyinfra.import_function(spec)


def is_deploy_file(spec: str) -> bool:
    return spec.endswith(".py")


# ------------------------------------------------------------------------------------------------- click


def _check_data(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if "=" not in value or not value.split("=", 1)[0]:
            raise click.BadParameter(f"{value!r}: expected KEY=VALUE, e.g. --data gpufleet_power_limit=80%")
    return values


def limit_option(f):
    return click.option("--limit", multiple=True, metavar="NAME,...",
                        help="only these hosts: host names, group names or glob patterns, comma-separated "
                             "(repeatable), as pyinfra's --limit")(f)


def pyinfra_options(*, verbose: bool = True):
    """``--limit``, ``--data``, ``--user``/``--port``/``--key`` (and ``-v``) on a command, collected into one
    ``pyinfra_args`` parameter (:class:`PyinfraArgs`)."""

    def decorate(command):
        @functools.wraps(command)  # keeps the options declared below this decorator (click's __click_params__)
        def wrapper(*args, limit=(), data=(), ssh_user=None, ssh_port=None, ssh_key=None, verbosity=0, **kwargs):
            kwargs["pyinfra_args"] = PyinfraArgs(limit=tuple(limit), data=tuple(data), verbosity=verbosity,
                                                 ssh_user=ssh_user, ssh_port=ssh_port, ssh_key=ssh_key)
            return command(*args, **kwargs)

        options = [
            limit_option,
            click.option("--data", multiple=True, metavar="KEY=VALUE", callback=_check_data,
                         help="override host data for every host (repeatable), as pyinfra's --data"),
            click.option("--ssh-user", "--user", "ssh_user", metavar="USER", help="SSH user to connect as"),
            click.option("--ssh-port", "--port", "ssh_port", type=click.IntRange(1, 65535), metavar="PORT",
                         help="SSH port to connect to"),
            click.option("--ssh-key", "--key", "ssh_key", type=click.Path(dir_okay=False), metavar="FILE",
                         help="SSH private key file"),
        ]
        if verbose:
            options.append(click.option("-v", "verbosity", count=True,
                                        help="show pyinfra's log: meta (-v), input (-vv) and output (-vvv)"))
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate
