"""Install the simulated driver from the simulator's signed repository, as a user's deploy would."""

from io import StringIO

from pyinfra import host
from pyinfra.operations import apt, files

repo_url = host.data.gpufleet_sim_repo_url
keyring = "/usr/share/keyrings/gpufleet-sim-keyring.gpg"
files.download(name="repository keyring", src=f"{repo_url}/gpufleet-sim-keyring.gpg", dest=keyring)
files.put(
    name="repository source",
    src=StringIO(f"deb [signed-by={keyring}] {repo_url}/ ./\n"),
    dest="/etc/apt/sources.list.d/gpufleet-sim.list",
)
apt.packages(name="driver", packages=["nvidia-driver-580-server-open"], update=True)
