"""amqpscope.ingest."""
