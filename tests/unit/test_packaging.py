"""The source distribution is complete: a wheel built from the sdist (what PyPI users and distribution packagers
build) holds exactly the files of a wheel built from the checkout, templates and node scripts included.
(tests/sim/test_installed_wheel.py runs the checkout's wheel against a simulated host.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path) -> None:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stdout}{result.stderr}"


def _wheel_files(directory: Path) -> set[str]:
    (wheel,) = directory.glob("gpufleet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _checkout_copy(target: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, not ignored): a wheel built in the checkout itself
    also packs whatever an earlier build left in its ignored build/lib (a module since moved or deleted)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, copy = REPO / name, target / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # e.g. gpufleet/templates -> ../templates
            copy.symlink_to(source.readlink())
        elif source.is_file():
            shutil.copy2(source, copy)
    return target


def test_a_wheel_built_from_the_sdist_equals_the_wheel_built_from_the_checkout(tmp_path):
    _run(sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path / "sdist"), str(REPO), cwd=tmp_path)
    (sdist,) = (tmp_path / "sdist").glob("gpufleet-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = archive.getmembers()
    assert "gpufleet-0.1.0/LICENSE" in {m.name for m in members}
    assert not [m.name for m in members if m.issym()], "the sdist must not carry symlinks"

    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "from-sdist"), str(sdist),
         cwd=tmp_path)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "from-checkout"),
         str(_checkout_copy(tmp_path / "checkout")),
         cwd=tmp_path)
    from_sdist, from_checkout = _wheel_files(tmp_path / "from-sdist"), _wheel_files(tmp_path / "from-checkout")
    assert from_sdist == from_checkout, (sorted(from_checkout - from_sdist), sorted(from_sdist - from_checkout))
    templates = {n.split("gpufleet/templates/", 1)[1] for n in from_sdist if n.startswith("gpufleet/templates/")}
    on_disk = {str(p.relative_to(REPO / "templates")) for p in (REPO / "templates").rglob("*.j2")}
    assert templates == on_disk
    assert "gpufleet/monitoring/alerts.yml" in from_sdist
