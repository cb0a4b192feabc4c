"""amqpscope.expectations."""
