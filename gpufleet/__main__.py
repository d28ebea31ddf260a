"""``python -m gpufleet``: the ``gpufleet`` command."""

from gpufleet.cli import main

if __name__ == "__main__":
    main()
