#!/usr/bin/env python3
"""Produce N records with librdkafka (the confluent-kafka wheel) and read them back.

Usage: kafka_roundtrip.py '<client config as JSON>' TOPIC N
The JSON holds librdkafka settings (bootstrap.servers, security.protocol, ssl.ca.location,
sasl.*). Prints "consumed N" and exits 0 when every record came back; otherwise prints what
failed (never the configuration, which may hold a password) and exits 1.
"""

import json
import sys
import time

from confluent_kafka import Consumer, Producer


def main():
    conf = json.loads(sys.argv[1])
    topic = sys.argv[2]
    n = int(sys.argv[3])
    errors = []
    producer = Producer(dict(conf, **{
        "message.timeout.ms": conf.pop("message.timeout.ms", 20000),
        "error_cb": lambda e: errors.append(str(e)),
    }))
    failed = []

    def report(err, _msg):
        if err is not None:
            failed.append(str(err))

    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, on_delivery=report)
        producer.poll(0)
    left = producer.flush(30)
    if left or failed:
        print("produce failed: %d undelivered, delivery errors %s, client errors %s"
              % (left, failed[:3], errors[:3]))
        return 1
    consumer = Consumer(dict(conf, **{
        "group.id": "roundtrip-" + topic,
        "auto.offset.reset": "earliest",
        "error_cb": lambda e: errors.append(str(e)),
    }))
    consumer.subscribe([topic])
    seen = set()
    deadline = time.time() + 60
    while len(seen) < n and time.time() < deadline:
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        seen.add(message.value())
    consumer.close()
    print("consumed %d" % len(seen))
    if len(seen) != n:
        print("client errors %s" % errors[:3])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
