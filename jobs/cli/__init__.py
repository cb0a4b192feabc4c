"""The command line: the ``amqpscope`` command (``cli``: argument parsing, one-line errors, exit
codes), what each of its commands runs (``commands``), the entry points of the scheduled stages
(``entry``: console scripts, Databricks tasks, spark-submit), how every command ends
(``outcomes``), and ``amqpscope diagnose``'s answer (``diagnose``).

The command line is the top: it may import the stages, the lake and the engine, and nothing
imports it but ``python -m amqpscope``. It imports Spark only when a command runs a job.
"""
