"""Where the tests find the repository's bundled captures."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
# The three samples at the top of samples/ (each with its *.truth.json).
SAMPLE_CAPTURES = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".pcap", ".pcapng"))
