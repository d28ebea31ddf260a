"""The ``--query-gpu`` field table of nvidia-smi 590.48.01 (order, aliases, units).

One line per field: ``canonical|aliases|unit|default``. The default is what the real H100 capture printed
(used for fields the simulator does not model); modelled fields are computed in smi_query.py.
"""

FIELD_TABLE = """\
timestamp|||
driver_version|||590.48.01
vgpu_driver_capability.heterogenous_multivGPU|||[N/A]
count|||1
name|gpu_name||NVIDIA H100 80GB HBM3
serial|gpu_serial||0000000000000
uuid|gpu_uuid||GPU-00000000-0000-0000-0000-000000000000
pci.bus_id|gpu_bus_id||00000000:00:09.0
pci.domain|||0x0000
pci.bus|||0x00
pci.device|||0x09
pci.baseClass|||0x3
pci.subClass|||0x2
pci.device_id|||0x233010DE
pci.sub_device_id|||0x16C110DE
vgpu_device_capability.fractional_multiVgpu|||[N/A]
vgpu_device_capability.heterogeneous_timeSlice_profile|||[N/A]
vgpu_device_capability.heterogeneous_timeSlice_sizes|||[N/A]
vgpu_device_capability.homogeneous_placements|||[N/A]
vgpu_device_capability.mig_timeSlicing|||[N/A]
vgpu_device_capability.mig_timeSlicing_mode|||[N/A]
pcie.link.gen.current|||5
pcie.link.gen.gpucurrent|||5
pcie.link.gen.max|||5
pcie.link.gen.gpumax|||5
pcie.link.gen.hostmax|||[N/A]
pcie.link.width.current|||16
pcie.link.width.max|||16
index|||0
display_mode|||[Requested functionality has been deprecated]
display_attached|||Yes
display_active|||Disabled
persistence_mode|||Enabled
addressing_mode|||None
accounting.mode|||Disabled
accounting.buffer_size|||4000
driver_model.current|||[N/A]
driver_model.pending|||[N/A]
vbios_version|||96.00.A5.00.01
inforom.img|inforom.image||G520.0200.00.05
inforom.oem|||2.1
inforom.ecc|||7.16
inforom.pwr|inforom.power||[N/A]
inforom.checksum_validation|||valid
gpu_recovery_action|||None
gom.current|gpu_operation_mode.current||[N/A]
gom.pending|gpu_operation_mode.pending||[N/A]
fan.speed||%|[N/A]
pstate|||P0
clocks_event_reasons.supported|clocks_throttle_reasons.supported||0x00000000000001FF
clocks_event_reasons.active|clocks_throttle_reasons.active||0x0000000000000001
clocks_event_reasons.gpu_idle|clocks_throttle_reasons.gpu_idle||Active
clocks_event_reasons.applications_clocks_setting|clocks_throttle_reasons.applications_clocks_setting||Not Active
clocks_event_reasons.sw_power_cap|clocks_throttle_reasons.sw_power_cap||Not Active
clocks_event_reasons.hw_slowdown|clocks_throttle_reasons.hw_slowdown||Not Active
clocks_event_reasons.hw_thermal_slowdown|clocks_throttle_reasons.hw_thermal_slowdown||Not Active
clocks_event_reasons.hw_power_brake_slowdown|clocks_throttle_reasons.hw_power_brake_slowdown||Not Active
clocks_event_reasons.sw_thermal_slowdown|clocks_throttle_reasons.sw_thermal_slowdown||Not Active
clocks_event_reasons.sync_boost|clocks_throttle_reasons.sync_boost||Not Active
clocks_event_reasons_counters.sw_power_cap||us|0
clocks_event_reasons_counters.sync_boost||us|0
clocks_event_reasons_counters.sw_thermal_slowdown||us|0
clocks_event_reasons_counters.hw_thermal_slowdown||us|0
clocks_event_reasons_counters.hw_power_brake_slowdown||us|0
memory.total||MiB|81559
memory.reserved||MiB|479
memory.used||MiB|0
memory.free||MiB|81081
compute_mode|||Default
compute_cap|||9.0
utilization.gpu||%|0
utilization.memory||%|0
utilization.encoder||%|0
utilization.decoder||%|0
utilization.jpeg||%|0
utilization.ofa||%|0
encoder.stats.sessionCount|||0
encoder.stats.averageFps|||0
encoder.stats.averageLatency|||0
dramEncryption.mode.current|||[N/A]
dramEncryption.mode.pending|||[N/A]
ecc.mode.current|||Enabled
ecc.mode.pending|||Enabled
ecc.errors.corrected.volatile.device_memory|||0
ecc.errors.corrected.volatile.dram|||0
ecc.errors.corrected.volatile.register_file|||[N/A]
ecc.errors.corrected.volatile.l1_cache|||[N/A]
ecc.errors.corrected.volatile.l2_cache|||[N/A]
ecc.errors.corrected.volatile.texture_memory|||[N/A]
ecc.errors.corrected.volatile.cbu|||[N/A]
ecc.errors.corrected.volatile.sram|||0
ecc.errors.corrected.volatile.total|||0
ecc.errors.corrected.aggregate.device_memory|||0
ecc.errors.corrected.aggregate.dram|||0
ecc.errors.corrected.aggregate.register_file|||[N/A]
ecc.errors.corrected.aggregate.l1_cache|||[N/A]
ecc.errors.corrected.aggregate.l2_cache|||[N/A]
ecc.errors.corrected.aggregate.texture_memory|||[N/A]
ecc.errors.corrected.aggregate.cbu|||[N/A]
ecc.errors.corrected.aggregate.sram|||0
ecc.errors.corrected.aggregate.total|||0
ecc.errors.uncorrected.volatile.device_memory|||0
ecc.errors.uncorrected.volatile.dram|||0
ecc.errors.uncorrected.volatile.register_file|||[N/A]
ecc.errors.uncorrected.volatile.l1_cache|||[N/A]
ecc.errors.uncorrected.volatile.l2_cache|||[N/A]
ecc.errors.uncorrected.volatile.texture_memory|||[N/A]
ecc.errors.uncorrected.volatile.cbu|||[N/A]
ecc.errors.uncorrected.volatile.sram|||0
ecc.errors.uncorrected.volatile.total|||0
ecc.errors.uncorrected.aggregate.device_memory|||0
ecc.errors.uncorrected.aggregate.dram|||0
ecc.errors.uncorrected.aggregate.register_file|||[N/A]
ecc.errors.uncorrected.aggregate.l1_cache|||[N/A]
ecc.errors.uncorrected.aggregate.l2_cache|||[N/A]
ecc.errors.uncorrected.aggregate.texture_memory|||[N/A]
ecc.errors.uncorrected.aggregate.cbu|||[N/A]
ecc.errors.uncorrected.aggregate.sram|||0
ecc.errors.uncorrected.aggregate.total|||0
ecc.errors.uncorrected.volatile.sram.parity|||0
ecc.errors.uncorrected.volatile.sram.secded|||0
ecc.errors.uncorrected.aggregate.sram.parity|||0
ecc.errors.uncorrected.aggregate.sram.secded|||0
ecc.errors.uncorrected.aggregate.sram.thresholdExceeded|||No
ecc.errors.uncorrected.aggregate.sram.l2|||0
ecc.errors.uncorrected.aggregate.sram.sm|||0
ecc.errors.uncorrected.aggregate.sram.mcu|||0
ecc.errors.uncorrected.aggregate.sram.pcie|||0
ecc.errors.uncorrected.aggregate.sram.other|||0
retired_pages.single_bit_ecc.count|retired_pages.sbe||[N/A]
retired_pages.double_bit.count|retired_pages.dbe||[N/A]
retired_pages.pending|||[N/A]
remapped_rows.correctable|remapped_rows.sbe||0
remapped_rows.uncorrectable|remapped_rows.dbe||0
remapped_rows.pending|||No
remapped_rows.failure|||No
remapped_rows.histogram.max|||2560
remapped_rows.histogram.high|||0
remapped_rows.histogram.partial|||0
remapped_rows.histogram.low|||0
remapped_rows.histogram.none|||0
temperature.gpu|||41
temperature.gpu.tlimit|||46
temperature.memory|||48
power.management|||[Requested functionality has been deprecated]
power.draw||W|69.85
power.draw.average|gpu.power.draw.average|W|69.85
power.draw.instant|gpu.power.draw.instant|W|69.62
power.limit|gpu.power.requested_limit|W|700.00
enforced.power.limit|gpu.power.current_limit|W|700.00
power.default_limit|gpu.power.default_limit|W|700.00
power.min_limit|gpu.power.min_limit|W|200.00
power.max_limit|gpu.power.max_limit|W|700.00
module.power.draw.average||W|[N/A]
module.power.draw.instant||W|[N/A]
module.power.limit|module.power.requested_limit|W|[N/A]
module.enforced.power.limit|module.power.current_limit|W|[N/A]
module.power.default_limit||W|[N/A]
module.power.min_limit||W|[N/A]
module.power.max_limit||W|[N/A]
power_smoothing.delayed_power_smoothing_supported|||[N/A]
power_smoothing.primary_power_floor||W|[N/A]
power_smoothing.secondary_power_floor||W|[N/A]
power_smoothing.min_primary_floor_activation_offset||W|[N/A]
power_smoothing.min_primary_floor_activation_point||W|[N/A]
power_smoothing.window_multiplier||ms|[N/A]
power_smoothing.curr_profile.secondary_power_floor||W|[N/A]
power_smoothing.curr_profile.primary_floor_act_window_multiplier|||[N/A]
power_smoothing.curr_profile.primary_floor_tar_window_multiplier|||[N/A]
power_smoothing.curr_profile.primary_floor_act_offset||W|[N/A]
power_smoothing.admin_override.secondary_power_floor||W|[N/A]
power_smoothing.admin_override.primary_floor_act_window_multiplier|||[N/A]
power_smoothing.admin_override.primary_floor_tar_window_multiplier|||[N/A]
power_smoothing.admin_override.primary_floor_act_offset||W|[N/A]
edpp_multiplier||%|100.00
clocks.current.graphics|clocks.gr|MHz|345
clocks.current.sm|clocks.sm|MHz|345
clocks.current.memory|clocks.mem|MHz|2619
clocks.current.video|clocks.video|MHz|765
clocks.applications.graphics|clocks.applications.gr|MHz|[Requested functionality has been deprecated]
clocks.applications.memory|clocks.applications.mem|MHz|[Requested functionality has been deprecated]
clocks.default_applications.graphics|clocks.default_applications.gr|MHz|[Requested functionality has been deprecated]
clocks.default_applications.memory|clocks.default_applications.mem|MHz|[Requested functionality has been deprecated]
clocks.max.graphics|clocks.max.gr|MHz|1980
clocks.max.sm||MHz|1980
clocks.max.memory|clocks.max.mem|MHz|2619
mig.mode.current|||Disabled
mig.mode.pending|||Disabled
gsp.mode.current|||Enabled
gsp.mode.default|||Enabled
c2c.mode|||Disabled
protected_memory.total||MiB|0
protected_memory.used||MiB|0
protected_memory.free||MiB|0
fabric.state|||Completed
fabric.status|||Success
fabric.cliqueId|||0
fabric.clusterUuid|||00000000-0000-0000-0000-000000000000
fabric.health.summary|||N/A
fabric.health.bandwidth|||N/A
fabric.health.route_recovery_in_progress|||N/A
fabric.health.route_unhealthy|||N/A
fabric.health.access_timeout_recovery|||N/A
fabric.health.incorrect_configuration|||N/A
platform.chassis_serial_number|||
platform.slot_number|||0
platform.tray_index|||0
platform.host_id|||1
platform.peer_type|||Direct Connected
platform.module_id|||7
platform.gpu_fabric_guid|||0x0000000000000000
hostname|||[N/A]
"""


def _parse() -> tuple[list[str], dict[str, str], dict[str, str], dict[str, str]]:
    order, alias, unit, default = [], {}, {}, {}
    for line in FIELD_TABLE.splitlines():
        name, aliases, field_unit, value = line.split("|", 3)
        order.append(name)
        alias[name] = name
        for other in aliases.split():
            alias[other] = name
        unit[name] = field_unit
        default[name] = value
    return order, alias, unit, default


ORDER, ALIASES, UNITS, DEFAULTS = _parse()
