"""testbed: real AMQP 0-9-1 and 1.0 captures from a private RabbitMQ on loopback.

``broker`` starts a throw-away RabbitMQ node, ``scenarios`` drives real clients (pika,
python-qpid-proton) and returns their ground truth, ``capture`` records them with tcpdump,
``tshark`` reads the captures back with Wireshark's dissector as an independent check.

A top-level package of the repository, run from a checkout (``python -m testbed capture ...``;
the tests import it from the repository's root): it is not in the wheel, and no product module
imports it (tests/test_product_boundary.py). It imports the product (``amqpscope.*``) as any
user would. Its clients are the ``test`` extra's.
"""
