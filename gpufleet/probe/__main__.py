"""``python3 -m gpufleet.probe`` (or ``python3 -m probe`` from the directory above a shipped copy)."""

import sys

from .probe import main

sys.exit(main())
