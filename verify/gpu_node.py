"""Verify every GPU node with pyinfra (the same work as ``gpufleet verify``, as pyinfra operations):

    pyinfra -y INVENTORY verify/gpu_node.py
    pyinfra -y INVENTORY verify/gpu_node.py --data gpufleet_verify_bench=quick --data gpufleet_verify_out=/srv/verify

1. The probe (gpufleet/probe/ and the control machine's nvidia-ml-py ``pynvml.py``) is put into
   ``/opt/gpufleet/probe/`` with ``files.put`` (uploaded only when its checksum differs).
2. ``python.call``: the probe runs with the node's ``python3``; its JSON is checked against the node's
   configuration (the same validated ``gpufleet_*`` data as deploys/gpu_node.py). When the last node has finished,
   the fleet report is written into ``./gpufleet-verify/`` (``gpufleet_verify_out``): report.html, report.md,
   report.json, junit.xml, Prometheus textfiles. Hosts pyinfra could not connect to are reported unreachable.
3. ``python.call``: each node's Prometheus textfile is written into its node_exporter textfile directory
   (``gpufleet_verify_textfile_dir``); the operation fails on a node whose verify failed, so pyinfra's exit
   code is non-zero when anything failed.

Nothing on a node is changed besides /opt/gpufleet/probe/ and the textfile.
"""

from pyinfra import host, inventory, state
from pyinfra.operations import files, python

from gpufleet.verify.bundle import PROBE_REMOTE_DIR
from gpufleet.verify.pyinfra_entry import deploy_verify

verify = deploy_verify(state, inventory)

if verify.is_gpu_node(host.name):
    files.directory(name="gpufleet probe directory", path=PROBE_REMOTE_DIR, present=True, mode="755")
    for bundle_file in verify.bundle.files:
        files.put(name=f"gpufleet probe: {bundle_file.name}", src=bundle_file.path,
                  dest=f"{PROBE_REMOTE_DIR}/{bundle_file.name}", mode="644")
    python.call(name="gpufleet verify: probe and checks", function=verify.probe_host)
    python.call(name="gpufleet verify: node textfile", function=verify.textfile_host)
else:
    host.noop("gpufleet verify: not a GPU node (gpufleet_stages is empty)")
