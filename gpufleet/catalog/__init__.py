"""GPU catalog: per-model facts (nvidia-smi names, PCI ids, power limits per board variant, dense peaks, MIG
profile tables).

Data lives in ``gpufleet/catalog/models/<key>.json``, one file per model, every value with a source tag
(``real`` / ``doc`` / ``unverified``). ``load_catalog()`` reads them once per process::

    from gpufleet.catalog import load_catalog
    cat = load_catalog()
    h100 = cat.by_name("NVIDIA H100 80GB HBM3")
    h100.dense_peak("bf16")          # 989.4 (dense, never the 1979 sparse figure)
    h100.mig.profile("1g.10gb").id   # 19
"""

from __future__ import annotations

import functools

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
]


@functools.cache
def load_catalog() -> Catalog:
    """The catalog shipped with gpufleet (read once, then cached). Raises CatalogError on a bad data file."""
    return load_package_catalog()
