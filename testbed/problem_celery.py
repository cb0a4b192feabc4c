"""The Celery application of the ``celery_*`` problem scenarios, for a worker started as
``python -m celery -A testbed.problem_celery worker ...`` and for the producer.

The broker URL, the work per task and the file the worker notes each finished task in come from
the environment (the scenario sets them before it starts the worker process):
``AMQPSCOPE_CELERY_BROKER``, ``AMQPSCOPE_CELERY_WORK_SECONDS``, ``AMQPSCOPE_CELERY_DONE_FILE``.
"""

from __future__ import annotations

import os
import time

from celery import Celery

TASK = "amqpscope.work"

app = Celery("amqpscope", broker=os.environ.get("AMQPSCOPE_CELERY_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    # Plain RabbitMQ as the broker, nothing else: no result backend, no events.
    task_ignore_result=True,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=False,
    worker_hijack_root_logger=False,
)


@app.task(name=TASK)
def work(index: int) -> None:
    """Sleep the configured work time, then note the task as done (index and wall clock in µs)."""
    time.sleep(float(os.environ.get("AMQPSCOPE_CELERY_WORK_SECONDS", "0")))
    done = os.environ.get("AMQPSCOPE_CELERY_DONE_FILE")
    if done:
        with open(done, "a") as out:
            out.write(f"{index} {time.time_ns() // 1000}\n")
