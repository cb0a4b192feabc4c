"""The ``amqpscope`` command: thin argument parsing over the jobs."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import math
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from amqpscope.conf.settings import ENGINE_CHOICES, STORAGE_BACKENDS, AnalyzeConfig, load_yaml
from amqpscope.ingest.pcap import CaptureError
from amqpscope.jobs.cli.outcomes import COMMAND_EXIT_MEANINGS, EXIT_MEANINGS, ExitCode
from amqpscope.jobs.lake.errors import LakeError, printable, table_of

# Wrong input: the message says it all (a capture or landing directory that cannot be read, a bad
# setting, a lake that cannot be written).
_INPUT_ERRORS = (CaptureError, ValueError, PermissionError, FileNotFoundError, yaml.YAMLError)


class UsageError(Exception):
    """Arguments that do not make a command: its usage is printed with the message (exit 2)."""


def exit_code(exc: BaseException) -> ExitCode:
    """The exit code of a command that raised ``exc``: wrong arguments or input, else a failure."""
    return ExitCode.USAGE if isinstance(exc, (UsageError, *_INPUT_ERRORS)) else ExitCode.FAILED


def _exit_codes_epilog(extra: dict[ExitCode, str] | None = None) -> str:
    meanings = {**EXIT_MEANINGS, **(extra or {})}
    return "exit status: " + "; ".join(f"{int(code)} {meaning}" for code, meaning in meanings.items()) + "."


def _ports(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"ports are comma-separated numbers, got {text!r}") from None


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="decode captures into Delta tables, rebuild flow state, run the verdict suites, write a report",
        description="Decode pcap/pcapng captures of AMQP 0-9-1 and 1.0 into Delta tables under --lake "
        "(bronze: captures, connections, frames, quarantine, tcp_segments; messages_091, deliveries_10), "
        "rebuild flow state (link_credit, link_state, session_window, channel_unacked, consumer_unacked, "
        "channel_confirms, channel_flow, connection_blocked, frame_limits, idle_gaps, tcp_flow, flow_intervals, "
        "throughput; rule state lifecycle_10, lifecycle_091; events), "
        "diagnose the bottleneck (bottlenecks, diagnosis; each capture's headline is printed on stderr as "
        "soon as it is known), run the Great Expectations suites (violations table, Data Docs) and write an HTML report. "
        "Rotated files of one capture decode as one. "
        "Re-running on the same captures replaces their rows: the lake ends up the same. "
        "This is ingest + derive + report in one run; the runs table records each stage per capture, so a run "
        "that is killed leaves its captures marked incomplete and the next run repairs them.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="pcap or pcapng files")
    _add_lake_arguments(p)
    _add_tls_argument(p)
    _add_report_arguments(p)
    p.set_defaults(run=_run_analyze)


def _add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", type=Path, help="HTML report path (default <lake>/reports/<run id>.html, one per run)")
    p.add_argument("--data-docs", type=Path, help="Great Expectations Data Docs directory (default <lake>/_data_docs)")


def _add_tls_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-keylog",
        dest="tls_keylog",
        action="append",
        type=Path,
        metavar="FILE",
        help="NSS key log (SSLKEYLOGFILE, Python's ssl keylog_filename) of the AMQP clients: TLS "
        "connections (AMQPS, port 5671) are decrypted with it and decoded like plain ones (repeatable; "
        "docs/TLS.md says how to get one from each client). Read from its path where captures are "
        "decoded (on a cluster: a path every executor can read, such as a volume), never copied into "
        "the lake. Without it TLS connections are recorded (version, cipher suite, SNI, bytes) but not "
        "decoded",
    )


def _add_remote_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remote",
        metavar="URL",
        help="run on a Spark Connect server: sc://host:port[/;param=value...] (Databricks serverless and "
        "standard access mode run Spark Connect), or local[N] to start one in this process; default: "
        "SPARK_REMOTE when it is set, as PySpark reads it. Not with --master. On Spark Connect the "
        "progress line shows the steps and the decode's counts but no Spark task counts, and the local "
        "JVM's tuning (class archive, collector) is the server's own affair (docs/ARCHITECTURE.md)",
    )


def _add_engine_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        help="spark (default): a classic session on --master, or Spark Connect on --remote; sail: Sail, an "
        "embedded Rust engine serving Spark Connect in this process, no JVM (the sail extra: pip install "
        "'amqpscope[sail]'; docs/ARCHITECTURE.md says what it does differently)",
    )


def _add_lake_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", help="root directory of the Delta tables (required unless set in --config)")
    p.add_argument("--config", type=Path, help="YAML settings (see conf/analyze.yml); flags win over it")
    p.add_argument(
        "--master",
        help="Spark master URL (default: the one spark-submit was given, else local[2]; "
        "on Databricks the runtime's session)",
    )
    _add_remote_argument(p)
    _add_engine_argument(p)
    p.add_argument(
        "--storage",
        choices=STORAGE_BACKENDS,
        help="Delta writer (default auto: delta-spark when the JVM has Delta, else delta-rs)",
    )
    p.add_argument(
        "--catalog",
        help="Unity Catalog catalog: with --schema, the tables are CATALOG.SCHEMA.<table> "
        "(delta-spark; the lake directory keeps reports and Data Docs); an empty value is none",
    )
    p.add_argument("--schema", help="Unity Catalog schema (with --catalog)")
    p.add_argument(
        "--ports",
        type=_ports,
        help="comma-separated TCP ports carrying AMQP (default 5672,5671); "
        "AMQP is also recognised on any port by its protocol header",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="show the running step and its Spark tasks done on stderr (auto: when stderr is a terminal)",
    )
    p.add_argument(
        "--no-group-rotated",
        dest="group_rotated",
        action="store_const",
        const=False,
        help="decode every file as its own capture; by default files whose names differ only in "
        "digits (tcpdump -C / -G / -W, editcap -c / -i), with one link layer and consecutive "
        "times, are the parts of one capture and decode as one",
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return load_yaml(args.config) if args.config else {}


def _config(args: argparse.Namespace) -> AnalyzeConfig:
    """Settings from --config, overridden by the flags given."""
    settings = _settings(args)
    for key in (
        "lake",
        "master",
        "remote",
        "engine",
        "storage",
        "ports",
        "report",
        "data_docs",
        "group_rotated",
        "catalog",
        "schema",
        "tls_keylog",
    ):
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    if "lake" not in settings:
        raise UsageError("--lake is required (or lake: in --config)")
    return AnalyzeConfig(**settings)


def _run_analyze(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.stages import analyze  # Spark is imported only when a job runs

    config = _config(args)
    result = analyze.main(args.captures, config, args.progress)  # prints the headlines as they come
    print(
        json.dumps(
            {
                "run_id": result.run_id,
                "engine": result.engine,
                "captures": list(result.capture_ids),
                "diagnosis": _diagnosis_json(result.diagnoses),
                "lake": str(config.lake),
                "tables": result.row_counts,
                "suites_passed": result.suites_passed,
                "report": str(result.report) if result.report is not None else None,
                "data_docs": str(result.data_docs_index) if result.data_docs_index else None,
                "seconds": {k: round(v, 2) for k, v in result.stage_seconds.items()},
            },
            indent=2,
        )
    )
    return ExitCode.OK


def _diagnosis_json(diagnoses) -> dict[str, dict[str, Any]]:
    """Per capture: its bottleneck and headline, as analyze and watch print them."""
    return {a["capture_id"]: {"bottleneck": a["bottleneck"], "headline": a["headline"]} for a in diagnoses}


def _add_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="incrementally decode a landing directory of captures into the bronze Delta tables",
        description="Decode every capture file under LANDING_DIR that is not in the lake yet (captures are "
        "keyed by content hash, so a renamed copy is not ingested twice) into the bronze tables "
        "(captures, connections, frames, quarantine, tcp_segments). A file that is not a readable capture is "
        "recorded in captures (status failed: reason) and quarantine, and the rest of the batch commits. "
        "Re-running on the same directory changes nothing.",
    )
    p.add_argument(
        "landing", type=Path, metavar="LANDING_DIR", help="directory of pcap/pcapng files (searched recursively)"
    )
    _add_lake_arguments(p)
    _add_tls_argument(p)
    p.set_defaults(run=_run_ingest)


def _run_ingest(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.cli import commands  # Spark is imported only when a job runs

    result = commands.ingest(args.landing, _config(args), args.progress)
    print(
        json.dumps(
            {
                "ingested": list(result.ingested),
                "skipped": list(result.skipped),
                "failed": [{"file": f, "reason": r} for f, r in result.failed],
                "busy": [{"capture_id": c, "run": r} for c, r in result.busy],
            },
            indent=2,
        )
    )
    return ExitCode.OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:  # nan and inf too
        raise argparse.ArgumentTypeError(f"seconds are a number of 0 or more, got {text!r}")
    return value


def _rounds(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"rounds are a whole number of 0 or more, got {text!r}")
    return int(text)


def _add_watch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "watch",
        help="ingest, derive and report each capture as it lands in a directory, in one process",
        description="Watch LANDING_DIR: each round ingests its new captures (as `amqpscope ingest` does), derives "
        "every capture that needs it (as `amqpscope derive` does) and writes the report of those derived; then it "
        "waits --interval seconds. One Spark session serves every round, so from the second round on the JVM's "
        "code is already compiled: a small capture's answer comes in about half the time of a run of its own "
        "(docs/BENCHMARKS.md). A file is taken once it has not changed for --settle seconds (tcpdump writes its "
        "files under their final names). Each round prints one JSON line on stdout, and each capture's diagnosis "
        "headline on stderr. A failed round is reported and the watch goes on (the next round does what it left). "
        "SIGTERM or Ctrl-C ends the watch after the round under way; a second one ends it at once.",
    )
    p.add_argument(
        "landing", type=Path, metavar="LANDING_DIR", help="directory of pcap/pcapng files (searched recursively)"
    )
    p.add_argument(
        "--interval", type=_seconds, default=30.0, help="seconds from the end of a round to the next (default 30)"
    )
    p.add_argument(
        "--settle",
        type=_seconds,
        default=10.0,
        help="take a file once it has not changed for this many seconds (default 10; 0: at once)",
    )
    p.add_argument(
        "--rounds",
        type=_rounds,
        default=0,
        help="stop after this many rounds (default 0: until a signal); the exit status is the last round's",
    )
    _add_lake_arguments(p)
    _add_report_arguments(p)
    _add_tls_argument(p)
    p.set_defaults(run=_run_watch)


def _run_watch(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.cli import commands  # Spark is imported only when a job runs
    from amqpscope.jobs.stages.analyze import headline_line

    last: list[ExitCode] = [ExitCode.OK]

    def answered(answers) -> None:  # as soon as the diagnoses are written, before the rest of the round
        for answer in answers:
            print(headline_line(answer), file=sys.stderr, flush=True)

    def each(done) -> None:
        if done.error is not None:
            print(f"amqpscope watch: round {done.number}: error: {_one_line(done.error)}", file=sys.stderr, flush=True)
        last[0] = ExitCode.OK if done.error is None else exit_code(done.error)
        print(json.dumps(_round_json(done)), flush=True)

    try:
        commands.watch(
            args.landing,
            _config(args),
            interval=args.interval,
            settle=args.settle,
            rounds=args.rounds,
            each=each,
            answered=answered,
            progress=args.progress,
        )
    except KeyboardInterrupt:
        print("amqpscope watch: stopped during a round; the next run does what it left", file=sys.stderr)
        return ExitCode.INTERRUPTED
    return last[0]


def _round_json(done) -> dict[str, Any]:
    """One round of ``watch`` as one line of JSON."""
    ingested, derived, report = done.ingested, done.derived, done.report
    return {
        "round": done.number,
        "seconds": round(done.seconds, 2),
        "ingested": list(ingested.ingested) if ingested else [],
        "failed": [{"file": f, "reason": r} for f, r in ingested.failed] if ingested else [],
        "derived": list(derived.derived) if derived else [],
        "suites_passed": derived.suites_passed if derived else None,
        "diagnosis": _diagnosis_json(done.diagnoses),
        "report": str(report.report) if report else None,
        "error": _one_line(done.error) if done.error is not None else None,
    }


def _add_derive(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "derive",
        help="derive messages, flow state, diagnosis and verdicts for the captures in the lake that need it",
        description="Read the bronze tables of the lake and write the derived tables (messages_091, deliveries_10, "
        "the flow-state tables, bottlenecks, diagnosis, violations and the Great Expectations Data Docs) for every "
        "capture whose bronze "
        "rows are newer than its derived rows (the runs table says which), or for the --capture ids given. "
        "Derived rows of captures gone from the bronze tables are removed. Re-running changes nothing; a run that "
        "did not finish is repaired by the next.",
    )
    p.add_argument(
        "--capture",
        dest="capture_ids",
        action="append",
        metavar="CAPTURE_ID",
        help="derive this capture again (repeatable; default: every capture that needs it)",
    )
    _add_lake_arguments(p)
    p.add_argument("--data-docs", type=Path, help="Great Expectations Data Docs directory (default <lake>/_data_docs)")
    p.set_defaults(run=_run_derive)


def _run_derive(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.cli import commands  # Spark is imported only when a job runs

    result = commands.derive(_config(args), args.capture_ids, args.progress)
    print(
        json.dumps(
            {
                "derived": list(result.derived),
                "removed": list(result.removed),
                "up_to_date": list(result.up_to_date),
                "suites_passed": result.suites_passed,
                "busy": [{"capture_id": c, "run": r} for c, r in result.busy],
            },
            indent=2,
        )
    )
    return ExitCode.OK


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write the HTML report of captures from the lake",
        description="Write the HTML report of the chosen captures (default: every capture in the lake) from the "
        "gold tables derive wrote, read with delta-rs: on a local lake of the delta-rs storage no Spark session "
        "is started (with --master, under spark-submit, on Databricks or with Delta's jars configured, one is). "
        "Captures whose derive did not finish on their latest ingest are not reported: they are "
        "listed as incomplete in the output.",
    )
    p.add_argument(
        "--capture",
        dest="capture_ids",
        action="append",
        metavar="CAPTURE_ID",
        help="report this capture (repeatable; default: every capture in the lake)",
    )
    _add_lake_arguments(p)
    _add_report_arguments(p)
    p.set_defaults(run=_run_report)


def _run_report(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.cli import commands  # Spark is imported only when a job runs

    result = commands.report(_config(args), args.capture_ids, args.progress)
    print(
        json.dumps(
            {
                "report": str(result.report),
                "captures": list(result.captures),
                "incomplete": [{"capture_id": c, "reason": r} for c, r in result.incomplete],
            },
            indent=2,
        )
    )
    return ExitCode.OK


def _add_maintain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "maintain",
        help="compact the lake's tables and remove the files they no longer reference",
        description="For every table of the lake: compact its small files (OPTIMIZE with delta-spark, which also "
        "clusters by capture_id; delta-rs's compaction otherwise), remove the files no version younger than "
        "--retain-hours references (VACUUM), and, with delta-spark, bring the tables' column comments and "
        "descriptions up to those of schemas/. The rows do not change.",
    )
    _add_lake_arguments(p)
    p.add_argument(
        "--retain-hours",
        type=int,
        default=168,
        metavar="HOURS",
        help="keep the files of the versions of the last HOURS (default 168, Delta's own minimum: "
        "readers and time travel within a week keep working)",
    )
    p.set_defaults(run=_run_maintain)


def _run_maintain(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.cli import commands  # Spark is imported only when a job runs

    result = commands.maintain(_config(args), args.retain_hours)
    print(
        json.dumps(
            {
                "tables": {
                    t.table: {
                        "files_before": t.files_before,
                        "files_after": t.files_after,
                        "files_vacuumed": t.files_vacuumed,
                        "comments_set": t.comments_set,
                    }
                    for t in result.tables
                }
            },
            indent=2,
        )
    )
    return ExitCode.OK


def _add_diagnose(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="say what the bottleneck is: ranked findings with entities, times, packets and Wireshark filters",
        description="Print, in plain language, the bottleneck of each capture (resource alarm, a stage of "
        "RabbitMQ's credit flow, a slow consumer, a client not reading, the network, or none) and its ranked "
        "findings with entity names, times, packet numbers and a Wireshark display filter (docs/DIAGNOSIS.md), "
        "then the problems found beside the verdict, warnings first (returned or refused messages, closes with "
        "an error, short-lived connections or channels); --json marks each finding's kind and severity. "
        "Captures already analysed into --lake by a run that finished are answered from its diagnosis and "
        "bottlenecks tables without starting Spark; others (not in the lake, or left incomplete by a killed or "
        "failed run) are analysed first (into --lake, or a temporary lake without it). TLS connections are "
        "decrypted with --tls-keylog; without it they are named in the headline as encrypted, and when nothing "
        'else could be judged the bottleneck is "encrypted". A capture in which no AMQP connection was decoded '
        'gets no verdict: "No AMQP traffic found" with what it holds instead (bottleneck no_amqp; a capture '
        "without packets is answered before Spark starts). The exit status is 4 when no capture could be judged.",
    )
    p.add_argument("captures", nargs="+", metavar="CAPTURE", help="pcap or pcapng files")
    p.add_argument("--lake", help="lake to answer from and analyse into (default: a temporary lake)")
    p.add_argument("--config", type=Path, help="YAML settings (see conf/analyze.yml), diagnosis thresholds included")
    _add_tls_argument(p)
    p.add_argument("--json", action="store_true", help="print every finding of every capture as JSON")
    p.add_argument("--reanalyze", action="store_true", help="analyse again even when the lake has a diagnosis")
    _add_remote_argument(p)
    _add_engine_argument(p)
    p.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="show analyze's progress on stderr when a capture must be analysed",
    )
    p.set_defaults(run=_run_diagnose)


def _run_diagnose(args: argparse.Namespace) -> ExitCode:
    from amqpscope.jobs.cli import diagnose

    settings = _settings(args)
    if args.lake is not None:
        settings["lake"] = args.lake
    if args.tls_keylog is not None:
        settings["tls_keylog"] = tuple(args.tls_keylog)
    for key in ("remote", "engine"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    config = AnalyzeConfig(**settings) if "lake" in settings else None
    if config is None and set(settings) - {"tls_keylog", "remote", "engine"}:
        raise UsageError("--config without a lake: set --lake or lake: in the file")
    answers = diagnose.diagnose(
        args.captures,
        config,
        args.progress,
        args.reanalyze,
        tls_keylog=tuple(settings.get("tls_keylog", ())),
        remote=settings.get("remote"),
        engine=settings.get("engine", "spark"),
    )
    print(diagnose.render_json(answers) if args.json else diagnose.render_text(answers), end="")
    return diagnose.exit_code(answers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amqpscope",
        description="AMQP 0-9-1 / 1.0 packet captures to a Delta lakehouse, flow-control timelines and bottleneck verdicts.",
        epilog=_exit_codes_epilog(),
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log progress of each stage, and show the full trace of an error"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_analyze(sub)
    _add_ingest(sub)
    _add_derive(sub)
    _add_report(sub)
    _add_watch(sub)
    _add_maintain(sub)
    _add_diagnose(sub)
    for name, command in sub.choices.items():
        command.epilog = _exit_codes_epilog(COMMAND_EXIT_MEANINGS.get(name))
        command.set_defaults(parser=command)  # a UsageError prints its command's usage
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (``ExitCode``). argparse's own usage errors exit 2 too."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    # Progress is ours to report; the libraries' INFO chatter is not.
    for noisy in ("great_expectations", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.run(args))
    except Exception as exc:
        code = exit_code(exc)
        if args.verbose:
            traceback.print_exc()
        if isinstance(exc, UsageError):
            args.parser.print_usage(sys.stderr)
            print(f"amqpscope {args.command}: error: {printable(str(exc))}", file=sys.stderr)
        elif code == ExitCode.USAGE:
            print(f"amqpscope {args.command}: error: {printable(str(exc))}", file=sys.stderr)
        else:  # a stage failed (StageFailed), a Py4J / JVM error: one line, the trace with -v
            print(
                f"amqpscope {args.command}: error: {_one_line(exc)}"
                + ("" if args.verbose else " (run with -v for the full trace)"),
                file=sys.stderr,
            )
        return int(code)


def _one_line(exc: BaseException) -> str:
    from amqpscope.jobs.stages.stages import StageFailed, one_line  # imports PySpark: only once a job has run

    if isinstance(exc, (StageFailed, LakeError)):
        return str(exc)
    table = table_of(exc)  # a write outside a stage (bookkeeping between stages) names its table too
    return f"table {table}: {one_line(exc)}" if table else one_line(exc)


def version() -> str:
    """The installed amqpscope's version (its distribution metadata)."""
    try:
        return importlib.metadata.version("amqpscope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
