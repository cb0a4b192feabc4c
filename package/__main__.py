"""``python -m amqpscope``: the ``amqpscope`` command."""

import sys

from amqpscope.jobs.cli.cli import main

sys.exit(main())
