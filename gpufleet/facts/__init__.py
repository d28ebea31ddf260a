"""pyinfra facts gpufleet reads from a node: parse, never decide.

Every fact runs ONE remote command that always exits 0 and reports missing programs and error output
explicitly (see ``_sections``), so a bare server (no driver, no pciutils, no mokutil) is described, never failed.

| fact | module | command |
| --- | --- | --- |
| ``GpuInventory`` | nvidia | ``nvidia-smi --query-gpu=... --format=csv`` |
| ``MigState`` | mig | ``nvidia-smi mig -lgi`` + ``-lci`` |
| ``NvidiaPackages`` | packages | ``dpkg-query -W`` + ``apt-mark showhold`` / ``rpm -qa`` + ``dnf versionlock list`` |
| ``SystemdUnit``, ``NvidiaPersistenced`` | systemd | ``systemctl show -p ...`` |
| ``NvidiaPciDevices`` | pci | ``lspci -n -D -d 10de:`` (sysfs when lspci is missing) |
| ``SecureBoot``, ``OsInfo`` | system | ``mokutil --sb-state``; ``/etc/os-release`` + ``uname -r`` |
"""

from .mig import MigState, instances_by_gpu
from .nvidia import GpuInventory
from .packages import NvidiaPackages, upstream_version
from .pci import NvidiaPciDevices
from .system import OsInfo, SecureBoot
from .systemd import NvidiaPersistenced, SystemdUnit

__all__ = [
    "GpuInventory",
    "MigState",
    "NvidiaPackages",
    "NvidiaPciDevices",
    "NvidiaPersistenced",
    "OsInfo",
    "SecureBoot",
    "SystemdUnit",
    "instances_by_gpu",
    "upstream_version",
]
