"""Every command README.md and docs/*.md show exists with the flags shown.

Checked: the lines of ``sh``/``bash``/``shell`` code blocks, and inline code that starts with ``gpufleet ``,
``python -m gpufleet`` or ``pyinfra `` (a command quoted in a sentence). Untagged blocks are program output.

* ``gpufleet …`` / ``python -m gpufleet …``: each word up to the command must be a command of the click tree
  (``a|b`` alternatives each), each ``--flag``/``-f`` an option of that command (or ``-h``/``--help``), a value after
  an option with fixed choices one of them.
* ``pyinfra …``: each flag one of pyinfra's own CLI (its click command), each deploy a file that exists (for paths
  in this repository) or a module path gpufleet can import (``gpufleet.deploys.gpu_node.gpu_node``).
* ``make TARGET``: a target of the Makefile.
* Any word naming a file under ``scripts/``, ``deploys/``, ``verify/``, ``benchmarks/`` or ``inventories/``: the file
  exists.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from pyinfra_cli.cli import cli as pyinfra_cli

from gpufleet import pyinfra_args
from gpufleet.cli import main as gpufleet_cli

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
REPO_DIRS = ("scripts/", "deploys/", "verify/", "benchmarks/", "inventories/")
OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "&"}


@dataclass
class Checked:
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1


def shown_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, words) of every command a Markdown text shows: shell code blocks, and inline code that starts
    with a gpufleet or pyinfra command."""
    out: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    fence = None
    pending, start = "", 0
    for number, line in enumerate(lines, start=1):
        opening = re.match(r"^\s*```(\w*)\s*$", line)
        if fence is None and opening:
            fence = opening.group(1).lower()
            continue
        if fence is not None:
            if re.match(r"^\s*```\s*$", line):
                fence = None
                continue
            if fence in SHELL:
                if not pending:
                    start = number
                pending += line
                if pending.endswith("\\"):  # a continued command
                    pending = pending[:-1] + " "
                    continue
                out.extend((start, words) for words in _shell_words(pending))
                pending = ""
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if re.match(r"(gpufleet|python -m gpufleet|pyinfra) ", span):
                out.append((number, [w.strip("[]") for w in span.split() if w.strip("[]")]))
    return out


def _shell_words(line: str) -> list[list[str]]:
    """The commands of one shell line (split at pipes, redirections, ``&&``, ``;``; comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote: the line is not a command
        return []
    commands, current = [], []
    for word in words:
        if word in OPERATORS:
            commands.append(current)
            current = []
            if word in (">", ">>", "<"):
                current = None  # the redirection's file: not a command
            continue
        if current is not None:
            current.append(word)
    commands.append(current)
    return [c for c in commands if c]


def _option_names(command: click.Command, ctx: click.Context) -> dict[str, click.Parameter]:
    return {name: p for p in command.get_params(ctx) if isinstance(p, click.Option)
            for name in (*p.opts, *p.secondary_opts)}


def _check_flags(words: list[str], command: click.Command, ctx: click.Context, where: str, checked: Checked) -> None:
    """Each flag of ``words`` an option of ``command``; a value after an option with choices one of them."""
    options = _option_names(command, ctx)
    for i, word in enumerate(words):
        if word == "--":
            return
        if not word.startswith("-") or word == "-" or re.fullmatch(r"-\d+(\.\d+)?%?", word):
            continue
        name, _, inline = word.partition("=")
        option = options.get(name)
        if option is None and re.fullmatch(r"-([a-zA-Z])\1+", name):  # -vv: a counted short option
            option = options.get(name[:2])
            option = option if option is not None and option.count else None
        if option is None:
            checked.problems.append(f"{where}: {name} is no option of {ctx.command_path}")
            continue
        checked.count("flag")
        value = inline or (words[i + 1] if i + 1 < len(words) and not option.is_flag and not option.count else "")
        if isinstance(option.type, click.Choice) and value and value != "…":
            for choice in value.strip("[]").split("|"):
                if choice not in option.type.choices:
                    checked.problems.append(f"{where}: {name} {choice}: allowed {', '.join(option.type.choices)}")


def check_gpufleet(words: list[str], where: str, checked: Checked) -> None:
    """``words`` after ``gpufleet``."""
    command: click.Command = gpufleet_cli
    ctx = click.Context(gpufleet_cli, info_name="gpufleet", **gpufleet_cli.context_settings)
    rest = list(words)
    while isinstance(command, click.Group) and rest:
        word = rest[0]
        if word.startswith("-"):
            _check_flags([word], command, ctx, where, checked)
            rest.pop(0)
            continue
        if re.fullmatch(r"[A-Z][A-Z_]*", word):  # a placeholder (gpufleet sim COMMAND -h): nothing to check
            return
        names = word.split("|")
        unknown = [n for n in names if n not in command.commands]
        if unknown:
            checked.problems.append(f"{where}: {ctx.command_path} has no command {', '.join(unknown)}")
            return
        for _ in names[1:]:  # alternatives (sim up|down): each exists; the first is followed
            checked.count("command")
        command = command.commands[names[0]]
        ctx = click.Context(command, info_name=names[0], parent=ctx)
        rest.pop(0)
    checked.count("command")
    _check_flags(rest, command, ctx, where, checked)


def _pyinfra_takes_value(option: click.Parameter | None) -> bool:
    return isinstance(option, click.Option) and not option.is_flag and not option.count


def check_pyinfra(words: list[str], where: str, checked: Checked) -> None:
    """``words`` after ``pyinfra``: its flags, then INVENTORY and the deploys."""
    ctx = click.Context(pyinfra_cli, info_name="pyinfra", **pyinfra_cli.context_settings)
    options = _option_names(pyinfra_cli, ctx)
    _check_flags(words, pyinfra_cli, ctx, where, checked)
    positional, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = "=" not in word and _pyinfra_takes_value(options.get(word))
        else:
            positional.append(word)
    checked.count("pyinfra")
    for deploy in positional[1:]:
        if deploy.endswith(".py"):
            continue  # a file: checked with the repository's paths (check_paths) where it is one of ours
        if deploy.startswith("gpufleet."):
            problem = pyinfra_args.check_deploy(deploy)
            if problem:
                checked.problems.append(f"{where}: {problem}")
            checked.count("deploy function")


def check_make(words: list[str], where: str, checked: Checked, targets: set[str]) -> None:
    for word in words:
        if not word.startswith("-"):
            checked.count("make")
            if word not in targets:
                checked.problems.append(f"{where}: make {word}: no such target in the Makefile")


def check_paths(words: list[str], where: str, checked: Checked, root: Path) -> None:
    for word in words:
        word = word.split("=", 1)[-1]
        if word.startswith(REPO_DIRS) and re.search(r"\.\w+$", word):
            checked.count("path")
            if not (root / word).exists():
                checked.problems.append(f"{where}: {word}: no such file")


def makefile_targets(makefile: Path) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+):", makefile.read_text(), re.M)}


def check_text(text: str, name: str, root: Path = REPO, checked: Checked | None = None) -> Checked:
    checked = checked if checked is not None else Checked()
    targets = makefile_targets(root / "Makefile")
    for number, words in shown_commands(text):
        where = f"{name}:{number}: {' '.join(words)}"
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value before the command
            words = words[1:]
        check_paths(words, where, checked, root)
        program = words[0] if words else ""
        if program in ("gpufleet", ".venv/bin/gpufleet"):
            check_gpufleet(words[1:], where, checked)
        elif len(words) > 2 and program.split("/")[-1].startswith("python") and words[1] == "-m":
            if words[2] == "gpufleet":
                check_gpufleet(words[3:], where, checked)
            elif importlib.util.find_spec(words[2]) is None:
                checked.problems.append(f"{where}: python -m {words[2]}: no such module")
        elif program in ("pyinfra", ".venv/bin/pyinfra"):
            check_pyinfra(words[1:], where, checked)
        elif program == "make":
            check_make(words[1:], where, checked, targets)
    return checked


def test_every_command_the_docs_show_exists_with_its_flags():
    checked = Checked()
    for path in DOCS:
        check_text(path.read_text(), str(path.relative_to(REPO)), checked=checked)
    assert checked.problems == []
    # what the docs show today, at least: the checks ran over real commands (a parser that found none would pass)
    for kind, least in {"command": 40, "flag": 60, "pyinfra": 15, "make": 3, "path": 30,
                        "deploy function": 3}.items():
        assert checked.counts.get(kind, 0) >= least, (kind, checked.counts)


def test_the_readme_shows_the_two_set_up_commands_and_fits_in_200_lines():
    text = (REPO / "README.md").read_text()
    words = [w for _, w in shown_commands(text)]
    assert ["make", "demo"] in words and ["make", "test"] in words
    assert len(text.splitlines()) <= 200


@pytest.mark.parametrize("doc, problem", [
    ("```sh\ngpufleet rollout inv.py --no-such-flag\n```", "--no-such-flag is no option of gpufleet rollout"),
    ("```sh\ngpufleet verify inv.py --bench slow\n```", "--bench slow: allowed none, quick, full"),
    ("```sh\ngpufleet sim up --hosts 2 && gpufleet sim explode\n```", "gpufleet sim has no command explode"),
    ("see `gpufleet sim up|down|explode`", "gpufleet sim has no command explode"),
    ("see `gpufleet sim COMMAND -h` and `gpufleet simulate`", "gpufleet has no command simulate"),
    ("run `gpufleet drift INVENTORY [--since DAYS]`", "--since is no option of gpufleet drift"),
    ("```sh\npython -m gpufleet rollout inv.py -q\n```", "-q is no option of gpufleet rollout"),
    ("```sh\ngpufleet verify inv.py -vv\n```", "-vv is no option of gpufleet verify"),
    ("```bash\npyinfra -y --no-such inv.py deploys/gpu_node.py\n```", "--no-such is no option of pyinfra"),
    ("```sh\npyinfra inv.py deploys/no_such_deploy.py\n```", "deploys/no_such_deploy.py: no such file"),
    ("```sh\npyinfra inv.py gpufleet.deploys.gpu_node.gpu_nod\n```", "No such attribute in module"),
    ("```sh\nmake demo && make deploy\n```", "make deploy: no such target"),
    ("```sh\nbash scripts/no_such.sh   # comment\n```", "scripts/no_such.sh: no such file"),
    ("```sh\npython -m gpufleet.no_such_module --check\n```", "no such module"),
])
def test_a_doc_showing_what_does_not_exist_is_found(doc, problem):
    problems = check_text(doc, "doc.md").problems
    assert len(problems) == 1 and problem in problems[0], problems


def test_what_exists_passes_and_output_blocks_are_not_commands():
    doc = """```sh
gpufleet rollout inv.py --limit a,b --data k=v --user ops --port 22 --key id -vv -y --verify none \\
    --drain "slurm:ssh root@ctl" --on-timeout=skip
GPUFLEET_SIM_DIR=/tmp/x gpufleet sim ssh node01 -- nvidia-smi -q
pyinfra -y --limit a --data x=1 inv.py deploys/gpu_node.py   # a comment --not-a-flag
gpufleet completion bash > /etc/bash_completion.d/gpufleet
```

```
gpufleet verify: 3 host(s), bench none
```
"""
    checked = check_text(doc, "doc.md")
    assert checked.problems == []
    assert checked.counts["command"] == 3 and checked.counts["pyinfra"] == 1 and checked.counts["path"] == 1
