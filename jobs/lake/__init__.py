"""The lake: the Delta tables and how they are written and read, by delta-rs or delta-spark
(``lake.Lake``), the commits and their conflicts, the ``runs`` table's bookkeeping per capture, and
the lake's errors told in one line.

The lake may import the engine (which engine runs, whether its JVM has Delta); it imports nothing
of the stages or the command line.
"""
