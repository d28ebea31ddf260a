"""The files an operation manages, in one remote command: parse, never decide."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase, OperationValueError

from .sections import print_file

_SEP = "\t"
# sha1sum's line: HASH, two spaces, the path; a leading backslash where it escaped one in the path (\\ for \)
_SHA1_LINE = re.compile(r"^(\\?)([0-9a-f]{40})  (.*)$")


def check_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "\t\n\r") \
            or path.endswith("/"):
        raise OperationValueError(f"not an absolute file path: {path!r}")
    return path


def _entry(kind: str, **values) -> dict:
    return {"type": kind, "mode": None, "user": None, "group": None, "sha1": None, "target": None, **values}


class ManagedState(FactBase):
    """
    The files an operation manages, in one remote command (stat, sha1, contents).

    + paths: files, links or directories to stat (sha1 for regular files)
    + read: files whose contents are returned too (small text files only)

    .. code:: python

        host.get_fact(ManagedState, paths=("/etc/nccl.conf", "/etc/missing"), read=("/run/gpufleet/gpu-clocks.locked",))
        {"files": {"/etc/nccl.conf": {"type": "file", "mode": "644", "user": "root", "group": "root",
                                      "sha1": "…", "target": None},
                   "/etc/missing": None},
         "contents": {"/run/gpufleet/gpu-clocks.locked": "GPU-…=1500,1980\\n"}}  # None: absent
    """

    default = dict

    def command(self, paths: tuple[str, ...] = (), read: tuple[str, ...] = ()):
        for path in (*paths, *read):
            check_path(path)
        parts = ["LC_ALL=C; export LC_ALL"]
        if paths:
            quoted = " ".join(shlex.quote(p) for p in paths)
            # regular files are collected and stat'd and hashed together: two processes per read, not five per file
            parts.append(
                f"set --; for p in {quoted}; do "
                "if [ -L \"$p\" ]; then printf 'link\\t%s\\t%s\\n' \"$p\" \"$(readlink \"$p\")\"; "
                "elif [ -d \"$p\" ]; then printf 'dir\\t%s\\n' \"$p\"; "
                "elif [ -f \"$p\" ]; then set -- \"$@\" \"$p\"; "
                "elif [ -e \"$p\" ]; then printf 'other\\t%s\\n' \"$p\"; "
                "else printf 'absent\\t%s\\n' \"$p\"; fi; done; "
                "if [ $# -gt 0 ]; then stat -c 'file\t%n\t%a\t%U\t%G' -- \"$@\"; sha1sum -- \"$@\"; fi"
            )
        if read:
            quoted = " ".join(shlex.quote(p) for p in read)
            parts.append(
                f"for p in {quoted}; do "
                "if [ -f \"$p\" ]; then printf 'content\\t%s\\n' \"$p\"; " + print_file('"$p"', "|") + "; echo; "
                "else printf 'nocontent\\t%s\\n' \"$p\"; fi; done"
            )
        parts.append("true")
        return "; ".join(parts)

    def process(self, output):
        files: dict[str, dict | None] = {}
        contents: dict[str, str | None] = {}
        reading: str | None = None
        sha1s: dict[str, str] = {}
        for line in output:
            if reading is not None and line.startswith("|"):
                contents[reading] = (contents[reading] or "") + line[1:] + "\n"
                continue
            hashed = _SHA1_LINE.match(line)
            if hashed:
                escaped, sha1, path = hashed.groups()
                sha1s[path.replace("\\\\", "\\") if escaped else path] = sha1
                continue
            kind, _, rest = line.partition(_SEP)
            fields = rest.split(_SEP)
            if kind == "content":
                reading = fields[0]
                contents[reading] = ""
            elif kind == "nocontent":
                reading = None
                contents[fields[0]] = None
            elif kind == "absent":
                files[fields[0]] = None
            elif kind in ("dir", "other"):
                files[fields[0]] = _entry(kind)
            elif kind == "link" and len(fields) == 2:
                files[fields[0]] = _entry("link", target=fields[1])
            elif kind == "file" and len(fields) == 4:
                path, mode, user, group = fields
                files[path] = _entry("file", mode=mode, user=user, group=group)
        for path, entry in files.items():
            if entry is not None and entry["type"] == "file":
                entry["sha1"] = sha1s.get(path)
        return {"files": files, "contents": contents}
