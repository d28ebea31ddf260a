"""The files gpufleet ships beside its code, found the same way in a checkout, an editable install and a wheel.

* Jinja2 templates (``templates/`` at the top of the repository, what users read and adapt; it reaches the
  package as ``gpufleet/templates``, a link in the checkout and a copy in the wheel). A directory given with
  ``gpufleet_templates_dir`` (host data) is searched first, so a site can override one template by name.
* Node-side scripts (``gpufleet/node/``): installed on nodes by the operations.
* The verify probe bundle (``gpufleet/probe/``): copied to nodes by verify.

Everything goes through :mod:`importlib.resources`, never through ``__file__`` arithmetic, so nothing depends on
where the package was installed.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from pathlib import Path

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, StrictUndefined

from gpufleet.probe import PROBE_FILES

TEMPLATES_SETTING = "gpufleet_templates_dir"


@functools.cache
def template_environment(override_dir: str | None = None) -> Environment:
    """The Jinja2 environment of gpufleet's templates (``override_dir`` first when given)."""
    loader = PackageLoader("gpufleet", "templates")
    if override_dir:
        loader = ChoiceLoader([FileSystemLoader(override_dir), loader])
    return Environment(
        loader=loader,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_template(name: str, override_dir: str | None = None, **values) -> str:
    """Template ``name`` (e.g. ``"systemd/gpufleet-mig.service.j2"``) rendered with ``values``."""
    return template_environment(override_dir).get_template(name).render(**values)


def template_names() -> list[str]:
    """Every template gpufleet ships, as names for :func:`render_template`."""
    return sorted(template_environment().list_templates(extensions=("j2",)))


@functools.cache
def node_script(name: str) -> str:
    """The text of a node-side script of ``gpufleet/node/`` (``"gpu-settings.sh"``, ``"mig_apply.py"``)."""
    return files("gpufleet").joinpath("node", name).read_text()


def probe_paths() -> list[tuple[str, Path]]:
    """(name, local path) of every file of the probe bundle (``gpufleet/probe/``)."""
    probe = files("gpufleet.probe")
    paths = []
    for name in PROBE_FILES:
        path = probe.joinpath(name)
        if not isinstance(path, Path):
            # a zipped install: verify uploads files by path and checksums them, so it needs them on disk
            raise RuntimeError(f"gpufleet's probe file {name} is not a file on disk ({path}); install gpufleet "
                               "as a regular (not zipped) package")
        paths.append((name, path))
    return paths
