"""A process that holds a simulated GPU like a CUDA job does (the 'busy' fault).

``python3 -m simgpu.hold INDEX [USED_MIB]``: registers itself as a compute process on GPU INDEX and
stays until terminated.
"""

from __future__ import annotations

import os
import sys

from . import daemon, state


def main(argv: list[str]) -> int:
    index, used_mib = int(argv[0]), int(argv[1]) if len(argv) > 1 else 1024
    pid = os.getpid()
    key = f"gpu.{index}.proc.{pid}"
    with state.locked() as gpus:
        gpus[key] = f"python3,{used_mib}"

    def release() -> None:
        with state.locked() as gpus:
            gpus.pop(key, None)

    daemon.serve_until_terminated(release)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
