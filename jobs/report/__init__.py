"""The report: one self-contained HTML page per run, an operator's dashboard of the captures.

It opens on an overview, one row per capture, worst first: file, span, the verdict in words with
its component and entity, a severity colour, frames, connections and violations, each row linking
to the capture's section. The sections are collapsed (``<details>``) so that many captures are
still one screen of overview. In a section: the answer (the diagnosis headline and the ranked
bottleneck findings, then the rule violations), the operator's context (products, limits, queues,
consumers, links), the charts, a section per connection to drill down to, and the data-quality
view. The captures a report leaves out are listed with why (the runs table says).

Every row the page shows comes from a gold table derive wrote (``REPORT_GOLD``): the sections
of each capture, ranked and cut to their first rows (``pipelines.report.sections``), the chart
series (``pipelines.report.chart_series``), the diagnosis, its findings and the data-quality summary. The
report job and analyze read them through delta-rs, so a page of a capture of any size is drawn
without a Spark query (``write_gold_report``); given as DataFrames, the same rows are computed and
collected (``write_report``), and the page is the same. The page is rendered from Jinja2 templates
with autoescaping on, and the charts are Plotly figures whose library (plotly.js's basic bundle,
installed from npm: ``amqpscope.web_assets``) is inlined once: nothing is fetched when the page
opens, and a capture's charts are drawn when its section is opened. Every value from the wire is
hostile input: escaped in the HTML, escaped again inside the charts' JSON and shown by Plotly as
text (``charts``).

The page is ``page``; its charts ``figures``, ``balance`` and ``charts``; its tables ``tables``. The
report reads the lake (``jobs.lake``) and the gold rows the pipelines' report builders wrote
(``pipelines.report``); it imports nothing of the stages or the command line.
"""
