"""Simulated ``nvidia-smi``: reads and writes the host's GPU state file (STATE.md), prints like the real tool.

Installed in a simulated host as ``simgpu.nvidia_smi`` and run by ``/usr/bin/nvidia-smi``
(``from simgpu.nvidia_smi import main; sys.exit(main(sys.argv[1:]))``). Stdlib only.
Output formats follow real 590-series captures (see tests/unit/test_sim_nvidia_smi.py).
"""

from __future__ import annotations

import sys

from . import state as st
from .smi_common import SmiExit, bad_option, init_nvml, invalid_combination, major, option_value, select

# Each action imports its own module when it runs (below): every fact read of a simulated host starts nvidia-smi,
# and importing them all cost about as much as Python's own start.

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
# --help-query-* texts (smi_help_query) by the driver generation of the installed nvidia-smi (595+ list kmd_version)
HELP_QUERY = {
    "help_gpu": ("GPU_590", "GPU_610"),
    "help_compute_apps": ("COMPUTE_APPS",) * 2,
    "help_accounted_apps": ("ACCOUNTED_APPS",) * 2,
    "help_retired_pages": ("RETIRED_PAGES",) * 2,
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
            from . import smi_mig

            lines, rc = smi_mig.run(argv[1:], state, version)
        elif argv[0] in ("dmon", "pmon"):
            from . import smi_monitor

            lines, rc = smi_monitor.run(argv[0], argv[1:])
        else:
            from . import smi_misc

            lines, rc = (smi_misc.nvlink if argv[0] == "nvlink" else smi_misc.topo)(argv[1:], state)
        return lines, rc, None
    opts = parse(argv)
    if opts.get("help"):
        from .smi_help import HELP, HELP_610

        version = _help_version()
        return [(HELP_610 if major(version) >= 610 else HELP).replace("{version}", version)], 0, None
    for option, texts in HELP_QUERY.items():
        if opts.get(option):  # static text: no driver needed
            from . import smi_help_query
            from .smi_query import KMD_VERSION_SINCE

            text = getattr(smi_help_query, texts[major(_help_version()) >= KMD_VERSION_SINCE])
            return [text.rstrip("\n") + "\n"], 0, None
    actions = [a for a in ACTIONS if a in opts]
    if len(actions) > 1:
        raise invalid_combination()
    action = actions[0] if actions else "table"
    filename = opts.get("filename")
    id_arg = opts.get("id")
    id_arg = id_arg if isinstance(id_arg, str) else None
    state, version = init_nvml()
    value = opts.get(action)
    value = value if isinstance(value, str) else ""
    fmt = opts.get("format")
    fmt = fmt if isinstance(fmt, str) else None
    if action in ("table", "list", "version", "query", "query_gpu", "query_apps", "query_accounted", "query_retired"):
        lines, rc = _report(action, state, select(state, id_arg), version, value, fmt, opts.get("display"))
    else:
        lines, rc = _change(action, id_arg, value, version)
    return lines, rc, filename if isinstance(filename, str) else None


def _report(action: str, state: dict[str, str], gpus: list, version: str, value: str, fmt: str | None,
            display) -> tuple[list[str], int]:
    """The actions that print what the GPUs are."""
    if action in ("table", "list", "version"):
        cuda = state.get("driver.cuda_version") or st.cuda_version_for(version)
        if action == "version":
            from . import smi_misc

            return smi_misc.version_banner(version, cuda), 0
        from . import smi_table

        return smi_table.summary(gpus, version, cuda) if action == "table" else smi_table.list_gpus(gpus)
    if action == "query":
        from . import smi_q

        return smi_q.query(state, gpus, display if isinstance(display, str) else None, version)
    from . import smi_query

    if action == "query_gpu":
        return smi_query.query_gpu(state, gpus, value, fmt, version)
    if action == "query_apps":
        return smi_query.query_compute_apps(gpus, value, fmt)
    query = smi_query.query_accounted_apps if action == "query_accounted" else smi_query.query_retired_pages
    return query(gpus, value, fmt)


def _change(action: str, id_arg: str | None, value: str, version: str) -> tuple[list[str], int]:
    """The actions that change a setting."""
    from . import smi_set

    if action == "pm":
        return smi_set.persistence(id_arg, value, version)
    if action == "pl":
        return smi_set.power_limit(id_arg, value, version)
    if action == "mig":
        return smi_set.mig_mode(id_arg, value, version)
    if action == "reset":
        return smi_set.gpu_reset(id_arg)
    if action in ("lgc", "rgc"):
        return smi_set.lock_clocks(id_arg, value if action == "lgc" else None)
    if action == "ecc":
        return smi_set.ecc_config(id_arg, value)
    return smi_set.compute_mode(id_arg, value)


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
