"""amqpscope.testbed: real AMQP 0-9-1 and 1.0 captures from a private RabbitMQ on loopback.

``broker`` starts a throw-away RabbitMQ node, ``scenarios`` drives real clients (pika,
python-qpid-proton) and returns their ground truth, ``capture`` records them with tcpdump,
``tshark`` reads the captures back with Wireshark's dissector as an independent check.
"""
