"""The report's gold builders: the tables derive writes for the report to draw without Spark. The
sections of each capture, ranked and cut to their first rows (``sections``, from the operator's
context of ``context``), and the chart series on each capture's time grid (``chart_series``: the
grid and the count and state charts of ``series_grid``, the queues' rates and consumers'
utilisation of ``queue_series``).

They read the flow-state and diagnosis tables the other pipelines build; nothing in the pipelines
imports them but ``pipelines.tables``.
"""
