"""Converge every GPU node of the inventory:

    pyinfra INVENTORY deploys/gpu_node.py

Stages (each skippable with ``gpufleet_stages``): driver, persistence, power, mig, nccl, clocks (off by
default). Every host's configuration and preflight are checked before any host is changed. See docs/converging.md.
"""

from gpufleet.deploys.gpu_node import gpu_node

gpu_node()
