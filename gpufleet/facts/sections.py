"""One shell command, several outputs: the section protocol shared by gpufleet's facts.

A fact that needs more than one program's output runs them in ONE remote command; each program's output is
framed by marker lines, with its exit status and whether the program exists at all::

    @@gpufleet begin lgi
    ...output (stdout and stderr)...
    @@gpufleet end lgi rc=0
    @@gpufleet absent lci          <- `command -v nvidia-smi` failed: the program is not installed

The command itself always exits 0 (the last thing it runs is ``echo``), so pyinfra never marks a host failed
because a probed program is missing or unhappy: the fact reports it, the operation decides.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

MARKER = "@@gpufleet"
_LINE_RE = re.compile(rf"^{MARKER} (begin|end|absent) ([A-Za-z0-9_.-]+)(?: rc=(\d+))?\s*$")


def section(name: str, script: str, requires: str | None = None) -> str:
    """Shell snippet running ``script`` (stdout+stderr) between the markers of section ``name``.

    With ``requires`` (a program name) the section reports ``absent`` when the program is not on PATH.
    """
    body = f"echo '{MARKER} begin {name}'; {{ {script} ; }} 2>&1; echo \"{MARKER} end {name} rc=$?\""
    if requires is None:
        return body
    return (
        f"if command -v {shlex.quote(requires)} >/dev/null 2>&1; then {body}; "
        f"else echo '{MARKER} absent {name}'; fi"
    )


def join(*snippets: str) -> str:
    return "; ".join(snippets)


def print_file(path: str, prefix: str = "") -> str:
    """Shell snippet printing the text file ``path`` (quoted, or a ``"$variable"``) as ``cat`` prints it, each line
    after ``prefix`` (``printf`` text), with shell builtins: the reads every run makes on every host start no
    program for it. A missing file prints nothing (and the shell's error on stderr)."""
    return (f"_gf_line=''; while IFS= read -r _gf_line; do printf '{prefix}%s\\n' \"$_gf_line\"; done < {path}; "
            f"[ -z \"$_gf_line\" ] || printf '{prefix}%s' \"$_gf_line\"")


@dataclass
class Section:
    name: str
    present: bool = True  # False: the required program is not installed
    rc: int | None = None  # None: the section never ended (output cut short)
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.present and self.rc == 0

    @property
    def text(self) -> str:
        return "\n".join(line for line in self.lines if line.strip()).strip()


def parse_sections(output: list[str] | str) -> dict[str, Section]:
    """Split fact output into its sections (unknown text outside sections is ignored)."""
    if isinstance(output, str):
        output = output.splitlines()
    sections: dict[str, Section] = {}
    current: Section | None = None
    for raw in output:
        line = raw.rstrip("\r\n")
        match = _LINE_RE.match(line)
        if match:
            verb, name, rc = match.groups()
            if verb == "begin":
                current = sections[name] = Section(name)
            elif verb == "end":
                target = sections.setdefault(name, Section(name))
                target.rc = int(rc) if rc is not None else None
                current = None
            else:
                sections[name] = Section(name, present=False)
                current = None
            continue
        if current is not None:
            current.lines.append(line)
    return sections


def first_line(lines: list[str]) -> str:
    for line in lines:
        if line.strip():
            return line.strip()
    return ""
