"""
Slurm's view of a GPU node: ``/etc/slurm/gres.conf`` lines that match the node's GPUs and MIG devices.

How the GPUs are named (one decision, :func:`gres_text`):

* ``files``: ``AutoDetect=off``, then one ``Name=gpu Type=<type> File=/dev/nvidiaN`` line per GPU. The type is the
  name nvidia-smi prints, lower case, spaces as ``_``, without ``NVIDIA`` (``h100_80gb_hbm3``, ``a100-sxm4-40gb``,
  ``geforce_rtx_4090``): a substring of the type slurmd's NVML detection reports, so slurm.conf's
  ``Gres=gpu:<type>:N`` stays right if the node later moves to ``AutoDetect=nvml``.
* ``nvml``: ``AutoDetect=nvml``: slurmd finds GPUs and MIG devices itself (needs a slurmd built with NVML; Debian
  12's ``slurmd`` 22.05 is not). This is Slurm's own way for MIG: a MIG device is named by its GPU and
  ``/dev/nvidia-caps/nvidia-capN`` files whose numbers follow the GPU and compute instance ids the driver gives when
  the layout is created, which no plan can know in advance, and Slurm does not repartition MIG itself. The
  file carries, as comments, the node's GPUs and MIG devices from the node plan and the matching slurm.conf
  ``Gres=`` (a MIG device's type is its profile, e.g. ``gpu:1g.10gb:7``, a substring of NVML's name).
* ``auto`` (default): ``nvml`` on a node where the node plan's MIG layout enables MIG on a GPU, else ``files``.

``File=/dev/nvidiaN`` takes N from nvidia-smi's index: the driver numbers its device files in PCI bus order, as
nvidia-smi orders its indices, while every GPU is present. With a GPU fallen off the bus the file lists fewer GPUs
(Slurm then drains the node for its lower GRES count, which is what a lost GPU deserves), but the remaining GPUs'
device numbers are not known to nvidia-smi's query (only ``nvidia-smi -q``'s "Minor Number"): not handled yet.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence

from pyinfra import host
from pyinfra.api import OperationValueError, operation

from gpufleet.facts.files import check_path
from gpufleet.healthcheck_bundle import BUNDLE_NAME, bundle

from .managed_files import put_bytes, put_file
from .reads import get_state, read_together
from .units import systemctl

GRES_CONF = "/etc/slurm/gres.conf"
SLURMD = "slurmd.service"
HEALTHCHECK_BUNDLE = posixpath.join("/opt/gpufleet/healthcheck", BUNDLE_NAME)
HEALTHCHECK_PROGRAM = "/usr/local/sbin/gpufleet-healthcheck"  # slurm.conf HealthCheckProgram: an absolute path
HEALTHCHECK_PLAN = "/etc/gpufleet/healthcheck.json"  # gpufleet.healthcheck.node.PLAN_PATH
PYTHON = "/usr/bin/python3"
read_together(SLURMD, files=(GRES_CONF, HEALTHCHECK_BUNDLE, HEALTHCHECK_PROGRAM, HEALTHCHECK_PLAN))
MODES = ("auto", "files", "nvml")
HEADER = "# Managed by gpufleet (slurm stage), overwritten on every run."


def gres_type(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100_80gb_hbm3``: nvidia-smi's name, lower case, spaces as ``_``, without
    ``NVIDIA``."""
    words = name.strip().lower().split()
    if words and words[0] == "nvidia" and len(words) > 1:
        words = words[1:]
    return "_".join(words)


def _gres_line(counts: Mapping[str, int]) -> str:
    return ",".join(f"gpu:{kind}:{n}" for kind, n in counts.items())


def gres_text(gpus: Sequence[str], mig: Mapping[int, Mapping[str, int]] | None = None, mode: str = "auto") -> str:
    """gres.conf for GPUs named ``gpus`` (nvidia-smi names, index order) of which those in ``mig`` ({index:
    {profile: count}}) are MIG-enabled with these instances."""
    if mode not in MODES:
        raise OperationValueError(f"slurm.gres_conf: mode={mode!r}; allowed: {', '.join(MODES)}")
    if not gpus:
        raise OperationValueError("slurm.gres_conf: no GPU to describe (gpus is empty)")
    mig = {int(i): dict(c) for i, c in (mig or {}).items() if c}
    unknown = sorted(i for i in mig if not 0 <= i < len(gpus))
    if unknown:
        raise OperationValueError(f"slurm.gres_conf: MIG layout for GPU {unknown[0]}; this node has GPUs "
                                  f"0-{len(gpus) - 1}")
    if mode == "auto":
        mode = "nvml" if mig else "files"
    if mode == "files" and mig:
        raise OperationValueError("slurm.gres_conf: mode='files' with a MIG layout; allowed: auto or nvml (MIG "
                                  "devices are found by slurmd through NVML)")
    counts: Counter[str] = Counter()
    for index, name in enumerate(gpus):
        if index in mig:
            counts.update({profile: n for profile, n in mig[index].items()})
        else:
            counts[gres_type(name)] += 1
    lines = [HEADER]
    if mode == "files":
        lines.append(f"# slurm.conf for this node: Gres={_gres_line(counts)}")
        lines.append("AutoDetect=off")
        lines += [f"Name=gpu Type={gres_type(name)} File=/dev/nvidia{i}" for i, name in enumerate(gpus)]
    else:
        lines.append("# slurmd finds the GPUs and MIG devices through NVML. This node, by gpufleet's plan:")
        for index, name in enumerate(gpus):
            if index in mig:
                shown = ", ".join(f"{n} x {profile}" for profile, n in mig[index].items())
                lines.append(f"#   GPU {index}: {name}, MIG: {shown}")
            else:
                lines.append(f"#   GPU {index}: {name}")
        lines.append("# slurm.conf for this node (a type matches a substring of NVML's name):")
        lines.append(f"#   Gres={_gres_line(counts)}")
        lines.append("AutoDetect=nvml")
    return "\n".join(lines) + "\n"


@operation()
def gres_conf(gpus: list[str], mig: dict[int, dict[str, int]] | None = None, mode: str = "auto",
              path: str = GRES_CONF):
    """
    Write Slurm's ``gres.conf`` for this node's GPUs; restart slurmd when the file changed and slurmd runs.

    + gpus: the GPUs' names as nvidia-smi prints them, in index order
    + mig: ``{GPU index: {MIG profile: count}}`` of the MIG-enabled GPUs (from the node plan's layout)
    + mode: ``files`` (one ``File=/dev/nvidiaN`` line per GPU), ``nvml`` (``AutoDetect=nvml``), or ``auto``:
      nvml where a GPU has MIG enabled, else files
    + path: the file, beside ``slurm.conf``

    The file is mode 0644, owned by root. A changed file restarts ``slurmd`` where it is installed and running
    (``systemctl try-restart``); slurm.conf's ``Gres=`` for the node is in the file's comments.

    **Example:**

    .. code:: python

        from gpufleet.operations import slurm

        slurm.gres_conf(
            name="Slurm gres.conf",
            gpus=["NVIDIA H100 80GB HBM3"] * 8,
            mig={0: {"1g.10gb": 7}},
        )
    """
    check_path(path)
    text = gres_text(gpus, mig, mode)
    current = get_state(paths=(path,), units=(SLURMD,))
    commands = list(put_file(current["files"][path], path, text))
    if not commands:
        host.noop(f"{path} describes {len(gpus)} GPU(s)")
        return
    yield from commands
    if current["units"][SLURMD]["load_state"] == "loaded":
        yield systemctl("try-restart", SLURMD)


def healthcheck_program_text() -> str:
    """``gpufleet-healthcheck``: the bundle under the node's Python, with root's usual PATH (slurmd runs it with
    an environment of its own; the check calls ``sinfo``, ``scontrol`` and ``journalctl``)."""
    return ("#!/bin/sh\n# Managed by gpufleet (slurm stage): Slurm's HealthCheckProgram (gpufleet/healthcheck).\n"
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nexport PATH\n"
            f"exec {shlex.quote(PYTHON)} {shlex.quote(HEALTHCHECK_BUNDLE)} \"$@\"\n")


def slurm_conf_lines(interval: int, node_state: list[str]) -> list[str]:
    """The slurm.conf lines that make Slurm run the health check (slurm.conf.5 of Slurm 22.05)."""
    return [f"HealthCheckProgram={HEALTHCHECK_PROGRAM}", f"HealthCheckInterval={interval}",
            f"HealthCheckNodeState={','.join(node_state)}"]


@operation()
def healthcheck(plan: dict):
    """
    Install ``gpufleet-healthcheck``, Slurm's health check program for this GPU node, and the node's plan it
    checks against.

    + plan: the node's plan for the check (``gpufleet.healthcheck.node``): ``node`` (its Slurm name), ``gpu_count``,
      ``gpu_model``, ``persistence``, ``mig``, ``nvswitch``, ``checks`` (the check groups), ``reason_prefix``

    Writes the zip application (verify's checks, the probe, nvidia-ml-py) under /opt/gpufleet/healthcheck,
    ``/usr/local/sbin/gpufleet-healthcheck`` (0755) and ``/etc/gpufleet/healthcheck.json``. Nothing restarts: Slurm
    runs the program afresh every ``HealthCheckInterval``.

    **Example:**

    .. code:: python

        from gpufleet.operations import slurm

        slurm.healthcheck(
            name="Slurm health check",
            plan={"node": "gpu01", "gpu_count": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "persistence": True,
                  "mig": None, "nvswitch": True, "checks": ["gpus", "xid"], "reason_prefix": "gpufleet health"},
        )
    """
    current = get_state(paths=(HEALTHCHECK_BUNDLE, HEALTHCHECK_PROGRAM, HEALTHCHECK_PLAN))["files"]
    commands = [*put_bytes(current[HEALTHCHECK_BUNDLE], HEALTHCHECK_BUNDLE, bundle()),
                *put_file(current[HEALTHCHECK_PROGRAM], HEALTHCHECK_PROGRAM, healthcheck_program_text(), mode="755"),
                *put_file(current[HEALTHCHECK_PLAN], HEALTHCHECK_PLAN, json.dumps(plan, indent=1, sort_keys=True)
                          + "\n")]
    if not commands:
        host.noop(f"{HEALTHCHECK_PROGRAM} checks {plan.get('gpu_count')} GPU(s)")
        return
    yield from commands
