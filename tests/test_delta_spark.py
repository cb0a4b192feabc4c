"""The delta-spark backend and Unity Catalog, checked by what they send to Delta: Delta's jars are not
on this machine (Maven Central is out of reach), so the SQL statements are parsed by Spark's own SQL
parser and read back from the plan it makes, and the lake's calls into the backend (create, write
with its options, maintain) are recorded instead of run. The delta-rs backend, run for real, is the
rest of the suite's lake."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake import delta_spark
from amqpscope.jobs.lake import lake as lake_module
from amqpscope.jobs.lake.delta_spark import TableRef
from amqpscope.jobs.lake.errors import WriteConflict
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages import maintain
from amqpscope.schemas.catalog import description, documented, tables
from amqpscope.schemas.runs import RUNS_SCHEMA

UC = TableRef("captures", name="main.amqpscope.captures")
BY_PATH = TableRef("captures", path="/Volumes/main/amqpscope/lake/captures")


def parsed(spark, statement: str):
    """Spark's logical plan of ``statement``: its parser raises on anything it cannot read."""
    return spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)


def option_value(option):
    return option.get() if option.isDefined() else None


@pytest.mark.parametrize("ref", [UC, BY_PATH], ids=["unity-catalog", "path"])
def test_every_table_is_created_with_its_comments_description_and_clustering(spark, ref):
    for name, table in tables().items():
        ref = TableRef(name, name=f"main.amqpscope.{name}") if ref.name else TableRef(name, path=f"/lake/{name}")
        plan = parsed(spark, delta_spark.create_table_sql(ref, table.schema, table.description))
        assert plan.ignoreIfExists(), name
        identifier = _seq(plan.name().nameParts())
        assert identifier == (["main", "amqpscope", name] if ref.name else ["delta", f"/lake/{name}"])
        columns = {c.name(): (c.dataType().simpleString(), option_value(c.comment())) for c in _seq(plan.columns())}
        assert columns == {f.name: (f.dataType.simpleString(), f.metadata.get("comment")) for f in table.schema.fields}
        assert option_value(plan.tableSpec().provider()).lower() == "delta"
        assert option_value(plan.tableSpec().comment()) == table.description
        assert [t.toString() for t in _seq(plan.partitioning())] == ["cluster_by(capture_id)"], name


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def test_documented_columns_reach_the_create_statement(spark):
    schema = documented("captures", tables()["captures"].schema)
    statement = delta_spark.create_table_sql(UC, schema, description("captures"))
    assert "CREATE TABLE IF NOT EXISTS `main`.`amqpscope`.`captures` (" in statement
    assert "`status` string COMMENT 'status of the capture" not in statement  # comments are the schema's own
    assert "COMMENT 'The captures table: one row per capture ingested" in statement
    assert "CLUSTER BY (`capture_id`)" in statement
    assert "PARTITIONED BY" not in statement


def test_quoting_keeps_names_and_texts_whole(spark):
    odd = TableRef("t", path="/data/it's `here`")
    schema = StructType([StructField("capture_id", LongType(), True, {"comment": "a \\ backslash, a ' quote"})])
    plan = parsed(spark, delta_spark.create_table_sql(odd, schema, "it's described"))
    assert _seq(plan.name().nameParts()) == ["delta", "/data/it's `here`"]
    [column] = _seq(plan.columns())
    assert option_value(column.comment()) == "a \\ backslash, a ' quote"
    assert option_value(plan.tableSpec().comment()) == "it's described"


def test_writes_replace_their_captures_rows_and_widen_only_when_asked():
    assert delta_spark.write_options(["a", "b'c"], merge_schema=False) == {
        "replaceWhere": "`capture_id` IN ('a', 'b\\'c')"
    }
    assert delta_spark.write_options(["a"], merge_schema=True) == {
        "replaceWhere": "`capture_id` IN ('a')",
        "mergeSchema": "true",
    }


def test_maintenance_statements(spark):
    assert delta_spark.optimize_sql(UC) == "OPTIMIZE `main`.`amqpscope`.`captures`"
    assert (
        delta_spark.vacuum_sql(BY_PATH, 168) == "VACUUM delta.`/Volumes/main/amqpscope/lake/captures` RETAIN 168 HOURS"
    )
    with pytest.raises(ValueError):
        delta_spark.vacuum_sql(UC, -1)
    wanted = documented("captures", tables()["captures"].schema)
    bare = StructType([StructField(f.name, f.dataType, True) for f in wanted.fields])
    statements = delta_spark.comment_sql(UC, bare, wanted, "The frames table: ...", description("captures"))
    assert len(statements) == len([f for f in wanted.fields if f.metadata.get("comment")]) + 1
    for statement in statements:
        parsed(spark, statement)
    assert (
        statements[-1]
        == f"COMMENT ON TABLE `main`.`amqpscope`.`captures` IS {delta_spark.sql_string(description('captures'))}"
    )
    assert delta_spark.comment_sql(UC, wanted, wanted, description("captures"), description("captures")) == []


class Recorder:
    """The backend's calls, recorded; tables 'created' keep the schema they were created with."""

    def __init__(self, spark) -> None:
        self.spark = spark
        self.created: dict[str, StructType] = {}
        self.statements: list[str] = []
        self.writes: list[tuple[str, dict[str, str], list[str]]] = []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(lake_module, "jvm_has_delta", lambda spark: True)
        monkeypatch.setattr(delta_spark, "table_exists", lambda spark, ref: str(ref) in self.created)
        monkeypatch.setattr(
            delta_spark, "read_table", lambda spark, ref: self.spark.createDataFrame([], self.created[str(ref)])
        )

        def create(spark, ref, schema, text, cluster_by):
            self.statements.append(delta_spark.create_table_sql(ref, schema, text, cluster_by))
            self.created[str(ref)] = schema

        def write(df, ref, capture_ids, merge_schema, user_metadata=None):
            self.writes.append(
                (str(ref), delta_spark.write_options(capture_ids, merge_schema, user_metadata), df.columns)
            )
            if merge_schema:
                self.created[str(ref)] = df.schema

        monkeypatch.setattr(delta_spark, "create_table", create)
        monkeypatch.setattr(delta_spark, "write_rows", write)


def test_a_unity_catalog_lake_creates_then_replaces_then_widens(spark, monkeypatch, tmp_path):
    recorder = Recorder(spark)
    recorder.install(monkeypatch)
    lake = Lake.of(spark, AnalyzeConfig(lake=tmp_path, storage="delta-spark", catalog="main", schema="amqpscope"))
    assert (lake.backend, str(lake.table_ref("runs"))) == ("delta-spark", "main.amqpscope.runs")
    rows = spark.createDataFrame([], RUNS_SCHEMA)
    lake.write(rows, "runs", replace_capture_ids=["b", "a"])
    [statement] = recorder.statements
    assert statement == delta_spark.create_table_sql(
        lake.table_ref("runs"), documented("runs", RUNS_SCHEMA), description("runs"), ["capture_id"]
    )
    plan = parsed(spark, statement)
    assert option_value(plan.tableSpec().comment()).startswith("The ``runs`` table")
    assert recorder.writes == [
        ("main.amqpscope.runs", {"replaceWhere": "`capture_id` IN ('a', 'b')"}, RUNS_SCHEMA.fieldNames())
    ]
    lake.write(rows, "runs", replace_capture_ids=["a"])  # the table exists: no second CREATE
    assert len(recorder.statements) == 1 and recorder.writes[-1][1] == {"replaceWhere": "`capture_id` IN ('a')"}
    lake.write(rows.withColumn("note", F.lit("x")), "runs", replace_capture_ids=["a"])  # a column added at the end
    assert recorder.writes[-1][1]["mergeSchema"] == "true"
    with pytest.raises(ValueError, match="column 'outcome' is missing"):
        lake.write(rows.drop("outcome"), "runs", replace_capture_ids=["a"])


def test_unity_catalog_needs_the_delta_spark_backend(spark, tmp_path):
    with pytest.raises(ValueError, match="written by the delta-spark backend"):
        Lake(spark, tmp_path, backend="delta-rs", catalog="main", schema="amqpscope")
    with pytest.raises(ValueError, match="catalog and schema go together"):
        AnalyzeConfig(lake=tmp_path, catalog="main")
    assert AnalyzeConfig(lake=tmp_path, catalog="", schema="").catalog is None  # a blank job parameter: none
    with pytest.raises(ValueError, match="must be a Unity Catalog name"):
        AnalyzeConfig(lake=tmp_path, catalog="main", schema="a.b")


def test_maintain_on_delta_spark_optimizes_vacuums_and_documents(spark, monkeypatch, tmp_path):
    recorder = Recorder(spark)
    recorder.install(monkeypatch)
    documented_runs = documented("runs", RUNS_SCHEMA)
    recorder.created["main.amqpscope.runs"] = StructType([StructField(f.name, f.dataType, True) for f in RUNS_SCHEMA])
    sent: list[str] = []
    monkeypatch.setattr(delta_spark, "file_count", lambda spark, ref: 3 if not sent else 1)
    monkeypatch.setattr(delta_spark, "table_description", lambda spark, ref: None)

    class Session:  # what maintain sends to Spark, recorded
        def sql(self, statement: str) -> None:
            sent.append(statement)

    session = Session()
    monkeypatch.setattr(
        maintain.Lake,
        "of",
        classmethod(
            lambda cls, _spark, config: Lake(session, config.lake, "delta-spark", config.catalog, config.schema)
        ),
    )
    config = AnalyzeConfig(lake=tmp_path, storage="delta-spark", catalog="main", schema="amqpscope")
    result = maintain.maintain_lake(spark, config, retain_hours=200)
    [done] = result.tables
    assert (done.table, done.files_before, done.files_after, done.files_vacuumed) == ("runs", 3, 1, None)
    comments = [f for f in documented_runs.fields if f.metadata.get("comment")]
    assert sent[:2] == ["OPTIMIZE `main`.`amqpscope`.`runs`", "VACUUM `main`.`amqpscope`.`runs` RETAIN 200 HOURS"]
    assert len(sent) == 2 + len(comments) + 1 and done.comments_set == len(comments) + 1
    assert sent[-1].startswith("COMMENT ON TABLE `main`.`amqpscope`.`runs` IS 'The ``runs`` table")


# What Delta says when a replaceWhere loses to another run's commit of the same capture (the message of
# DeltaErrors.concurrentAppendException: the winning commit's commitInfo as JSON, its userMetadata ours).
APPEND_LOST = (
    "Files were added to partition [capture_id=abc] by a concurrent update. Please try the operation "
    'again.\nConflicting commit: {"timestamp":1764160000000,"userMetadata":"amqpscope.runId=run-7f3a",'
    '"operation":"WRITE","operationParameters":{"mode":"Overwrite"},"readVersion":3,'
    '"isolationLevel":"Serializable","isBlindAppend":false,"version":4}\n'
    "Refer to https://docs.delta.io/latest/concurrency-control.html for more details."
)


def delta_python_exception(kind: str, message: str) -> Exception:
    """The exception delta-spark's Python package raises for a Java one (delta.exceptions.<kind>)."""
    return type(kind, (Exception,), {"__module__": "delta.exceptions"})(message)


class JavaClass:
    def __init__(self, name: str) -> None:
        self.name = name

    def getName(self) -> str:
        return self.name


class JavaException:
    def __init__(self, name: str, message: str) -> None:
        self.name, self.message = name, message

    def getClass(self) -> JavaClass:
        return JavaClass(self.name)

    def getMessage(self) -> str:
        return self.message


class Py4JLikeError(Exception):
    """PySpark's error for a Java exception it has no class of its own for (py4j's Py4JJavaError)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name)
        self.java_exception = JavaException(name, message)


def test_every_commit_names_its_run():
    assert delta_spark.write_options(["a"], merge_schema=False, user_metadata="amqpscope.runId=r1") == {
        "replaceWhere": "`capture_id` IN ('a')",
        "userMetadata": "amqpscope.runId=r1",
    }


@pytest.mark.parametrize(
    "raised",
    [
        delta_python_exception("ConcurrentAppendException", APPEND_LOST),
        Py4JLikeError("io.delta.exceptions.ConcurrentAppendException", APPEND_LOST),
    ],
    ids=["delta's Python class", "the Java exception"],
)
def test_a_conflict_delta_raises_names_the_run_that_won(raised):
    conflict = delta_spark.commit_conflict(raised)
    assert conflict is not None
    assert (conflict.kind, conflict.version, conflict.user_metadata("amqpscope.runId")) == (
        "ConcurrentAppendException",
        4,
        "run-7f3a",
    )
    lost = lake_module._delta_spark_conflict(raised, "frames", ["abc" + "0" * 61])
    assert str(lost) == (
        "table frames: capture abc000000000 was written by run run-7f3a (version 4) after this "
        "run read the table; not written twice"
    )


@pytest.mark.parametrize(
    "raised",
    [
        ValueError("Conflicting commit: version 4"),
        type("ConcurrentAppendException", (Exception,), {"__module__": "someone.else"})("x"),
        Py4JLikeError("org.apache.spark.SparkException", APPEND_LOST),
        Py4JLikeError("io.delta.exceptions.DeltaAnalysisException", "no conflict"),
    ],
)
def test_other_errors_are_not_conflicts(raised):
    assert delta_spark.commit_conflict(raised) is None
    assert lake_module._delta_spark_conflict(raised, "frames", ["abc"]) is None


def test_a_conflict_without_our_metadata_names_its_kind():
    # Two writers creating one table at once: Delta refuses one (ProtocolChangedException), no run named.
    raised = delta_python_exception(
        "ProtocolChangedException",
        "The protocol version of the Delta table has been "
        "changed by a concurrent update. This happens when multiple writers are writing "
        "to an empty directory.",
    )
    lost = lake_module._delta_spark_conflict(raised, "runs", ["abc"])
    assert str(lost) == (
        "table runs: capture abc was written by another writer (ProtocolChangedException) after "
        "this run read the table; not written twice"
    )


def test_a_lost_write_is_one_line_naming_the_table_and_the_winner(spark, monkeypatch, tmp_path):
    recorder = Recorder(spark)
    recorder.install(monkeypatch)
    lake = Lake.of(spark, AnalyzeConfig(lake=tmp_path, storage="delta-spark"), run_id="run-mine")
    rows = spark.createDataFrame([], RUNS_SCHEMA)
    lake.write(rows, "runs", replace_capture_ids=["a"])
    assert recorder.writes[-1][1]["userMetadata"] == "amqpscope.runId=run-mine"

    def lose(df, ref, capture_ids, merge_schema, user_metadata=None):
        raise Py4JLikeError("io.delta.exceptions.ConcurrentDeleteReadException", APPEND_LOST)

    monkeypatch.setattr(delta_spark, "write_rows", lose)
    with pytest.raises(
        WriteConflict, match=r"^table runs: capture a was written by run run-7f3a \(version 4\)"
    ) as lost:
        lake.write(rows, "runs", replace_capture_ids=["a"])
    assert isinstance(lost.value.__cause__, Py4JLikeError)


def test_a_table_two_runs_create_at_once_is_written_by_both(spark, monkeypatch, tmp_path):
    recorder = Recorder(spark)
    recorder.install(monkeypatch)

    def created_by_the_other_run(spark_, ref, schema, text, cluster_by):
        recorder.created[str(ref)] = schema  # the other run's CREATE committed version 0 first
        raise delta_python_exception("ProtocolChangedException", "multiple writers are writing to an empty directory")

    monkeypatch.setattr(delta_spark, "create_table", created_by_the_other_run)
    lake = Lake.of(spark, AnalyzeConfig(lake=tmp_path, storage="delta-spark"))
    rows = spark.createDataFrame([], RUNS_SCHEMA)
    lake.write(rows, "runs", replace_capture_ids=["a"])
    assert [(ref, options["replaceWhere"]) for ref, options, _ in recorder.writes] == [
        (str(lake.table_ref("runs")), "`capture_id` IN ('a')")
    ]

    def refused(spark_, ref, schema, text, cluster_by):  # a conflict, yet no table: not ours to hide
        raise delta_python_exception("ProtocolChangedException", "refused")

    monkeypatch.setattr(delta_spark, "create_table", refused)
    with pytest.raises(Exception, match="refused"):
        lake.write(rows, "diagnosis_empty", replace_capture_ids=["a"])
