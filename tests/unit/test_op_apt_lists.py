"""The checked ``apt-get update`` (gpufleet.operations.apt_lists), run by /bin/sh against an ``apt-get`` that prints
what the real one printed; and the ``packages`` operation's commands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pyinfra.facts.deb import DebPackages
from pyinfra_harness import run_operation

from gpufleet.facts.packages import DebInstalled
from gpufleet.operations import apt_lists

# apt 2.6.1 (Debian 12), `LC_ALL=C apt-get update -o Acquire::http::Proxy=http://127.0.0.1:9 -o Acquire::Retries=0`
# with the mirror unreachable (a refused proxy): exit status 0
UNREACHABLE = """\
Err:1 http://deb.debian.org/debian bookworm InRelease
  Could not connect to 127.0.0.1:9 (127.0.0.1). - connect (111: Connection refused)
Err:2 http://deb.debian.org/debian bookworm-updates InRelease
  Unable to connect to 127.0.0.1:9:
Err:3 http://deb.debian.org/debian-security bookworm-security InRelease
  Unable to connect to 127.0.0.1:9:
Reading package lists...
W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Could not connect to 127.0.0.1:9 \
(127.0.0.1). - connect (111: Connection refused)
W: Failed to fetch http://deb.debian.org/debian/dists/bookworm-updates/InRelease  Unable to connect to 127.0.0.1:9:
W: Failed to fetch http://deb.debian.org/debian-security/dists/bookworm-security/InRelease  Unable to connect to \
127.0.0.1:9:
W: Some index files failed to download. They have been ignored, or old ones used instead.
"""
# apt 2.6.1 on a simulated host, everything fetched: exit status 0
FETCHED = """\
Hit:1 http://10.77.51.1:8731 ./ InRelease
Get:2 http://deb.debian.org/debian bookworm InRelease [151 kB]
Get:3 http://deb.debian.org/debian bookworm/main amd64 Packages [8792 kB]
Fetched 8943 kB in 2s (4471 kB/s)
Reading package lists...
"""
# A non-transient failure: apt-pkg/update.cc makes the summary an error (E:) and apt-get exits 100
HASH_MISMATCH = """\
Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
Err:2 http://deb.debian.org/debian bookworm/main amd64 Packages
  Hash Sum mismatch
Reading package lists...
W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/Packages.xz  Hash Sum mismatch
E: Some index files failed to download. They have been ignored, or old ones used instead.
"""


def checked_update(tmp_path, apt_output: str, apt_status: int) -> subprocess.CompletedProcess:
    fake = tmp_path / "apt-get"
    (tmp_path / "output").write_text(apt_output)
    fake.write_text(f"#!/bin/sh\n[ \"$*\" = update ] || exit 2\ncat {tmp_path / 'output'}\nexit {apt_status}\n")
    fake.chmod(0o755)
    return subprocess.run(["/bin/sh", "-c", apt_lists.checked_update()], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})


def test_an_unreachable_mirror_fails_the_update_naming_each_source_and_apts_reason(tmp_path):
    result = checked_update(tmp_path, UNREACHABLE, 0)
    assert result.returncode == 1
    assert result.stdout == UNREACHABLE  # apt's own output, as it was
    assert result.stderr == (
        "apt-get update could not fetch every package index (exit 0): apt would install from old or missing lists. "
        "Failed:\n"
        "http://deb.debian.org/debian/dists/bookworm/InRelease: Could not connect to 127.0.0.1:9 (127.0.0.1). - "
        "connect (111: Connection refused)\n"
        "http://deb.debian.org/debian/dists/bookworm-updates/InRelease: Unable to connect to 127.0.0.1:9:\n"
        "http://deb.debian.org/debian-security/dists/bookworm-security/InRelease: Unable to connect to 127.0.0.1:9:\n")


def test_every_index_fetched_passes_quietly(tmp_path):
    result = checked_update(tmp_path, FETCHED, 0)
    assert (result.returncode, result.stdout, result.stderr) == (0, FETCHED, "")


def test_an_error_of_apt_fails_with_its_exit_status(tmp_path):
    result = checked_update(tmp_path, HASH_MISMATCH, 100)
    assert result.returncode == 1
    assert "(exit 100)" in result.stderr
    assert "binary-amd64/Packages.xz: Hash Sum mismatch" in result.stderr


def test_only_the_summary_line_still_fails(tmp_path):
    """apt without a "Failed to fetch" line but with its summary (as older apt printed some failures)."""
    result = checked_update(tmp_path, "Reading package lists...\nW: Some index files failed to download. They have "
                                      "been ignored, or old ones used instead.\n", 0)
    assert result.returncode == 1
    assert result.stderr.endswith("Failed:\n(see apt output above)\n")


APT_INSTALL = ('DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
               '-o Dpkg::Options::="--force-confold" install')


def facts(installed: dict) -> dict:
    return {DebPackages: installed,
            DebInstalled: lambda packages: {n: sorted(installed[n])[0] for n in packages if n in installed}}


def test_packages_missing_are_installed_after_the_checked_update():
    commands, _ = run_operation(apt_lists.packages, facts=facts({"prometheus": {"2.42.0"}}),
                                packages=["prometheus", "prometheus-alertmanager"])
    assert commands == [apt_lists.checked_update(), f"{APT_INSTALL} --no-install-recommends prometheus-alertmanager"]


def test_packages_installed_read_no_lists_and_change_nothing():
    commands, noops = run_operation(apt_lists.packages, facts=facts({"grafana": {"12.3.0"}}), packages=["grafana"],
                                    no_recommends=False)
    assert (commands, noops) == ([], ["grafana installed"])


def test_the_messages_checked_are_apts_own():
    """apt's own message formats (recorded from Debian/apt's apt-pkg/update.cc with provenance): "URL  reason" with
    two spaces, as the check parses it, and the summary line it looks for."""
    recorded = json.loads((Path(__file__).parents[1] / "reference/upstream/apt/facts.json").read_text())
    update = recorded["files"]["apt/apt-pkg/update.cc"]
    assert update["failed_to_fetch"]["format"] == apt_lists.FAILED_TO_FETCH + "%s  %s\\n"
    assert update["index_files_failed"]["text"].startswith(apt_lists.INDEX_FILES_FAILED + ". ")
