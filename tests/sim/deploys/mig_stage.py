"""Test deploy for the MIG stage; the layout comes from host data, else a default per GPU model.

Host data (optional; ``pyinfra --data key=value``):
  mig_layout       JSON ``{"GPU index": {"profile": count} | null}``; GPUs not in it are left alone
  mig_persistenced "no": do not start nvidia-persistenced first (by default it runs, as the persistence stage
                   leaves it, so that it is one of the services holding the GPUs)
  mig_allow_reboot "yes": reboot when a MIG mode change needs one
"""

import json

from pyinfra import host
from pyinfra.operations import systemd

from gpufleet.facts.nvidia import GpuInventory
from gpufleet.operations import mig

# Per GPU model: the default layout of a host with such GPUs (index -> profiles; other indices MIG disabled).
DEFAULT_LAYOUTS = {
    "NVIDIA H100 80GB HBM3": {
        0: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
        1: {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
        2: {"1g.10gb": 7},
    },
    "NVIDIA A100-SXM4-40GB": {0: {"3g.20gb": 2}},
}

gpus = host.get_fact(GpuInventory)["gpus"]
raw = host.data.get("mig_layout")
if raw:
    layout = {int(k): v for k, v in (json.loads(raw) if isinstance(raw, str) else raw).items()}
else:
    per_model = DEFAULT_LAYOUTS.get(gpus[0]["name"] if gpus else "", {})
    layout = {gpu["index"]: per_model.get(gpu["index"]) for gpu in gpus}

if host.data.get("mig_persistenced", "yes") != "no":
    systemd.service(name="nvidia-persistenced running", service="nvidia-persistenced.service", running=True)
allow_reboot = str(host.data.get("mig_allow_reboot", "no")).lower() in ("yes", "true", "1")
mig.layout(name="MIG layout", layout=layout, allow_reboot=allow_reboot)
