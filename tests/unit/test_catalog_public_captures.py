"""The catalog and the simulator against real ``nvidia-smi -q`` of other people's machines (captures/public/).

Every GPU of every capture whose name the catalog knows must agree with its model (identity, clocks, PCIe, the
power limits its board reports), and the simulated hosts of those models print what the real boards print where
the layout differs by generation (MIG Mode N/A, pre-Turing ECC / retired pages / absolute temperatures).
"""

from __future__ import annotations

import pytest
from reference import CAPTURES
from test_sim_nvidia_smi import make_smi  # noqa: F401 - fixture

from gpufleet.catalog import UnknownGpuModel, load_catalog
from gpufleet.facts.nvidia_q import get, number, parse_q

PUBLIC = CAPTURES / "public"
Q_CAPTURES = sorted(p.name for p in PUBLIC.glob("*.q.txt"))
# simulated profile -> (the real capture of that board, its driver)
SIM_BOARDS = {"v100-16gb-8": ("v100-sxm2-16gb-x8_550.127.05.q.txt", "550.127.05"),
              "l4-1": ("l4_550.90.07.q.txt", "550.90.07")}


def _gpus(name: str) -> list[dict]:
    header, gpus = parse_q((PUBLIC / name).read_text(encoding="utf-8"))
    assert len(gpus) == int(header["Attached GPUs"]) > 0
    return gpus


def _catalogued(name: str) -> list[tuple[dict, object]]:
    out = []
    for gpu in _gpus(name):
        try:
            out.append((gpu, load_catalog().by_name(gpu["Product Name"])))
        except UnknownGpuModel:
            pass
    return out


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_parser_reads_every_gpu_of_the_real_captures(capture):
    for gpu in _gpus(capture):
        assert gpu["Product Name"] and get(gpu, "PCI", "Device Id").endswith("10DE")
        assert number(get(gpu, "FB Memory Usage", "Total")) > 0


@pytest.mark.parametrize("capture", [c for c in Q_CAPTURES if not c.startswith(("gtx680", "rtx5090"))])
def test_catalog_models_are_what_the_real_boards_print(capture):
    pairs = _catalogued(capture)
    assert pairs, f"{capture}: no catalogued GPU"
    for gpu, model in pairs:
        assert (gpu["Product Brand"], gpu["Product Architecture"]) == (model.brand, model.architecture)
        assert int(get(gpu, "PCI", "Device Id"), 16) == model.pci_device_id
        assert number(get(gpu, "FB Memory Usage", "Total")) == model.memory_mib
        assert (get(gpu, "MIG Mode", "Current") == "N/A") == (model.mig is None)
        clocks = gpu["Max Clocks"]
        assert (number(clocks["SM"]), number(clocks["Graphics"]), number(clocks["Memory"])) == (
            model.clocks_max_sm_mhz, model.clocks_max_graphics_mhz, model.clocks_max_mem_mhz)
        link = get(gpu, "PCI", "GPU Link Info")
        assert (number(get(link, "PCIe Generation", "Max")), number(get(link, "Link Width", "Max"))) == (
            model.pcie_gen_max, model.pcie_width_max)


@pytest.mark.parametrize("capture", Q_CAPTURES)
def test_every_real_board_is_one_of_its_models_power_variants(capture):
    """Default, min and max as each real board reports them are one board variant of its catalog model: never a
    single figure that a real board contradicts (A100-SXM4-80GB at 500 W, H100 NVL at 310 W, RTX 4090 capped at
    450 W)."""
    for gpu, model in _catalogued(capture):
        variants = {(v.default_w, v.min_w, v.max_w) for v in model.power_limits_w}
        assert _power_limits(gpu) in variants, (gpu["Bus Id"], model.key)
        assert all(v.source.startswith("real: ") for v in model.power_limits_w
                   if (v.default_w, v.min_w, v.max_w) == _power_limits(gpu))


SECTIONS = ("MIG Mode", "ECC Errors", "Retired Pages", "Remapped Rows")


@pytest.mark.parametrize("profile", sorted(SIM_BOARDS))
def test_simulated_boards_print_what_the_real_ones_print(make_smi, profile):  # noqa: F811
    capture, driver = SIM_BOARDS[profile]
    real = _gpus(capture)[0]
    out, rc = make_smi(profile, driver=driver)("-q", "-i", "0")
    assert rc == 0, out
    _, (sim,) = parse_q(out)
    for section in SECTIONS:  # the labels the real 550 driver prints (590's additions aside)
        want = real[section]
        assert (sim[section] if isinstance(want, str) else {k: sim[section].get(k) for k in want}) == want, section
    assert list(sim["Temperature"]) == list(real["Temperature"])
    for label in ("GPU Shutdown Temp", "GPU Slowdown Temp", "GPU Max Operating Temp", "GPU Shutdown T.Limit Temp",
                  "GPU Slowdown T.Limit Temp", "Memory Max Operating Temp"):
        assert sim["Temperature"].get(label) == real["Temperature"].get(label), label
    for label in ("Product Name", "Product Brand", "Product Architecture", "VBIOS Version", "Board Part Number",
                  "GPU Part Number"):
        assert sim[label] == real[label], label
    assert sim["Inforom Version"] == real["Inforom Version"] | {"Power Management Object": sim["Inforom Version"][
        "Power Management Object"]}
    for path in (("PCI", "Device Id"), ("PCI", "Sub System Id"), ("FB Memory Usage", "Total"),
                 ("FB Memory Usage", "Reserved"), ("Max Clocks",), ("ECC Mode",)):
        assert get(sim, *path) == get(real, *path), path
    boards = _gpus(capture)  # every simulated GPU is the board variant of the real GPU at its index
    out, rc = make_smi(profile, driver=driver)("-q")
    assert [_power_limits(gpu) for gpu in parse_q(out)[1]] == [_power_limits(board) for board in boards]


def _power_limits(gpu: dict) -> tuple[float | None, ...]:
    return tuple(number(gpu["GPU Power Readings"][f"{kind} Power Limit"]) for kind in ("Default", "Min", "Max"))
