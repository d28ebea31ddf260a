"""One worker of ``gpufleet verify --jobs N`` (:class:`gpufleet.verify.run.Sliced`, the coordinator): the
inventory loaded and validated as the coordinator did, its slice of the hosts to verify
(:func:`gpufleet.pyinfra_args.slice_hosts`, as ``gpufleet apply`` cuts them), each host connected, probed and
checked as ``gpufleet verify`` does in one process; then, with the fleet's report the coordinator sends, its hosts'
node textfiles written.

    python -m gpufleet.verify.workers JOB   # JOB: JSON, written by gpufleet.verify.run.Sliced

Messages to the coordinator are JSON lines on stdout (this process's own prints go to stderr): ``host`` (a host's
result, as it ends), ``verified`` (every host of the slice), ``textfile`` (where a host's textfile went, or why not).
The fleet's report comes as one JSON line on stdin; end of input without it: no textfiles.
"""

from __future__ import annotations

import io
import json
import os
import sys


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else prints goes to stderr: stdout is the coordinator's

    def send(**message) -> None:
        out.write(json.dumps(message) + "\n")

    from gevent import monkey

    monkey.patch_all()  # before pyinfra and paramiko are imported: the hosts then run concurrently
    from pyinfra.context import ctx_config, ctx_inventory, ctx_state

    from gpufleet import interruption
    from gpufleet.pyinfra_args import slice_hosts
    from gpufleet.results import FleetResult
    from gpufleet.verify import run

    interruption.catch_signals()
    try:
        state, hosts = run.load_inventory(job["inventory"], job["limit"], cwd=job["cwd"],
                                          override_data=job["override_data"])
        with ctx_state.use(state), ctx_config.use(state.config), ctx_inventory.use(state.inventory):
            configs, settings, _, targets = run._targets(state, hosts)
            mine = set(slice_hosts([(h.name, list(h.groups)) for h in targets], job["jobs"])[job["index"]])
            slice_ = [h for h in targets if h.name in mine]
            runs = run._verify_all(state, slice_, configs, settings, run.probe_bundle(), job["bench"], io.StringIO(),
                                   done=lambda r: send(type="host", name=r.name, result=r.result.to_dict(),
                                                       seconds=r.seconds, uploaded=r.uploaded,
                                                       connected=r.connected)) if slice_ else []
            send(type="verified")
            line = sys.stdin.readline()
            if line.strip():
                run._write_textfiles(state, runs, settings, FleetResult.from_dict(json.loads(line)),
                                     {h.name: h for h in slice_})
                for one in runs:
                    if one.connected:
                        send(type="textfile", name=one.name, textfile=one.textfile, error=one.textfile_error)
            for host in slice_:
                run._disconnect(host)
    except KeyboardInterrupt as error:  # the coordinator names the hosts without a result
        out.flush()
        os._exit(interruption.status_of(error))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
