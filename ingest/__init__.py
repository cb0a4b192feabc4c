"""amqpscope.ingest: capture bytes to rows. The decoders run compiled when built so (``compiled``)."""

from amqpscope.ingest import compiled

compiled.select()
