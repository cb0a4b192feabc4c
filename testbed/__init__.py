"""amqpscope.testbed."""
