"""amqpscope.jobs."""
