"""``gpufleet catalog list | show KEY | learn INVENTORY HOST``: the GPU catalog, packaged and the user's own.

The user's models are the ``gpufleet_catalog/`` directory beside an inventory (or ``--dir``), the directory the
converge's ``gpufleet_catalog_dir`` setting names. ``learn`` reads a live node over SSH with pyinfra (its
``NvidiaSmiReport`` fact, read-only) and writes ``<key>.json`` there: every value read tagged ``real`` with the
host and date, accepted by the same strict loader as the packaged files.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.catalog import Catalog, CatalogError, GpuModel, load_catalog, load_package_catalog, use_user_models
from gpufleet.catalog.learn import LearnError, learn_model
from gpufleet.facts.mig_profiles import parse_lgip, parse_lgipp
from gpufleet.facts.nvidia_q import get, parse_q
from gpufleet.pyinfra_args import PyinfraArgs
from gpufleet.rollout.converge import pyinfra_executable

USER_DIRECTORY = "gpufleet_catalog"  # beside the inventory
FACT = "gpufleet.facts.nvidia_q.NvidiaSmiReport"


class CommandError(Exception):
    """What the command cannot do; the message says why (exit code 2)."""


def user_directory(inventory: str | None, directory: str | None) -> Path | None:
    """``directory``, else ``gpufleet_catalog/`` beside ``inventory`` when it exists, else None."""
    if directory is not None:
        return Path(directory)
    if inventory is not None:
        beside = Path(inventory).resolve().parent / USER_DIRECTORY
        if beside.is_dir():
            return beside
    return None


def catalog_with(directory: Path | None) -> Catalog:
    """The catalog with the user's models of ``directory`` (when given)."""
    try:
        return use_user_models(directory) if directory is not None else load_catalog()
    except CatalogError as err:
        raise CommandError(f"catalog: {err}") from None


def list_lines(catalog: Catalog) -> list[str]:
    """One line per model: key, name, architecture, MIG, power limits, where it comes from."""
    packaged = load_package_catalog()
    rows = [("KEY", "NAME", "ARCHITECTURE", "MIG", "POWER W (default/min/max per board)", "FROM")]
    for model in catalog:
        power = ", ".join("/".join("-" if w is None else f"{w:g}" for w in (v.default_w, v.min_w, v.max_w))
                          for v in model.power_limits_w)
        mig = f"{len(model.mig.gpu_instance_profiles)} profiles" if model.mig else "no"
        source = "packaged" if packaged.models.get(model.key) == model else "user"
        rows.append((model.key, model.name, model.architecture, mig, power, source))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def show_text(model: GpuModel) -> str:
    """Every field of ``model`` with its value and source, as the model file has them."""
    lines = [f"{model.key}: {model.name}"]
    for field, source in model.sources.items():
        value = getattr(model, field)
        if field in ("pci_device_id", "pci_sub_device_id_example") and value is not None:
            value = f"0x{value:08X}"
        elif field == "other_pci_device_ids":
            value = [f"0x{v:08X}" for v in value]
        elif field == "power_limits_w":
            value = [(v.default_w, v.min_w, v.max_w) for v in value]
        elif field == "mig" and value is not None:
            value = [f"{p.name} (ID {p.id}) x{p.max_instances}" for p in value.gpu_instance_profiles]
        lines.append(f"  {field}: {value}")
        lines.append(f"      {source}")
    return "\n".join(lines)


def read_report(inventory: str, host: str, args: PyinfraArgs | None = None) -> dict[str, Any]:
    """The ``NvidiaSmiReport`` of ``host``, read by ``pyinfra --json INVENTORY fact`` (pyinfra's own SSH, the
    inventory's connection data)."""
    cmd = [pyinfra_executable(), "--json", *(args.argv() if args else ()), "--limit", host, inventory, "fact", FACT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    try:
        payload = json.loads(proc.stdout)
        report = payload[FACT][host]
    except (ValueError, KeyError, TypeError):
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise CommandError(f"{host}: could not read the GPUs with pyinfra (exit {proc.returncode}): "
                           f"{detail[-1] if detail else 'no output'}") from None
    if not isinstance(report, dict) or report.get("status") != "ok":
        why = report.get("error") if isinstance(report, dict) else report
        raise CommandError(f"{host}: nvidia-smi did not answer ({why}); learn needs the driver loaded")
    return report


def learn(report: dict[str, Any], host: str, catalog: Catalog, today: datetime.date | None = None,
          gpu_index: int = 0) -> dict[str, Any]:
    """The model document of the host's GPU ``gpu_index`` (its other GPUs of the same name are its boards)."""
    header, gpus = parse_q(report.get("q") or "")
    if not gpus or gpu_index >= len(gpus):
        raise CommandError(f"{host}: nvidia-smi -q lists {len(gpus)} GPU(s); no GPU {gpu_index}")
    gpu = gpus[gpu_index]
    boards = [g for g in gpus if g.get("Product Name") == gpu.get("Product Name")]
    caps = dict(line.split(", ", 1) for line in (report.get("compute_cap") or "").splitlines() if ", " in line)
    nvlink = report.get("nvlink") or ""
    links = sum(1 for line in nvlink.splitlines() if line.strip().startswith("Link "))
    known = catalog.by_pci_device_id(get(gpu, "PCI", "Device Id") or "")
    date = (today or datetime.datetime.now(datetime.timezone.utc).date()).isoformat()
    origin = f"nvidia-smi {header.get('Driver Version', '?')} on {host}, {date} (gpufleet catalog learn)"
    index = str(gpu_index)
    try:
        return learn_model(
            gpu, origin=origin, boards=boards, compute_cap=caps.get(index),
            nvlinks=links if nvlink.strip() else None, known=known,
            mig_profiles=parse_lgip(report.get("lgip") or "").get(gpu_index, []),
            mig_placements=parse_lgipp(report.get("lgipp") or "").get(gpu_index, {}),
            key=known.key if known is not None and known.name == gpu.get("Product Name") else None)
    except LearnError as err:
        raise CommandError(f"{host}: {err}") from None


def write_model(doc: dict[str, Any], directory: Path, force: bool = False) -> Path:
    """``directory/<key>.json`` (created; an existing file only with ``force``), written whole."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{doc['key']}.json"
    if path.exists() and not force:
        raise CommandError(f"{path} exists (--force replaces it)")
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def learn_command(inventory: str, host: str, directory: str | None, force: bool, args: PyinfraArgs | None,
                  echo: Callable[[str], None]) -> int:
    """Read ``host``, write its model, load it back with the strict loader. Exit code: 0 written, 2 not."""
    target = Path(directory) if directory else Path(inventory).resolve().parent / USER_DIRECTORY
    try:
        catalog = catalog_with(user_directory(inventory, directory) if target.is_dir() else None)
        doc = learn(read_report(inventory, host, args), host, catalog)
        path = write_model(doc, target, force)
        try:
            Catalog.from_directory(target)
        except CatalogError as err:  # pragma: no cover - learn_model's documents pass the loader (unit-tested)
            path.unlink()
            raise CommandError(f"{path}: the strict loader refused it: {err}") from None
    except CommandError as err:
        echo(f"gpufleet catalog learn: {err}")
        return 2
    echo(f"{host}: {doc['name']['value']} -> {path} (key {doc['key']}"
         f"{', replaces the packaged model' if doc['key'] in load_package_catalog() else ''})")
    return 0


__all__ = ["USER_DIRECTORY", "CommandError", "catalog_with", "learn", "learn_command", "list_lines", "read_report",
           "show_text", "user_directory", "write_model"]
