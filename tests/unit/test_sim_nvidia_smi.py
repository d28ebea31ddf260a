"""The simulated nvidia-smi (gpufleet/sim/gpu/nvidia_smi.py) against REAL nvidia-smi output.

Real output pinned below is copied verbatim from reference/captures (H100 80GB HBM3 and H100 in MIG mode,
driver 590.48.01) and reference/nvidia_ground_truth.md (§2: messages, -lgip / -lgipp / -cgi / -lgi samples).
Where the reference directory is available (env GPUFLEET_REFERENCE_DIR, <repo>/shared/reference or
<repo>/../shared/reference) the full captures are compared too (whole -q layout, full --query-gpu header).

Tables are compared by *structure*: every digit becomes 9 (and hex of ids / UUIDs is normalised), so the
simulator must print the same line lengths, fixed text, column positions, units and placeholders as the real
tool while its readings may differ.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from reference import REFERENCE

from gpufleet.sim.gpu import nvidia_smi
from gpufleet.sim.gpu import state as simstate
from gpufleet.sim.hardware import PROFILES, build_state

DRIVER_590 = "590.48.01"
DRIVER_570 = "570.172.08"
DRIVER_580 = "580.126.09"

# ----------------------------------------------------------------------------------------------------------------
# Real output (verbatim)
# ----------------------------------------------------------------------------------------------------------------

# captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, "idle :: nvidia-smi (default table)"
REAL_H100_TABLE = """\
Tue Jul 14 08:12:38 2026       
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 590.48.01              Driver Version: 590.48.01      CUDA Version: 13.1     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:09.0 Off |                    0 |
| N/A   41C    P0             69W /  700W |       0MiB /  81559MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""  # noqa: W291

# captures/linux-x86_64__nvidia-h100-mig__590.48.01.txt, "idle :: nvidia-smi (default table)"
REAL_H100_MIG_TABLE = """\
Tue Jul 14 09:00:26 2026       
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 590.48.01              Driver Version: 590.48.01      CUDA Version: 13.1     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:09.0 Off |                   On |
| N/A   42C    P0             98W /  700W |      59MiB /  81559MiB |     N/A      Default |
|                                         |                        |              Enabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|
|  0    2   0   0  |              26MiB / 40448MiB    | 60      0 |  3   0    3    0    3 |
|                  |               0MiB / 24739MiB    |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
|  0    3   0   1  |              17MiB / 20096MiB    | 32      0 |  2   0    2    0    2 |
|                  |               0MiB / 12369MiB    |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
|  0    9   0   2  |               9MiB /  9984MiB    | 16      0 |  1   0    1    0    1 |
|                  |               0MiB /  6184MiB    |           |                       |
+------------------+----------------------------------+-----------+-----------------------+
|  0   10   0   3  |               9MiB /  9984MiB    | 16      0 |  1   0    1    0    1 |
|                  |               0MiB /  6184MiB    |           |                       |
+------------------+----------------------------------+-----------+-----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""  # noqa: W291

# the same capture, "load" section: process rows with and without MIG
REAL_PROC_ROW = "|    0   N/A  N/A           11327      C   /root/tools/memhog                     2566MiB |"
REAL_MIG_PROC_ROW = "|    0    2    0            21180      C   /root/tools/memhog                     2296MiB |"

# captures/linux-x86_64__nvidia-h100-mig__590.48.01.txt, "capabilities :: list (-L)" (UUIDs masked there)
REAL_H100_MIG_LIST = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)
  MIG 3g.40gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)
  MIG 2g.20gb     Device  1: (UUID: MIG-00000001-0000-0000-0000-000000000001)
  MIG 1g.10gb     Device  2: (UUID: MIG-00000002-0000-0000-0000-000000000002)
  MIG 1g.10gb     Device  3: (UUID: MIG-00000003-0000-0000-0000-000000000003)
"""

# nvidia_ground_truth.md §2.6: `sudo nvidia-smi mig -lgip`, H100 80GB HBM3 [REAL], GPU 0's rows
REAL_H100_LGIP = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     7/7        9.75       No     16     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     1/1        9.75       No     16     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.20gb       15     4/4        19.62      No     26     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 2g.20gb       14     3/3        19.62      No     32     2     0   |
|                                                             2     2     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.40gb        9     2/2        39.50      No     60     3     0   |
|                                                             3     3     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 4g.40gb        5     1/1        39.50      No     64     4     0   |
|                                                             4     4     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.80gb        0     1/1        79.25      No     132    7     0   |
|                                                             8     7     1   |
+-----------------------------------------------------------------------------+
"""

# §2.6, GB200 on a 580-series driver (wide layout): header and first row
REAL_WIDE_LGIP_HEADER = """\
+-------------------------------------------------------------------------------+
| GPU instance profiles:                                                        |
| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                                Free/Total   GiB              CE    JPEG  OFA  |
|===============================================================================|
|   0  MIG 1g.23gb         19     7/7        22.00      No     18     1     0   |
|                                                               2     1     0   |
"""

# §2.6 `nvidia-smi mig -i 0 -lgipp`, H100 80GB [REAL]
REAL_H100_LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""

# §2.6 `sudo nvidia-smi mig -i 0 -cgi 19,19,19,19,19,19,19 -C`, H100 [REAL]
REAL_H100_CGI_7X1G = """\
Successfully created GPU instance ID 13 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID 13 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID 11 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID 11 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID 12 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID 12 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID  7 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  7 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID  8 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  8 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID  9 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID  9 using profile MIG 1g.10gb (ID  0)
Successfully created GPU instance ID 10 on GPU  0 using profile MIG 1g.10gb (ID 19)
Successfully created compute instance ID  0 on GPU  0 GPU instance ID 10 using profile MIG 1g.10gb (ID  0)
"""

# §2.6 `sudo nvidia-smi mig -i 0 -lgi` after the above, H100 [REAL]
REAL_H100_LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.10gb         19        7          0:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        8          1:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        9          2:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19       10          3:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19       11          4:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19       12          5:1     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19       13          6:1     |
+-------------------------------------------------------+
"""

# §2.6 `sudo nvidia-smi mig -i 0 -lci` (head and first row), H100 [REAL]
REAL_H100_LCI_HEAD = """\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
|   0      7       MIG 1g.10gb          0         0          0:1     |
+--------------------------------------------------------------------+
"""

# §2.6 MIG user guide, A100 40GB: `sudo nvidia-smi mig -cgi 19,19,14,9`
REAL_A100_CGI_INSUFFICIENT = """\
Successfully created GPU instance ID 13 on GPU  0 using profile MIG 1g.5gb (ID 19)
Successfully created GPU instance ID 11 on GPU  0 using profile MIG 1g.5gb (ID 19)
Successfully created GPU instance ID  3 on GPU  0 using profile MIG 2g.10gb (ID 14)
Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources
Failed to create GPU instances: Insufficient Resources
"""

# captures (H100 590.48.01, -q): the power section layout
REAL_H100_POWER_SECTION = """\
    GPU Power Readings
        Average Power Draw                             : 69.85 W
        Instantaneous Power Draw                       : 69.62 W
        Current Power Limit                            : 700.00 W
        Requested Power Limit                          : 700.00 W
        Default Power Limit                            : 700.00 W
        Min Power Limit                                : 200.00 W
        Max Power Limit                                : 700.00 W
    GPU Memory Power Readings 
        Average Power Draw                             : 43.19 W
        Instantaneous Power Draw                       : N/A
    Module Power Readings
        Average Power Draw                             : N/A
        Instantaneous Power Draw                       : N/A
        Current Power Limit                            : N/A
        Requested Power Limit                          : N/A
        Default Power Limit                            : N/A
        Min Power Limit                                : N/A
        Max Power Limit                                : N/A
    Power Smoothing                                    : N/A
    Workload Power Profiles
        Requested Profiles                             : N/A
        Enforced Profiles                              : N/A
    EDPp Multiplier                                    : 100.00%
"""  # noqa: W291

# -q -d power, driver 590.48.01 (laptop, open-gpu-kernel-modules#483): header and the Power Samples block labels
REAL_Q_POWER_HEAD = """\

==============NVSMI LOG==============

Timestamp                                              : Thu Feb  5 13:46:20 2026
Driver Version                                         : 590.48.01
CUDA Version                                           : 13.1

Attached GPUs                                          : 1
GPU 00000000:01:00.0
    GPU Power Readings
"""

# The real H100 idle row values for the fields whose placeholders / units matter (captures, --query-gpu)
REAL_H100_QUERY = {
    "name": "NVIDIA H100 80GB HBM3",
    "pci.bus_id": "00000000:00:09.0",
    "driver_version": "590.48.01",
    "persistence_mode": "Enabled",
    "power.draw [W]": "69.85 W",
    "power.limit [W]": "700.00 W",
    "enforced.power.limit [W]": "700.00 W",
    "power.default_limit [W]": "700.00 W",
    "power.min_limit [W]": "200.00 W",
    "power.max_limit [W]": "700.00 W",
    "power.management": "[Requested functionality has been deprecated]",
    "temperature.gpu": "41",
    "temperature.memory": "48",
    "clocks.current.sm [MHz]": "345 MHz",
    "clocks.current.memory [MHz]": "2619 MHz",
    "clocks.max.sm [MHz]": "1980 MHz",
    "clocks.max.memory [MHz]": "2619 MHz",
    "clocks_event_reasons.supported": "0x00000000000001FF",
    "clocks_event_reasons.active": "0x0000000000000001",
    "clocks_event_reasons.gpu_idle": "Active",
    "clocks_event_reasons.sw_power_cap": "Not Active",
    "clocks_event_reasons.hw_slowdown": "Not Active",
    "ecc.mode.current": "Enabled",
    "ecc.mode.pending": "Enabled",
    "ecc.errors.uncorrected.volatile.total": "0",
    "ecc.errors.uncorrected.aggregate.total": "0",
    "retired_pages.single_bit_ecc.count": "[N/A]",
    "retired_pages.double_bit.count": "[N/A]",
    "retired_pages.pending": "[N/A]",
    "remapped_rows.correctable": "0",
    "remapped_rows.uncorrectable": "0",
    "remapped_rows.pending": "No",
    "remapped_rows.failure": "No",
    "pcie.link.gen.current": "5",
    "pcie.link.gen.max": "5",
    "pcie.link.gen.gpucurrent": "5",
    "pcie.link.gen.gpumax": "5",
    "pcie.link.width.current": "16",
    "pcie.link.width.max": "16",
    "mig.mode.current": "Disabled",
    "mig.mode.pending": "Disabled",
    "memory.total [MiB]": "81559 MiB",
    "memory.reserved [MiB]": "479 MiB",
    "memory.used [MiB]": "0 MiB",
    "memory.free [MiB]": "81081 MiB",
    "utilization.gpu [%]": "0 %",
    "utilization.memory [%]": "0 %",
    "pstate": "P0",
    "fan.speed [%]": "[N/A]",
    "compute_mode": "Default",
    "vbios_version": "96.00.A5.00.01",
    "count": "1",
    "index": "0",
}

# ----------------------------------------------------------------------------------------------------------------
# Harness
# ----------------------------------------------------------------------------------------------------------------


needs_reference = pytest.mark.reference  # real captures: always present in tests/fixtures/reference


def capture_section(filename: str, title: str) -> list[str]:
    """Lines of one ``# <title>`` section of a capture file (without the trailing blank lines)."""
    lines = (REFERENCE / "captures" / filename).read_text(encoding="utf-8").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {title}"))
    body = []
    for line in lines[start + 3 :]:
        if line.startswith("#####"):
            break
        body.append(line)
    while body and body[-1] == "":
        body.pop()
    return body


def shape(text: str) -> str:
    """Structure of nvidia-smi output: digits -> 9, bus ids and UUID hex normalised, weekday/month kept apart."""
    text = re.sub(r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r"\1-UUID", text)
    text = re.sub(r"\b[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]\b", "BUSID", text)
    text = re.sub(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", "TIMESTAMP", text, flags=re.M)
    return re.sub(r"\d", "9", text)


class Smi:
    """Runs the simulated nvidia-smi's main() in-process against a state file."""

    def __init__(self, path: Path, capsys):
        self.path = path
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[str, int]:
        self.capsys.readouterr()
        rc = nvidia_smi.main(list(args))
        out = self.capsys.readouterr()
        assert out.err == "", out.err
        return out.out, rc

    def edit(self, **values: str) -> None:
        with simstate.locked(str(self.path)) as state:
            for key, value in values.items():
                state[key.replace("__", ".")] = value

    def set(self, key: str, value: str) -> None:
        with simstate.locked(str(self.path)) as state:
            state[key] = value

    def state(self) -> dict[str, str]:
        return simstate.read_state(str(self.path))


@pytest.fixture
def make_smi(tmp_path, monkeypatch, capsys):
    """make_smi(profile, driver=..., root=True, loaded=True, installed=None, gpus=None) -> Smi"""

    def make(profile: str = "h100-sxm-8", driver: str = DRIVER_590, root: bool = True, loaded: bool = True,
             installed: str | None = None, hostname: str = "gpu-node-01") -> Smi:  # fmt: skip
        state = build_state(profile, hostname)
        if loaded:
            simstate.reset_for_boot(state, driver)
        path = tmp_path / f"{profile}.state"
        simstate.write_state(str(path), state)
        version_file = tmp_path / "driver-version"
        version_file.write_text((installed or driver) + "\n", encoding="utf-8")
        monkeypatch.setenv("GPUFLEET_SIM_STATE", str(path))
        monkeypatch.setenv("GPUFLEET_SIM_DRIVER_VERSION_FILE", str(version_file))
        monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
        return Smi(path, capsys)

    return make


@pytest.fixture
def holder():
    """A live process to register as a GPU client / compute process."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def h100_like_capture(make_smi) -> Smi:
    """An H100 board tuned to the capture's idle conditions (persistence on, fabric up)."""
    smi = make_smi("h100-sxm-8", hostname="capture-like")
    smi.edit(
        **{
            "gpu.0.persistence": "1",
            "gpu.0.temp.gpu": "41",
            "gpu.0.temp.memory": "48",
            "gpu.0.power.draw_mw": "69850",
            "fabric.state": "completed",
        }
    )
    return smi


def with_capture_mig_layout(smi: Smi) -> Smi:
    """MIG on GPU 0 with the MIG capture's instances: 3g.40gb, 2g.20gb and 2x 1g.10gb, each with its CI."""
    assert smi("-i", "0", "-mig", "1")[1] == 0
    out, rc = smi("mig", "-i", "0", "-cgi", "9,14,19,19", "-C")
    assert rc == 0, out
    return smi


# ----------------------------------------------------------------------------------------------------------------
# Default table, -L
# ----------------------------------------------------------------------------------------------------------------


def test_default_table_has_the_real_h100_structure(make_smi):
    smi = h100_like_capture(make_smi)
    out, rc = smi("-i", "0")
    assert rc == 0
    assert shape(out) == shape(REAL_H100_TABLE)
    lines = out.split("\n")
    assert lines[0].endswith("       ")  # the real timestamp line ends with 7 spaces
    assert "| N/A   41C    P0             69W /  700W |" in out  # exact cell text for the capture's readings
    assert all(len(line) == 91 for line in lines[1:] if line.startswith(("|", "+")))


def test_default_table_all_gpus_and_values(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi()
    assert rc == 0
    rows = [line for line in out.split("\n") if re.match(r"^\|\s+\d+  NVIDIA", line)]
    assert [int(r.split()[1]) for r in rows] == list(range(8))
    assert "NVIDIA-SMI 590.48.01              Driver Version: 590.48.01      CUDA Version: 13.1     |" in out
    assert "00000000:18:00.0" in rows[0] and "00000000:DB:00.0" in rows[7]
    assert "Off |" in rows[0]  # persistence off after boot
    grid = "+-----------------------------------------+------------------------+----------------------+"
    assert out.count(grid) == 1 + 8  # header + after each GPU


def test_default_table_truncates_long_names_like_the_real_tool(make_smi):
    smi = make_smi("rtx4090-1")
    smi.set("gpu.0.name", "NVIDIA GeForce RTX 4080 SUPER")
    out, _ = smi()
    # real RTX 4080 SUPER capture: "|   0  NVIDIA GeForce RTX 4080 ...    Off |"
    assert "|   0  NVIDIA GeForce RTX 4080 ...    Off |" in out
    assert re.search(r"^\|  0%   \d\dC    P8 +\d+W /  450W \|", out, re.M)  # GeForce: fan %, P8 idle
    assert out.split("\n")[8].endswith("|                  Off |")  # ECC supported but off on GeForce
    smi.set("gpu.0.display.active", "1")  # a desktop on it: Disp.A On, like the real RTX 4080 SUPER capture
    assert "|   00000000:01:00.0  On |" in smi()[0]
    assert smi("--query-gpu=display_active", "--format=csv,noheader")[0] == "Enabled\n"


def test_mig_table_has_the_real_h100_mig_structure(make_smi):
    smi = h100_like_capture(make_smi)
    smi.edit(**{"gpu.0.power.draw_mw": "98000", "gpu.0.temp.gpu": "42"})
    with_capture_mig_layout(smi)
    out, rc = smi("-i", "0")
    assert rc == 0
    assert shape(out) == shape(REAL_H100_MIG_TABLE)
    # same GI / CI / device numbering and engine columns as the real capture
    for real in ("|  0    2   0   0  |", "|  0    3   0   1  |", "|  0    9   0   2  |", "|  0   10   0   3  |",
                 "| 60      0 |  3   0    3    0    3 |", "| 16      0 |  1   0    1    0    1 |",
                 "|              26MiB / 40448MiB    |", "|               9MiB /  9984MiB    |"):  # fmt: skip
        assert real in out


# captures/linux-x86_64__nvidia-h100-mig__590.48.01.txt, -q: the first MIG device (GI 2, 3g.40gb), up to FB usage
REAL_Q_MIG_DEVICE = """\
    MIG Device
        Index                                          : 0
        GPU Instance ID                                : 2
        Compute Instance ID                            : 0
        Device Attributes
            Shared
                Multiprocessor count                   : 60
                Copy Engine count                      : 3
                Encoder count                          : 0
                Decoder count                          : 3
                OFA count                              : 0
                JPG count                              : 3
        ECC Errors
            Volatile
                SRAM Uncorrectable                     : 0
        Shared FB Memory Usage
            Total                                      : 40448 MiB
            Reserved                                   : 0 MiB
            Used                                       : 26 MiB
            Free                                       : 40423 MiB
        Shared BAR1 Memory
"""


def test_q_mig_devices_like_real(make_smi):
    smi = with_capture_mig_layout(make_smi("h100-sxm-8"))
    out, rc = smi("-q", "-i", "0")
    assert rc == 0
    assert "    MIG Mode\n        Current                                        : Enabled\n" in out
    assert "\n" + REAL_Q_MIG_DEVICE in out
    assert out.count("    MIG Device\n") == 4
    assert "    Remapped Rows                                      : N/A\n" in out  # real MIG capture
    assert "        GPU                                            : N/A\n" in out  # utilization in MIG mode


def test_process_rows_match_real_layout(make_smi, holder):
    smi = make_smi("h100-sxm-8")
    smi.set(f"gpu.0.proc.{holder}", "/root/tools/memhog,2566")
    out, _ = smi("-i", "0")
    row = next(line for line in out.split("\n") if "/root/tools/memhog" in line)
    assert row[17:33] == f"{holder:>16}"  # the PID column
    assert row[:17] + row[33:] == REAL_PROC_ROW[:17] + REAL_PROC_ROW[33:]
    assert row.endswith("2566MiB |") and len(row) == 91
    assert "|       0MiB /  81559MiB |" not in out  # memory.used includes the process
    # in MIG mode the GI/CI columns carry the instance ids
    smi.set("gpu.0.mig.current", "1")
    smi("mig", "-i", "0", "-cgi", "9", "-C")
    smi.set(f"gpu.0.proc.{holder}", "/root/tools/memhog,2296,2,0")
    out, _ = smi("-i", "0")
    row = next(line for line in out.split("\n") if "/root/tools/memhog" in line)
    assert row[:17] + row[33:] == REAL_MIG_PROC_ROW[:17] + REAL_MIG_PROC_ROW[33:]


def test_list_gpus_with_mig_devices_like_real(make_smi):
    smi = with_capture_mig_layout(make_smi("h100-sxm-8"))
    out, rc = smi("-L", "-i", "0")
    assert rc == 0
    assert shape(out) == shape(REAL_H100_MIG_LIST)
    uuids = re.findall(r"MIG-[0-9a-f-]{36}", out)
    assert len(set(uuids)) == 4
    out_all, _ = smi("-L")
    assert out_all.count("\nGPU ") + 1 == 8 and out_all.startswith(out)


# ----------------------------------------------------------------------------------------------------------------
# --query-gpu / --query-compute-apps
# ----------------------------------------------------------------------------------------------------------------


def _query(smi: Smi, fields: list[str], fmt: str = "csv", *extra: str) -> tuple[list[str], int]:
    out, rc = smi(f"--query-gpu={','.join(fields)}", f"--format={fmt}", *extra)
    return out.rstrip("\n").split("\n"), rc


def test_query_gpu_header_units_and_values_like_real_h100(make_smi):
    smi = h100_like_capture(make_smi)
    smi.set("gpu.0.memory.reserved_mib", "479")
    headers = list(REAL_H100_QUERY)
    fields = [h.split(" [")[0] for h in headers]
    lines, rc = _query(smi, fields, "csv", "-i", "0")
    assert rc == 0
    assert lines[0] == ", ".join(headers)
    values = dict(zip(headers, lines[1].split(", "), strict=True))
    stable = {"power.draw [W]", "temperature.gpu", "temperature.memory", "pci.bus_id", "count"}
    for header, real in REAL_H100_QUERY.items():
        if header in stable:
            assert shape(values[header]) == shape(real), header
        else:
            assert values[header] == real, header
    assert values["count"] == "8"


def test_query_gpu_aliases_print_canonical_names(make_smi):
    smi = make_smi("h100-sxm-8")
    lines, _ = _query(smi, ["gpu_uuid", "gpu_name", "gpu_bus_id", "memory.total", "compute_mode"], "csv", "-i", "0")
    # real (Tesla P40 doc): "uuid, name, pci.bus_id, memory.total [MiB], compute_mode"
    assert lines[0] == "uuid, name, pci.bus_id, memory.total [MiB], compute_mode"
    lines, _ = _query(smi, ["clocks.sm", "clocks.mem", "clocks.gr", "clocks.video", "clocks_throttle_reasons.active",
                            "clocks_throttle_reasons.gpu_idle", "power.limit"], "csv", "-i", "0")  # fmt: skip
    assert lines[0] == (
        "clocks.current.sm [MHz], clocks.current.memory [MHz], clocks.current.graphics [MHz], "
        "clocks.current.video [MHz], clocks_event_reasons.active, clocks_event_reasons.gpu_idle, power.limit [W]"
    )
    assert re.fullmatch(r"\d+ MHz, \d+ MHz, \d+ MHz, \d+ MHz, 0x0000000000000001, Active, 700\.00 W", lines[1])


def test_query_gpu_noheader_nounits(make_smi):
    smi = make_smi("h100-sxm-8")
    lines, rc = _query(smi, ["index", "power.limit", "memory.total", "fan.speed", "temperature.memory"],
                       "csv,noheader,nounits")  # fmt: skip
    assert rc == 0 and len(lines) == 8
    assert re.fullmatch(r"0, 700\.00, 81559, \[N/A\], \d+", lines[0])
    lines, _ = _query(smi, ["power.limit"], "csv,nounits", "-i", "1")
    assert lines == ["power.limit", "700.00"]


def test_query_gpu_placeholders_for_geforce_and_pcie_cards(make_smi):
    smi = make_smi("l40s-4")
    lines, _ = _query(smi, ["mig.mode.current", "temperature.memory", "fan.speed", "ecc.mode.current",
                            "remapped_rows.pending", "fabric.state", "serial"], "csv,noheader", "-i", "0")  # fmt: skip
    # real L40S: [N/A] MIG, N/A (no brackets) memory temp, [N/A] fan, ECC on, row remapping, fabric N/A
    assert re.fullmatch(r"\[N/A\], N/A, \[N/A\], Enabled, No, N/A, \d{13}", lines[0])
    smi = make_smi("rtx4090-1")
    lines, _ = _query(smi, ["serial", "fan.speed", "temperature.gpu.tlimit", "remapped_rows.correctable",
                            "mig.mode.pending"], "csv,noheader")  # fmt: skip
    assert re.fullmatch(r"\[N/A\], \d+ %, \[N/A\], \[N/A\], \[N/A\]", lines[0])


def test_query_gpu_mig_mode_makes_utilization_na(make_smi):
    smi = make_smi("h200-8")
    smi("-i", "0", "-mig", "1")
    lines, _ = _query(smi, ["mig.mode.current", "mig.mode.pending", "utilization.gpu", "remapped_rows.correctable"],
                      "csv,noheader", "-i", "0")  # fmt: skip
    assert lines == ["Enabled, Enabled, [N/A], [N/A]"]  # real H200 MIG capture


def test_query_gpu_event_reasons(make_smi):
    smi = make_smi("h100-sxm-8")
    smi.set("gpu.3.clocks.event_reasons", "0x0000000000000044")  # HW thermal + SW power cap
    fields = ["clocks_event_reasons.active", "clocks_event_reasons.gpu_idle", "clocks_event_reasons.sw_power_cap",
              "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
              "clocks_throttle_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
              "clocks_event_reasons.sync_boost", "clocks_event_reasons.applications_clocks_setting"]  # fmt: skip
    lines, _ = _query(smi, fields, "csv,noheader", "-i", "3")
    assert lines == ["0x0000000000000044, Not Active, Active, Not Active, Active, Not Active, Not Active, "
                     "Not Active, Not Active"]  # fmt: skip


def test_query_gpu_unknown_field_is_the_real_error(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("--query-gpu=device_minor,gpu_uuid,pci.bus_id", "--format=csv,noheader,nounits")
    # real (CoHDI/composable-resource-operator#37): exit code 2, stdout 'Field "device_minor" is not a valid ...\n\n'
    assert (out, rc) == ('Field "device_minor" is not a valid field to query.\n\n', 2)
    out, rc = smi("--query-gpu=name")
    assert rc == 2


@needs_reference
def test_query_gpu_full_real_field_list(make_smi):
    """The exporter's 212-field query: identical header, same value shapes as the real H100 idle row."""
    section = capture_section("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", "idle :: query-gpu")
    header, row = section[0], section[1]
    fields = [h.split(" [")[0] for h in header.split(", ")]
    smi = h100_like_capture(make_smi)
    lines, rc = _query(smi, fields, "csv", "-i", "0")
    assert rc == 0
    assert lines[0] == header
    ours = lines[1].split(", ")
    real = row.split(", ")
    assert len(ours) == len(real)
    units = re.compile(r" (W|MHz|MiB|%|us|ms)$")
    for name, mine, theirs in zip(fields, ours, real, strict=True):
        if theirs.startswith("[") or theirs in ("N/A", ""):
            if name not in ("hostname",):
                assert mine == theirs, name
        elif units.search(theirs):
            assert units.search(mine) and units.search(mine).group(1) == units.search(theirs).group(1), name


def test_query_compute_apps(make_smi, holder):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("--query-compute-apps=timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,"
                  "used_gpu_memory", "--format=csv")  # fmt: skip
    # real idle capture: only the header
    assert (out, rc) == ("timestamp, gpu_name, gpu_bus_id, gpu_serial, gpu_uuid, pid, process_name, "
                         "used_gpu_memory [MiB]\n", 0)  # fmt: skip
    smi.set(f"gpu.2.proc.{holder}", "./gpu_burn,15690")
    smi.set("gpu.1.proc.999999", "dead,1")  # dead pids are not shown
    out, rc = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv")
    lines = out.rstrip("\n").split("\n")
    assert lines[0] == "pid, process_name, used_gpu_memory [MiB], gpu_uuid, gpu_bus_id"
    uuid = smi.state()["gpu.2.uuid"]
    assert lines[1:] == [f"{holder}, ./gpu_burn, 15690 MiB, {uuid}, 00000000:3A:00.0"]
    out, _ = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert out == f"{holder}, 15690\n"


# ----------------------------------------------------------------------------------------------------------------
# -q
# ----------------------------------------------------------------------------------------------------------------


def _labels(lines: list[str]) -> list[tuple[str, int]]:
    """(label, key column width) per line: the -q layout without the values."""
    out = []
    for line in lines:
        key, colon, _ = line.partition(": ")
        out.append((key.rstrip() if colon else line.rstrip(), len(key) if colon else -1))
    return out


def test_q_power_section_labels_identical_to_real(make_smi):
    smi = h100_like_capture(make_smi)
    out, rc = smi("-q", "-d", "POWER", "-i", "0")
    assert rc == 0
    lines = out.split("\n")
    head = REAL_Q_POWER_HEAD.rstrip("\n").split("\n")
    assert _labels(lines[:8]) == _labels(head[:8])  # blank, NVSMI LOG, Timestamp, Driver/CUDA Version, Attached GPUs
    assert lines[4:6] == head[4:6]  # same driver: same version lines
    assert lines[8] == "GPU 00000000:18:00.0" and lines[9] == head[9] == "    GPU Power Readings"
    assert "        Current Power Limit                            : 700.00 W" in lines
    real = REAL_H100_POWER_SECTION.rstrip("\n").split("\n")
    ours = [line for line in lines[9:] if line]
    # -d POWER adds the "Power Samples" block after GPU Power Readings (real 590.48.01 -d power output)
    samples = ours.index("    Power Samples")
    assert ours[samples + 1 : samples + 6] and [lab for lab, _ in _labels(ours[samples + 1 : samples + 6])] == [
        "        Duration", "        Number of Samples", "        Max", "        Min", "        Avg"]  # fmt: skip
    del ours[samples : samples + 6]
    assert _labels(ours) == _labels(real)
    assert shape("\n".join(ours)) == shape("\n".join(real))  # units, decimals, trailing space after "Readings"
    assert ours[:8] == real[:8]  # same readings as the capture (draw 69.85 W, limits 700/200/700)


def test_q_power_values_follow_state(make_smi):
    smi = make_smi("h100-sxm-8")
    smi("-i", "2", "-pl", "500")
    out, _ = smi("-q", "-d", "POWER", "-i", "2")
    assert "        Current Power Limit                            : 500.00 W" in out
    assert "        Requested Power Limit                          : 500.00 W" in out
    assert "        Default Power Limit                            : 700.00 W" in out
    assert "        Min Power Limit                                : 200.00 W" in out


def test_q_temperature_and_clock_sections(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("-q", "-d", "TEMPERATURE,CLOCK", "-i", "0")
    assert rc == 0
    labels = [line.split(":")[0].rstrip() for line in out.split("\n")[9:] if line]
    assert labels[:9] == ["    Temperature", "        GPU Current Temp", "        GPU T.Limit Temp",
                          "        GPU Shutdown T.Limit Temp", "        GPU Slowdown T.Limit Temp",
                          "        GPU Max Operating T.Limit Temp", "        GPU Target Temperature",
                          "        Memory Current Temp", "        Memory Max Operating T.Limit Temp"]  # fmt: skip
    assert "        GPU Shutdown T.Limit Temp                      : -8 C" in out  # real H100 value
    assert "        GPU Slowdown T.Limit Temp                      : -2 C" in out
    assert "    Clocks Event Reasons" not in out
    assert "        Graphics                                       : Requested functionality has been deprecated" in out
    assert "        Video                                          : 1545 MHz" in out
    out, rc = smi("-q", "-d", "NOPE")
    assert rc == 2


@needs_reference
@pytest.mark.parametrize(
    ("capture", "mig"),
    [
        ("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", False),
        ("linux-x86_64__nvidia-h100-mig__590.48.01.txt", True),
    ],
)
def test_full_q_layout_identical_to_real(make_smi, capture, mig):
    smi = h100_like_capture(make_smi)
    if mig:
        with_capture_mig_layout(smi)
    out, rc = smi("-q", "-i", "0")
    assert rc == 0
    real = capture_section(capture, "idle :: query (-q)")
    ours = out.rstrip("\n").split("\n")
    ours[7] = ours[7].replace(": 8", ": 1")  # Attached GPUs: the capture host had one
    ours[8] = ours[8].replace("00000000:18:00.0", "00000000:00:09.0")
    assert _labels(ours) == _labels(real)


# ----------------------------------------------------------------------------------------------------------------
# Setters: messages and exit codes (nvidia_ground_truth.md §2)
# ----------------------------------------------------------------------------------------------------------------


def test_power_limit_out_of_range_real_message(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("-pl", "50")
    assert out == (
        "Provided power limit 50.00 W is not a valid power limit which should be between 200.00 W and 700.00 W "
        "for GPU 00000000:18:00.0\nTerminating early due to previous errors.\n"
    )
    assert rc == 2
    assert smi.state()["gpu.0.power.limit_mw"] == "700000"


def test_power_limit_set_with_580_persistence_warning(make_smi):
    smi = make_smi("h100-sxm-8", driver=DRIVER_580)
    out, rc = smi("-i", "1", "-pl", "450.5")
    assert rc == 0
    assert out == (
        "Power limit for GPU 00000000:2A:00.0 was set to 450.50 W from 700.00 W.\n"
        "\n"
        "Warning: persistence mode is disabled on device 00000000:2A:00.0. See the Known Issues section of the "
        "nvidia-smi(1) man page for more information. Run with [--help | -h] switch to get more information on how "
        "to enable persistence mode.\n"
        "All done.\n"
    )
    assert smi.state()["gpu.1.power.limit_mw"] == "450500"
    lines, _ = _query(smi, ["power.limit", "enforced.power.limit", "power.default_limit"], "csv,noheader", "-i", "1")
    assert lines == ["450.50 W, 450.50 W, 700.00 W"]


def test_power_limit_old_driver_wording_and_persistence_on(make_smi):
    smi = make_smi("h100-sxm-8", driver=DRIVER_570)
    out, _ = smi("-i", "0", "-pl", "300")
    assert (
        "Warning: persistence mode is disabled on this device. This settings will go back to default as soon as "
        "driver unloads (e.g. last application like nvidia-smi or cuda application terminates)." in out
    )
    smi.set("gpu.0.persistence", "1")
    out, rc = smi("-i", "0", "-pl", "400")
    assert (out, rc) == ("Power limit for GPU 00000000:18:00.0 was set to 400.00 W from 300.00 W.\nAll done.\n", 0)


def test_power_limit_needs_root(make_smi):
    smi = make_smi("h100-sxm-8", root=False)
    out, rc = smi("-i", "0", "-pl", "300")
    assert out == ("Failed to set power management limit for GPU 00000000:18:00.0: Insufficient Permissions\n"
                   "Terminating early due to previous errors.\n")  # fmt: skip
    assert rc == 4


def test_persistence_mode_messages(make_smi):
    smi = make_smi("h100-sxm-8", driver=DRIVER_580)
    out, rc = smi("-i", "0", "-pm", "1")
    assert (out, rc) == ("Enabled Legacy persistence mode for GPU 00000000:18:00.0.\nAll done.\n", 0)
    out, _ = smi("-i", "0", "-pm", "ENABLED")
    assert out == "Persistence mode is already Enabled for GPU 00000000:18:00.0.\nAll done.\n"
    out, _ = smi("-i", "0", "-pm", "0")
    assert out == "Disabled persistence mode for GPU 00000000:18:00.0.\nAll done.\n"
    smi = make_smi("h100-sxm-8", driver=DRIVER_570)
    out, _ = smi("-i", "0", "-pm", "1")
    assert out == "Enabled persistence mode for GPU 00000000:18:00.0.\nAll done.\n"
    smi = make_smi("h100-sxm-8", root=False)
    out, rc = smi("-i", "0", "-pm", "1")
    assert out.startswith("Unable to set persistence mode for GPU 00000000:18:00.0: Insufficient Permissions\n")
    assert rc == 4


def test_mig_mode_enable_disable(make_smi):
    smi = make_smi("h100-sxm-8")
    smi.set("gpu.0.persistence", "1")
    out, rc = smi("-i", "0", "-mig", "1")
    assert (out, rc) == ("Enabled MIG Mode for GPU 00000000:18:00.0\nAll done.\n", 0)
    state = smi.state()
    assert state["gpu.0.mig.current"] == state["gpu.0.mig.pending"] == "1"
    out, rc = smi("-i", "0", "-mig", "0")
    assert (out, rc) == ("Disabled MIG Mode for GPU 00000000:18:00.0\nAll done.\n", 0)


def test_mig_mode_refused_while_held(make_smi, holder):
    smi = make_smi("h100-sxm-8")
    smi.set(f"gpu.0.client.{holder}", "nv-hostengine")
    smi.set("gpu.1.client.999999", "dead-process")  # dead holders do not count
    out, rc = smi("-i", "0", "-mig", "0")
    assert out == ("Unable to disable MIG Mode for GPU 00000000:18:00.0: In use by another client\n"
                   "Terminating early due to previous errors.\n")  # fmt: skip
    assert rc != 0
    assert smi("-i", "1", "-mig", "1")[1] == 0
    # Ampere: the mode goes pending (real A100 text, gpu-operator#118)
    smi = make_smi("a100-80gb-8")
    smi.set(f"gpu.0.client.{holder}", "nvidia-persistenced")
    out, rc = smi("-i", "0", "-mig", "1")
    assert out == (
        "Warning: MIG mode is in pending enable state for GPU 00000000:07:00.0:In use by another client\n"
        "00000000:07:00.0 is currently being used by one or more other processes (e.g. CUDA application or a "
        "monitoring application such as another instance of nvidia-smi). Please first kill all processes using the "
        "device and retry the command or reboot the system to make MIG mode effective.\n"
        "All done.\n"
    )
    assert rc == 0
    state = smi.state()
    assert (state["gpu.0.mig.current"], state["gpu.0.mig.pending"]) == ("0", "1")


def test_mig_mode_not_supported_is_a_warning(make_smi):
    smi = make_smi("l40s-4")
    out, rc = smi("-i", "0", "-mig", "1")
    assert out == ("Unable to enable MIG Mode for GPU 00000000:17:00.0: Not Supported\n"
                   "Treating as warning and moving on.\nAll done.\n")  # fmt: skip
    assert rc == 0
    out, rc = smi("mig", "-lgip")
    assert out == "No MIG-supported devices found.\n"


def test_gpu_reset(make_smi, holder):
    smi = make_smi("h100-sxm-8")
    smi("-i", "0", "-pl", "300")
    smi("-i", "0", "-lgc", "1500,1500")
    smi("-i", "0", "-mig", "1")
    smi("mig", "-i", "0", "-cgi", "19", "-C")
    out, rc = smi("-r", "-i", "0")
    assert (out, rc) == ("GPU 00000000:18:00.0 was successfully reset.\n", 0)
    state = smi.state()
    assert state["gpu.0.power.limit_mw"] == "700000"
    assert state["gpu.0.clocks.locked.max"] == "0"
    assert not [k for k in state if k.startswith(("gpu.0.mig.gi.", "gpu.0.mig.ci."))]
    smi.set(f"gpu.1.proc.{holder}", "python3,1024")
    out, rc = smi("--gpu-reset", "-i", "1")
    assert out == (
        "\nThe following GPUs could not be reset:\n"
        "  GPU 00000000:2A:00.0: In use by another client\n"
        "\n"
        "1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
        "graphics application such as an X server, or a monitoring application such as another instance of "
        "nvidia-smi). Please first kill all processes using this device and all compute applications running in the "
        "system.\n"
    )
    assert rc == 255
    smi = make_smi("h100-sxm-8", root=False)
    out, rc = smi("-r", "-i", "0")
    assert out.startswith("Unable to reset GPU 00000000:18:00.0: Insufficient Permissions\n") and rc == 4


def test_lock_and_reset_gpu_clocks(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("-i", "0", "-lgc", "1500,1980")
    assert (out, rc) == (
        'GPU clocks set to "(gpuClkMin 1500, gpuClkMax 1980)" for GPU 00000000:18:00.0\nAll done.\n',
        0,
    )
    assert smi.state()["gpu.0.clocks.locked.min"] == "1500"
    out, rc = smi("-i", "0", "-rgc")
    assert (out, rc) == ("All done.\n", 0)
    assert smi.state()["gpu.0.clocks.locked.min"] == "0"
    smi = make_smi("h100-sxm-8", root=False)
    out, rc = smi("-i", "0", "-lgc", "1500,1500")
    # real (A100 allocation): rc=4
    assert out == ("The current user does not have permission to change clocks for GPU 00000000:18:00.0.\n"
                   "Terminating early due to previous errors.\n")  # fmt: skip
    assert rc == 4


# ----------------------------------------------------------------------------------------------------------------
# Driver state, lost GPUs, options
# ----------------------------------------------------------------------------------------------------------------


def test_driver_not_loaded(make_smi):
    smi = make_smi("h100-sxm-8", loaded=False)
    for args in ((), ("-L",), ("--query-gpu=name", "--format=csv"), ("-pm", "1")):
        out, rc = smi(*args)
        assert out.split("\n")[0] == (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running."
        )
        assert rc == 9


def test_driver_library_version_mismatch(make_smi):
    smi = make_smi("h100-sxm-8", driver="570.172.08", installed="580.126.09")
    out, rc = smi()
    # real (anderskm/gputil#55): exit 18
    assert out == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.126\n"
    assert rc == 18


def test_lost_gpu(make_smi):
    smi = make_smi("h100-sxm-8")
    smi.set("gpu.2.lost", "1")
    lost = (
        "Unable to determine the device handle for GPU0000:3A:00.0: GPU is lost.  Reboot the system to recover this GPU"
    )
    out, rc = smi()
    assert out.split("\n")[0] == lost and rc == 15
    assert "00000000:3A:00.0" not in out and "00000000:5D:00.0" in out  # the other GPUs still print
    lines, rc = _query(smi, ["index", "name"], "csv,noheader")
    assert lines[2] == lost and lines[3].startswith("3, ") and rc == 15
    out, rc = smi("-L")
    assert out.split("\n")[2] == lost and rc == 15
    out, rc = smi("-i", "0", "--query-gpu=name", "--format=csv,noheader")
    assert rc == 0


def test_bad_options_and_ids(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("-format=csv")
    assert (out, rc) == ("ERROR: Option -format=csv is not recognized. Please run 'nvidia-smi -h' for help.\n\n", 2)
    out, rc = smi("-i", "9", "-L")
    assert (out, rc) == ("No devices were found\n", 6)
    uuid = smi.state()["gpu.5.uuid"]
    for ident in ("5", uuid, "00000000:AB:00.0", "0000:AB:00.0"):
        lines, _ = _query(smi, ["index"], "csv,noheader", "-i", ident)
        assert lines == ["5"], ident
    lines, _ = _query(smi, ["index"], "csv,noheader", "-i", "1,3")
    assert lines == ["1", "3"]


def test_version_and_help(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("--version")
    banner = ["NVIDIA-SMI version  : 590.48.01", "NVML version        : 590.48", "DRIVER version      : 590.48.01",
              "CUDA Version        : 13.1"]  # fmt: skip
    assert (out, rc) == ("\n".join(banner) + "\n", 0)
    out, rc = smi("-h")
    assert rc == 0 and out.startswith("NVIDIA System Management Interface -- v590.48.01\n")
    assert "    -pl   --power-limit=        Specifies maximum power management limit in watts." in out


def test_nvlink_status(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("nvlink", "-s", "-i", "0")
    lines = out.rstrip("\n").split("\n")
    assert rc == 0 and lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert lines[1:] == [f"\t Link {n}: 26.562 GB/s" for n in range(18)]  # real H100 SXM capture
    smi.set("gpu.0.nvlink.down", "3")
    assert "\t Link 3: <inactive>" in smi("nvlink", "-s", "-i", "0")[0]
    smi("-i", "1", "-mig", "1")
    assert smi("nvlink", "-s", "-i", "1")[0].endswith("\nNvlink queries are not supported for Devices in MIG mode\n")
    smi = make_smi("l40s-4")
    assert smi("nvlink", "-s", "-i", "0")[0].endswith("\nDevice does not have or support Nvlink\n")


def test_topo_matrix(make_smi):
    smi = make_smi("h100-sxm-8")
    out, rc = smi("topo", "-m")
    lines = out.split("\n")
    assert rc == 0 and lines[0].startswith("\t\x1b[4mGPU0\tGPU1") and lines[0].endswith("GPU NUMA ID\x1b[0m")
    assert lines[1].split("\t")[:3] == ["GPU0", " X ", "NV18"]
    assert "  NV#  = Connection traversing a bonded set of # NVLinks" in lines


# ----------------------------------------------------------------------------------------------------------------
# nvidia-smi mig
# ----------------------------------------------------------------------------------------------------------------


def test_lgip_h100_identical_to_real(make_smi):
    smi = make_smi("h100-sxm-8", driver=DRIVER_570)
    smi("-i", "0", "-mig", "1")
    out, rc = smi("mig", "-i", "0", "-lgip")
    assert (out, rc) == (REAL_H100_LGIP, 0)
    out, rc = smi("mig", "-lgip")  # MIG enabled on GPU 0 only
    assert out == REAL_H100_LGIP


def test_lgip_wide_layout_on_580(make_smi):
    smi = make_smi("b200-8", driver=DRIVER_580)
    smi("-i", "0", "-mig", "1")
    out, _ = smi("mig", "-i", "0", "-lgip")
    head = REAL_WIDE_LGIP_HEADER.split("\n")
    lines = out.split("\n")
    assert lines[:5] == head[:5]
    assert lines[5:7] == head[5:7]  # B200 1g.23gb row equals the real (GB200) row
    assert all(len(line) == 81 for line in lines if line)


def test_lgip_free_counts_drop_with_placement(make_smi):
    smi = make_smi("h100-sxm-8", driver=DRIVER_570)
    smi("-i", "0", "-mig", "1")
    smi("mig", "-i", "0", "-cgi", "9")
    out, _ = smi("mig", "-i", "0", "-lgip")
    free = dict(re.findall(r"MIG (\S+)\s+\d+\s+(\d+/\d+)", out))
    assert free == {"1g.10gb": "4/7", "1g.10gb+me": "1/1", "1g.20gb": "2/4", "2g.20gb": "2/3", "3g.40gb": "1/2",
                    "4g.40gb": "1/1", "7g.80gb": "0/1"}  # fmt: skip


def test_lgipp_h100_identical_to_real(make_smi):
    smi = make_smi("h100-sxm-8")
    smi("-i", "0", "-mig", "1")
    assert smi("mig", "-i", "0", "-lgipp") == (REAL_H100_LGIPP, 0)


def test_create_list_destroy_round_trip(make_smi):
    smi = make_smi("h100-sxm-8")
    smi("-i", "0", "-mig", "1")
    out, rc = smi("mig", "-i", "0", "-lgi")
    assert (out, rc) == ("No GPU instances found: Not Found\n", 6)
    out, rc = smi("mig", "-i", "0", "-cgi", "19,19,19,19,19,19,19", "-C")
    assert (out, rc) == (REAL_H100_CGI_7X1G, 0)
    assert smi("mig", "-i", "0", "-lgi") == (REAL_H100_LGI, 0)
    out, rc = smi("mig", "-i", "0", "-lci")
    assert out.startswith(REAL_H100_LCI_HEAD) and out.count("MIG 1g.10gb") == 7
    out, rc = smi("mig", "-i", "0", "-cgi", "19")
    assert (out, rc) == ("Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources\n"
                         "Failed to create GPU instances: Insufficient Resources\n", 23)  # fmt: skip
    out, rc = smi("mig", "-i", "0", "-dgi", "-gi", "7")
    assert out == ("Unable to destroy GPU instance ID  7 from GPU  0: In use by another client\n"
                   "Failed to destroy GPU instances: In use by another client\n")  # fmt: skip
    assert rc != 0
    out, rc = smi("mig", "-i", "0", "-dci")
    assert (
        rc == 0 and out.split("\n")[0] == "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  7"
    )
    assert out.count("Successfully destroyed compute instance") == 7
    out, rc = smi("mig", "-i", "0", "-dgi")
    assert rc == 0 and out.split("\n")[0] == "Successfully destroyed GPU instance ID  7 from GPU  0"
    assert out.count("Successfully destroyed GPU instance") == 7
    assert smi("mig", "-i", "0", "-lgi") == ("No GPU instances found: Not Found\n", 6)
    # back to a mixed layout; GI ids as in the real H100 MIG capture (GI 2, 3, 9, 10)
    out, _ = smi("mig", "-i", "0", "-cgi", "3g.40gb,MIG 2g.20gb,1g.10gb,19")
    assert re.findall(r"GPU instance ID +(\d+)", out) == ["2", "3", "9", "10"]
    out, _ = smi("mig", "-i", "0", "-cci", "-gi", "2")
    assert (
        out == "Successfully created compute instance on GPU  0 GPU instance ID  2 using profile MIG 3g.40gb (ID  2)\n"
    )
    out, rc = smi("mig", "-i", "0", "-cci", "0", "-gi", "3")
    assert (
        out
        == "Successfully created compute instance on GPU  0 GPU instance ID  3 using profile MIG 1c.2g.20gb (ID  0)\n"
    )


def test_cgi_insufficient_resources_like_the_mig_guide(make_smi):
    smi = make_smi("a100-40gb-1")
    smi("-mig", "1")
    out, rc = smi("mig", "-cgi", "19,19,14,9")
    assert out == REAL_A100_CGI_INSUFFICIENT
    assert rc != 0


def test_mig_commands_need_root_and_mig_mode(make_smi, monkeypatch):
    smi = make_smi("h100-sxm-8")
    assert smi("mig", "-i", "0", "-cgi", "19") == ("No MIG-enabled devices found.\n", 6)
    smi("-i", "0", "-mig", "1")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    out, rc = smi("mig", "-i", "0", "-cgi", "19")
    assert out == ("Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Permissions\n"
                   "Failed to create GPU instances: Insufficient Permissions\n")  # fmt: skip
    assert rc == 4


def test_mig_device_busy_blocks_destroy(make_smi, holder):
    smi = make_smi("h100-sxm-8")
    smi("-i", "0", "-mig", "1")
    smi("mig", "-i", "0", "-cgi", "9", "-C")
    smi.set(f"gpu.0.proc.{holder}", "python3,1000,2,0")
    out, rc = smi("mig", "-i", "0", "-dci")
    assert out == ("Unable to destroy compute instance ID  0 from GPU  0 GPU instance ID  2: In use by another client\n"
                   "Failed to destroy compute instances: In use by another client\n")  # fmt: skip
    assert rc != 0


# ----------------------------------------------------------------------------------------------------------------
# Every profile
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", sorted(p for p in PROFILES if PROFILES[p].gpu_count))  # cpu-only: no GPU
def test_every_profile_prints_list_table_and_query(make_smi, profile):
    smi = make_smi(profile)
    count = PROFILES[profile].gpu_count
    out, rc = smi("-L")
    assert rc == 0
    assert re.fullmatch(rf"(GPU \d: (?:NVIDIA|Tesla) [^\n]+ \(UUID: GPU-[0-9a-f-]{{36}}\)\n){{{count}}}", out)
    out, rc = smi()
    assert rc == 0
    assert all(len(line) == 91 for line in out.split("\n")[1:] if line.startswith(("|", "+")))
    lines, rc = _query(smi, list(REAL_H100_QUERY_FIELDS), "csv,noheader")
    assert rc == 0 and len(lines) == count
    out, rc = smi("-q")
    assert rc == 0 and out.count("\nGPU 0000") == count


REAL_H100_QUERY_FIELDS = [h.split(" [")[0] for h in REAL_H100_QUERY]


def test_installed_wrapper_runs_main(tmp_path, make_smi):
    """The host wrapper: ``from simgpu.nvidia_smi import main; sys.exit(main(sys.argv[1:]))`` as a subprocess."""
    make_smi("h100-sxm-8")
    pkg = tmp_path / "simgpu"
    src = Path(nvidia_smi.__file__).parent
    pkg.mkdir()
    for file in src.glob("*.py"):
        (pkg / file.name).write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
    wrapper = "import sys\nfrom simgpu.nvidia_smi import main\nsys.exit(main(sys.argv[1:]))\n"
    result = subprocess.run([sys.executable, "-c", wrapper, "-L"], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)}, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("GPU ") == 8
