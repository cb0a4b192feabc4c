"""What TLS costs the per-capture decode: the same scenario plain and over TLS, in one process, in turn.

    .venv/bin/python benchmarks/tls_decode.py [--rounds 7]

``ingest.capture.decode_capture`` (every row of every table, the tcp_segments too, as the Spark
ingest runs it) on, in turn each round:

- ``samples/amqp091-qos-confirms.pcap`` (plain AMQP 0-9-1, 1 593 frames);
- ``samples/tls/amqp091-qos-confirms-tls13-aes256gcm.pcap`` with its key log (the same scenario over TLS 1.3,
  TLS_AES_256_GCM_SHA384: decrypted and decoded);
- the same without the key log (recorded, quarantined, not decoded);
- ``samples/tls/amqp091-qos-confirms-tls12-ecdhe-aes256gcm.pcap`` with its key log (TLS 1.2, AES-256-GCM).

Each decode is timed by this process's CPU time; the medians and the ratios to the plain decode are
printed (and written as JSON with ``--out``). The key log is read once per process (it is cached
while the file is unchanged), as a decode task of a Spark worker reads it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from amqpscope.ingest import compiled
from amqpscope.ingest.capture import decode_capture

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CASES = {
    "plain": (SAMPLES / "amqp091-qos-confirms.pcap", None),
    "tls13_decrypted": (
        SAMPLES / "tls" / "amqp091-qos-confirms-tls13-aes256gcm.pcap",
        SAMPLES / "tls" / "amqp091-qos-confirms-tls13-aes256gcm.keylog",
    ),
    "tls13_without_keys": (SAMPLES / "tls" / "amqp091-qos-confirms-tls13-aes256gcm.pcap", None),
    "tls12_decrypted": (
        SAMPLES / "tls" / "amqp091-qos-confirms-tls12-ecdhe-aes256gcm.pcap",
        SAMPLES / "tls" / "amqp091-qos-confirms-tls12-ecdhe-aes256gcm.keylog",
    ),
}


def decode(capture: Path, keylog: Path | None) -> tuple[float, int]:
    """CPU seconds of one decode, and the frames it made."""
    began = time.process_time()
    frames = sum(
        1
        for kind, _ in decode_capture(
            capture, "bench", (5672, 5671), segments=True, tls_keylog=[keylog] if keylog else ()
        )
        if kind == "frames"
    )
    return time.process_time() - began, frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    for capture, keylog in CASES.values():
        decode(capture, keylog)  # warm: imports, the key log read once
    seconds: dict[str, list[float]] = {name: [] for name in CASES}
    frames: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, (capture, keylog) in CASES.items():
            took, frames[name] = decode(capture, keylog)
            seconds[name].append(took)
    plain = statistics.median(seconds["plain"])
    result = {
        "decoders": compiled.running(),
        "rounds": args.rounds,
        "cases": {
            name: {
                "frames": frames[name],
                "cpu_seconds_median": round(statistics.median(s), 4),
                "cpu_seconds_min": round(min(s), 4),
                "cpu_seconds_max": round(max(s), 4),
                "ratio_to_plain": round(statistics.median(s) / plain, 3),
            }
            for name, s in seconds.items()
        },
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
