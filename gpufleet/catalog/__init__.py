"""GPU catalog: per-model facts (nvidia-smi names, PCI ids, power limits per board variant, dense peaks, MIG
profile tables).

Data lives in ``gpufleet/catalog/models/<key>.json``, one file per model, every value with a source tag
(``real`` / ``doc`` / ``unverified``). ``load_catalog()`` reads them once per process::

    from gpufleet.catalog import load_catalog
    cat = load_catalog()
    h100 = cat.by_name("NVIDIA H100 80GB HBM3")
    h100.dense_peak("bf16")          # 989.4 (dense, never the 1979 sparse figure)
    h100.mig.profile("1g.10gb").id   # 19

The user's own models (``gpufleet_catalog_dir``, or ``gpufleet_catalog/`` beside the inventory for the
``gpufleet`` commands) join them through :func:`use_user_models`; ``gpufleet catalog learn`` writes one.
"""

from __future__ import annotations

import functools
import os
import sys

from ._loader import (
    ARCHITECTURES,
    MODEL_FIELDS,
    PRECISIONS,
    SOURCE_TAGS,
    Catalog,
    CatalogError,
    GpuModel,
    MigProfile,
    MigSpec,
    PowerLimits,
    UnknownGpuModel,
    UnknownMigProfile,
    load_package_catalog,
    parse_model,
)

__all__ = [
    "ARCHITECTURES",
    "MODEL_FIELDS",
    "PRECISIONS",
    "SOURCE_TAGS",
    "Catalog",
    "CatalogError",
    "GpuModel",
    "MigProfile",
    "MigSpec",
    "PowerLimits",
    "UnknownGpuModel",
    "UnknownMigProfile",
    "load_catalog",
    "parse_model",
    "use_user_models",
]


_USER_DIRECTORY: list[str] = []  # the user's model directory of this process (at most one: a run has one catalog)


@functools.cache
def _catalog(user_directory: str | None) -> Catalog:
    package = load_package_catalog()
    if user_directory is None:
        return package
    user = Catalog.from_directory(user_directory, allow_empty=True)
    for key in sorted(set(user.models) & set(package.models)):
        print(f"gpufleet: catalog: {user_directory}/{key}.json replaces the packaged model {key!r}", file=sys.stderr)
    return Catalog({**package.models, **user.models})


def load_catalog() -> Catalog:
    """The catalog: the models shipped with gpufleet, and the user's (:func:`use_user_models`), a user model
    replacing the packaged one of its key. Read once per process, then cached. Raises CatalogError on a bad file."""
    return _catalog(_USER_DIRECTORY[0] if _USER_DIRECTORY else None)


def use_user_models(directory: str | os.PathLike) -> Catalog:
    """Add the model files of ``directory`` (``<key>.json``, the packaged files' format, the same strict loader) to
    :func:`load_catalog` for the rest of the process; a note on stderr names each packaged model one replaces
    (once). Raises CatalogError on a bad file, or when another directory is already in use."""
    path = os.path.abspath(os.fspath(directory))
    if _USER_DIRECTORY and _USER_DIRECTORY[0] != path:
        raise CatalogError(f"{path}: the user's models of this run are already {_USER_DIRECTORY[0]} (one directory "
                           "for the whole fleet)")
    catalog = _catalog(path)
    _USER_DIRECTORY[:] = [path]
    return catalog
