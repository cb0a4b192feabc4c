"""amqpscope.pipelines."""
