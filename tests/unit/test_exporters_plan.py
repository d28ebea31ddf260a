"""The GPU exporter's plan (gpufleet.plan.ExportersPlan) and its settings: dcgm-exporter's collect interval (from the
scrape interval unless set), profiling counters and the proprietary DCGM package on Ampere and earlier."""

from __future__ import annotations

import pytest

from gpufleet.catalog import ARCHITECTURES, load_catalog
from gpufleet.config import ConfigErrors, load_node_config
from gpufleet.plan import ExportersPlan, Gpu

CATALOG = load_catalog()


def gpus(key: str, count: int = 8) -> list[Gpu]:
    model = CATALOG.get(key)
    return [Gpu(index=i, source="nvidia-smi", name=model.name, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
                model=model)
            for i in range(count)]


def plan(data: dict, key: str = "h100-sxm") -> ExportersPlan:
    return ExportersPlan.resolve(load_node_config("gpu01", data), gpus(key))


@pytest.mark.parametrize(("data", "ms"), [
    ({}, 15000),  # no scrape interval in the host's data: Prometheus' 15s default as gpufleet's monitoring sets it
    ({"gpufleet_monitoring_scrape_interval": "30s"}, 30000),  # the fleet's group_data: follows the scrape interval
    ({"gpufleet_monitoring_scrape_interval": "1m"}, 60000),
    ({"gpufleet_monitoring_scrape_interval": "30s", "gpufleet_exporters_collect_interval": "10s"}, 10000),
    ({"gpufleet_exporters_collect_interval": "1m30s"}, 90000),
    ({"gpufleet_exporters_collect_interval": "1500ms"}, 1500),
])
def test_collect_interval_follows_the_scrape_interval_unless_set(data, ms):
    assert plan(data).collect_interval_ms == ms


@pytest.mark.parametrize(("data", "message"), [
    ({"gpufleet_exporters_collect_interval": "15"},
     "gpu01: gpufleet_exporters_collect_interval='15': not a collect interval; allowed: a duration between 1s and "
     "1h, e.g. \"15s\" (unset: the scrape interval, else 15s)"),
    ({"gpufleet_exporters_collect_interval": "500ms"}, "gpu01: gpufleet_exporters_collect_interval='500ms'"),
    ({"gpufleet_exporters_collect_interval": "2h"}, "gpu01: gpufleet_exporters_collect_interval='2h'"),
    ({"gpufleet_monitoring_scrape_interval": "fast"},
     "gpu01: gpufleet_monitoring_scrape_interval='fast': not a scrape interval; allowed: a Prometheus duration "
     "between 1s and 1h"),
])
def test_bad_collect_interval_names_host_key_value_and_what_is_allowed(data, message):
    with pytest.raises(ConfigErrors) as caught:
        load_node_config("gpu01", data)
    assert message in str(caught.value)


def test_a_bad_scrape_interval_does_not_matter_when_the_collect_interval_is_set():
    assert plan({"gpufleet_monitoring_scrape_interval": "fast",
                 "gpufleet_exporters_collect_interval": "20s"}).collect_interval_ms == 20000


@pytest.mark.parametrize(("key", "profiling", "package"), [
    ("a100-sxm4-80gb", True, True),  # Ampere: profiling needs datacenter-gpu-manager-4-proprietary
    ("a30", True, True),
    ("t4", True, True),  # Turing
    ("l40s", True, False),  # Ada Lovelace: after Ampere
    ("h100-sxm", True, False),
    ("b200", True, False),
    ("rtx4090", False, False),  # no profiling counters on GeForce: no package either
    ("rtx2080-super", False, False),
])
def test_profiling_and_its_proprietary_package_from_the_catalog(key, profiling, package):
    resolved = plan({}, key)
    assert (resolved.profiling, resolved.profiling_package) == (profiling, package)


def test_no_gpus_no_profiling():
    assert ExportersPlan.resolve(load_node_config("gpu01", {}), []) == ExportersPlan(False, False, 15000)


def test_every_catalog_architecture_is_ordered():
    assert {m.architecture for m in CATALOG} <= set(ARCHITECTURES)
    assert CATALOG.get("a100-sxm4-80gb").architecture_at_most("Ampere")
    assert not CATALOG.get("l40s").architecture_at_most("Ampere")
