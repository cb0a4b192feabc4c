"""The jobs: everything that runs on Spark or the lake, in packages that each import only those
listed before them.

- ``engine``: the SparkSession (classic, Spark Connect, Sail) and what makes it start fast;
- ``lake``: the Delta tables, their commits and the runs table;
- ``report``: the HTML report, read from the lake's gold tables;
- ``stages``: the stages (decode, ingest, derive, report, maintain) and the jobs that run them
  (analyze, watch);
- ``cli``: the ``amqpscope`` command and the stages' entry points.

The decoding itself is ``amqpscope.ingest``, the tables' schemas ``amqpscope.schemas``, the
transformations ``amqpscope.pipelines``, the verdicts ``amqpscope.expectations``.
"""
