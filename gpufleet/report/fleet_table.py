"""A plain-text table of the fleet's GPUs, for people at a terminal."""

from __future__ import annotations

from collections import Counter

from pyinfra import logger

_rows: dict[str, dict] = {}

HEADER = ("HOST", "GPUS", "MODEL", "DRIVER", "POWER LIMIT W", "PERSISTENCE", "MIG", "STATUS")


def host_row(name: str, inventory_fact: dict) -> tuple[str, ...]:
    gpus = inventory_fact["gpus"]
    if inventory_fact["error"] and not gpus:
        return (name, "0", "-", "-", "-", "-", "-", inventory_fact["error"])
    models = Counter(g["name"] for g in gpus)

    def summary(key: str) -> str:
        values = sorted({"-" if g[key] is None else str(g[key]) for g in gpus})
        return values[0] if len(values) == 1 else "mixed: " + "/".join(values)

    return (name, str(len(gpus)), ", ".join(models), summary("driver_version"), summary("power_limit_w"),
            summary("persistence_mode"), summary("mig_current"), "ok")


def render(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [HEADER, *rows]]
    return "\n".join(lines)


def collect_and_print(host, inventory, inventory_fact: dict) -> None:
    """Called from a deploy once per host; logs the table after the last active host.

    Through pyinfra's logger (stderr), never stdout: ``pyinfra --json`` prints its JSON document there."""
    _rows[host.name] = host_row(host.name, inventory_fact)
    active = sorted(h.name for h in inventory.iter_activated_hosts())
    if set(active) <= set(_rows):
        logger.info("--> GPU inventory of the fleet:\n" + render([_rows[name] for name in active]) + "\n")
