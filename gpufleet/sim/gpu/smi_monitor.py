"""``nvidia-smi dmon`` and ``pmon``: the real 590 / 595 column layout (captures' ``dmon -c 5`` / ``pmon -c 5``).

One sample per GPU (dmon) or per GPU process (pmon) every ``-d`` seconds (default 1), ``-c`` times, or until
interrupted as the real tool does without ``-c``. Readings come from the state file: power draw, temperatures,
utilization, clocks; the simulator has no encoder / decoder / JPEG / OFA load (0) and no per-process
utilization ("-", as the real tool prints for a process that did not run in the sample).
"""

from __future__ import annotations

import os
import sys
import time

from . import state as st
from .smi_common import Gpu, bad_option, select

DMON_HEADER = [
    "# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk ",
    "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz ",
]
PMON_HEADER = [
    "# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command ",
    "# Idx           #    C/G      %      %      %      %      %      %    name ",
]


def _options(argv: list[str]) -> tuple[str | None, int | None, float]:
    id_arg, count, delay = None, None, 1.0
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-i", "-c", "-d") and i + 1 < len(argv):
            value = argv[i + 1]
            i += 1
        else:
            raise bad_option(arg)
        if arg == "-i":
            id_arg = value
        elif arg == "-c":
            if not value.isdigit() or int(value) < 1:
                raise bad_option(value)
            count = int(value)
        else:
            if not value.isdigit() or int(value) < 1:
                raise bad_option(value)
            delay = float(value)
        i += 1
    return id_arg, count, delay


def _dmon_row(g: Gpu) -> str:
    util = ["-"] * 6 if g.mig_on else [str(g.i("util.gpu")), str(g.i("util.memory")), "0", "0", "0", "0"]
    cells = [str(g.i("power.draw_mw") // 1000), g.s("temp.gpu"), g.s("temp.memory") or "-", *util,
             g.s("clocks.mem"), g.s("clocks.graphics")]
    return f"{g.index:>5}" + "".join(f"{c:>7}" for c in cells) + " "


def _pmon_rows(g: Gpu) -> list[str]:
    procs = g.procs()
    if not procs:
        return [f"{g.index:>5}{'-':>11}{'-':>6}" + "".join(f"{'-':>7}" for _ in range(6)) + f"    {'-':<15}"]
    return [f"{g.index:>5}{p['pid']:>11}{p['type']:>6}" + "".join(f"{'-':>7}" for _ in range(6))
            + f"    {os.path.basename(p['name'])[:15]:<15}" for p in procs]


def run(kind: str, argv: list[str]) -> tuple[list[str], int]:
    """Print the header, then the samples as they are taken (a monitor streams); returns no further lines."""
    id_arg, count, delay = _options(argv)
    out = sys.stdout
    out.write("\n".join(DMON_HEADER if kind == "dmon" else PMON_HEADER) + "\n")
    taken = 0
    while count is None or taken < count:
        if taken:
            time.sleep(delay)
        state = st.read_state()
        rows = []
        for g in select(state, id_arg):
            rows += [_dmon_row(g)] if kind == "dmon" else _pmon_rows(g)
        out.write("\n".join(rows) + "\n")
        out.flush()
        taken += 1
    return [], 0
