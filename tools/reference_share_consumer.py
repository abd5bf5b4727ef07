#!/usr/bin/env python3
"""The reference share consumer: confluent_kafka.ShareConsumer (librdkafka), for interop tests and
benchmarks.

It joins a share group, acknowledges every record explicitly with ACCEPT and commits once per poll
(commit_sync), as Spillway's own consumer does in the benchmark.

Output (stdout, one JSON object per line):
  {"ready": true}                                     once subscribed
  {"t": topic, "p": partition, "o": offset, "dc": n}  per record, with --report records
  {"summary": {"records": n, "seconds": s, "cpu_seconds": c, "first_record_at": t}}  at the end

It stops after --max-records, after --idle-exit-ms without records (counted once the first record
arrived), or when stdin closes (so it never outlives its parent).
"""

import argparse
import json
import os
import select
import sys
import time

from confluent_kafka import AcknowledgeType, ShareConsumer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--max-records", type=int, default=0)
    parser.add_argument("--idle-exit-ms", type=int, default=0)
    parser.add_argument("--report", choices=["records", "count"], default="records")
    parser.add_argument("--max-poll-records", type=int, default=500)
    args = parser.parse_args()

    consumer = ShareConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": args.max_poll_records,
            "log_level": 3,
        }
    )
    consumer.subscribe(args.topic)
    print(json.dumps({"ready": True}), flush=True)

    received = 0
    started = time.monotonic()
    cpu_started = time.process_time()
    first_record_at = None
    last_record_at = time.monotonic()
    stdin_open = True
    try:
        while True:
            if stdin_open and select.select([sys.stdin], [], [], 0)[0]:
                if not os.read(sys.stdin.fileno(), 4096):
                    break
            batch = consumer.poll(0.2)
            lines = []
            for msg in batch:
                if msg.error():
                    print(json.dumps({"error": str(msg.error())}), flush=True)
                    continue
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                received += 1
                if args.report == "records":
                    lines.append(
                        json.dumps(
                            {
                                "t": msg.topic(),
                                "p": msg.partition(),
                                "o": msg.offset(),
                                "dc": msg.delivery_count() if hasattr(msg, "delivery_count") else 0,
                            }
                        )
                    )
            if len(batch):
                consumer.commit_sync()
                now = time.monotonic()
                if first_record_at is None:
                    first_record_at = now - started
                last_record_at = now
                if lines:
                    print("\n".join(lines), flush=True)
            if args.max_records and received >= args.max_records:
                break
            if (
                args.idle_exit_ms
                and first_record_at is not None
                and (time.monotonic() - last_record_at) * 1000 > args.idle_exit_ms
            ):
                break
    finally:
        seconds = last_record_at - started - (first_record_at or 0)
        consumer.close()
        summary = {
            "records": received,
            "seconds": seconds,
            "cpu_seconds": time.process_time() - cpu_started,
            "first_record_at": first_record_at,
        }
        print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
