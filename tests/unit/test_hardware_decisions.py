"""Decisions from the hardware on real machines of other people (captures/public/, nvidia-smi -q of 12 hosts):
architecture, ``auto`` flavour, branch support, MIG capability and power, for GPUs the catalog knows and for the
same GPUs with an empty catalog (any NVIDIA GPU: only what the node reports decides).

A bare node is known from lspci and the node's PCI ID database (Debian's pci.ids, read by gpufleet's own command);
a node with a driver from nvidia-smi (the capture's values). The expected architecture is what nvidia-smi itself
prints (Product Architecture); the chip codes, compute capabilities and last branches are NVIDIA's
(tests/reference/upstream/nvidia-architectures/facts.json).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from pyinfra_harness import fixture, wrap
from reference import CAPTURES

from gpufleet import plan
from gpufleet.catalog import Catalog
from gpufleet.config import load_node_config
from gpufleet.facts import NvidiaPciDevices, OsInfo, SecureBoot
from gpufleet.facts.nvidia_q import get, number, parse_q
from gpufleet.facts.pci import PCI_IDS
from gpufleet.plan import DriverPlan
from gpufleet.plan.architecture import CHIP_ARCHITECTURES, COMPUTE_CAP_ARCHITECTURES, LAST_BRANCH
from gpufleet.preflight import HostFacts, host_gpus, preflight
from tests import upstream

PUBLIC = CAPTURES / "public"
Q_CAPTURES = sorted(p.name for p in PUBLIC.glob("*.q.txt"))
RECORD = upstream.facts("nvidia-architectures")
# the driver's compute_cap (--query-gpu; -q does not print it) of the GPUs Debian 12's pci.ids does not know,
# as NVIDIA's CUDA GPUs page lists them (checked against the record below)
COMPUTE_CAP = {"0x233510DE": ("9.0", "H200"), "0x234210DE": ("9.0", "GH200"), "0x2B8510DE": ("12.0", "RTX 5090")}


def _gpus(capture: str) -> list[dict]:
    return parse_q((PUBLIC / capture).read_text(encoding="utf-8"))[1]


def _architecture(gpu: dict) -> str:
    """What nvidia-smi prints; the 470 driver's -q has no Product Architecture: the GTX 680 is Kepler (GK104)."""
    return gpu.get("Product Architecture") or {"NVIDIA GeForce GTX 680": "Kepler"}[gpu["Product Name"]]


def _bus(gpu: dict) -> str:
    return gpu["Bus Id"].lower()[-12:]


def _pci_fact(gpus: list[dict]) -> dict:
    """The NvidiaPciDevices fact as gpufleet's command reads it on a node with these GPUs and Debian's pci.ids."""
    if not Path(PCI_IDS).is_file():
        pytest.skip(f"Debian's pci.ids is not installed ({PCI_IDS})")
    lspci = "".join(f"{_bus(g)} 0302: 10de:{get(g, 'PCI', 'Device Id')[2:6].lower()} (rev a1)\\n" for g in gpus)
    command = NvidiaPciDevices().command().replace("command -v lspci", "true").replace(
        "lspci -n -D -d 10de:", f"printf '{lspci}'").replace("lspci -n -d 10de:", f"printf '{lspci}'")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    return NvidiaPciDevices().process(out.splitlines())


def _bare(gpus: list[dict]) -> HostFacts:
    return HostFacts(
        os=OsInfo().process(wrap("os-release", fixture("os_release_ubuntu_2204.txt")) + wrap("kernel", "6.8.0-1")),
        secure_boot=SecureBoot().process(wrap("mokutil", "SecureBoot disabled") + wrap("efi", "uefi")),
        pci=_pci_fact(gpus))


def _power(gpu: dict) -> tuple[float | None, ...]:
    readings = gpu.get("GPU Power Readings") or gpu.get("Power Readings") or {}
    return tuple(number(readings.get(f"{kind} Power Limit")) for kind in ("Default", "Min", "Max"))


def _with_driver(gpus: list[dict]) -> HostFacts:
    listed = []
    for i, gpu in enumerate(gpus):
        default, low, high = _power(gpu)
        device_id = get(gpu, "PCI", "Device Id")
        listed.append({"index": i, "name": gpu["Product Name"], "uuid": gpu.get("GPU UUID"),
                       "pci_bus_id": gpu["Bus Id"], "pci_device_id": device_id,
                       "compute_cap": COMPUTE_CAP.get(device_id, (None,))[0],
                       "power_default_w": default, "power_min_w": low, "power_max_w": high, "power_limit_w": default,
                       "mig_current": get(gpu, "MIG Mode", "Current"), "mig_pending": get(gpu, "MIG Mode", "Pending")})
    inventory = {"status": "ok", "error": None, "exit_code": 0, "driver_version": "550.127.05",
                 "driver_version_field": "driver_version", "lost_gpus": [], "gpus": listed}
    return dataclasses.replace(_bare(gpus), gpu_inventory=inventory)


@pytest.fixture(params=["catalog", "no-catalog"])
def catalog(request, monkeypatch):
    """The packaged catalog, or none at all (every GPU uncatalogued: decided from the hardware only)."""
    if request.param == "no-catalog":
        monkeypatch.setattr(plan.gpu, "load_catalog", lambda *args, **kwargs: Catalog({}))
    return request.param


def _messages(data: dict, facts: HostFacts) -> list[str]:
    return [e.message for e in preflight("node01", load_node_config("node01", {"gpufleet_stages": ["driver"],
                                                                              **data}), facts)]


def _expected_flavour(gpu: dict) -> str:
    architecture = _architecture(gpu)
    if architecture in ("Kepler", "Maxwell", "Pascal", "Volta"):
        return "proprietary"
    return "open"


def _required(gpu: dict) -> str | None:
    """NVIDIA: proprietary required before Turing, open on Blackwell and Grace (GH200); either on the others."""
    if _architecture(gpu) in ("Kepler", "Maxwell", "Pascal", "Volta"):
        return "proprietary"
    if _architecture(gpu) == "Blackwell" or "GH200" in gpu["Product Name"]:
        return "open"
    return None


# ------------------------------------------------------------------------------------------------- the record


def test_the_tables_are_nvidias():
    assert CHIP_ARCHITECTURES == {k: v["architecture"] for k, v in RECORD["chip_architectures"]["prefixes"].items()}
    recorded = RECORD["compute_capability"]["architectures"]
    assert {k: v for k, v in COMPUTE_CAP_ARCHITECTURES.items() if k in recorded} == recorded
    assert LAST_BRANCH == {k: v for k, v in RECORD["last_branch"].items() if k != "sources"}
    statements = RECORD["compute_capability"]["by_product"]["statements"]
    for cap, product in COMPUTE_CAP.values():
        assert product in statements[cap]


# ------------------------------------------------------------------------------------------------ architecture


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_architecture_with_a_driver_is_what_nvidia_smi_prints(capture, catalog):
    gpus = _gpus(capture)
    assert [g.architecture for g in host_gpus(_with_driver(gpus))] == [_architecture(g) for g in gpus]


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_bare_node_architecture_from_the_pci_id_database(capture):
    """No driver, no catalog: the chip code of the node's pci.ids decides; a device id the database does not
    list (Debian 12's lacks H200, GH200, RTX 5090) leaves it unknown, and ``auto`` is refused naming the GPU."""
    gpus = _gpus(capture)
    facts = _bare(gpus)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan.gpu, "load_catalog", lambda *args, **kwargs: Catalog({}))
        decided = host_gpus(facts)
        messages = _messages({}, facts)
    for gpu, seen in zip(gpus, decided, strict=True):
        if seen.pci_name is None:
            assert seen.architecture is None
        else:
            assert seen.architecture == _architecture(gpu), seen.pci_name
    unknown = [g for g in decided if g.architecture is None]
    assert any("gpufleet_driver_flavour='auto'" in m and "architecture is unknown" in m for m in messages) == bool(
        unknown)


# ------------------------------------------------------------------------------------------ flavour and branch


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_auto_flavour_and_the_refused_ones(capture, catalog):
    gpus = _gpus(capture)
    facts = _with_driver(gpus)
    config = load_node_config("node01", {})
    assert DriverPlan.resolve(config, host_gpus(facts), "ubuntu").flavour == _expected_flavour(gpus[0])
    assert not [m for m in _messages({"gpufleet_driver_branch": "470"}, facts) if "flavour" in m]
    required = _required(gpus[0])
    for flavour in ("open", "proprietary"):
        refused = [m for m in _messages({"gpufleet_driver_flavour": flavour}, facts) if "flavour" in m]
        if required is None or required == flavour:
            assert refused == []
        else:
            assert len(refused) == 1 and refused[0].startswith(f"node01: gpufleet_driver_flavour='{flavour}' on GPU")
            assert gpus[0]["Product Name"] in refused[0]


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_branch_newer_than_the_architectures_last_is_refused(capture, catalog):
    gpus = _gpus(capture)
    facts = _with_driver(gpus)
    last = {"Volta": 580, "Kepler": 470}.get(_architecture(gpus[0]))
    refused = [m for m in _messages({"gpufleet_driver_branch": "590"}, facts) if "gpufleet_driver_branch" in m]
    if last is None:
        assert refused == []
        return
    which = f"GPUs 0-{len(gpus) - 1}" if len(gpus) > 1 else "GPU 0"
    architecture = _architecture(gpus[0])
    assert refused == [f"node01: gpufleet_driver_branch='590' on {which} ({gpus[0]['Product Name']}): driver branch "
                       f"590 does not support {architecture} GPUs; allowed: {last} or an older branch (NVIDIA: the "
                       f"{last} series is the last to support {architecture} GPUs)"]
    assert not [m for m in _messages({"gpufleet_driver_branch": str(last)}, facts) if "gpufleet_driver_branch" in m]


# --------------------------------------------------------------------------------------------------------- MIG


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_mig_on_a_gpu_without_mig_is_refused_at_preflight_for_that_reason(capture, catalog):
    gpus = _gpus(capture)
    layout = {"gpufleet_stages": ["driver", "mig"], "gpufleet_driver_branch": "470",
              "gpufleet_mig": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}]}
    messages = _messages(layout, _with_driver(gpus))
    without = [m for m in messages if "MIG requested on a GPU without MIG" in m]
    if get(gpus[0], "MIG Mode", "Current") == "N/A":
        assert len(without) == 1 and gpus[0]["Product Name"] in without[0], messages
        assert not [m for m in messages if "profiles are unknown" in m]
    else:
        assert without == []


@pytest.mark.parametrize("capture", [c for c in Q_CAPTURES if c.startswith(("gh200", "h200", "a100", "h100"))])
def test_mig_on_an_uncatalogued_mig_gpu_is_refused_at_preflight_not_mid_run(capture, monkeypatch):
    """A MIG-capable GPU the catalog does not know: its profiles are unknown, which preflight says before any change
    (the MIG stage refused it mid-run, after earlier stages had changed the host)."""
    monkeypatch.setattr(plan.gpu, "load_catalog", lambda *args, **kwargs: Catalog({}))
    gpus = _gpus(capture)
    layout = {"gpufleet_stages": ["driver", "mig"],
              "gpufleet_mig": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}]}
    unknown = [m for m in _messages(layout, _with_driver(gpus)) if "MIG profiles of a GPU not in the catalog" in m]
    assert len(unknown) == 1 and "gpufleet_mig[0].mig-devices" in unknown[0] and "catalog learn" in unknown[0]


# ------------------------------------------------------------------------------------------------------- power


@pytest.mark.parametrize("capture", [c for c in Q_CAPTURES if not c.startswith("gtx680")])
def test_power_within_the_boards_real_range(capture, catalog):
    """Each board's own default limit passes; above its real maximum is refused, naming that maximum."""
    gpus = _gpus(capture)
    facts = _with_driver(gpus)
    default, _low, high = _power(gpus[0])
    stages = {"gpufleet_stages": ["power"]}
    assert _messages({**stages, "gpufleet_power_limit": default}, facts) == []
    refused = _messages({**stages, "gpufleet_power_limit": high + 1}, facts)
    assert refused and all(f"-{high:g} W" in m or f"{high:g} W" in m for m in refused), refused
