"""gpufleet.config: strict validation of pyinfra host data, with exact messages (host, key, value, allowed)."""

from __future__ import annotations

import textwrap

import pytest

from gpufleet.config import (
    DEFAULT_STAGES,
    ConfigError,
    ConfigErrors,
    NodeConfig,
    PowerLimit,
    load_node_config,
    register_namespace,
    validate_inventory,
)

H100 = "NVIDIA H100 80GB HBM3"
UUID_A = "GPU-76aef7ff-372d-2432-b4b4-beca4d8d3400"
UUID_B = "GPU-c7a0294c-c2c2-5476-438c-fb468eaa223b"

# The shape of NVIDIA mig-parted's examples/config files (version: v1, mig-configs, device-filter, quoted profiles).
MIG_PARTED_FILE = textwrap.dedent("""\
    version: v1
    mig-configs:
      all-disabled:
        - devices: all
          mig-enabled: false

      all-enabled:
        - devices: all
          mig-enabled: true
          mig-devices: {}

      all-1g.10gb:
        - devices: all
          mig-enabled: true
          mig-devices:
            "1g.10gb": 7

      # H100-80GB, A100-80GB
      all-balanced:
        - device-filter: ["0x233010DE", "0x233110DE", "0x20B210DE"]
          devices: all
          mig-enabled: true
          mig-devices:
            "1g.10gb": 2
            "2g.20gb": 1
            "3g.40gb": 1

      custom-config:
        - devices: [0, 1, 2, 3]
          mig-enabled: false
        - devices: [4]
          mig-enabled: true
          mig-devices:
            "1g.10gb": 7
        - devices: [5, 6, 7]
          mig-enabled: true
          mig-devices:
            "3g.40gb": 2
    """)


def errors_of(data: dict, host: str = "node01") -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_node_config(host, data)
    assert all(isinstance(e, ConfigError) and e.host == host for e in info.value.errors)
    return [e.message for e in info.value.errors]


# ------------------------------------------------------------------------------------------- bad inputs

BAD_INPUTS = [
    pytest.param(
        {"gpufleet_power_limt": 300},
        "node01: gpufleet_power_limt=300: unknown gpufleet setting; allowed: a known gpufleet_* key "
        "(did you mean 'gpufleet_power_limit'?)",
        id="unknown-key-typo",
    ),
    pytest.param(
        {"gpufleet_driver_flavour": "opne"},
        "node01: gpufleet_driver_flavour='opne': unknown choice; allowed: auto, open, proprietary "
        "(did you mean 'open'?)",
        id="flavour-typo",
    ),
    pytest.param(
        {"gpufleet_stages": ["power", "driver"]},
        "node01: gpufleet_stages=['power', 'driver']: stages out of order; allowed: a list of stages, in this "
        "order: driver, persistence, power, mig, nccl, clocks, exporters, slurm",
        id="stages-order",
    ),
    pytest.param(
        {"gpufleet_stages": ["drivers", "power"]},
        "node01: gpufleet_stages[0]='drivers': unknown stage; allowed: driver, persistence, power, mig, nccl, "
        "clocks, exporters, slurm (did you mean 'driver'?)",
        id="stages-unknown",
    ),
    pytest.param(
        {"gpufleet_stages": "driver"},
        "node01: gpufleet_stages='driver': not a list; allowed: a list of stages, in this order: driver, "
        "persistence, power, mig, nccl, clocks, exporters, slurm",
        id="stages-not-list",
    ),
    pytest.param(
        {"gpufleet_stages": ["driver", "driver"]},
        "node01: gpufleet_stages=['driver', 'driver']: stage 'driver' listed twice; allowed: a list of stages, in "
        "this order: driver, persistence, power, mig, nccl, clocks, exporters, slurm; each stage once",
        id="stages-duplicate",
    ),
    pytest.param(
        {"gpufleet_driver_branch": "580.95.05"},
        "node01: gpufleet_driver_branch='580.95.05': not a driver branch; allowed: a driver branch: 3 digits, "
        'e.g. "580"',
        id="branch-full-version",
    ),
    pytest.param(
        {"gpufleet_driver_repo_url": "ftp://mirror.example.com/cuda"},
        "node01: gpufleet_driver_repo_url='ftp://mirror.example.com/cuda': not a URL; allowed: an http:// or "
        "https:// URL without spaces or quotes, e.g. https://mirror.example.com/cuda/ubuntu2204/x86_64/",
        id="repo-url-scheme",
    ),
    pytest.param(
        {"gpufleet_driver_repo_keyring_url": "https://mirror.example.com/key ring.gpg"},
        "node01: gpufleet_driver_repo_keyring_url='https://mirror.example.com/key ring.gpg': not a URL; allowed: "
        "an http:// or https:// URL without spaces or quotes, e.g. https://mirror.example.com/cuda/ubuntu2204/x86_64/",
        id="keyring-url-space",
    ),
    pytest.param(
        {"gpufleet_driver_packages_style": "debian"},
        "node01: gpufleet_driver_packages_style='debian': unknown choice; allowed: ubuntu, nvidia (or unset)",
        id="packages-style",
    ),
    pytest.param(
        {"gpufleet_allow_reboot": "yes"},
        "node01: gpufleet_allow_reboot='yes': not a boolean; allowed: true or false",
        id="allow-reboot-string",
    ),
    pytest.param(
        {"gpufleet_driver_secure_boot_signing": 1},
        "node01: gpufleet_driver_secure_boot_signing=1: not a boolean; allowed: true or false",
        id="sb-signing-int",
    ),
    pytest.param(
        {"gpufleet_config_version": 2},
        "node01: gpufleet_config_version=2: unsupported configuration version; allowed: 1",
        id="config-version",
    ),
    pytest.param(
        {"gpufleet_power_limit": "80 percent"},
        "node01: gpufleet_power_limit='80 percent': not a power limit; allowed: watts as a number (e.g. 300; > 0 "
        'and <= 5000), a percent of the GPU\'s default limit as a string (e.g. "80%"; > 0% and <= 200%), or '
        '"default"',
        id="power-words",
    ),
    pytest.param(
        {"gpufleet_power_limit": -50},
        "node01: gpufleet_power_limit=-50: power limit out of range; allowed: watts as a number (e.g. 300; > 0 "
        'and <= 5000), a percent of the GPU\'s default limit as a string (e.g. "80%"; > 0% and <= 200%), or '
        '"default"',
        id="power-negative",
    ),
    pytest.param(
        {"gpufleet_power_limit": "250%"},
        "node01: gpufleet_power_limit='250%': percent out of range; allowed: watts as a number (e.g. 300; > 0 "
        'and <= 5000), a percent of the GPU\'s default limit as a string (e.g. "80%"; > 0% and <= 200%), or '
        '"default"',
        id="power-percent-range",
    ),
    pytest.param(
        {"gpufleet_power_limit": True},
        "node01: gpufleet_power_limit=True: not a power limit; allowed: watts as a number (e.g. 300; > 0 "
        'and <= 5000), a percent of the GPU\'s default limit as a string (e.g. "80%"; > 0% and <= 200%), or '
        '"default"',
        id="power-bool",
    ),
    pytest.param(
        {"gpufleet_power_limit_by_model": {"NVIDIA H100 80GB HMB3": 600}},
        "node01: gpufleet_power_limit_by_model['NVIDIA H100 80GB HMB3']='NVIDIA H100 80GB HMB3': unknown GPU model; "
        "allowed: a GPU name as nvidia-smi prints it or a catalog key: a10, a100-pcie-40gb, a100-pcie-80gb, "
        "a100-sxm4-40gb, a100-sxm4-80gb, a10g, a30, a40, b200, gb200, gb300, gh200-480gb, h100-nvl, h100-pcie, "
        "h100-sxm, h20, h200, h200-nvl, l4, l40, l40s, rtx-a6000, rtx-pro-6000-blackwell-server, rtx2080-super, "
        "rtx4080-super, rtx4090, rtx6000-ada, t4, v100-sxm2-16gb, v100-sxm2-32gb (did you mean 'NVIDIA H100 80GB "
        "HBM3'?)",
        id="power-model-typo",
    ),
    pytest.param(
        {"gpufleet_power_limit_by_model": {"h100-sxm": 600, H100: 650}},
        f"node01: gpufleet_power_limit_by_model['{H100}']='{H100}': same model as 'h100-sxm'; allowed: one entry "
        "per GPU model",
        id="power-model-duplicate",
    ),
    pytest.param(
        {"gpufleet_power_limit_by_uuid": {"GPU-1234": 500}},
        "node01: gpufleet_power_limit_by_uuid['GPU-1234']='GPU-1234': not a GPU UUID; allowed: a GPU UUID as "
        "nvidia-smi -L prints it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
        id="power-uuid-shape",
    ),
    pytest.param(
        {"gpufleet_mig": [{"devices": "all", "mig_enabled": True}]},
        "node01: gpufleet_mig[0].mig_enabled=True: unknown mig-parted key; allowed: devices, device-filter, "
        "mig-enabled, mig-devices (did you mean 'mig-enabled'?)",
        id="mig-key-underscore",
    ),
    pytest.param(
        {"gpufleet_mig": [{"devices": "some", "mig-enabled": True}]},
        "node01: gpufleet_mig[0].devices='some': not a device selection; allowed: \"all\" or a list of distinct "
        "GPU indices (0, 1, ...)",
        id="mig-devices-selection",
    ),
    pytest.param(
        {"gpufleet_mig": [{"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 7}}]},
        "node01: gpufleet_mig[0].mig-devices={'1g.10gb': 7}: MIG devices on a GPU with MIG disabled; allowed: "
        "empty when mig-enabled is false",
        id="mig-disabled-with-devices",
    ),
    pytest.param(
        {"gpufleet_mig": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1c.3g.40gb": 2}}]},
        "node01: gpufleet_mig[0].mig-devices['1c.3g.40gb']='1c.3g.40gb': compute-instance profiles are not "
        'supported; allowed: GPU instance profiles such as "3g.40gb" (each gets one full compute instance)',
        id="mig-ci-profile",
    ),
    pytest.param(
        {"gpufleet_mig": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": -1}}]},
        "node01: gpufleet_mig[0].mig-devices['1g.10gb']=-1: not an instance count; allowed: a whole number of "
        "instances >= 0",
        id="mig-count-negative",
    ),
    pytest.param(
        {"gpufleet_mig": [{"devices": "all", "mig-enabled": True, "device-filter": "0x2330"}]},
        "node01: gpufleet_mig[0].device-filter='0x2330': not a device filter; allowed: a PCI device id or a list "
        'of them, as nvidia-smi prints pci.device_id: "0x233010DE"',
        id="mig-device-filter",
    ),
    pytest.param(
        {"gpufleet_mig": {"version": "v1"}},
        "node01: gpufleet_mig={'version': 'v1'}: not a non-empty list; allowed: a mig-parted layout: a list of "
        '{devices: all | [indices], mig-enabled: true|false, mig-devices: {"1g.10gb": 7}, device-filter '
        '(optional): ["0x233010DE"]}',
        id="mig-whole-file-inline",
    ),
    pytest.param(
        {"gpufleet_mig_config_file": "/etc/mig.yaml"},
        "node01: gpufleet_mig_config=None: required when gpufleet_mig_config_file is set; allowed: the label of "
        "the layout to apply, one of the mig-configs in gpufleet_mig_config_file",
        id="mig-file-without-label",
    ),
    pytest.param(
        {"gpufleet_mig_config": "all-1g.10gb"},
        "node01: gpufleet_mig_config_file=None: required when gpufleet_mig_config is set; allowed: a path to a "
        "mig-parted config file",
        id="mig-label-without-file",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_SOCKET_IFNAM": "eth0"}},
        "node01: gpufleet_nccl['NCCL_SOCKET_IFNAM']='eth0': unknown NCCL variable; allowed: one of NCCL_ALGO, "
        "NCCL_CROSS_NIC, NCCL_DEBUG, NCCL_DEBUG_FILE, NCCL_DEBUG_SUBSYS, NCCL_IB_DISABLE, NCCL_IB_GID_INDEX, "
        "NCCL_IB_HCA, NCCL_NET, NCCL_NET_GDR_LEVEL, NCCL_NVLS_ENABLE, NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_PROTO, "
        "NCCL_SHM_DISABLE, NCCL_SOCKET_FAMILY, NCCL_SOCKET_IFNAME, NCCL_TOPO_FILE (did you mean "
        "'NCCL_SOCKET_IFNAME'?)",
        id="nccl-unknown-key",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_SOCKET_IFNAME": "eth0, eth1"}},
        "node01: gpufleet_nccl['NCCL_SOCKET_IFNAME']='eth0, eth1': not representable in nccl.conf; allowed: comma "
        "list of interface prefixes, ^ to exclude, = for exact names, e.g. eth, =eth0,eth1, ^docker; written as "
        "KEY=VALUE: no spaces, quotes, backslashes or #",
        id="nccl-space",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_DEBUG": '"INFO"'}},
        "node01: gpufleet_nccl['NCCL_DEBUG']='\"INFO\"': not representable in nccl.conf; allowed: VERSION, WARN, "
        "INFO, TRACE; written as KEY=VALUE: no spaces, quotes, backslashes or #",
        id="nccl-quotes",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_DEBUG": "LOUD"}},
        "node01: gpufleet_nccl['NCCL_DEBUG']='LOUD': invalid NCCL_DEBUG value; allowed: VERSION, WARN, INFO, TRACE",
        id="nccl-debug-level",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_P2P_LEVEL": "NVLINK"}},
        "node01: gpufleet_nccl['NCCL_P2P_LEVEL']='NVLINK': invalid NCCL_P2P_LEVEL value; allowed: LOC, NVL, PIX, "
        "PXB, PHB, SYS (or a legacy integer >= 0)",
        id="nccl-p2p-level",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_ALGO": "ring,butterfly"}},
        "node01: gpufleet_nccl['NCCL_ALGO']='ring,butterfly': invalid NCCL_ALGO value; allowed: a comma list of "
        "ring, tree, collnet, collnetchain, collnetdirect, nvls, nvlstree, pat (case-insensitive, ^ to exclude; "
        "since 2.24 also per function: ring,tree;allreduce:^tree)",
        id="nccl-algo",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_IB_GDR_LEVEL": "PHB"}},
        "node01: gpufleet_nccl['NCCL_IB_GDR_LEVEL']='PHB': renamed NCCL variable; allowed: NCCL_NET_GDR_LEVEL "
        "(renamed in NCCL 2.4)",
        id="nccl-renamed",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_CONF_FILE": "/etc/other.conf"}},
        "node01: gpufleet_nccl['NCCL_CONF_FILE']='/etc/other.conf': NCCL reads it before any config file, so "
        "setting it in /etc/nccl.conf has no effect; allowed: set it in the environment of the job instead",
        id="nccl-conf-file",
    ),
    pytest.param(
        {"gpufleet_nccl": {"NCCL_CROSS_NIC": 3}},
        "node01: gpufleet_nccl['NCCL_CROSS_NIC']=3: invalid NCCL_CROSS_NIC value; allowed: an integer 0..2",
        id="nccl-cross-nic",
    ),
    pytest.param(
        {"gpufleet_clocks": {"lock_gpu_mhz": [1980, 1410]}},
        "node01: gpufleet_clocks.lock_gpu_mhz=[1980, 1410]: not a [min, max] clock range; allowed: "
        '{"lock_gpu_mhz": [min, max]} (MHz, 1..5000, min <= max) or "reset"',
        id="clocks-reversed",
    ),
    pytest.param(
        {"gpufleet_clocks": {"lock_clocks": [1410, 1410]}},
        "node01: gpufleet_clocks.lock_clocks=[1410, 1410]: unknown clocks key; allowed: lock_gpu_mhz",
        id="clocks-key",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_INPUTS)
def test_bad_input_message(data, message):
    assert errors_of(data) == [message]


def test_at_least_fifteen_distinct_bad_inputs():
    assert len({p.id for p in BAD_INPUTS}) >= 15


def test_error_attributes_name_host_key_value_allowed():
    with pytest.raises(ConfigErrors) as info:
        load_node_config("gpu-7", {"gpufleet_driver_flavour": "closed"})
    (error,) = info.value.errors
    assert (error.host, error.key, error.value) == ("gpu-7", "gpufleet_driver_flavour", "closed")
    assert error.allowed == "auto, open, proprietary"
    assert str(error) == "gpu-7: gpufleet_driver_flavour='closed': unknown choice; allowed: auto, open, proprietary"


def test_all_errors_of_one_host_are_reported_together():
    messages = errors_of({"gpufleet_allow_reboot": "no", "gpufleet_driver_branch": 58, "gpufleet_foo": 1})
    assert [m.split(":")[1].split("=")[0].strip() for m in messages] == [
        "gpufleet_foo", "gpufleet_allow_reboot", "gpufleet_driver_branch"]


# ------------------------------------------------------------------------------------------- inventory


def test_validate_inventory_collects_errors_of_every_host():
    hosts = [
        ("node01", {"gpufleet_power_limit": 300}),
        ("node02", {"gpufleet_power_limit": "lots"}),
        ("node03", {"gpufleet_driver_flavour": "opne", "gpufleet_stages": ["mig", "power"]}),
    ]
    with pytest.raises(ConfigErrors) as info:
        validate_inventory(hosts)
    errors = info.value.errors
    assert [(e.host, e.key) for e in errors] == [
        ("node02", "gpufleet_power_limit"),
        ("node03", "gpufleet_stages"),
        ("node03", "gpufleet_driver_flavour"),
    ]
    text = str(info.value)
    assert text.splitlines()[0] == "3 configuration error(s) on 2 host(s) (node02, node03):"
    assert "  - node02: gpufleet_power_limit='lots': not a power limit;" in text


def test_validate_inventory_returns_configs_when_clean():
    configs = validate_inventory([("a", {}), ("b", {"gpufleet_allow_reboot": True})])
    assert set(configs) == {"a", "b"}
    assert configs["b"].allow_reboot is True and configs["a"].allow_reboot is False


def test_foreign_keys_are_ignored():
    data = {
        "ssh_user": "root",
        "ssh_key": "/k",
        "_sudo": True,
        "gpufleet_sim_profile": "h100-sxm-8",
        "gpufleet_sim_repo_url": "http://10.77.0.1:8731",
        "monitoring_port": 9400,
    }
    assert load_node_config("n", data) == NodeConfig(host="n")


def test_registered_namespace_is_left_to_its_owner():
    with pytest.raises(ConfigErrors):
        load_node_config("n", {"gpufleet_testns_thing": 1})
    register_namespace("gpufleet_testns_")
    assert load_node_config("n", {"gpufleet_testns_thing": 1}).host == "n"
    with pytest.raises(ValueError):
        register_namespace("verify_")


# ---------------------------------------------------------------------------------------------- defaults


def test_defaults():
    config = load_node_config("n", {})
    assert config.stages == DEFAULT_STAGES == ("driver", "persistence", "power", "mig", "nccl", "exporters")
    assert not config.stage_enabled("clocks")
    assert config.driver.branch == "580" and config.driver.flavour == "auto"
    assert config.driver.repo_url is None and config.driver.packages_style is None
    assert config.allow_reboot is False and config.driver.secure_boot_signing is False
    assert not config.power.managed and config.mig is None and not config.nccl.managed
    assert config.clocks.mode is None


def test_config_is_frozen_and_hashable():
    config = load_node_config("n", {"gpufleet_power_limit_by_model": {"h100-sxm": 600},
                                    "gpufleet_mig": [{"devices": "all", "mig-enabled": True,
                                                      "mig-devices": {"1g.10gb": 7}}],
                                    "gpufleet_nccl": {"NCCL_DEBUG": "WARN"}})
    with pytest.raises(AttributeError):
        config.allow_reboot = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.power.by_model["h100-sxm"] = PowerLimit("watts", 1)  # type: ignore[index]
    same = load_node_config("n", {"gpufleet_power_limit_by_model": {"NVIDIA H100 80GB HBM3": 600},
                                  "gpufleet_mig": [{"devices": "all", "mig-enabled": True,
                                                    "mig-devices": {"1g.10gb": 7}}],
                                  "gpufleet_nccl": {"NCCL_DEBUG": "warn"}})
    assert config == same and hash(config) == hash(same)


def test_valid_values_parse():
    config = load_node_config("n", {
        "gpufleet_stages": ["driver", "power", "clocks"],
        "gpufleet_driver_branch": 570,  # pyinfra --data parses 570 to an int
        "gpufleet_driver_flavour": "open",
        "gpufleet_driver_repo_url": "http://10.77.0.1:8731",
        "gpufleet_driver_repo_keyring_url": "https://mirror.example.com/cuda/keyring.gpg",
        "gpufleet_driver_packages_style": "nvidia",
        "gpufleet_clocks": {"lock_gpu_mhz": [1410, 1410]},
        "gpufleet_nccl": {
            "NCCL_SOCKET_IFNAME": "=eth0,eth1",
            "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
            "NCCL_IB_DISABLE": False,
            "NCCL_DEBUG": "warn",
            "NCCL_ALGO": "ring,collnetdirect;allreduce:^tree",
            "NCCL_NET_GDR_LEVEL": "phb",
            "NCCL_IB_GID_INDEX": -1,
            "NCCL_DEBUG_SUBSYS": "^INIT,ENV",
            "NCCL_TOPO_FILE": "/etc/nccl/topo.xml",
        },
    })
    assert config.stages == ("driver", "power", "clocks")
    assert config.driver.branch == "570"
    assert config.clocks.lock_gpu_mhz == (1410, 1410)
    assert config.nccl.lines() == [
        "NCCL_ALGO=ring,collnetdirect;allreduce:^tree",
        "NCCL_DEBUG=WARN",
        "NCCL_DEBUG_SUBSYS=^INIT,ENV",
        "NCCL_IB_DISABLE=0",
        "NCCL_IB_GID_INDEX=-1",
        "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1",
        "NCCL_NET_GDR_LEVEL=PHB",
        "NCCL_SOCKET_IFNAME==eth0,eth1",
        "NCCL_TOPO_FILE=/etc/nccl/topo.xml",
    ]
    assert load_node_config("n", {"gpufleet_clocks": "reset"}).clocks.mode == "reset"


# ------------------------------------------------------------------------------------------ power limits


def test_power_limit_values():
    assert PowerLimit("watts", 300).resolve(700) == 300
    assert PowerLimit("percent", 80).resolve(700) == 560
    assert PowerLimit("percent", 85).resolve(350) == 297.5
    assert PowerLimit("default").resolve(450) == 450
    assert PowerLimit("percent", 80).resolve(None) is None
    assert [str(PowerLimit("watts", 300)), str(PowerLimit("percent", 80)), str(PowerLimit("default"))] == [
        "300 W", "80%", "default"]


# ------------------------------------------------------------------------------------------------- MIG


@pytest.fixture
def mig_file(tmp_path):
    path = tmp_path / "mig-parted-config.yaml"
    path.write_text(MIG_PARTED_FILE)
    return path


def test_mig_parted_file_label(mig_file):
    config = load_node_config("n", {"gpufleet_mig_config_file": str(mig_file), "gpufleet_mig_config": "all-1g.10gb"})
    mig = config.mig
    assert (mig.key, mig.file, mig.label) == ("gpufleet_mig_config", str(mig_file), "all-1g.10gb")
    (entry,) = mig.entries
    assert entry.devices == "all" and entry.mig_enabled is True and dict(entry.mig_devices) == {"1g.10gb": 7}
    assert entry.device_filter is None
    assert mig.layout_for(3, "0x233010DE") is entry


def test_mig_parted_file_device_filter_and_device_lists(mig_file):
    base = {"gpufleet_mig_config_file": str(mig_file)}
    balanced = load_node_config("n", {**base, "gpufleet_mig_config": "all-balanced"}).mig
    assert balanced.entries[0].device_filter == ("0x233010DE", "0x233110DE", "0x20B210DE")
    assert balanced.layout_for(0, "0x233010de") is balanced.entries[0]
    assert balanced.layout_for(0, "0x26B910DE") is None  # an L40S is not selected: left alone
    custom = load_node_config("n", {**base, "gpufleet_mig_config": "custom-config"}).mig
    assert [e.devices for e in custom.entries] == [(0, 1, 2, 3), (4,), (5, 6, 7)]
    assert custom.layout_for(2, None).mig_enabled is False
    assert dict(custom.layout_for(6, None).mig_devices) == {"3g.40gb": 2}
    enabled = load_node_config("n", {**base, "gpufleet_mig_config": "all-enabled"}).mig
    assert enabled.entries[0].mig_enabled and dict(enabled.entries[0].mig_devices) == {}


def test_mig_inline_same_format():
    config = load_node_config("n", {"gpufleet_mig": [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": "all", "device-filter": ["0x20b210de"], "mig-enabled": False},
    ]})
    assert config.mig.key == "gpufleet_mig" and config.mig.file is None
    assert config.mig.entries[1].device_filter == ("0x20B210DE",)
    assert config.mig.matching_entries(0, "0x20B210DE") == [0, 1]


def test_mig_file_label_unknown(mig_file):
    messages = errors_of({"gpufleet_mig_config_file": str(mig_file), "gpufleet_mig_config": "all-1g.10g"})
    assert messages == [
        f"node01: gpufleet_mig_config='all-1g.10g': no such label in {mig_file}; allowed: all-disabled, "
        "all-enabled, all-1g.10gb, all-balanced, custom-config (did you mean 'all-1g.10gb'?)"]


def test_mig_file_missing(tmp_path):
    path = tmp_path / "nope.yaml"
    messages = errors_of({"gpufleet_mig_config_file": str(path), "gpufleet_mig_config": "x"})
    assert len(messages) == 1
    assert messages[0].startswith(f"node01: gpufleet_mig_config_file='{path}': file not found; allowed: an "
                                  "existing file (relative paths are from ")


def test_mig_file_wrong_version(tmp_path):
    path = tmp_path / "v2.yaml"
    path.write_text("version: v2\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n")
    assert errors_of({"gpufleet_mig_config_file": str(path), "gpufleet_mig_config": "a"}) == [
        "node01: gpufleet_mig_config_file:version='v2': unsupported version; allowed: \"v1\" (mig-parted config "
        "format)"]


def test_mig_file_bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("version: v1\nmig-configs:\n  a: [\n")
    messages = errors_of({"gpufleet_mig_config_file": str(path), "gpufleet_mig_config": "a"})
    assert len(messages) == 1
    assert messages[0].startswith(f"node01: gpufleet_mig_config_file='{path}': not valid YAML at line 4")


def test_mig_file_bad_entry_names_the_label(mig_file, tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(MIG_PARTED_FILE.replace('"3g.40gb": 2', '"3g.40gb": two'))
    messages = errors_of({"gpufleet_mig_config_file": str(path), "gpufleet_mig_config": "custom-config"})
    assert messages == [
        "node01: gpufleet_mig_config_file:mig-configs['custom-config'][2].mig-devices['3g.40gb']='two': not an "
        "instance count; allowed: a whole number of instances >= 0"]
    # other labels are not this host's concern
    assert load_node_config("n", {"gpufleet_mig_config_file": str(path), "gpufleet_mig_config": "all-1g.10gb"})


def test_mig_inline_and_file_together(mig_file):
    messages = errors_of({"gpufleet_mig": [{"devices": "all", "mig-enabled": False}],
                          "gpufleet_mig_config_file": str(mig_file), "gpufleet_mig_config": "all-disabled"})
    assert messages == [
        "node01: gpufleet_mig=[{'devices': 'all', 'mig-enabled': False}]: two MIG layouts given; allowed: either "
        "gpufleet_mig (inline) or gpufleet_mig_config_file + gpufleet_mig_config, not both"]
