# ruff: noqa: E501, W291
"""``nvidia-smi --help-query-*`` texts, verbatim from real captures (tests/fixtures/reference/captures).

590: driver 590.48.01 (H100 80GB HBM3 capture); 610: driver 610.57.04 (RTX 2080 SUPER capture), whose
--help-query-gpu lists "kmd_version" and marks "driver_version" deprecated (as 595.x already does). The
compute-apps, accounted-apps and retired-pages texts are identical in both drivers.
"""

GPU_590 = """\
List of valid properties to query for the switch "--query-gpu":

"timestamp"
The timestamp of when the query was made in format "YYYY/MM/DD HH:MM:SS.msec".

"driver_version"
The version of the installed NVIDIA display driver. This is an alphanumeric string.

Section about vgpu_driver_capability properties
Retrieves information about driver level caps.

"vgpu_driver_capability.heterogenous_multivGPU"
Whether heterogeneuos multi-vGPU is supported by driver.

"count"
The number of NVIDIA GPUs in the system.

"name" or "gpu_name"
The official product name of the GPU. This is an alphanumeric string. For all products.

"serial" or "gpu_serial"
This number matches the serial number physically printed on each board. It is a globally unique immutable alphanumeric value.

"uuid" or "gpu_uuid"
This value is the globally unique immutable alphanumeric identifier of the GPU. It does not correspond to any physical label on the board.

"pci.bus_id" or "gpu_bus_id"
PCI bus id as "domain:bus:device.function", in hex.

"pci.domain"
PCI domain number, in hex.

"pci.bus"
PCI bus number, in hex.

"pci.device"
PCI device number, in hex.

"pci.baseClass"
PCI Base Classcode, in hex.

"pci.subClass"
PCI Sub Classcode, in hex.

"pci.device_id"
PCI vendor device id, in hex

"pci.sub_device_id"
PCI Sub System id, in hex

Section about vgpu_device_capability properties
Retrieves information about device level caps.

"vgpu_device_capability.fractional_multiVgpu"
Fractional vGPU profiles on this GPU can be used in multi-vGPU configurations.

"vgpu_device_capability.heterogeneous_timeSlice_profile"
Supports concurrent execution of timesliced vGPU profiles of differing types.

"vgpu_device_capability.heterogeneous_timeSlice_sizes"
Supports concurrent execution of timesliced vGPU profiles of differing framebuffer sizes.

"vgpu_device_capability.homogeneous_placements"
Supports reporting of placements of timesliced vGPU profiles of identical framebuffer sizes.

"vgpu_device_capability.mig_timeSlicing"
Reports whether GPU supports timesliced vGPU on MIG.

"vgpu_device_capability.mig_timeSlicing_mode"
Reports whether MIG timesliced mode is enabled or not.

"pcie.link.gen.current"
The current PCI-E link generation. These may be reduced when the GPU is not in use. Deprecated, use pcie.link.gen.gpucurrent instead.

"pcie.link.gen.gpucurrent"
The current PCI-E link generation. These may be reduced when the GPU is not in use.

"pcie.link.gen.max"
The maximum PCI-E link generation possible with this GPU and system configuration. For example, if the GPU supports a higher PCIe generation than the system supports then this reports the system PCIe generation.

"pcie.link.gen.gpumax"
The maximum PCI-E link generation supported by this GPU.

"pcie.link.gen.hostmax"
The maximum PCI-E link generation supported by the root port corresponding to this GPU.

"pcie.link.width.current"
The current PCI-E link width. These may be reduced when the GPU is not in use.

"pcie.link.width.max"
The maximum PCI-E link width possible with this GPU and system configuration. For example, if the GPU supports a higher PCIe generation than the system supports then this reports the system PCIe generation.

"index"
Zero based index of the GPU. Can change at each boot.

"display_mode"
Deprecated, do not use.

"display_attached"
A flag that indicates whether a physical display (e.g. monitor) is currently connected to any of the GPU's connectors. "Yes" indicates an attached display. "No" indicates otherwise.

"display_active"
A flag that indicates whether a display is initialized on the GPU's (e.g. memory is allocated on the device for display). Display can be active even when no monitor is physically attached. "Enabled" indicates an active display. "Disabled" indicates otherwise.

"persistence_mode"
A flag that indicates whether persistence mode is enabled for the GPU. Value is either "Enabled" or "Disabled". When persistence mode is enabled the NVIDIA driver remains loaded even when no active clients, such as X11 or nvidia-smi, exist. This minimizes the driver load latency associated with running dependent apps, such as CUDA programs. Linux only.

"addressing_mode"
A flag that indicates the type of addressing mode enabled for the GPU. Value is either "HMM" or "ATS" or "None". When the mode is HMM, system allocated memory (malloc, mmap) is addressable from the device (GPU), via software-based mirroring of the CPU's page tables, on the GPU. When the mode is ATS, system allocated memory (malloc, mmap) is addressable from the device (GPU), via Address Translation Services. This means that there is (effectively) a single set of page tables, and the CPU and GPU both use them. The mode is None when neither HMM nor ATS is active. Linux only.

"accounting.mode"
A flag that indicates whether accounting mode is enabled for the GPU. Value is either "Enabled" or "Disabled". When accounting is enabled statistics are calculated for each compute process running on the GPU.Statistics can be queried during the lifetime or after termination of the process.The execution time of process is reported as 0 while the process is in running state and updated to actualexecution time after the process has terminated. See --help-query-accounted-apps for more info.

"accounting.buffer_size"
The size of the circular buffer that holds list of processes that can be queried for accounting stats. This is the maximum number of processes that accounting information will be stored for before information about oldest processes will get overwritten by information about new processes.

Section about driver_model properties
On Windows, the TCC, WDDM and MCDM driver models are supported. The driver model can be changed with the (-dm) or (-fdm) flags. The TCC and MCDM driver models are optimized for compute applications. I.E. kernel launch times will be quicker. The WDDM driver model is designed for graphics applications and is not recommended for compute applications. Linux does not support multiple driver models, and will always have the value of "N/A". Only for selected products. Please see feature matrix in NVML documentation.

"driver_model.current"
The driver model currently in use. Always "N/A" on Linux.

"driver_model.pending"
The driver model that will be used on the next reboot. Always "N/A" on Linux.

"vbios_version"
The BIOS of the GPU board.

Section about inforom properties
Version numbers for each object in the GPU board's inforom storage. The inforom is a small, persistent store of configuration and state data for the GPU. All inforom version fields are numerical. It can be useful to know these version numbers because some GPU features are only available with inforoms of a certain version or higher.

"inforom.img" or "inforom.image"
Global version of the infoROM image. Image version just like VBIOS version uniquely describes the exact version of the infoROM flashed on the board in contrast to infoROM object version which is only an indicator of supported features.

"inforom.oem"
Version for the OEM configuration data.

"inforom.ecc"
Version for the ECC recording data.

"inforom.pwr" or "inforom.power"
Version for the power management data.

"inforom.checksum_validation"
Inforom Checksum Validation information.

"gpu_recovery_action"
GPU recovery action information. Reports the GPU Recovery action recommended to recover from a bad state. 'N/A' indicates that the field is not supported on the current device or device configuration. An error message indicates that retrieving the field failed.

Section about gom properties
GOM allows to reduce power usage and optimize GPU throughput by disabling GPU features. Each GOM is designed to meet specific user needs.
In "All On" mode everything is enabled and running at full speed.
The "Compute" mode is designed for running only compute tasks. Graphics operations are not allowed.
The "Low Double Precision" mode is designed for running graphics applications that don't require high bandwidth double precision.
GOM can be changed with the (--gom) flag.

"gom.current" or "gpu_operation_mode.current"
The GOM currently in use.

"gom.pending" or "gpu_operation_mode.pending"
The GOM that will be used on the next reboot.

"fan.speed"
The fan speed value is the percent of the product's maximum noise tolerance fan speed that the device's fan is currently intended to run at. This value may exceed 100% in certain cases. Note: The reported speed is the intended fan speed. If the fan is physically blocked and unable to spin, this output will not match the actual fan speed. Many parts do not report fan speeds because they rely on cooling via fans in the surrounding enclosure.

"pstate"
The current performance state for the GPU. States range from P0 (maximum performance) to P12 (minimum performance).

Section about clocks_event_reasons properties
Retrieves information about factors that are reducing the frequency of clocks. If all event reasons are returned as "Not Active" it means that clocks are running as high as possible.

"clocks_event_reasons.supported" or "clocks_throttle_reasons.supported"
Bitmask of supported clock event reasons. See nvml.h for more details.

"clocks_event_reasons.active" or "clocks_throttle_reasons.active"
Bitmask of active clock event reasons. See nvml.h for more details.

"clocks_event_reasons.gpu_idle" or "clocks_throttle_reasons.gpu_idle"
Nothing is running on the GPU and the clocks are dropping to Idle state. This limiter may be removed in a later release.

"clocks_event_reasons.applications_clocks_setting" or "clocks_throttle_reasons.applications_clocks_setting"
GPU clocks are limited by applications clocks setting. E.g. can be changed by nvidia-smi --applications-clocks=

"clocks_event_reasons.sw_power_cap" or "clocks_throttle_reasons.sw_power_cap"
SW Power Scaling algorithm is reducing the clocks below requested clocks because the GPU is consuming too much power. E.g. SW power cap limit can be changed with nvidia-smi --power-limit=

"clocks_event_reasons.hw_slowdown" or "clocks_throttle_reasons.hw_slowdown"
HW Slowdown (reducing the core clocks by a factor of 2 or more) is engaged. This is an indicator of:
 HW Thermal Slowdown: temperature being too high
 HW Power Brake Slowdown: External Power Brake Assertion is triggered (e.g. by the system power supply)
 * Power draw is too high and Fast Trigger protection is reducing the clocks
 * May be also reported during PState or clock change
 * This behavior may be removed in a later release

"clocks_event_reasons.hw_thermal_slowdown" or "clocks_throttle_reasons.hw_thermal_slowdown"
HW Thermal Slowdown (reducing the core clocks by a factor of 2 or more) is engaged. This is an indicator of temperature being too high

"clocks_event_reasons.hw_power_brake_slowdown" or "clocks_throttle_reasons.hw_power_brake_slowdown"
HW Power Brake Slowdown (reducing the core clocks by a factor of 2 or more) is engaged. This is an indicator of External Power Brake Assertion being triggered (e.g. by the system power supply)

"clocks_event_reasons.sw_thermal_slowdown" or "clocks_throttle_reasons.sw_thermal_slowdown"
SW Thermal capping algorithm is reducing clocks below requested clocks because GPU temperature is higher than Max Operating Temp.

"clocks_event_reasons.sync_boost" or "clocks_throttle_reasons.sync_boost"
Sync Boost This GPU has been added to a Sync boost group with nvidia-smi or DCGM in
 * order to maximize performance per watt. All GPUs in the sync boost group
 * will boost to the minimum possible clocks across the entire group. Look at
 * the event reasons for other GPUs in the system to see why those GPUs are
 * holding this one at lower clocks.

Section about clocks_event_reasons_counters properties
Retrieves counters in microseconds for events which have reduced the frequency of clocks.

"clocks_event_reasons_counters.sw_power_cap"
Amount of time SW Power Scaling algorithm has reduced the clocks below requested clocks because the GPU was consuming too much power.

"clocks_event_reasons_counters.sync_boost"
Amount of time the clock frequency of this GPU was reduced to match the minimum possible clock across the sync boost group.

"clocks_event_reasons_counters.sw_thermal_slowdown"
Amount of time SW Thermal capping algorithm has reduced clocks below requested clocks because GPU temperature was higher than Max Operating Temp.

"clocks_event_reasons_counters.hw_thermal_slowdown"
Amount of time HW Thermal Slowdown was engaged, reducing the core clocks by a factor of 2 or more, due to temperature being too high.

"clocks_event_reasons_counters.hw_power_brake_slowdown"
Amount of time External Power Brake Assertion was triggered (e.g. by the system power supply).

Section about memory properties
On-board memory information. Reported total memory is affected by ECC state. If ECC is enabled the total available memory is decreased by several percent, due to the requisite parity bits. The driver may also reserve a small amount of memory for internal use, even without active work on the GPU.

"memory.total"
Total installed GPU memory.

"memory.reserved"
Total memory reserved by the NVIDIA driver and firmware.

"memory.used"
Total memory allocated by active contexts.

"memory.free"
Total free memory.

"compute_mode"
The compute mode flag indicates whether individual or multiple compute applications may run on the GPU.
"0: Default" means multiple contexts are allowed per device.
"1: Exclusive_Thread", deprecated, use Exclusive_Process instead
"2: Prohibited" means no contexts are allowed per device (no compute apps).
"3: Exclusive_Process" means only one context is allowed per device, usable from multiple threads at a time.

"compute_cap"
The CUDA Compute Capability, represented as Major DOT Minor.

Section about utilization properties
Utilization rates report how busy each GPU is over time, and can be used to determine how much an application is using the GPUs in the system.
Note: On MIG-enabled GPUs, querying the utilization of encoder, decoder, jpeg, ofa, gpu, and memory is not currently supported.

"utilization.gpu"
Percent of time over the past sample period during which one or more kernels was executing on the GPU.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.memory"
Percent of time over the past sample period during which global (device) memory was being read or written.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.encoder"
Percent of time over the past sample period during which one or more kernels was executing on the Encoder Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.decoder"
Percent of time over the past sample period during which one or more kernels was executing on the Decoder Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.jpeg"
Percent of time over the past sample period during which one or more kernels was executing on the Jpeg Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.ofa"
Percent of time over the past sample period during which one or more kernels was executing on the Optical Flow Accelerator Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

Section about encoder.stats properties
Encoder stats report number of encoder sessions, average FPS and average latency in us for given GPUs in the system.

"encoder.stats.sessionCount"
Number of encoder sessions running on the GPU.

"encoder.stats.averageFps"
Average FPS of all sessions running on the GPU.

"encoder.stats.averageLatency"
Average latency in microseconds of all sessions running on the GPU.

Section about dramEncryption.mode properties
A flag that indicates whether DRAM Encryption support is enabled. May be either "Enabled" or "Disabled". Changes to DRAM Encryption mode require a reboot. Requires Inforom DRAM Encryption object version 1.0 or higher.

"dramEncryption.mode.current"
The DRAM Encryption mode that the GPU is currently operating under.

"dramEncryption.mode.pending"
The DRAM Encryption mode that the GPU will operate under after the next reboot.

Section about ecc.mode properties
A flag that indicates whether ECC support is enabled. May be either "Enabled" or "Disabled". Changes to ECC mode require a reboot. Requires Inforom ECC object version 1.0 or higher.

"ecc.mode.current"
The ECC mode that the GPU is currently operating under.

"ecc.mode.pending"
The ECC mode that the GPU will operate under after the next reboot.

Section about ecc.errors properties
NVIDIA GPUs can provide error counts for various types of ECC errors. Some ECC errors are either single or double bit, where single bit errors are corrected and double bit errors are uncorrectable. Texture memory errors may be correctable via resend or uncorrectable if the resend fails. These errors are available across two timescales (volatile and aggregate). Single bit ECC errors are automatically corrected by the HW and do not result in data corruption. Double bit errors are detected but not corrected. Please see the ECC documents on the web for information on compute application behavior when double bit errors occur. Volatile error counters track the number of errors detected since the last driver load. Aggregate error counts persist indefinitely and thus act as a lifetime counter.

"ecc.errors.corrected.volatile.device_memory"
Errors detected in global device memory.

"ecc.errors.corrected.volatile.dram"
Errors detected in global device memory.

"ecc.errors.corrected.volatile.register_file"
Errors detected in register file memory.

"ecc.errors.corrected.volatile.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.corrected.volatile.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.corrected.volatile.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.corrected.volatile.cbu"
Parity errors detected in CBU.

"ecc.errors.corrected.volatile.sram"
Errors detected in global SRAMs.

"ecc.errors.corrected.volatile.total"
Total errors detected across entire chip.

"ecc.errors.corrected.aggregate.device_memory"
Errors detected in global device memory.

"ecc.errors.corrected.aggregate.dram"
Errors detected in global device memory.

"ecc.errors.corrected.aggregate.register_file"
Errors detected in register file memory.

"ecc.errors.corrected.aggregate.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.corrected.aggregate.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.corrected.aggregate.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.corrected.aggregate.cbu"
Parity errors detected in CBU.

"ecc.errors.corrected.aggregate.sram"
Errors detected in global SRAMs.

"ecc.errors.corrected.aggregate.total"
Total errors detected across entire chip.

"ecc.errors.uncorrected.volatile.device_memory"
Errors detected in global device memory.

"ecc.errors.uncorrected.volatile.dram"
Errors detected in global device memory.

"ecc.errors.uncorrected.volatile.register_file"
Errors detected in register file memory.

"ecc.errors.uncorrected.volatile.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.uncorrected.volatile.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.uncorrected.volatile.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.uncorrected.volatile.cbu"
Parity errors detected in CBU.

"ecc.errors.uncorrected.volatile.sram"
Errors detected in global SRAMs.

"ecc.errors.uncorrected.volatile.total"
Total errors detected across entire chip.

"ecc.errors.uncorrected.aggregate.device_memory"
Errors detected in global device memory.

"ecc.errors.uncorrected.aggregate.dram"
Errors detected in global device memory.

"ecc.errors.uncorrected.aggregate.register_file"
Errors detected in register file memory.

"ecc.errors.uncorrected.aggregate.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.uncorrected.aggregate.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.uncorrected.aggregate.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.uncorrected.aggregate.cbu"
Parity errors detected in CBU.

"ecc.errors.uncorrected.aggregate.sram"
Errors detected in global SRAMs.

"ecc.errors.uncorrected.aggregate.total"
Total errors detected across entire chip.

"ecc.errors.uncorrected.volatile.sram.parity"
Unique volatile parity errors detected in SRAM

"ecc.errors.uncorrected.volatile.sram.secded"
Unique volatile SEC-DED errors detected in SRAM

"ecc.errors.uncorrected.aggregate.sram.parity"
Unique aggregate parity errors detected in SRAM

"ecc.errors.uncorrected.aggregate.sram.secded"
Unique aggregate SEC-DED errors detected in SRAM

"ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"
Unique aggregate error threshold exceeded flag in SRAM

"ecc.errors.uncorrected.aggregate.sram.l2"
Unique aggregate errors detected in L2 cache

"ecc.errors.uncorrected.aggregate.sram.sm"
Unique aggregate errors detected in SM

"ecc.errors.uncorrected.aggregate.sram.mcu"
Unique aggregate errors detected in microcontrollers

"ecc.errors.uncorrected.aggregate.sram.pcie"
Aggregate errors detected in PCIe

"ecc.errors.uncorrected.aggregate.sram.other"
Unique aggregate SRAM errors detected not in L2 cache, SM, microcontrollers and PCIe

Section about retired_pages properties
NVIDIA GPUs can retire pages of GPU device memory when they become unreliable. This can happen when multiple single bit ECC errors occur for the same page, or on a double bit ECC error. When a page is retired, the NVIDIA driver will hide it such that no driver, or application memory allocations can access it.

"retired_pages.single_bit_ecc.count" or "retired_pages.sbe"
The number of GPU device memory pages that have been retired due to multiple single bit ECC errors.

"retired_pages.double_bit.count" or "retired_pages.dbe"
The number of GPU device memory pages that have been retired due to a double bit ECC error.

"retired_pages.pending"
Checks if any GPU device memory pages are pending retirement on the next reboot. Pages that are pending retirement can still be allocated, and may cause further reliability issues.

Section about remapped_rows properties
NVIDIA GPUs can remap bank rows of GPU device memory when they become unreliable. This can happen when multiple single bit ECC errors occur for the same row, or on a double bit ECC error. When a pending row remapping happens, GPU reset is required to complete row remapping.

"remapped_rows.correctable" or "remapped_rows.sbe"
The number of rows that have been remapped due to multiple single bit ECC errors.

"remapped_rows.uncorrectable" or "remapped_rows.dbe"
The number of rows that have been remapped due to a double bit ECC error.

"remapped_rows.pending"
Checks if any row remapping are pending on the next reboot.

"remapped_rows.failure"
Checks if any row remapping failure happens in the GPU lifespan.

Section about remapped_rows.histogram properties
The histogram of bank remap availability.

"remapped_rows.histogram.max"
The number of banks with full remap availability.

"remapped_rows.histogram.high"
The number of banks with high remap availability.

"remapped_rows.histogram.partial"
The number of banks with partial remap availability.

"remapped_rows.histogram.low"
The number of banks with low remap availability.

"remapped_rows.histogram.none"
The number of banks without remap availability.

"temperature.gpu"
 Core GPU temperature. in degrees C.

"temperature.gpu.tlimit"
 GPU T.Limit temperature. in degrees C.

"temperature.memory"
 HBM memory temperature. in degrees C.

"power.management"
A flag that indicates whether power management is enabled. Either "Supported" or "[Not Supported]". Requires Inforom PWR object version 3.0 or higher or Kepler device.

"power.draw"
The last measured power draw for the entire board, in watts. On Ampere or newer devices, returns average power draw over 1 sec. On older devices, returns instantaneous power draw. Only available if power management is supported. This reading is accurate to within +/- 5 watts.

"power.draw.average" or "gpu.power.draw.average"
The last measured average power draw for the entire board, in watts. Only available if power management is supported and Ampere (except GA100) or newer devices. This reading is accurate to within +/- 5 watts.

"power.draw.instant" or "gpu.power.draw.instant"
The last measured instant power draw for the entire board, in watts. Only available if power management is supported. This reading is accurate to within +/- 5 watts.

"power.limit" or "gpu.power.requested_limit"
The software power limit in watts. Set by software like nvidia-smi. On Kepler devices Power Limit can be adjusted using [-pl | --power-limit=] switches.

"enforced.power.limit" or "gpu.power.current_limit"
The power management algorithm's power ceiling, in watts. Total board power draw is manipulated by the power management algorithm such that it stays under this value. This value is the minimum of various power limiters.

"power.default_limit" or "gpu.power.default_limit"
The default power management algorithm's power ceiling, in watts. Power Limit will be set back to Default Power Limit after driver unload.

"power.min_limit" or "gpu.power.min_limit"
The minimum value in watts that power limit can be set to.

"power.max_limit" or "gpu.power.max_limit"
The maximum value in watts that power limit can be set to.

"module.power.draw.average"
The last measured average power draw for the entire module, in watts. This reading is accurate to within +/- 5 watts.

"module.power.draw.instant"
The last measured instant power draw for the entire module, in watts. This reading is accurate to within +/- 5 watts.

"module.power.limit" or "module.power.requested_limit"
The software power limit in watts for the entire module.

"module.enforced.power.limit" or "module.power.current_limit"
The power management algorithm's power ceiling for the entire module, in watts. This value is the minimum of various power limiters.

"module.power.default_limit"
The default power management algorithm's power ceiling for the entire module, in watts. Power Limit will be set back to Default Power Limit after driver unload.

"module.power.min_limit"
The minimum value in watts that module power limit can be set to.

"module.power.max_limit"
The maximum value in watts that module power limit can be set to.

"power_smoothing.delayed_power_smoothing_supported"
Indicates whether delayed power smoothing is supported (Yes/No).

"power_smoothing.primary_power_floor"
Current primary Power floor value in watts for power smoothing.

"power_smoothing.secondary_power_floor"
Current secondary Power floor value in watts for power smoothing.

"power_smoothing.min_primary_floor_activation_offset"
Minimum primary floor activation offset value in watts for power smoothing.

"power_smoothing.min_primary_floor_activation_point"
Minimum primary floor activation point value in watts for power smoothing.

"power_smoothing.window_multiplier"
The window multiplier value in ms for power smoothing.

"power_smoothing.curr_profile.secondary_power_floor"
Current profile secondary power floor value in watts.

"power_smoothing.curr_profile.primary_floor_act_window_multiplier"
Current profile primary floor activation window multiplier value.

"power_smoothing.curr_profile.primary_floor_tar_window_multiplier"
Current profile primary floor target window multiplier value.

"power_smoothing.curr_profile.primary_floor_act_offset"
Current profile primary floor activation offset value in watts.

"power_smoothing.admin_override.secondary_power_floor"
Admin override for secondary power floor value in watts, if set.

"power_smoothing.admin_override.primary_floor_act_window_multiplier"
Admin override for primary floor activation window multiplier value, if set.

"power_smoothing.admin_override.primary_floor_tar_window_multiplier"
Admin override for primary floor target window multiplier value, if set.

"power_smoothing.admin_override.primary_floor_act_offset"
Admin override for primary floor activation offset value in watts, if set.

"edpp_multiplier"
The EDPp multiplier expressed as a percentage.

"clocks.current.graphics" or "clocks.gr"
Current frequency of graphics (shader) clock.

"clocks.current.sm" or "clocks.sm"
Current frequency of SM (Streaming Multiprocessor) clock.

"clocks.current.memory" or "clocks.mem"
Current frequency of memory clock.

"clocks.current.video" or "clocks.video"
Current frequency of video encoder/decoder clock.

Section about clocks.applications properties
User specified frequency at which applications will be running at. Can be changed with [-ac | --applications-clocks] switches.

"clocks.applications.graphics" or "clocks.applications.gr"
User specified frequency of graphics (shader) clock.

"clocks.applications.memory" or "clocks.applications.mem"
User specified frequency of memory clock.

Section about clocks.default_applications properties
Default frequency at which applications will be running at. Application clocks can be changed with [-ac | --applications-clocks] switches. Application clocks can be set to default using [-rac | --reset-applications-clocks] switches.

"clocks.default_applications.graphics" or "clocks.default_applications.gr"
Default frequency of applications graphics (shader) clock.

"clocks.default_applications.memory" or "clocks.default_applications.mem"
Default frequency of applications memory clock.

Section about clocks.max properties
Maximum frequency at which parts of the GPU are design to run.

"clocks.max.graphics" or "clocks.max.gr"
Maximum frequency of graphics (shader) clock.

"clocks.max.sm" or "clocks.max.sm"
Maximum frequency of SM (Streaming Multiprocessor) clock.

"clocks.max.memory" or "clocks.max.mem"
Maximum frequency of memory clock.

Section about mig.mode properties
A flag that indicates whether MIG mode is enabled. May be either "Enabled" or "Disabled". Changes to MIG mode require a GPU reset.

"mig.mode.current"
The MIG mode that the GPU is currently operating under.

"mig.mode.pending"
The MIG mode that the GPU will operate under after reset.

Section about gsp.mode properties
A flag that indicates whether GSP firmware is enabled.May be either "Enabled" or "Disabled".

"gsp.mode.current"
The current status of GSP firmware.

"gsp.mode.default"
The default status of GSP firmware.

"c2c.mode"
A flag the indicates whether the device is in C2C mode, if supported.May be either "Enabled" or "Disabled".

Section about protected_memory properties
On-board protected memory information.

"protected_memory.total"
Total installed GPU conf compute protected memory.

"protected_memory.used"
Total conf compute protected memory allocated by active contexts.

"protected_memory.free"
Total free conf compute protected memory.

"fabric.state"
Current state of GPU fabric registration process.

"fabric.status"
Error status, valid only if gpu fabric registration state is "completed"

"fabric.cliqueId"
ID of the fabric clique to which this GPU belongs

"fabric.clusterUuid"
Uuid of the cluster to which this GPU belongs

"fabric.health.summary"
Fabric Health summary

"fabric.health.bandwidth"
Fabric Degraded bandwidth

"fabric.health.route_recovery_in_progress"
Fabric Route Recovery

"fabric.health.route_unhealthy"
Fabric Route Unhealthy

"fabric.health.access_timeout_recovery"
Fabric Access Timeout Recovery

"fabric.health.incorrect_configuration"
Fabric Incorrect Configuration

Section about platform properties
Platform Information.

"platform.chassis_serial_number"
Serial number of the chassis containing this GPU.

"platform.slot_number"
The slot number in the chassis containing this GPU (includes switches).

"platform.tray_index"
The tray index within the compute slots in the chassis containing this GPU (does not include switches).

"platform.host_id"
Index of the node within the slot containing this GPU.

"platform.peer_type"
Platform indicated NVLink-peer type (e.g. switch present or not).

"platform.module_id"
ID of this GPU within the node.

"platform.gpu_fabric_guid"
Fabric ID for this GPU.

"hostname"
Hostname associated with the GPU.

"""

GPU_610 = """\
List of valid properties to query for the switch "--query-gpu":

"timestamp"
The timestamp of when the query was made in format "YYYY/MM/DD HH:MM:SS.msec".

"driver_version"
The version of the installed NVIDIA display driver. This is an alphanumeric string. Deprecated; use "kmd_version" instead.

"kmd_version"
The version of the installed NVIDIA display driver. This is an alphanumeric string.

Section about vgpu_driver_capability properties
Retrieves information about driver level caps.

"vgpu_driver_capability.heterogenous_multivGPU"
Whether heterogeneuos multi-vGPU is supported by driver.

"count"
The number of NVIDIA GPUs in the system.

"name" or "gpu_name"
The official product name of the GPU. This is an alphanumeric string. For all products.

"serial" or "gpu_serial"
This number matches the serial number physically printed on each board. It is a globally unique immutable alphanumeric value.

"uuid" or "gpu_uuid"
This value is the globally unique immutable alphanumeric identifier of the GPU. It does not correspond to any physical label on the board.

"pci.bus_id" or "gpu_bus_id"
PCI bus id as "domain:bus:device.function", in hex.

"pci.domain"
PCI domain number, in hex.

"pci.bus"
PCI bus number, in hex.

"pci.device"
PCI device number, in hex.

"pci.baseClass"
PCI Base Classcode, in hex.

"pci.subClass"
PCI Sub Classcode, in hex.

"pci.device_id"
PCI vendor device id, in hex

"pci.sub_device_id"
PCI Sub System id, in hex

Section about vgpu_device_capability properties
Retrieves information about device level caps.

"vgpu_device_capability.fractional_multiVgpu"
Fractional vGPU profiles on this GPU can be used in multi-vGPU configurations.

"vgpu_device_capability.heterogeneous_timeSlice_profile"
Supports concurrent execution of timesliced vGPU profiles of differing types.

"vgpu_device_capability.heterogeneous_timeSlice_sizes"
Supports concurrent execution of timesliced vGPU profiles of differing framebuffer sizes.

"vgpu_device_capability.homogeneous_placements"
Supports reporting of placements of timesliced vGPU profiles of identical framebuffer sizes.

"vgpu_device_capability.mig_timeSlicing"
Reports whether GPU supports timesliced vGPU on MIG.

"vgpu_device_capability.mig_timeSlicing_mode"
Reports whether MIG timesliced mode is enabled or not.

"pcie.link.gen.current"
The current PCI-E link generation. These may be reduced when the GPU is not in use. Deprecated, use pcie.link.gen.gpucurrent instead.

"pcie.link.gen.gpucurrent"
The current PCI-E link generation. These may be reduced when the GPU is not in use.

"pcie.link.gen.max"
The maximum PCI-E link generation possible with this GPU and system configuration. For example, if the GPU supports a higher PCIe generation than the system supports then this reports the system PCIe generation.

"pcie.link.gen.gpumax"
The maximum PCI-E link generation supported by this GPU.

"pcie.link.gen.hostmax"
The maximum PCI-E link generation supported by the root port corresponding to this GPU.

"pcie.link.width.current"
The current PCI-E link width. These may be reduced when the GPU is not in use.

"pcie.link.width.max"
The maximum PCI-E link width possible with this GPU and system configuration. For example, if the GPU supports a higher PCIe generation than the system supports then this reports the system PCIe generation.

"index"
Zero based index of the GPU. Can change at each boot.

"display_mode"
Deprecated, do not use.

"display_attached"
A flag that indicates whether a physical display (e.g. monitor) is currently connected to any of the GPU's connectors. "Yes" indicates an attached display. "No" indicates otherwise.

"display_active"
A flag that indicates whether a display is initialized on the GPU's (e.g. memory is allocated on the device for display). Display can be active even when no monitor is physically attached. "Enabled" indicates an active display. "Disabled" indicates otherwise.

"persistence_mode"
A flag that indicates whether persistence mode is enabled for the GPU. Value is either "Enabled" or "Disabled". When persistence mode is enabled the NVIDIA driver remains loaded even when no active clients, such as X11 or nvidia-smi, exist. This minimizes the driver load latency associated with running dependent apps, such as CUDA programs. Linux only.

"addressing_mode"
A flag that indicates the type of addressing mode enabled for the GPU. Value is either "HMM" or "ATS" or "None". When the mode is HMM, system allocated memory (malloc, mmap) is addressable from the device (GPU), via software-based mirroring of the CPU's page tables, on the GPU. When the mode is ATS, system allocated memory (malloc, mmap) is addressable from the device (GPU), via Address Translation Services. This means that there is (effectively) a single set of page tables, and the CPU and GPU both use them. The mode is None when neither HMM nor ATS is active. Linux only.

"accounting.mode"
A flag that indicates whether accounting mode is enabled for the GPU. Value is either "Enabled" or "Disabled". When accounting is enabled statistics are calculated for each compute process running on the GPU.Statistics can be queried during the lifetime or after termination of the process.The execution time of process is reported as 0 while the process is in running state and updated to actualexecution time after the process has terminated. See --help-query-accounted-apps for more info.

"accounting.buffer_size"
The size of the circular buffer that holds list of processes that can be queried for accounting stats. This is the maximum number of processes that accounting information will be stored for before information about oldest processes will get overwritten by information about new processes.

Section about driver_model properties
On Windows, the TCC, WDDM and MCDM driver models are supported. The driver model can be changed with the (-dm) or (-fdm) flags. The TCC and MCDM driver models are optimized for compute applications. I.E. kernel launch times will be quicker. The WDDM driver model is designed for graphics applications and is not recommended for compute applications. Linux does not support multiple driver models, and will always have the value of "N/A". Only for selected products. Please see feature matrix in NVML documentation.

"driver_model.current"
The driver model currently in use. Always "N/A" on Linux.

"driver_model.pending"
The driver model that will be used on the next reboot. Always "N/A" on Linux.

"vbios_version"
The BIOS of the GPU board.

Section about inforom properties
Version numbers for each object in the GPU board's inforom storage. The inforom is a small, persistent store of configuration and state data for the GPU. All inforom version fields are numerical. It can be useful to know these version numbers because some GPU features are only available with inforoms of a certain version or higher.

"inforom.img" or "inforom.image"
Global version of the infoROM image. Image version just like VBIOS version uniquely describes the exact version of the infoROM flashed on the board in contrast to infoROM object version which is only an indicator of supported features.

"inforom.oem"
Version for the OEM configuration data.

"inforom.ecc"
Version for the ECC recording data.

"inforom.pwr" or "inforom.power"
Version for the power management data.

"inforom.checksum_validation"
Inforom Checksum Validation information.

"gpu_recovery_action"
GPU recovery action information. Reports the GPU Recovery action recommended to recover from a bad state. 'N/A' indicates that the field is not supported on the current device or device configuration. An error message indicates that retrieving the field failed.

Section about gom properties
GOM allows to reduce power usage and optimize GPU throughput by disabling GPU features. Each GOM is designed to meet specific user needs.
In "All On" mode everything is enabled and running at full speed.
The "Compute" mode is designed for running only compute tasks. Graphics operations are not allowed.
The "Low Double Precision" mode is designed for running graphics applications that don't require high bandwidth double precision.
GOM can be changed with the (--gom) flag.

"gom.current" or "gpu_operation_mode.current"
The GOM currently in use.

"gom.pending" or "gpu_operation_mode.pending"
The GOM that will be used on the next reboot.

"fan.speed"
The fan speed value is the percent of the product's maximum noise tolerance fan speed that the device's fan is currently intended to run at. This value may exceed 100% in certain cases. Note: The reported speed is the intended fan speed. If the fan is physically blocked and unable to spin, this output will not match the actual fan speed. Many parts do not report fan speeds because they rely on cooling via fans in the surrounding enclosure.

"pstate"
The current performance state for the GPU. States range from P0 (maximum performance) to P12 (minimum performance).

Section about clocks_event_reasons properties
Retrieves information about factors that are reducing the frequency of clocks. If all event reasons are returned as "Not Active" it means that clocks are running as high as possible.

"clocks_event_reasons.supported" or "clocks_throttle_reasons.supported"
Bitmask of supported clock event reasons. See nvml.h for more details.

"clocks_event_reasons.active" or "clocks_throttle_reasons.active"
Bitmask of active clock event reasons. See nvml.h for more details.

"clocks_event_reasons.gpu_idle" or "clocks_throttle_reasons.gpu_idle"
Nothing is running on the GPU and the clocks are dropping to Idle state. This limiter may be removed in a later release.

"clocks_event_reasons.applications_clocks_setting" or "clocks_throttle_reasons.applications_clocks_setting"
GPU clocks are limited by applications clocks setting. E.g. can be changed by nvidia-smi --applications-clocks=

"clocks_event_reasons.sw_power_cap" or "clocks_throttle_reasons.sw_power_cap"
SW Power Scaling algorithm is reducing the clocks below requested clocks because the GPU is consuming too much power. E.g. SW power cap limit can be changed with nvidia-smi --power-limit=

"clocks_event_reasons.hw_slowdown" or "clocks_throttle_reasons.hw_slowdown"
HW Slowdown (reducing the core clocks by a factor of 2 or more) is engaged. This is an indicator of:
 HW Thermal Slowdown: temperature being too high
 HW Power Brake Slowdown: External Power Brake Assertion is triggered (e.g. by the system power supply)
 * Power draw is too high and Fast Trigger protection is reducing the clocks
 * May be also reported during PState or clock change
 * This behavior may be removed in a later release

"clocks_event_reasons.hw_thermal_slowdown" or "clocks_throttle_reasons.hw_thermal_slowdown"
HW Thermal Slowdown (reducing the core clocks by a factor of 2 or more) is engaged. This is an indicator of temperature being too high

"clocks_event_reasons.hw_power_brake_slowdown" or "clocks_throttle_reasons.hw_power_brake_slowdown"
HW Power Brake Slowdown (reducing the core clocks by a factor of 2 or more) is engaged. This is an indicator of External Power Brake Assertion being triggered (e.g. by the system power supply)

"clocks_event_reasons.sw_thermal_slowdown" or "clocks_throttle_reasons.sw_thermal_slowdown"
SW Thermal capping algorithm is reducing clocks below requested clocks because GPU temperature is higher than Max Operating Temp.

"clocks_event_reasons.sync_boost" or "clocks_throttle_reasons.sync_boost"
Sync Boost This GPU has been added to a Sync boost group with nvidia-smi or DCGM in
 * order to maximize performance per watt. All GPUs in the sync boost group
 * will boost to the minimum possible clocks across the entire group. Look at
 * the event reasons for other GPUs in the system to see why those GPUs are
 * holding this one at lower clocks.

Section about clocks_event_reasons_counters properties
Retrieves counters in microseconds for events which have reduced the frequency of clocks.

"clocks_event_reasons_counters.sw_power_cap"
Amount of time SW Power Scaling algorithm has reduced the clocks below requested clocks because the GPU was consuming too much power.

"clocks_event_reasons_counters.sync_boost"
Amount of time the clock frequency of this GPU was reduced to match the minimum possible clock across the sync boost group.

"clocks_event_reasons_counters.sw_thermal_slowdown"
Amount of time SW Thermal capping algorithm has reduced clocks below requested clocks because GPU temperature was higher than Max Operating Temp.

"clocks_event_reasons_counters.hw_thermal_slowdown"
Amount of time HW Thermal Slowdown was engaged, reducing the core clocks by a factor of 2 or more, due to temperature being too high.

"clocks_event_reasons_counters.hw_power_brake_slowdown"
Amount of time External Power Brake Assertion was triggered (e.g. by the system power supply).

Section about memory properties
On-board memory information. Reported total memory is affected by ECC state. If ECC is enabled the total available memory is decreased by several percent, due to the requisite parity bits. The driver may also reserve a small amount of memory for internal use, even without active work on the GPU.

"memory.total"
Total installed GPU memory.

"memory.reserved"
Total memory reserved by the NVIDIA driver and firmware.

"memory.used"
Total memory allocated by active contexts.

"memory.free"
Total free memory.

"compute_mode"
The compute mode flag indicates whether individual or multiple compute applications may run on the GPU.
"0: Default" means multiple contexts are allowed per device.
"1: Exclusive_Thread", deprecated, use Exclusive_Process instead
"2: Prohibited" means no contexts are allowed per device (no compute apps).
"3: Exclusive_Process" means only one context is allowed per device, usable from multiple threads at a time.

"compute_cap"
The CUDA Compute Capability, represented as Major DOT Minor.

Section about utilization properties
Utilization rates report how busy each GPU is over time, and can be used to determine how much an application is using the GPUs in the system.
Note: On MIG-enabled GPUs, querying the utilization of encoder, decoder, jpeg, ofa, gpu, and memory is not currently supported.

"utilization.gpu"
Percent of time over the past sample period during which one or more kernels was executing on the GPU.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.memory"
Percent of time over the past sample period during which global (device) memory was being read or written.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.encoder"
Percent of time over the past sample period during which one or more kernels was executing on the Encoder Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.decoder"
Percent of time over the past sample period during which one or more kernels was executing on the Decoder Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.jpeg"
Percent of time over the past sample period during which one or more kernels was executing on the Jpeg Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

"utilization.ofa"
Percent of time over the past sample period during which one or more kernels was executing on the Optical Flow Accelerator Engine.
The sample period may be between 1 second and 1/6 second depending on the product.

Section about encoder.stats properties
Encoder stats report number of encoder sessions, average FPS and average latency in us for given GPUs in the system.

"encoder.stats.sessionCount"
Number of encoder sessions running on the GPU.

"encoder.stats.averageFps"
Average FPS of all sessions running on the GPU.

"encoder.stats.averageLatency"
Average latency in microseconds of all sessions running on the GPU.

Section about dramEncryption.mode properties
A flag that indicates whether DRAM Encryption support is enabled. May be either "Enabled" or "Disabled". Changes to DRAM Encryption mode require a reboot. Requires Inforom DRAM Encryption object version 1.0 or higher.

"dramEncryption.mode.current"
The DRAM Encryption mode that the GPU is currently operating under.

"dramEncryption.mode.pending"
The DRAM Encryption mode that the GPU will operate under after the next reboot.

Section about ecc.mode properties
A flag that indicates whether ECC support is enabled. May be either "Enabled" or "Disabled". Changes to ECC mode require a reboot. Requires Inforom ECC object version 1.0 or higher.

"ecc.mode.current"
The ECC mode that the GPU is currently operating under.

"ecc.mode.pending"
The ECC mode that the GPU will operate under after the next reboot.

Section about ecc.errors properties
NVIDIA GPUs can provide error counts for various types of ECC errors. Some ECC errors are either single or double bit, where single bit errors are corrected and double bit errors are uncorrectable. Texture memory errors may be correctable via resend or uncorrectable if the resend fails. These errors are available across two timescales (volatile and aggregate). Single bit ECC errors are automatically corrected by the HW and do not result in data corruption. Double bit errors are detected but not corrected. Please see the ECC documents on the web for information on compute application behavior when double bit errors occur. Volatile error counters track the number of errors detected since the last driver load. Aggregate error counts persist indefinitely and thus act as a lifetime counter.

"ecc.errors.corrected.volatile.device_memory"
Errors detected in global device memory.

"ecc.errors.corrected.volatile.dram"
Errors detected in global device memory.

"ecc.errors.corrected.volatile.register_file"
Errors detected in register file memory.

"ecc.errors.corrected.volatile.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.corrected.volatile.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.corrected.volatile.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.corrected.volatile.cbu"
Parity errors detected in CBU.

"ecc.errors.corrected.volatile.sram"
Errors detected in global SRAMs.

"ecc.errors.corrected.volatile.total"
Total errors detected across entire chip.

"ecc.errors.corrected.aggregate.device_memory"
Errors detected in global device memory.

"ecc.errors.corrected.aggregate.dram"
Errors detected in global device memory.

"ecc.errors.corrected.aggregate.register_file"
Errors detected in register file memory.

"ecc.errors.corrected.aggregate.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.corrected.aggregate.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.corrected.aggregate.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.corrected.aggregate.cbu"
Parity errors detected in CBU.

"ecc.errors.corrected.aggregate.sram"
Errors detected in global SRAMs.

"ecc.errors.corrected.aggregate.total"
Total errors detected across entire chip.

"ecc.errors.uncorrected.volatile.device_memory"
Errors detected in global device memory.

"ecc.errors.uncorrected.volatile.dram"
Errors detected in global device memory.

"ecc.errors.uncorrected.volatile.register_file"
Errors detected in register file memory.

"ecc.errors.uncorrected.volatile.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.uncorrected.volatile.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.uncorrected.volatile.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.uncorrected.volatile.cbu"
Parity errors detected in CBU.

"ecc.errors.uncorrected.volatile.sram"
Errors detected in global SRAMs.

"ecc.errors.uncorrected.volatile.total"
Total errors detected across entire chip.

"ecc.errors.uncorrected.aggregate.device_memory"
Errors detected in global device memory.

"ecc.errors.uncorrected.aggregate.dram"
Errors detected in global device memory.

"ecc.errors.uncorrected.aggregate.register_file"
Errors detected in register file memory.

"ecc.errors.uncorrected.aggregate.l1_cache"
Errors detected in the L1 cache.

"ecc.errors.uncorrected.aggregate.l2_cache"
Errors detected in the L2 cache.

"ecc.errors.uncorrected.aggregate.texture_memory"
Parity errors detected in texture memory.

"ecc.errors.uncorrected.aggregate.cbu"
Parity errors detected in CBU.

"ecc.errors.uncorrected.aggregate.sram"
Errors detected in global SRAMs.

"ecc.errors.uncorrected.aggregate.total"
Total errors detected across entire chip.

"ecc.errors.uncorrected.volatile.sram.parity"
Unique volatile parity errors detected in SRAM

"ecc.errors.uncorrected.volatile.sram.secded"
Unique volatile SEC-DED errors detected in SRAM

"ecc.errors.uncorrected.aggregate.sram.parity"
Unique aggregate parity errors detected in SRAM

"ecc.errors.uncorrected.aggregate.sram.secded"
Unique aggregate SEC-DED errors detected in SRAM

"ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"
Unique aggregate error threshold exceeded flag in SRAM

"ecc.errors.uncorrected.aggregate.sram.l2"
Unique aggregate errors detected in L2 cache

"ecc.errors.uncorrected.aggregate.sram.sm"
Unique aggregate errors detected in SM

"ecc.errors.uncorrected.aggregate.sram.mcu"
Unique aggregate errors detected in microcontrollers

"ecc.errors.uncorrected.aggregate.sram.pcie"
Aggregate errors detected in PCIe

"ecc.errors.uncorrected.aggregate.sram.other"
Unique aggregate SRAM errors detected not in L2 cache, SM, microcontrollers and PCIe

Section about retired_pages properties
NVIDIA GPUs can retire pages of GPU device memory when they become unreliable. This can happen when multiple single bit ECC errors occur for the same page, or on a double bit ECC error. When a page is retired, the NVIDIA driver will hide it such that no driver, or application memory allocations can access it.

"retired_pages.single_bit_ecc.count" or "retired_pages.sbe"
The number of GPU device memory pages that have been retired due to multiple single bit ECC errors.

"retired_pages.double_bit.count" or "retired_pages.dbe"
The number of GPU device memory pages that have been retired due to a double bit ECC error.

"retired_pages.pending"
Checks if any GPU device memory pages are pending retirement on the next reboot. Pages that are pending retirement can still be allocated, and may cause further reliability issues.

Section about remapped_rows properties
NVIDIA GPUs can remap bank rows of GPU device memory when they become unreliable. This can happen when multiple single bit ECC errors occur for the same row, or on a double bit ECC error. When a pending row remapping happens, GPU reset is required to complete row remapping.

"remapped_rows.correctable" or "remapped_rows.sbe"
The number of rows that have been remapped due to multiple single bit ECC errors.

"remapped_rows.correctable_inactive"
The number of rows that have been remapped due to multiple single bit ECC errors but are inactive.

"remapped_rows.uncorrectable" or "remapped_rows.dbe"
The number of rows that have been remapped due to a double bit ECC error.

"remapped_rows.uncorrectable_inactive"
The number of rows that have been remapped due to a double bit ECC error but are inactive.

"remapped_rows.pending"
Checks if any row remapping are pending on the next reboot.

"remapped_rows.failure"
Checks if any row remapping failure happens in the GPU lifespan.

Section about remapped_rows.histogram properties
The histogram of bank remap availability.

"remapped_rows.histogram.max"
The number of banks with full remap availability.

"remapped_rows.histogram.high"
The number of banks with high remap availability.

"remapped_rows.histogram.partial"
The number of banks with partial remap availability.

"remapped_rows.histogram.low"
The number of banks with low remap availability.

"remapped_rows.histogram.none"
The number of banks without remap availability.

"temperature.gpu"
 Core GPU temperature. in degrees C.

"temperature.gpu.tlimit"
 GPU T.Limit temperature. in degrees C.

"temperature.memory"
 HBM memory temperature. in degrees C.

"power.management"
A flag that indicates whether power management is enabled. Either "Supported" or "[Not Supported]". Requires Inforom PWR object version 3.0 or higher or Kepler device.

"power.draw"
The last measured power draw for the entire board, in watts. On Ampere or newer devices, returns average power draw over 1 sec. On older devices, returns instantaneous power draw. Only available if power management is supported. This reading is accurate to within +/- 5 watts.

"power.draw.average" or "gpu.power.draw.average"
The last measured average power draw for the entire board, in watts. Only available if power management is supported and Ampere (except GA100) or newer devices. This reading is accurate to within +/- 5 watts.

"power.draw.instant" or "gpu.power.draw.instant"
The last measured instant power draw for the entire board, in watts. Only available if power management is supported. This reading is accurate to within +/- 5 watts.

"power.limit" or "gpu.power.requested_limit"
The software power limit in watts. Set by software like nvidia-smi. On Kepler devices Power Limit can be adjusted using [-pl | --power-limit=] switches.

"enforced.power.limit" or "gpu.power.current_limit"
The power management algorithm's power ceiling, in watts. Total board power draw is manipulated by the power management algorithm such that it stays under this value. This value is the minimum of various power limiters.

"power.default_limit" or "gpu.power.default_limit"
The default power management algorithm's power ceiling, in watts. Power Limit will be set back to Default Power Limit after driver unload.

"power.min_limit" or "gpu.power.min_limit"
The minimum value in watts that power limit can be set to.

"power.max_limit" or "gpu.power.max_limit"
The maximum value in watts that power limit can be set to.

"module.power.draw.average"
The last measured average power draw for the entire module, in watts. This reading is accurate to within +/- 5 watts.

"module.power.draw.instant"
The last measured instant power draw for the entire module, in watts. This reading is accurate to within +/- 5 watts.

"module.power.limit" or "module.power.requested_limit"
The software power limit in watts for the entire module.

"module.enforced.power.limit" or "module.power.current_limit"
The power management algorithm's power ceiling for the entire module, in watts. This value is the minimum of various power limiters.

"module.power.default_limit"
The default power management algorithm's power ceiling for the entire module, in watts. Power Limit will be set back to Default Power Limit after driver unload.

"module.power.min_limit"
The minimum value in watts that module power limit can be set to.

"module.power.max_limit"
The maximum value in watts that module power limit can be set to.

"gpu.base.current"
The current base GPU power setting requested by software like nvidia-smi, in watts.

"gpu.base.requested"
The base GPU power setting currently enforced by the power management algorithm, in watts.

"gpu.base.default"
The default base GPU power setting, in watts.

"gpu.base.min"
The minimum value in watts that base GPU power can be set to.

"gpu.base.max"
The maximum value in watts that base GPU power can be set to.

Section about power_smoothing properties
Information about power smoothing.

"power_smoothing.tmp_floor"
The applied TMP floor value in watts for power smoothing.

"power_smoothing.tmp_ceil"
The applied TMP ceiling value in watts for power smoothing.

"power_smoothing.hw_lifetime_remaining_percent"
Remaining lifetime percentage of the power smoothing hardware circuitry.

"power_smoothing.enabled"
Indicates whether power smoothing is enabled (Yes/No).

"power_smoothing.delayed_power_smoothing_supported"
Indicates whether delayed power smoothing is supported (Yes/No).

"power_smoothing.soc_power_smoothing_enabled"
State-Of-Charge Power Smoothing feature enabled status (Enabled/Disabled).

"power_smoothing.priv_level"
Power smoothing privilege level.

"power_smoothing.imm_ramp_down"
Immediate ramp down setting for power smoothing (Enabled/Disabled).

"power_smoothing.max_percent_tmp_floor"
Maximum percent TMP floor allowed for power smoothing.

"power_smoothing.min_percent_tmp_floor"
Minimum percent TMP floor allowed for power smoothing.

"power_smoothing.primary_power_floor"
Current primary Power floor value in watts for power smoothing.

"power_smoothing.secondary_power_floor"
Current secondary Power floor value in watts for power smoothing.

"power_smoothing.min_primary_floor_activation_offset"
Minimum primary floor activation offset value in watts for power smoothing.

"power_smoothing.min_primary_floor_activation_point"
Minimum primary floor activation point value in watts for power smoothing.

"power_smoothing.window_multiplier"
The window multiplier value in ms for power smoothing.

"power_smoothing.num_preset_profiles"
Number of preset power smoothing profiles supported.

"power_smoothing.curr_profile.percent_tmp_floor"
Current profile percent TMP floor.

"power_smoothing.curr_profile.ramp_up_rate"
Current profile ramp up rate in W/s.

"power_smoothing.curr_profile.ramp_down_rate"
Current profile ramp down rate in W/s.

"power_smoothing.curr_profile.ramp_down_hysteresis"
Current profile ramp down hysteresis in ms.

"power_smoothing.curr_profile.secondary_power_floor"
Current profile secondary power floor value in watts.

"power_smoothing.curr_profile.primary_floor_act_window_multiplier"
Current profile primary floor activation window multiplier value.

"power_smoothing.curr_profile.primary_floor_tar_window_multiplier"
Current profile primary floor target window multiplier value.

"power_smoothing.curr_profile.primary_floor_act_offset"
Current profile primary floor activation offset value in watts.

"power_smoothing.active_profile"
Active preset profile number for power smoothing.

"power_smoothing.admin_override.percent_tmp_floor"
Admin override for percent TMP floor, if set.

"power_smoothing.admin_override.ramp_up_rate"
Admin override for ramp up rate in W/s, if set.

"power_smoothing.admin_override.ramp_down_rate"
Admin override for ramp down rate in W/s, if set.

"power_smoothing.admin_override.ramp_down_hysteresis"
Admin override for ramp down hysteresis in ms, if set.

"power_smoothing.admin_override.secondary_power_floor"
Admin override for secondary power floor value in watts, if set.

"power_smoothing.admin_override.primary_floor_act_window_multiplier"
Admin override for primary floor activation window multiplier value, if set.

"power_smoothing.admin_override.primary_floor_tar_window_multiplier"
Admin override for primary floor target window multiplier value, if set.

"power_smoothing.admin_override.primary_floor_act_offset"
Admin override for primary floor activation offset value in watts, if set.

"edpp_multiplier"
The EDPp multiplier expressed as a percentage.

"clocks.current.graphics" or "clocks.gr"
Current frequency of graphics (shader) clock.

"clocks.current.sm" or "clocks.sm"
Current frequency of SM (Streaming Multiprocessor) clock.

"clocks.current.memory" or "clocks.mem"
Current frequency of memory clock.

"clocks.current.video" or "clocks.video"
Current frequency of video encoder/decoder clock.

Section about clocks.applications properties
User specified frequency at which applications will be running at. Can be changed with [-ac | --applications-clocks] switches.

"clocks.applications.graphics" or "clocks.applications.gr"
User specified frequency of graphics (shader) clock.

"clocks.applications.memory" or "clocks.applications.mem"
User specified frequency of memory clock.

Section about clocks.default_applications properties
Default frequency at which applications will be running at. Application clocks can be changed with [-ac | --applications-clocks] switches. Application clocks can be set to default using [-rac | --reset-applications-clocks] switches.

"clocks.default_applications.graphics" or "clocks.default_applications.gr"
Default frequency of applications graphics (shader) clock.

"clocks.default_applications.memory" or "clocks.default_applications.mem"
Default frequency of applications memory clock.

Section about clocks.max properties
Maximum frequency at which parts of the GPU are design to run.

"clocks.max.graphics" or "clocks.max.gr"
Maximum frequency of graphics (shader) clock.

"clocks.max.sm" or "clocks.max.sm"
Maximum frequency of SM (Streaming Multiprocessor) clock.

"clocks.max.memory" or "clocks.max.mem"
Maximum frequency of memory clock.

Section about mig.mode properties
A flag that indicates whether MIG mode is enabled. May be either "Enabled" or "Disabled". Changes to MIG mode require a GPU reset.

"mig.mode.current"
The MIG mode that the GPU is currently operating under.

"mig.mode.pending"
The MIG mode that the GPU will operate under after reset.

Section about gsp.mode properties
A flag that indicates whether GSP firmware is enabled.May be either "Enabled" or "Disabled".

"gsp.mode.current"
The current status of GSP firmware.

"gsp.mode.default"
The default status of GSP firmware.

"c2c.mode"
A flag the indicates whether the device is in C2C mode, if supported.May be either "Enabled" or "Disabled".

Section about protected_memory properties
On-board protected memory information.

"protected_memory.total"
Total installed GPU conf compute protected memory.

"protected_memory.used"
Total conf compute protected memory allocated by active contexts.

"protected_memory.free"
Total free conf compute protected memory.

"fabric.state"
Current state of GPU fabric registration process.

"fabric.status"
Error status, valid only if gpu fabric registration state is "completed"

"fabric.cliqueId"
ID of the fabric clique to which this GPU belongs

"fabric.clusterUuid"
Uuid of the cluster to which this GPU belongs

"fabric.health.summary"
Fabric Health summary

"fabric.health.bandwidth"
Fabric Degraded bandwidth

"fabric.health.route_recovery_in_progress"
Fabric Route Recovery

"fabric.health.route_unhealthy"
Fabric Route Unhealthy

"fabric.health.access_timeout_recovery"
Fabric Access Timeout Recovery

"fabric.health.incorrect_configuration"
Fabric Incorrect Configuration

"fabric.health.partition_assigned"
Fabric Partition Assigned

Section about platform properties
Platform Information.

"platform.chassis_serial_number"
Serial number of the chassis containing this GPU.

"platform.slot_number"
The slot number in the chassis containing this GPU (includes switches).

"platform.tray_index"
The tray index within the compute slots in the chassis containing this GPU (does not include switches).

"platform.host_id"
Index of the node within the slot containing this GPU.

"platform.peer_type"
Platform indicated NVLink-peer type (e.g. switch present or not).

"platform.module_id"
ID of this GPU within the node.

"platform.gpu_fabric_guid"
Fabric ID for this GPU.

"hostname"
Hostname associated with the GPU.

"bbx.time_run"
Total time (in seconds) the GPU has been running since first initialization.

"""

COMPUTE_APPS = """\
List of valid properties to query for the switch "--query-compute-apps":

Section about Active Compute Processes properties
List of processes having compute context on the device.

"timestamp"
The timestamp of when the query was made in format "YYYY/MM/DD HH:MM:SS.msec".

"gpu_name"
The official product name of the GPU. This is an alphanumeric string. For all products.

"gpu_bus_id"
PCI bus id as "domain:bus:device.function", in hex.

"gpu_serial"
This number matches the serial number physically printed on each board. It is a globally unique immutable alphanumeric value.

"gpu_uuid"
This value is the globally unique immutable alphanumeric identifier of the GPU. It does not correspond to any physical label on the board.

"pid"
Process ID of the compute application

"process_name" or "name"
Process Name

"used_gpu_memory" or "used_memory"
Amount memory used on the device by the context. Not available on Windows when running in WDDM mode because Windows KMD manages all the memory not NVIDIA driver.

"""

ACCOUNTED_APPS = """\
List of valid properties to query for the switch "--query-accounted-apps":

Section about Accounted Graphics/Compute Processes properties
List of accounted processes having had a graphics/compute context on the device.

Format options and one or more properties to be queried need to be provided as comma separated values for this switch.
For example:
nvidia-smi --query-accounted-apps=gpu_name,pid,time,gpu_util,mem_util,max_memory_usage --format=csv

List of properties that can be queried are:

"timestamp"
The timestamp of when the query was made in format "YYYY/MM/DD HH:MM:SS.msec".

"gpu_name"
The official product name of the GPU. This is an alphanumeric string. For all products.

"gpu_bus_id"
PCI bus id as "domain:bus:device.function", in hex.

"gpu_serial"
This number matches the serial number physically printed on each board. It is a globally unique immutable alphanumeric value.

"gpu_uuid"
This value is the globally unique immutable alphanumeric identifier of the GPU. It does not correspond to any physical label on the board.

"vgpu_instance"
vGPU instance

"pid"
Process ID of the compute application

"gpu_utilization" or "gpu_util"
GPU Utilization

"mem_utilization" or "mem_util"
Percentage of GPU memory utilized on the device by the context.

"max_memory_usage"
Maximum amount memory used on the device by the context.

"time"
Amount of time in ms during which the compute context was active.

"""

RETIRED_PAGES = """\
List of valid properties to query for the switch "--query-retired-pages":

"timestamp"
The timestamp of when the query was made in format "YYYY/MM/DD HH:MM:SS.msec".

"gpu_name"
The official product name of the GPU. This is an alphanumeric string. For all products.

"gpu_bus_id"
PCI bus id as "domain:bus:device.function", in hex.

"gpu_serial"
This number matches the serial number physically printed on each board. It is a globally unique immutable alphanumeric value.

"gpu_uuid"
This value is the globally unique immutable alphanumeric identifier of the GPU. It does not correspond to any physical label on the board.

"retired_pages.address"
Address of a retired page. Address might be different when ECC is Enabled or Disabled.

"retired_pages.timestamp"
Timestamp at which the page was retired.

"retired_pages.cause"
Reason that describes why the page was retired. Can take one of two values: 
 - Double Bit ECC - The number of GPU device memory pages that have been retired due to a double bit ECC error.
 - Single Bit ECC - The number of GPU device memory pages that have been retired due to multiple single bit ECC errors.

"""
