"""Integrity tests for the GPU catalog (gpufleet/catalog/models/*.json and its loader).

Values that real hardware printed are pinned here (copied from reference/captures) and, where the reference
directory is available (env GPUFLEET_REFERENCE_DIR, <repo>/shared/reference or <repo>/../shared/reference),
cross-checked against the capture files themselves.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources

import pytest
from reference import REFERENCE

from gpufleet.catalog import (
    PRECISIONS,
    SOURCE_TAGS,
    Catalog,
    CatalogError,
    GpuModel,
    MigProfile,
    MigSpec,
    UnknownGpuModel,
    load_catalog,
    parse_model,
)

REQUIRED_KEYS = {
    "h100-sxm": "NVIDIA H100 80GB HBM3",
    "h100-pcie": "NVIDIA H100 PCIe",
    "h100-nvl": "NVIDIA H100 NVL",
    "h200": "NVIDIA H200",
    "a100-sxm4-40gb": "NVIDIA A100-SXM4-40GB",
    "a100-sxm4-80gb": "NVIDIA A100-SXM4-80GB",
    "a30": "NVIDIA A30",
    "l40s": "NVIDIA L40S",
    "rtx4090": "NVIDIA GeForce RTX 4090",
    "b200": "NVIDIA B200",
}
NON_MIG = ("rtx4090", "l40s", "rtx4080-super", "rtx2080-super", "t4")
TENSOR_PRECISIONS = ("tf32", "bf16", "fp16", "fp8", "int8")

# What real nvidia-smi printed (reference/captures and nvidia_ground_truth.md §1.3), per catalog key.
CAPTURE_FILES = {
    "h100-sxm": "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
    "l40s": "linux-x86_64__nvidia-l40s__595.80.txt",
    "rtx4080-super": "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt",
    "rtx2080-super": "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt",
}
CAPTURED = {
    # key: (name, pci id, memory.total MiB, (default, min, max) W, (max sm, max mem, max graphics) MHz)
    "h100-sxm": ("NVIDIA H100 80GB HBM3", 0x233010DE, 81559, (700.0, 200.0, 700.0), (1980, 2619, 1980)),
    "h200": ("NVIDIA H200", None, 143771, (700.0, 200.0, 700.0), (1980, 3201, 1980)),
    "l40s": ("NVIDIA L40S", 0x26B910DE, 46068, (350.0, 100.0, 350.0), (2520, 9001, 2520)),
    "rtx4080-super": ("NVIDIA GeForce RTX 4080 SUPER", 0x270210DE, 16376, (320.0, 150.0, 400.0), (3165, 11501, 3165)),
    "rtx2080-super": ("NVIDIA GeForce RTX 2080 SUPER", 0x1E8110DE, 8192, (250.0, 105.0, 350.0), (2145, 7751, 2145)),
}
# Real H100 MIG device table (590.48.01 MIG capture): profile -> (memory MiB, SM, CE, DEC, JPG, OFA, ENC)
H100_MIG_CAPTURED = {
    "3g.40gb": (40448, 60, 3, 3, 3, 0, 0),
    "2g.20gb": (20096, 32, 2, 2, 2, 0, 0),
    "1g.10gb": (9984, 16, 1, 1, 1, 0, 0),
}


needs_reference = pytest.mark.reference  # real captures: always present in tests/fixtures/reference


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog()


def all_models() -> list[GpuModel]:
    return list(load_catalog().models.values())


def mig_models() -> list[GpuModel]:
    return [m for m in all_models() if m.mig is not None]


def _ids(models: list[GpuModel]) -> list[str]:
    return [m.key for m in models]


# ----------------------------------------------------------------------------------------- loading / lookup


def test_load_is_cached_and_sorted(cat):
    assert load_catalog() is cat
    assert list(cat.models) == sorted(cat.models)
    assert all(isinstance(m, GpuModel) for m in cat.models.values())


def test_required_models_present_with_exact_nvidia_smi_names(cat):
    for key, name in REQUIRED_KEYS.items():
        assert cat.get(key).name == name


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_model_resolvable_by_key_and_name(cat, model):
    assert cat.get(model.key) is model
    assert cat.by_name(model.name) is model
    assert cat.by_name(f"  {model.name.lower()} ") is model
    assert cat.by_name(model.name.upper().replace(" ", "  ")) is model
    assert cat.by_pci_device_id(model.pci_device_id) is model


def test_names_and_keys_unique(cat):
    names = [re.sub(r"\s+", "", m.name).casefold() for m in cat]
    assert len(names) == len(set(names))
    assert len(cat.keys()) == len(set(cat.keys()))


def test_unknown_key_lists_known_keys(cat):
    with pytest.raises(UnknownGpuModel) as exc:
        cat.get("h100")
    assert isinstance(exc.value, KeyError) and isinstance(exc.value, ValueError)
    msg = str(exc.value)
    assert not msg.startswith("'")  # not KeyError's repr()
    for key in cat.keys():
        assert key in msg


def test_by_name_unknown_lists_known_names(cat):
    with pytest.raises(UnknownGpuModel) as exc:
        cat.by_name("NVIDIA H200 141GB HBM3e")  # go-nvml mock name, not what hardware prints
    assert isinstance(exc.value, KeyError) and isinstance(exc.value, ValueError)
    msg = str(exc.value)
    assert "NVIDIA H200 141GB HBM3e" in msg
    for name in cat.names():
        assert name in msg
    with pytest.raises(UnknownGpuModel):
        cat.by_name("NVIDIA H100")  # prefix of a real name must not match


def test_by_pci_device_id_forms(cat):
    h100 = cat.get("h100-sxm")
    assert cat.by_pci_device_id(0x233010DE) is h100
    assert cat.by_pci_device_id("0x233010DE") is h100
    assert cat.by_pci_device_id("0x233010de") is h100
    assert cat.by_pci_device_id(0x2330) is h100
    assert cat.by_pci_device_id(0x2B0010DE) is None  # go-nvml mock id for "B200"
    assert cat.by_pci_device_id("not-an-id") is None
    assert cat.by_pci_device_id(0x290910DE) is cat.get("b200")  # second B200 device id


# -------------------------------------------------------------------------------------- identity vs captures


@pytest.mark.parametrize("key", sorted(CAPTURED))
def test_values_match_real_captures(cat, key):
    name, pci, mem, power, clocks = CAPTURED[key]
    m = cat.get(key)
    assert m.name == name
    if pci is not None:
        assert m.pci_device_id == pci
    assert m.memory_mib == mem
    assert (m.power_default_w, m.power_min_w, m.power_max_w) == power
    assert (m.clocks_max_sm_mhz, m.clocks_max_mem_mhz, m.clocks_max_graphics_mhz) == clocks
    for f in ("name", "memory_mib", "clocks_max_sm_mhz"):
        assert m.source_tag(f) == "real", f
    assert [v.source.split(":")[0] for v in m.power_limits_w] == ["real"]


@needs_reference
@pytest.mark.parametrize("key", sorted(CAPTURE_FILES))
def test_names_as_printed_in_capture_files(cat, key):
    text = (REFERENCE / "captures" / CAPTURE_FILES[key]).read_text(encoding="utf-8", errors="replace")
    m = cat.get(key)
    product = set(re.findall(r"^\s+Product Name\s+: (.+?)\s*$", text, re.M))
    listed = set(re.findall(r"^GPU \d+: (.+?) \(UUID:", text, re.M))
    assert product == {m.name}
    assert listed == {m.name}
    device_ids = set(re.findall(r"^\s+Device Id\s+: (0x[0-9A-F]{8})\s*$", text, re.M))
    assert device_ids == {m.pci_device_id_hex}
    totals = re.findall(r"^\s+FB Memory Usage\n\s+Total\s+: (\d+) MiB", text, re.M)
    assert totals and {int(t) for t in totals} == {m.memory_mib}
    for label, value in (
        ("Default Power Limit", m.power_default_w),
        ("Min Power Limit", m.power_min_w),
        ("Max Power Limit", m.power_max_w),
    ):
        printed = re.findall(rf"^\s+GPU Power Readings\n(?:.*\n)*?\s+{label}\s+: ([\d.]+) W", text, re.M)
        assert printed and {float(p) for p in printed} == {value}, label
    for label, value in (
        ("GPU Shutdown Temp", m.temp_shutdown_c),
        ("GPU Slowdown Temp", m.temp_slowdown_c),
        ("GPU Max Operating Temp", m.temp_max_operating_c),
        ("GPU Shutdown T.Limit Temp", m.temp_shutdown_tlimit_c),
        ("GPU Slowdown T.Limit Temp", m.temp_slowdown_tlimit_c),
    ):
        printed = set(re.findall(rf"^\s+{re.escape(label)}\s+: (-?\d+) C", text, re.M))
        if printed:
            assert printed == {str(value)}, label
        else:
            assert value is None, label


@needs_reference
def test_h100_mig_profiles_match_capture(cat):
    text = (REFERENCE / "captures" / "linux-x86_64__nvidia-h100-mig__590.48.01.txt").read_text(encoding="utf-8")
    spec = cat.get("h100-sxm").mig
    rows = re.findall(
        r"^\|\s+0\s+\d+\s+0\s+\d+\s+\|\s+\d+MiB /\s*(\d+)MiB\s+\|\s+(\d+)\s+\d+\s+\|"
        r"\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|",
        text,
        re.M,
    )
    names = re.findall(r"^\s+MIG (\S+)\s+Device\s+\d+:", text, re.M)
    # the capture holds the default table twice (idle, under load); -L once
    assert names and len(rows) % len(names) == 0
    for name, (mem, sm, ce, enc, dec, ofa, jpg) in zip(names * (len(rows) // len(names)), rows, strict=True):
        p = spec.profile(name)
        assert (p.memory_mib, p.sm_count, p.copy_engines, p.encoders, p.decoders, p.ofa, p.jpeg) == tuple(
            int(x) for x in (mem, sm, ce, enc, dec, ofa, jpg)
        ), name


def test_h100_mig_profiles_match_pinned_capture_values(cat):
    spec = cat.get("h100-sxm").mig
    for name, (mem, sm, ce, dec, jpg, ofa, enc) in H100_MIG_CAPTURED.items():
        p = spec.profile(name)
        assert (p.memory_mib, p.sm_count, p.copy_engines, p.decoders, p.jpeg, p.ofa, p.encoders) == (
            mem,
            sm,
            ce,
            dec,
            jpg,
            ofa,
            enc,
        )


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_pci_ids_have_nvidia_vendor(model):
    for pci in (model.pci_device_id, *model.other_pci_device_ids):
        assert pci & 0xFFFF == 0x10DE
        assert 0 < pci >> 16 <= 0xFFFF
    assert re.fullmatch(r"0x[0-9A-F]{4}10DE", model.pci_device_id_hex)


def test_primary_pci_ids_unique(cat):
    ids = [m.pci_device_id for m in cat]
    assert len(ids) == len(set(ids))


# ------------------------------------------------------------------------------------------------- peaks


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_peak_tables_shape(model):
    assert tuple(model.dense_tflops) == PRECISIONS
    assert tuple(model.sparse_tflops) == PRECISIONS
    for table in (model.dense_tflops, model.sparse_tflops):
        for value in table.values():
            assert value is None or (isinstance(value, float) and value > 0)
    for p in ("fp64", "fp64_tensor", "fp32"):
        assert model.sparse_tflops[p] is None  # sparsity applies to tensor precisions only


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_dense_is_half_of_sparse(model):
    for p in PRECISIONS:
        dense, sparse = model.dense_tflops[p], model.sparse_tflops[p]
        if dense is None or sparse is None:
            continue
        assert dense < sparse, p
        if p in TENSOR_PRECISIONS:
            # datasheets round; L40S bf16/fp16 (362.05 vs 733*) is the widest gap at 1.2 %
            assert dense == pytest.approx(sparse / 2, rel=0.02), p


def test_hopper_dense_bf16_is_not_the_sparse_figure(cat):
    for key in ("h100-sxm", "h200"):
        m = cat.get(key)
        assert m.dense_peak("bf16") == pytest.approx(989.4, abs=0.5)
        assert m.dense_peak("torch.bfloat16") == m.dense_peak("bf16")
        assert m.dense_peak("fp8") == pytest.approx(1978.9, abs=0.5)
        assert m.sparse_tflops["bf16"] == pytest.approx(1979, abs=1)


def test_dense_peak_aliases_and_errors(cat):
    m = cat.get("a100-sxm4-80gb")
    assert m.dense_peak("float16") == m.dense_peak("FP16") == 312.0
    assert m.dense_peak("fp8") is None  # Ampere has no FP8
    assert cat.get("rtx4090").dense_peak("bf16") == pytest.approx(165.2)  # FP32-accumulate rate
    for m in cat:
        if m.architecture == "Turing":  # no BF16 / TF32 / FP8 tensor cores before Ampere
            assert (m.dense_peak("bf16"), m.dense_peak("tf32"), m.dense_peak("fp8")) == (None, None, None)
        if m.architecture == "Ampere":
            assert m.dense_peak("fp8") is None
    with pytest.raises(ValueError, match="fp64"):
        m.dense_peak("fp4")


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_datacenter_models_have_dense_bf16_or_fp16(model):
    if model.datacenter and any(model.dense_tflops.values()):  # all null: no published figure (A10G), none guessed
        assert model.dense_peak("fp16") is not None
        assert model.dense_peak("fp32") is not None


# ------------------------------------------------------------------------------------------ power / misc


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_power_range(model):
    assert model.power_limits_w
    for variant in model.power_limits_w:
        dflt, lo, hi = variant.default_w, variant.min_w, variant.max_w
        assert dflt is not None and hi is not None  # every board variant has at least a TDP
        assert dflt <= hi
        if lo is not None:
            assert 0 < lo <= dflt
    defaults = {v.default_w for v in model.power_limits_w}
    assert model.power_default_w == (defaults.pop() if len(defaults) == 1 else None)
    assert model.power_max_w == max(v.max_w for v in model.power_limits_w)


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_hardware_sanity(model):
    assert model.architecture in {"Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"}
    assert model.form_factor in {"SXM", "PCIe", "NVL", "Superchip"}
    assert model.pcie_gen_max in {3, 4, 5, 6} and model.pcie_width_max in {8, 16} | (
        {1} if model.form_factor == "Superchip" else set())  # a real GH200 prints 1x: its GPU sits on NVLink-C2C
    assert model.nvlink_count >= 0
    if model.nvswitch_systems:
        assert model.nvlink_count > 0 and model.form_factor in {"SXM", "Superchip"}
    if model.memory_reserved_mib is not None:
        assert model.memory_reserved_mib < model.memory_mib
    for clock in (model.clocks_max_sm_mhz, model.clocks_max_graphics_mhz):
        assert clock is None or 500 <= clock <= 4000
    temps = [model.temp_max_operating_c, model.temp_slowdown_c, model.temp_shutdown_c]
    if None not in temps:
        assert temps == sorted(temps) and len(set(temps)) == 3
    tl = [model.temp_shutdown_tlimit_c, model.temp_slowdown_tlimit_c, model.temp_max_operating_tlimit_c]
    if None not in tl:
        assert tl == sorted(tl) and tl[0] < tl[1] <= tl[2] <= 0
    if not model.datacenter:
        assert model.mig is None


# --------------------------------------------------------------------------------------------------- MIG


def test_non_mig_models(cat):
    for key in NON_MIG:
        assert cat.get(key).mig is None
        assert not cat.get(key).mig_capable
    for key in REQUIRED_KEYS:
        if key not in NON_MIG:
            assert isinstance(cat.get(key).mig, MigSpec), key


@pytest.mark.parametrize("model", mig_models(), ids=_ids(mig_models()))
def test_mig_profiles_fit_the_gpu(model):
    spec = model.mig
    assert spec.compute_slices in (4, 7) and spec.memory_slices in (4, 8, 12)  # 12: RTX PRO 6000 Blackwell (real)
    ids = [p.id for p in spec.gpu_instance_profiles]
    names = [p.name for p in spec.gpu_instance_profiles]
    assert len(ids) == len(set(ids)), "profile ids must be unique"
    assert len(names) == len(set(names))
    full = [p for p in spec.gpu_instance_profiles if p.compute_slices == spec.compute_slices]
    assert full, "a whole-GPU profile exists"
    for p in spec.gpu_instance_profiles:
        assert isinstance(p, MigProfile)
        assert re.fullmatch(rf"{p.compute_slices}g\.\d+gb(\+me|\+gfx|\+me\.all|-me)?", p.name), p.name
        assert 1 <= p.compute_slices <= spec.compute_slices, p.name
        assert 1 <= p.memory_slices <= spec.memory_slices, p.name
        assert p.max_instances >= 1
        assert p.max_instances * p.compute_slices <= spec.compute_slices or p.max_instances == 1
        if p.memory_mib is not None:
            assert p.memory_mib <= model.memory_mib, p.name
            # a profile gets at most its share of the framebuffer
            assert p.memory_mib <= model.memory_mib * p.memory_slices / spec.memory_slices, p.name
        if p.memory_gib_printed is not None and p.memory_mib is not None:  # -lgip prints GiB only
            assert abs(float(p.memory_gib_printed) * 1024 - p.memory_mib) < 64, p.name
        if p.sm_count is not None and model.sm_count is not None:
            assert p.sm_count <= model.sm_count, p.name
        assert p.placements, p.name
        starts = [s for s, _ in p.placements]
        assert len(starts) == len(set(starts)), p.name
        for start, size in p.placements:
            assert size == p.memory_slices, p.name
            assert 0 <= start and start + size <= spec.memory_slices, p.name
        if "+me" in p.name:  # one shared media engine: fewer instances than placements
            assert p.max_instances <= len(p.placements), p.name
        else:
            assert len(p.placements) == p.max_instances, p.name
        assert p.verified.split(":", 1)[0] in SOURCE_TAGS


@pytest.mark.parametrize("model", mig_models(), ids=_ids(mig_models()))
def test_mig_profile_lookup(model):
    spec = model.mig
    for p in spec.gpu_instance_profiles:
        assert spec.profile(p.name) is p
        assert spec.profile(f"MIG {p.name}") is p
        assert spec.profile(p.display_name.upper()) is p
        assert spec.profile(p.id) is p
        assert spec.profile(str(p.id)) is p
    with pytest.raises(KeyError) as exc:
        spec.profile("9g.999gb")
    for name in spec.profile_names:
        assert name in str(exc.value)
    with pytest.raises(KeyError):
        spec.profile(999)
    with pytest.raises(KeyError):
        spec.profile(True)


def test_known_mig_ids(cat):
    h100 = cat.get("h100-sxm").mig
    assert (h100.profile("1g.10gb").id, h100.profile("7g.80gb").id) == (19, 0)
    assert h100.profile(19).memory_gib_printed == "9.75"
    assert h100.profile("3g.40gb").placements == ((0, 4), (4, 4))
    a30 = cat.get("a30").mig
    assert (a30.compute_slices, a30.memory_slices) == (4, 4)
    assert (a30.profile("1g.6gb").id, a30.profile("2g.12gb").id, a30.profile("4g.24gb").id) == (14, 5, 0)
    assert cat.get("h200").mig.profile(0).name == "7g.141gb"


# ---------------------------------------------------------------------------------------------- sources


@pytest.mark.parametrize("model", all_models(), ids=_ids(all_models()))
def test_every_value_has_a_source_tag(model):
    fields = [f for f in GpuModel.__dataclass_fields__ if f not in ("key", "sources")]
    assert set(model.sources) == set(fields)
    for f, src in model.sources.items():
        tag, _, detail = src.partition(": ")
        assert tag in SOURCE_TAGS, f
        assert detail.strip(), f
    if model.mig is not None:
        for p in model.mig.gpu_instance_profiles:
            assert p.verified.partition(": ")[0] in SOURCE_TAGS


def test_unknown_values_are_null_not_guessed(cat):
    # nothing in reference/ gives these; they must stay None rather than be invented
    assert cat.get("a30").clocks_max_sm_mhz is None
    assert cat.get("h100-sxm").temp_slowdown_c is None  # 590.x prints only T.Limit-relative values
    assert cat.get("h100-sxm").temp_slowdown_tlimit_c == -2
    b200_7g = cat.get("b200").mig.profile("7g.180gb")
    assert b200_7g.sm_count is None and b200_7g.memory_mib is None


# ------------------------------------------------------------------------------------- data files / loader


def _model_files():
    return sorted(
        (e for e in (resources.files("gpufleet.catalog") / "models").iterdir() if e.name.endswith(".json")),
        key=lambda e: e.name,
    )


def test_package_data_has_one_file_per_model(cat):
    files = _model_files()
    assert sorted(f.name for f in files) == sorted(f"{k}.json" for k in cat.keys())


@pytest.fixture
def h100_doc() -> dict:
    entry = resources.files("gpufleet.catalog") / "models" / "h100-sxm.json"
    return json.loads(entry.read_text(encoding="utf-8"))


def test_parse_model_round_trip(h100_doc):
    assert parse_model(copy.deepcopy(h100_doc)).name == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(nvlinks={"value": 18, "source": "real: x"}), "unknown fields"),
        (lambda d: d.pop("power_limits_w"), "missing fields"),
        (lambda d: d["power_limits_w"].update(source="datasheet: H100"), "source must be"),
        (lambda d: d["power_limits_w"]["value"][0].update(source="real:"), "source must be"),
        (lambda d: d["power_limits_w"]["value"][0].pop("min_w"), "keys must be exactly"),
        (lambda d: d["power_limits_w"]["value"][0].update(min_w=800.0), "min_w <= default_w <= max_w"),
        (lambda d: d["power_limits_w"].update(value=[]), "non-empty list of board variants"),
        (lambda d: d["pci_device_id"].update(value="0x23301002"), "0xDDDD10DE"),
        (lambda d: d["sm_count"].update(value="132"), "positive integer"),
        (lambda d: d["ecc_supported"].update(value=1), "true/false"),
        (lambda d: d["dense_tflops"]["value"].pop("int8"), "keys must be exactly"),
        (lambda d: d["dense_tflops"]["value"].update(fp4=1.0), "keys must be exactly"),
        (lambda d: d["mig"]["value"]["gpu_instance_profiles"][0].update(extra=1), "unknown keys"),
        (lambda d: d["mig"]["value"]["gpu_instance_profiles"][0].update(verified="real-lgip"), "source must be"),
        (lambda d: d["mig"]["value"]["gpu_instance_profiles"][0].update(placements=[[0]]), "start, size"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d["name"].pop("source"), "value"),
    ],
)
def test_parse_model_rejects_bad_files(h100_doc, mutate, match):
    mutate(h100_doc)
    with pytest.raises(CatalogError, match=match):
        parse_model(h100_doc, origin="h100-sxm.json")


def test_from_directory_checks_file_name_and_duplicate_names(tmp_path, h100_doc):
    (tmp_path / "h100-sxm.json").write_text(json.dumps(h100_doc))
    assert Catalog.from_directory(tmp_path).keys() == ("h100-sxm",)
    (tmp_path / "other.json").write_text(json.dumps(h100_doc))
    with pytest.raises(CatalogError, match="file name"):
        Catalog.from_directory(tmp_path)
    dup = copy.deepcopy(h100_doc)
    dup["key"] = "other"
    dup["name"]["value"] = "nvidia h100 80gb  HBM3"
    (tmp_path / "other.json").write_text(json.dumps(dup))
    with pytest.raises(CatalogError, match="same name"):
        Catalog.from_directory(tmp_path)
