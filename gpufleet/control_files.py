"""Files gpufleet writes on the control machine: reports, state files, the fact cache.

* :func:`write_atomic` — a new file under a random name (``tempfile``) in the target's own directory, then
  ``os.replace``: a reader sees the old file or the new one, never half of one; a fixed temporary name that
  another user made a symlink cannot redirect the write (``mkstemp`` creates with ``O_EXCL``, which never follows
  a symlink, and ``os.replace`` replaces a symlink at the destination instead of writing through it).
* :func:`private_dir`, :func:`read_private` — a directory only its owner may change (the fact cache): created
  0700, its files 0600, and refused (:class:`UnsafePath`) when it or a file in it is owned by another user or
  writable by group or others. Whoever can write there decides what gpufleet reads on every host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import stat
import tempfile
from pathlib import Path


class UnsafePath(Exception):
    """A path another user could have written: refused, with the path, its owner and its mode."""


def write_atomic(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` atomically with ``mode`` (a random temporary name in the same directory, then
    ``os.replace``); the directory is created when missing. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check(path: Path, info: os.stat_result, what: str) -> None:
    problems = []
    if info.st_uid != os.geteuid():
        problems.append(f"owned by {_owner(info.st_uid)}, not by {_owner(os.geteuid())} who runs gpufleet")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append("writable by group or others")
    if problems:
        raise UnsafePath(f"{path}: refused: the {what} is {' and '.join(problems)} (mode "
                         f"{stat.S_IMODE(info.st_mode):04o}, owner {_owner(info.st_uid)}); whoever can write it "
                         "decides what gpufleet reads on every host. Make it yours and private (chown; chmod "
                         "700 for a directory, 600 for a file), or point GPUFLEET_CACHE_DIR at a private directory")


def private_dir(path: str | os.PathLike, what: str = "fact cache directory") -> Path:
    """``path`` as a directory only this user can change: created 0700 (with missing parents) where absent;
    raises :class:`UnsafePath` where it is another user's or group/world-writable."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as error:
        raise UnsafePath(f"{path}: cannot create the {what}: {error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{path}: the {what} is not a directory")
    _check(path, info, what)
    return path


@contextlib.contextmanager
def directory_lock(directory: Path):
    """Held by one process at a time (``flock`` on ``DIRECTORY/.lock``): what it creates on first use (a password,
    the fleet CA, a host certificate) is created once when workers of one run (``gpufleet apply --jobs``) or two
    runs ask for it at the same moment, and never read half written."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_private(path: str | os.PathLike, what: str = "fact cache file") -> str | None:
    """The text of ``path`` (not through a symlink), or None where it does not exist; raises :class:`UnsafePath`
    where the file is another user's or group/world-writable."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UnsafePath(f"{path}: cannot read the {what} (a symlink is refused): {error}") from None
    with os.fdopen(fd, encoding="utf-8") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{path}: the {what} is not a regular file")
        _check(path, info, what)
        return handle.read()
