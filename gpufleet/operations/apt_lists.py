"""
apt's package lists, updated and checked: every ``apt-get update`` gpufleet runs (driver, exporters, monitoring)
fails the host when an index could not be fetched, naming the source and apt's reason.

``apt-get update`` warns and exits 0 when a source cannot be reached (apt-pkg/update.cc, ``AcquireUpdate``: a
transient network error gives ``W: Failed to fetch URL  REASON`` and ``W: Some index files failed to download.
They have been ignored, or old ones used instead.``): the old lists, or none, stay in use, and the install that
follows fails later with a message about the package (``Unable to locate package``) instead of the network. Every
configured source counts as needed (a package's dependencies may come from any of them). No stamp marks the lists
fresh: the lists are updated whenever something is to be installed, so a run after a failed update updates again.
dnf needs no check: it refuses to run when a repository's metadata cannot be downloaded (``skip_if_unavailable``
is false by default), naming the repository.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.operations import apt

from gpufleet.facts.packages import DebInstalled

# apt's own messages (apt-pkg/update.cc), in the C locale the update runs in; older apt printed them as errors (E:)
FAILED_TO_FETCH = "Failed to fetch "
INDEX_FILES_FAILED = "Some index files failed to download"

# POSIX sh (awk and sed are in every Debian/Ubuntu base system): apt's output is printed as it was; the sources
# that failed, one per line as "URL: reason", go to stderr (what pyinfra shows of a failed command), and the command
# fails. The variable assignment from $(...) keeps apt's exit status in $?.
_CHECKED_UPDATE = "\n".join((
    "out=$(LC_ALL=C apt-get update 2>&1); rc=$?",
    "printf '%s\\n' \"$out\"",
    "failed=$(printf '%s\\n' \"$out\" | awk '/^[WE]: " + FAILED_TO_FETCH + "/ "
    "{ url = $5; $1 = $2 = $3 = $4 = $5 = \"\"; sub(/^ +/, \"\"); print url ($0 == \"\" ? \"\" : \": \" $0) }')",
    "if [ \"$rc\" -ne 0 ] || [ -n \"$failed\" ] || printf '%s\\n' \"$out\" | grep -q '^[WE]: "
    + INDEX_FILES_FAILED + "'; then",
    "  printf 'apt-get update could not fetch every package index (exit %s): apt would install from old or "
    "missing lists. Failed:\\n%s\\n' \"$rc\" \"${failed:-(see apt output above)}\" >&2",
    "  exit 1",
    "fi",
))


def checked_update() -> str:
    """The shell command: ``apt-get update`` that fails when an index was not fetched (see the module's doc)."""
    return _CHECKED_UPDATE


@operation(is_idempotent=False)
def update():
    """
    Update apt's package lists; fail when an index could not be fetched, naming the source and apt's reason.

    **Example:**

    .. code:: python

        from gpufleet.operations import apt_lists

        apt_lists.update(name="apt lists")
    """
    yield checked_update()


@operation()
def packages(packages: list[str], no_recommends: bool = True):
    """
    Install ``packages`` when one is missing, after a checked update of apt's lists; nothing when all are installed
    (a converged node's run changes nothing and reads no list, however old its lists are).

    + packages: Debian package names
    + no_recommends: ``--no-install-recommends``

    **Example:**

    .. code:: python

        from gpufleet.operations import apt_lists

        apt_lists.packages(name="node_exporter", packages=["prometheus-node-exporter"])
    """
    installed = host.get_fact(DebInstalled, packages=tuple(packages))
    if all(name in installed for name in packages):
        host.noop(f"{', '.join(packages)} installed")
        return
    yield from update._inner()
    yield from apt.packages._inner(packages=packages, no_recommends=no_recommends)
