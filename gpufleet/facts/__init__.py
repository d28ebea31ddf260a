"""pyinfra facts gpufleet reads from a node: parse, never decide.

Every fact runs ONE remote command that always exits 0 and reports missing programs and error output
explicitly (see ``sections``), so a bare server (no driver, no pciutils, no mokutil) is described, never failed.

| fact | module | command |
| --- | --- | --- |
| ``GpuInventory`` / ``MigState`` | nvidia / mig | ``nvidia-smi --query-gpu=...`` / ``nvidia-smi mig -lgi`` + ``-lci`` |
| ``NvidiaSmiReport`` | nvidia_q | ``nvidia-smi -q``, ``compute_cap``, ``nvlink -s``, ``mig -lgip`` / ``-lgipp`` |
| ``NvidiaPackages``, ``PackageHolds``, ``Deb*`` | packages | ``dpkg-query``, ``apt-mark showhold`` / ``rpm``, ``dnf`` |
| ``UnitStates`` / ``ManagedState`` | systemd / files | ``systemctl show ...`` / stat + sha1 (+ contents), one read |
| ``NvidiaPciDevices`` | pci | ``lspci -n -D -d 10de:`` (sysfs when lspci is missing) |
| ``SecureBoot``, ``OsInfo``, ``Distribution`` | system | ``mokutil --sb-state``, ``/etc/os-release``, ``uname -r`` |
"""

from .files import ManagedState
from .mig import MigState, instances_by_gpu
from .nvidia import GpuInventory
from .nvidia_q import NvidiaSmiReport
from .packages import DebInstalled, DebSelections, NvidiaPackages, PackageHolds, upstream_version
from .pci import NvidiaPciDevices
from .system import Distribution, OsInfo, SecureBoot
from .systemd import UnitStates

__all__ = [
    "DebInstalled",
    "DebSelections",
    "Distribution",
    "GpuInventory",
    "ManagedState",
    "MigState",
    "NvidiaPackages",
    "NvidiaSmiReport",
    "NvidiaPciDevices",
    "PackageHolds",
    "OsInfo",
    "SecureBoot",
    "UnitStates",
    "instances_by_gpu",
    "upstream_version",
]
