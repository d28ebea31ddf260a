"""The driver stage on a simulated host, as the node deploy calls it: NVIDIA's repository is the simulator's
(a mirror, as an air-gapped site has), the fabric manager only on the NVSwitch (HGX H100) host.

Branch and flavour come from host data (``pyinfra --data gpufleet_test_driver_branch=570``, default 580;
``gpufleet_test_driver_flavour``, default open; ``gpufleet_test_driver_style``, default ubuntu); reboots only
with ``--data gpufleet_test_allow_reboot=yes``.
"""

from pyinfra import host

from gpufleet.operations import driver

repo_url = host.data.gpufleet_sim_repo_url
driver.nvidia_driver(
    name="NVIDIA driver",
    branch=str(host.data.get("gpufleet_test_driver_branch", "580")),
    flavour=host.data.get("gpufleet_test_driver_flavour", "open"),
    repo_url=repo_url,
    # no keyring_url: the key NVIDIA publishes in the repository directory, which the simulator serves under the
    # recorded file name (3bf863cc.pub on Debian 12)
    nvswitch=host.data.gpufleet_sim_profile == "h100-sxm-8",
    # the simulator's repository carries Ubuntu's names (nvidia-driver-580-server-open) and NVIDIA's (nvidia-open
    # with nvidia-driver-pinning-580); Ubuntu's unless gpufleet_test_driver_style=nvidia
    packages_style=host.data.get("gpufleet_test_driver_style", "ubuntu"),
    allow_reboot=str(host.data.get("gpufleet_test_allow_reboot", "no")).lower() in ("1", "yes", "true"),
)
