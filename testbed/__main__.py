"""The testbed's commands, run from the repository's root (the testbed is not in the wheel).

The product never imports the testbed (tests/test_product_boundary.py):

    python -m testbed capture --out samples --scenario mixed --pcapng   # root: tcpdump on lo
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from testbed import capture


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser(
        "capture",
        help="record real AMQP traffic: private RabbitMQ, real clients, tcpdump on loopback",
        description="Start a private RabbitMQ (Debian's rabbitmq-server, amqp1_0 plugin) on loopback, run "
        "real pika / qpid-proton clients, capture with tcpdump, and write NAME.pcap with NAME.truth.json "
        "(what the clients did). Needs root for tcpdump; every process started is stopped.",
    )
    capture.configure_parser(p)
    p.set_defaults(run=capture.run_from_args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
