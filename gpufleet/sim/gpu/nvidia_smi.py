"""Simulated ``nvidia-smi``: reads and writes the host's GPU state file (STATE.md), prints like the real tool.

Installed in a simulated host as ``simgpu.nvidia_smi`` and run by ``/usr/bin/nvidia-smi``
(``from simgpu.nvidia_smi import main; sys.exit(main(sys.argv[1:]))``). Stdlib only.
Output formats follow real 590-series captures (see tests/unit/test_sim_nvidia_smi.py).
"""

from __future__ import annotations

import sys

from . import smi_help_query, smi_mig, smi_misc, smi_monitor, smi_q, smi_query, smi_set, smi_table
from . import state as st
from .smi_common import SmiExit, bad_option, init_nvml, invalid_combination, major, option_value, select
from .smi_help import HELP, HELP_610

# option spellings -> destination; VALUE options take an argument
VALUE_OPTIONS = {
    "-i": "id", "--id": "id",
    "-f": "filename", "--filename": "filename",
    "-l": "loop", "--loop": "loop", "-lms": "loop", "--loop-ms": "loop",
    "-d": "display", "--display": "display",
    "--query-gpu": "query_gpu", "--query-compute-apps": "query_apps",
    "--query-accounted-apps": "query_accounted", "--query-retired-pages": "query_retired",
    "--format": "format",
    "-pm": "pm", "--persistence-mode": "pm",
    "-pl": "pl", "--power-limit": "pl",
    "-sc": "scope", "--scope": "scope",
    "-mig": "mig", "--multi-instance-gpu": "mig",
    "-lgc": "lgc", "--lock-gpu-clocks": "lgc",
    "-m": "mode", "--mode": "mode",
    "-e": "ecc", "--ecc-config": "ecc",
    "-c": "compute_mode", "--compute-mode": "compute_mode",
}  # fmt: skip
FLAG_OPTIONS = {
    "-h": "help", "--help": "help",
    "--version": "version",
    "-L": "list", "--list-gpus": "list",
    "-q": "query", "--query": "query",
    "-r": "reset", "--gpu-reset": "reset",
    "-rgc": "rgc", "--reset-gpu-clocks": "rgc",
    "-eow": "eow", "--error-on-warning": "eow",
    "--help-query-gpu": "help_gpu", "--help-query-compute-apps": "help_compute_apps",
    "--help-query-accounted-apps": "help_accounted_apps", "--help-query-retired-pages": "help_retired_pages",
}  # fmt: skip
# --help-query-* texts by the driver generation of the installed nvidia-smi (595+ list kmd_version)
HELP_QUERY = {
    "help_gpu": (smi_help_query.GPU_590, smi_help_query.GPU_610),
    "help_compute_apps": (smi_help_query.COMPUTE_APPS,) * 2,
    "help_accounted_apps": (smi_help_query.ACCOUNTED_APPS,) * 2,
    "help_retired_pages": (smi_help_query.RETIRED_PAGES,) * 2,
}
ACTIONS = ("version", "list", "query", "query_gpu", "query_apps", "query_accounted", "query_retired", "pm", "pl",
           "mig", "reset", "lgc", "rgc", "ecc", "compute_mode")  # fmt: skip
SUBCOMMANDS = ("mig", "nvlink", "topo", "dmon", "pmon")


def parse(argv: list[str]) -> dict[str, str | bool]:
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if arg in FLAG_OPTIONS:
            opts[FLAG_OPTIONS[arg]] = True
        elif name in VALUE_OPTIONS:
            value, i = option_value(argv, i, eq, value)
            opts[VALUE_OPTIONS[name]] = value
        else:
            raise bad_option(arg)
        i += 1
    return opts


def _run(argv: list[str]) -> tuple[list[str], int, str | None]:
    if argv and argv[0] in SUBCOMMANDS:
        state, version = init_nvml()
        if argv[0] == "mig":
            lines, rc = smi_mig.run(argv[1:], state, version)
        elif argv[0] == "nvlink":
            lines, rc = smi_misc.nvlink(argv[1:], state)
        elif argv[0] in ("dmon", "pmon"):
            lines, rc = smi_monitor.run(argv[0], argv[1:])
        else:
            lines, rc = smi_misc.topo(argv[1:], state)
        return lines, rc, None
    opts = parse(argv)
    if opts.get("help"):
        version = _help_version()
        return [(HELP_610 if major(version) >= 610 else HELP).replace("{version}", version)], 0, None
    for option, texts in HELP_QUERY.items():
        if opts.get(option):  # static text: no driver needed
            return [texts[major(_help_version()) >= smi_query.KMD_VERSION_SINCE].rstrip("\n") + "\n"], 0, None
    actions = [a for a in ACTIONS if a in opts]
    if len(actions) > 1:
        raise invalid_combination()
    action = actions[0] if actions else "table"
    filename = opts.get("filename")
    id_arg = opts.get("id")
    id_arg = id_arg if isinstance(id_arg, str) else None
    state, version = init_nvml()
    cuda = state.get("driver.cuda_version") or st.cuda_version_for(version)
    value = opts.get(action)
    value = value if isinstance(value, str) else ""
    if action == "table":
        lines, rc = smi_table.summary(select(state, id_arg), version, cuda)
    elif action == "list":
        lines, rc = smi_table.list_gpus(select(state, id_arg))
    elif action == "version":
        lines, rc = smi_misc.version_banner(version, cuda), 0
    elif action == "query":
        display = opts.get("display")
        lines, rc = smi_q.query(state, select(state, id_arg), display if isinstance(display, str) else None, version)
    elif action == "query_gpu":
        fmt = opts.get("format")
        lines, rc = smi_query.query_gpu(
            state, select(state, id_arg), value, fmt if isinstance(fmt, str) else None, version
        )
    elif action == "query_apps":
        fmt = opts.get("format")
        lines, rc = smi_query.query_compute_apps(select(state, id_arg), value, fmt if isinstance(fmt, str) else None)
    elif action in ("query_accounted", "query_retired"):
        fmt = opts.get("format")
        query = smi_query.query_accounted_apps if action == "query_accounted" else smi_query.query_retired_pages
        lines, rc = query(select(state, id_arg), value, fmt if isinstance(fmt, str) else None)
    elif action == "pm":
        lines, rc = smi_set.persistence(id_arg, value, version)
    elif action == "pl":
        lines, rc = smi_set.power_limit(id_arg, value, version)
    elif action == "mig":
        lines, rc = smi_set.mig_mode(id_arg, value, version)
    elif action == "reset":
        lines, rc = smi_set.gpu_reset(id_arg)
    elif action in ("lgc", "rgc"):
        lines, rc = smi_set.lock_clocks(id_arg, value if action == "lgc" else None)
    elif action == "ecc":
        lines, rc = smi_set.ecc_config(id_arg, value)
    else:
        lines, rc = smi_set.compute_mode(id_arg, value)
    return lines, rc, filename if isinstance(filename, str) else None


def _help_version() -> str:
    from .smi_common import installed_version

    try:
        return installed_version(st.read_state()) or "590.48.01"
    except OSError:
        return installed_version({}) or "590.48.01"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    filename = None
    try:
        lines, rc, filename = _run(argv)
    except SmiExit as stop:
        lines, rc = stop.lines, stop.rc
    text = "\n".join(lines) + "\n" if lines else ""
    if filename:
        with open(filename, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
