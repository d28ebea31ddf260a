"""pyinfra facts gpufleet reads from a node: parse, never decide.

Every fact runs ONE remote command that always exits 0 and reports missing programs and error output
explicitly (see ``sections``), so a bare server (no driver, no pciutils, no mokutil) is described, never failed.

| fact | module | command |
| --- | --- | --- |
| ``GpuInventory`` | nvidia | ``nvidia-smi --query-gpu=... --format=csv`` (again, ``kmd_version``, if refused) |
| ``MigState`` | mig | ``nvidia-smi mig -lgi`` + ``-lci`` |
| ``NvidiaSmiReport`` | nvidia_q | ``nvidia-smi -q``, ``compute_cap``, ``nvlink -s``, ``mig -lgip`` / ``-lgipp`` |
| ``NvidiaPackages`` | packages | ``dpkg-query -W`` (holds: its ``h``) / ``rpm -qa`` + ``dnf versionlock list`` |
| ``PackageHolds`` | packages | ``apt-mark showhold`` / ``dnf versionlock list`` (dnf4 and dnf5) |
| ``DebInstalled`` | packages | ``dpkg-query -W`` of given package names (the exporters' packages) |
| ``UnitStates`` | systemd | ``systemctl show -p Id -p LoadState ... UNIT...`` (all the operations' at once) |
| ``ManagedState`` | files | stat + sha1 (+ contents) of files, in one read |
| ``NvidiaPciDevices`` | pci | ``lspci -n -D -d 10de:`` (sysfs when lspci is missing) |
| ``SecureBoot``, ``OsInfo`` | system | ``mokutil --sb-state``; ``/etc/os-release`` + ``uname -r`` |
| ``Distribution`` | system | pyinfra's ``LinuxDistribution`` (``/etc/*-release``), parsed once per distinct output |
"""

from .files import ManagedState
from .mig import MigState, instances_by_gpu
from .nvidia import GpuInventory
from .nvidia_q import NvidiaSmiReport
from .packages import DebInstalled, NvidiaPackages, PackageHolds, upstream_version
from .pci import NvidiaPciDevices
from .system import Distribution, OsInfo, SecureBoot
from .systemd import UnitStates

__all__ = [
    "DebInstalled",
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
