"""amqpscope.conf."""
