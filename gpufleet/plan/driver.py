"""The driver a host gets: branch, kernel module flavour (by GPU), package naming (by OS), DKMS, fabric manager."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.catalog import GpuModel
from gpufleet.config import (
    NodeConfig,
)

from .gpu import Gpu

OPEN_ONLY_ARCHITECTURES = ("Blackwell",)
PRE_TURING_ARCHITECTURES = ("Kepler", "Maxwell", "Pascal", "Volta")


def kernel_flavour_of(gpu: Gpu | GpuModel | None) -> str | None:
    """``open`` when this GPU needs the open kernel modules (Blackwell, Grace), ``proprietary`` when it needs the
    proprietary ones (pre-Turing), None when either works or its architecture is unknown."""
    architecture = gpu.architecture if gpu is not None else None
    if architecture is None:
        return None
    name = f"{gpu.name or ''} {getattr(gpu, 'pci_name', None) or ''}"
    if architecture.startswith(OPEN_ONLY_ARCHITECTURES) or "Grace" in architecture \
            or any(tag in name for tag in ("GH200", "GB200", "GB300")):
        return "open"
    return "proprietary" if architecture in PRE_TURING_ARCHITECTURES else None


def required_kernel_flavour(gpus: Iterable[Gpu | GpuModel | None]) -> str | None:
    """``open`` when a GPU needs the open kernel modules, else ``proprietary`` when one needs the proprietary ones,
    None when either works (or nothing is known)."""
    needs = {kernel_flavour_of(gpu) for gpu in gpus}
    return "open" if "open" in needs else "proprietary" if "proprietary" in needs else None


def choose_kernel_flavour(requested: str, gpus: Iterable[Gpu | GpuModel | None]) -> str:
    """The kernel module flavour to install: ``requested`` unless ``auto``; ``auto`` is ``open`` (NVIDIA's
    recommendation for Turing and newer, required on Blackwell/Grace) unless a GPU is pre-Turing. Preflight refuses
    ``auto`` where a GPU's architecture is unknown (:attr:`Gpu.architecture`)."""
    if requested != "auto":
        return requested
    return "proprietary" if required_kernel_flavour(gpus) == "proprietary" else "open"


def packages_style_for(os_id: str | None, requested: str | None = None) -> str:
    """The apt package naming of the driver (``gpufleet_driver_packages_style``, else by OS): Ubuntu's names on
    Ubuntu (its archive and NVIDIA's Ubuntu repositories), NVIDIA's CUDA repositories' names elsewhere."""
    if requested is not None:
        return requested
    return "ubuntu" if str(os_id or "").lower() == "ubuntu" else "nvidia"


def driver_on_branch(version: str | None, branch: str) -> bool:
    """Whether a driver version (``580.95.05``) is of ``branch`` (``580``): what verify and preflight compare."""
    version = str(version or "")
    return version == branch or version.split(".")[0] == branch


@dataclass(frozen=True)
class DriverPlan:
    """What the driver stage installs on a host: the branch, the kernel modules' flavour (``auto`` resolved from
    the GPUs), the package naming (by OS), whether its modules are built by DKMS (unsigned under Secure Boot),
    and the fabric manager where the host has NVSwitches."""

    branch: str
    flavour: str
    packages_style: str
    dkms: bool
    nvswitch: bool

    @classmethod
    def resolve(cls, config: NodeConfig, gpus: Iterable[Gpu], os_id: str | None, nvswitch: bool = False
                ) -> DriverPlan:
        style = packages_style_for(os_id, config.driver.packages_style)
        return cls(config.driver.branch, choose_kernel_flavour(config.driver.flavour, list(gpus)),
                   style,
                   # Ubuntu's packages on Ubuntu come with Canonical-signed precompiled modules
                   # (linux-modules-nvidia-*); NVIDIA's repository packages build with DKMS
                   dkms=not (style == "ubuntu" and str(os_id or "").lower() == "ubuntu"), nvswitch=nvswitch)

    def loaded(self, version: str | None) -> bool:
        """Whether the loaded driver (``version``) is of the planned branch."""
        return driver_on_branch(version, self.branch)
