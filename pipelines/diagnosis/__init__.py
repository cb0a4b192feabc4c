"""The diagnosis: from the flow-state tables to what held the traffic back, and the answer.

Three steps, each a module (docs/DIAGNOSIS.md):

- ``measures``: the figures the rules test, one row per entity (a consumer, a channel, a link, a
  connection, a queue). Each measure is a pure function of named inputs: the tables, the shared
  intermediates, other measures and the thresholds. The measures live by what they look at:
  ``alarms``, ``windows``, ``consumer_window`` and ``consumer_capacity``, ``queue_measures``,
  ``publisher_problems``, ``churn``, ``round_trips``, ``network``; ``figures`` holds the column
  helpers they share.
- ``findings``: the engine that runs the rule catalogue (expectations/bottlenecks.yml, data, loaded
  by ``expectations.bottleneck_rules``) over the measures: the bottlenecks table, ranked.
- ``verdict``: the diagnosis table, one row per capture: the bottleneck, its headline, and the
  problems found beside it.

The package reads the flow-state tables' builders' helpers (``pipelines.held``, ``pipelines.publishing``,
``pipelines.queue_depth``, ``pipelines.tcp_pressure``, ``pipelines.messages``), the thresholds
(``conf.diagnosis``), the catalogue (``expectations.bottleneck_rules``) and the schemas; nothing in
it reads the lake, a session or the jobs.
"""
