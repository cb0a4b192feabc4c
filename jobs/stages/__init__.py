"""The stages and the jobs that run them: decoding captures on Spark (``decode``, and the ``amqp``
data source, ``datasource``), the ``ingest`` of a landing directory (``landing``), ``derive``,
``report`` (``report_job``), ``maintain``, the one-shot ``analyze`` and ``watch``, with what they
share: timed stages and the job's session (``stages``), progress on the terminal, and the checks
made before Spark starts (``preflight``).

The stages may import the engine, the lake and the report (``jobs.report``); they import nothing
of the command line.
"""
