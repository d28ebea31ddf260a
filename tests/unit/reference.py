"""Where the tests find the real nvidia-smi captures (copied into tests/fixtures/reference)."""

from __future__ import annotations

from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
CAPTURES = REFERENCE / "captures"
