"""Where the tests find the repository's bundled captures."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
# The three samples at the top of samples/ (each with its *.truth.json).
SAMPLE_CAPTURES = sorted(p for p in SAMPLES.iterdir() if p.suffix in (".pcap", ".pcapng"))
# The bottleneck scenarios (each with its broker's states), the client-side flow samples, and
# the healthy ones (the bundled samples and the decoder samples).
BOTTLENECK_SCENARIOS = sorted((SAMPLES / "bottlenecks").glob("*.pcap"))
FLOW_SAMPLES = sorted((SAMPLES / "flow").glob("*.pcap"))
HEALTHY_SAMPLES = sorted([*SAMPLE_CAPTURES, *(SAMPLES / "decoders").glob("*.pcap")])
