"""The engine: where the work runs. The one place a SparkSession is built (classic, Spark Connect,
or Sail embedded in this process, ``sail``) and what makes a classic one start fast (the JVM's
class archive, Py4J's lookups remembered).

The engine imports nothing else of ``amqpscope.jobs``: the lake and the stages import it.
"""
