"""Decoding throughput: amqpscope's decoders against ``tshark -T fields`` on the same big capture.

One command:

    .venv/bin/python benchmarks/decode.py [--frames 1000000] [--out out/bench] [--seed CAPTURE ...]

1. Seeds are real captures made by the testbed (default: the bundled ``samples/``; ``--seed`` adds
   others, e.g. fresh ones from ``python -m testbed capture``). Each seed's TCP connections are replicated
   with a different client address per copy (127.x.y.z, so every copy is its own connection for
   both decoders) until the capture holds at least ``--frames`` AMQP frames; the file is written
   with a plain pcap writer.
2. amqpscope decodes it in this process (one core): ``ingest.capture.decode_capture``, every row of
   every table produced, exactly what the Spark ingest runs per capture. That is the build's
   decoders, compiled by mypyc (``ingest.compiled``); a child process decodes the file once more
   with the same modules run as Python source (``AMQPSCOPE_PURE_PYTHON=1``).
3. The frame splitter, decoders and row building alone are timed too, on the same streams
   reassembled beforehand; and reading the records alone, and reading them with the link / IP /
   TCP headers parsed. What is left of the whole decode is connection tracking, reassembly and
   the plumbing between the stages: together, the per-stage split of a frame's cost. The decoders
   alone are also split by protocol version (AMQP 0-9-1 and 1.0 frames cost very differently).
4. tshark decodes the same file, extracting the same fields (``-T fields``, by their Wireshark
   names) with out-of-order reassembly on, as the differential tests run it.

Each is timed by CPU time (tshark's as a child process: one core, whatever else the machine runs)
and by wall clock; frames and MB of the capture per CPU second are printed with the ratio, and
written to ``OUT/decode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from amqpscope.ingest import amqp091, amqp10, compiled
from amqpscope.ingest.capture import decode_capture, direction_payloads
from amqpscope.ingest.framing import FrameSplitter, RawFrame
from amqpscope.ingest.messages import stream_decoder
from amqpscope.ingest.packets import LINKTYPE_ETHERNET, parse_tcp
from amqpscope.ingest.pcap import read_container, read_records, scan
from amqpscope.ingest.rows import frame_row

sys.path.append(str(Path(__file__).resolve().parent.parent))  # the repository's root: testbed (not installed)
from testbed.capture import truth_path
from testbed.tshark import TSHARK_PREFERENCES

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SEEDS = tuple(sorted(p for p in (ROOT / "samples").iterdir() if p.suffix in (".pcap", ".pcapng")))

# The frames-table fields flow state and rules use, by their Wireshark names (testbed.tshark).
TSHARK_FIELDS = (
    "frame.number",
    "amqp.channel",
    "amqp.type",
    "amqp.length",
    "amqp.method.class",
    "amqp.method.method",
    "amqp.header.body-size",
    *(
        f"amqp.method.arguments.{name}"
        for name in (
            "delivery_tag",
            "multiple",
            "requeue",
            "prefetch_size",
            "prefetch_count",
            "global",
            "frame_max",
            "channel_max",
            "heartbeat",
            "active",
            "reason",
            "exchange",
            "routing_key",
            "queue",
            "consumer_tag",
            "reply_code",
            "reply_text",
            "no_ack",
            "redelivered",
            "mandatory",
            "mechanism",
        )
    ),
    "amqp.performative",
    "amqp.sasl.method",
    "amqp.sasl.mechanism",
    "amqp.sasl.saslCode",
    *(
        f"amqp.performative.arguments.{name}"
        for name in (
            "containerId",
            "maxFrameSize",
            "channelMax",
            "idleTimeout",
            "remoteChannel",
            "nextIncomingId",
            "incomingWindow",
            "nextOutgoingId",
            "outgoingWindow",
            "handleMax",
            "name",
            "handle",
            "role",
            "sndSettleMode",
            "rcvSettleMode",
            "initDeliveryCount",
            "maxMessageSize",
            "deliveryCount",
            "linkCredit",
            "available",
            "drain",
            "echo",
            "deliveryId",
            "deliveryTag",
            "messageFormat",
            "settled",
            "more",
            "aborted",
            "first",
            "last",
            "closed",
        )
    ),
    "amqp.error.condition",
    "amqp.error.description",
)

_PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, LINKTYPE_ETHERNET)
_RECORD = struct.Struct("<IIII")
_ETH_IPV4 = 0x0800


@dataclass(frozen=True)
class Run:
    tool: str
    frames: int
    seconds: float  # wall clock
    cpu_seconds: float  # user + system: the per-core measure, whatever else runs on the machine
    frames_per_second: float  # per CPU second
    megabytes_per_second: float  # of the capture file, per CPU second


def broker_port(seed: Path) -> int:
    return int(json.loads(truth_path(seed).read_text())["broker"]["port"])


def build_capture(seeds: list[Path], target_frames: int, out: Path) -> tuple[int, int]:
    """Replicate the seeds' connections into ``out`` until it holds ``target_frames``; (frames, copies)."""
    per_seed = [(seed, broker_port(seed), _frames_in(seed)) for seed in seeds]
    frames_per_round = sum(frames for _s, _p, frames in per_seed)
    copies = -(-target_frames // frames_per_round)
    records = {seed: list(read_records(seed)) for seed, _p, _f in per_seed}
    with open(out, "wb") as sink:
        sink.write(_PCAP_HEADER)
        clock = min(r.ts_us for rs in records.values() for r in rs)
        for copy in range(copies):
            for seed, port, _frames in per_seed:
                seed_records = records[seed]
                origin = seed_records[0].ts_us
                chunk = []
                for record in seed_records:
                    data = _readdress(record.data, port, copy)
                    ts = clock + record.ts_us - origin
                    chunk.append(_RECORD.pack(ts // 1_000_000, ts % 1_000_000, len(data), record.wirelen))
                    chunk.append(data)
                clock += seed_records[-1].ts_us - origin + 1000
                sink.write(b"".join(chunk))
    return copies * frames_per_round, copies


def _frames_in(seed: Path) -> int:
    return sum(1 for kind, _row in decode_capture(seed, "seed", (broker_port(seed),)) if kind == "frames")


def _readdress(frame: bytes, port: int, copy: int) -> bytes:
    """The same Ethernet/IPv4/TCP packet with the client's address made unique to ``copy``."""
    if struct.unpack_from(">H", frame, 12)[0] != _ETH_IPV4:
        raise ValueError("benchmark seeds must be Ethernet/IPv4 loopback captures")
    ip = 14
    sport = struct.unpack_from(">H", frame, ip + (frame[ip] & 0x0F) * 4)[0]
    client = ip + 12 if sport != port else ip + 16  # source address when the client sends
    address = bytes((127, 1 + (copy >> 16 & 0x7F), copy >> 8 & 0xFF, copy & 0xFF))
    return frame[:client] + address + frame[client + 4 :]


def _build() -> str:
    """How this process runs the decoders, in a word: compiled or python."""
    return compiled.running().split(" ")[0]


def run_amqpscope(capture: Path, ports: tuple[int, ...]) -> Run:
    frames = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for kind, _row in decode_capture(capture, "bench", ports):
        frames += kind == "frames"
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return _run(f"amqpscope, {_build()}", frames, wall, cpu, capture)


def run_amqpscope_as_python(capture: Path, ports: tuple[int, ...]) -> Run:
    """``run_amqpscope`` in a child process that runs the decoders as Python source."""
    child = subprocess.run(
        [sys.executable, __file__, "--whole-decode-only", str(capture), *(f"--port={p}" for p in ports)],
        env={**os.environ, compiled.PURE_PYTHON_VARIABLE: "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return Run(**json.loads(child.stdout))


def run_decoders_only(capture: Path, ports: tuple[int, ...]) -> tuple[Run, dict[str, dict[str, float]]]:
    """The frame splitter, decoders and row building alone, on streams reassembled beforehand; and
    the same per protocol version (frames, their share, CPU µs per frame).

    Tells the decoding apart from reading the capture, parsing TCP and tracking connections.
    """
    streams = direction_payloads(capture)
    frames = 0
    by_protocol = {amqp091.PROTOCOL: [0, 0.0], amqp10.PROTOCOL: [0, 0.0]}  # frames, CPU seconds
    cpu, wall = time.process_time(), time.perf_counter()
    for (src, sport, dst, dport), chunks in streams.items():
        stream_cpu, stream_frames = time.process_time(), frames
        client = (src, sport, dst, dport) if dport in ports else (dst, dport, src, sport)
        header = streams.get(client, [b""])[0][:8]
        protocol = amqp091.PROTOCOL if header == amqp091.PROTOCOL_HEADER else amqp10.PROTOCOL
        fmt = amqp091.Amqp091Format() if protocol == amqp091.PROTOCOL else amqp10.Amqp10Format()
        splitter, decode = FrameSplitter(fmt), stream_decoder(protocol)
        for number, chunk in enumerate(chunks):
            for raw in splitter.feed(chunk, number, 0):
                if isinstance(raw, RawFrame) and not raw.is_protocol_header:
                    frame_row(protocol, decode(raw.data), {"frame_index": frames, "stream_offset": raw.offset})
                    frames += 1
        by_protocol[protocol][0] += frames - stream_frames
        by_protocol[protocol][1] += time.process_time() - stream_cpu
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    shares = {
        protocol: {"frames": n, "share": round(n / frames, 3), "us_per_frame": round(seconds / n * 1e6, 2)}
        for protocol, (n, seconds) in by_protocol.items()
        if n
    }
    return _run(f"amqpscope decoders only, {_build()}", frames, wall, cpu, capture), shares


def stage_costs(capture: Path, whole: Run, decoders: Run) -> dict[str, float]:
    """CPU µs per frame of each stage of the whole decode (see the module docstring)."""
    c = read_container(capture)
    size = capture.stat().st_size
    cpu = time.process_time()
    for _record in scan(capture, c, c.data_start, size):
        pass
    records = time.process_time() - cpu
    cpu = time.process_time()
    for _offset, _ts, linktype, data, wirelen in scan(capture, c, c.data_start, size):
        parse_tcp(linktype, data, wirelen)
    headers = time.process_time() - cpu - records
    per_frame = 1e6 / whole.frames
    stages = {
        "pcap records": records * per_frame,
        "link / IP / TCP headers": headers * per_frame,
        "connection lookup, reassembly, plumbing": (whole.cpu_seconds - records - headers - decoders.cpu_seconds)
        * per_frame,
        "frame splitting, decoding, rows": decoders.cpu_seconds * per_frame,
    }
    return {name: round(value, 2) for name, value in stages.items()}


def run_tshark(capture: Path, ports: tuple[int, ...], frames: int) -> Run:
    command = ["tshark", "-r", str(capture), *TSHARK_PREFERENCES, "-n"]
    for port in ports:
        command += ["-d", f"tcp.port=={port},amqp"]
    command += ["-Y", "amqp", "-T", "fields"]
    for name in TSHARK_FIELDS:
        command += ["-e", name]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(command, stdout=sink, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return _run("tshark", frames, wall, cpu, capture)


def _run(tool: str, frames: int, wall: float, cpu: float, capture: Path) -> Run:
    megabytes = capture.stat().st_size / 1e6
    return Run(tool, frames, round(wall, 2), round(cpu, 2), round(frames / cpu), round(megabytes / cpu, 2))


def machine() -> dict[str, object]:
    memory_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    tshark = subprocess.run(["tshark", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 2**20, 1),
        "os": _os_name(),
        "python": platform.python_version(),
        "tshark": tshark,
    }


def _os_name() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return platform.platform()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000, help="AMQP frames in the capture (default 1 M)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    parser.add_argument("--seed", type=Path, action="append", help="seed capture with its truth JSON (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the big capture")
    parser.add_argument(
        "--whole-decode-only", type=Path, help=argparse.SUPPRESS
    )  # the child of run_amqpscope_as_python
    parser.add_argument("--port", type=int, action="append", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.whole_decode_only:
        print(json.dumps(asdict(run_amqpscope(args.whole_decode_only, tuple(args.port)))))
        return 0
    seeds = args.seed or list(DEFAULT_SEEDS)
    args.out.mkdir(parents=True, exist_ok=True)
    capture = args.out / "decode-bench.pcap"
    started = time.perf_counter()
    frames, copies = build_capture(seeds, args.frames, capture)
    built = time.perf_counter() - started
    ports = tuple(sorted({broker_port(seed) for seed in seeds}))
    print(
        f"capture: {capture} ({capture.stat().st_size / 1e6:.0f} MB, {frames} AMQP frames, {copies} copies "
        f"of {len(seeds)} seeds, built in {built:.1f} s)",
        file=sys.stderr,
    )
    ours = run_amqpscope(capture, ports)
    if ours.frames != frames:
        raise SystemExit(f"amqpscope decoded {ours.frames} frames, the seeds promise {frames}")
    decoders, by_protocol = run_decoders_only(capture, ports)
    stages = stage_costs(capture, ours, decoders)
    as_python = run_amqpscope_as_python(capture, ports)
    theirs = run_tshark(capture, ports, frames)
    result = {
        "capture": {
            "file_megabytes": round(capture.stat().st_size / 1e6, 1),
            "frames": frames,
            "copies": copies,
            "seeds": [s.name for s in seeds],
        },
        "machine": machine(),
        "decoders": compiled.running(),
        "runs": [asdict(ours), asdict(decoders), asdict(as_python), asdict(theirs)],
        "ratio_frames_per_second": round(ours.frames_per_second / theirs.frames_per_second, 2),
        "ratio_decoders_only": round(decoders.frames_per_second / theirs.frames_per_second, 2),
        "ratio_as_python": round(as_python.frames_per_second / theirs.frames_per_second, 2),
        "stages_us_per_frame": stages,
        "decoders_by_protocol": by_protocol,
    }
    (args.out / "decode.json").write_text(json.dumps(result, indent=2) + "\n")
    for run in (ours, decoders, as_python, theirs):
        print(
            f"{run.tool:>32}: {run.frames_per_second:>9,} frames/s  {run.megabytes_per_second:>7.1f} MB/s  "
            f"per CPU second ({run.cpu_seconds:.1f} s CPU, {run.seconds:.1f} s wall)"
        )
    print(
        f"amqpscope / tshark, frames per CPU second: {result['ratio_frames_per_second']}x "
        f"(decoders alone: {result['ratio_decoders_only']}x; as Python source: {result['ratio_as_python']}x)"
    )
    for name, micros in stages.items():
        print(f"{name:>42}: {micros:5.2f} µs / frame")
    for protocol, split in by_protocol.items():
        print(
            f"{'decoders alone, ' + protocol:>42}: {split['us_per_frame']:5.2f} µs / frame "
            f"({split['share']:.0%} of the frames)"
        )
    if not args.keep:
        capture.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
