#!/usr/bin/env bash
# Counts the dev broker's share-path work for each dev broker a command starts: how many
# lock-state list nodes the mock visits per record it hands out, and how the first nodes of
# each list sit in memory. `sink_pipeline --part overhead` starts a fresh cluster per
# contender, so each mock thread below is one contender's drain, in the order they ran.
#
# Why: the mock's ShareFetch answer walks every offset from the share-partition start to the
# log end and looks each one up in the partition's linked list of lock states
# (rd_kafka_mock_sgrp_write_acquired_records and ..._meta, rdkafka_mock_handlers.c). Its CPU
# per record is therefore (list nodes visited) x (time per visit); this separates the two.
#
# Needs root (uprobes) and perf. The field offsets are those of librdkafka 2.16's
# rd_kafka_mock_sgrp_partmeta_t (spso +64, speo +72, first lock state +80, list length +96,
# acquired +100), the wheel tools/ installs.
#
# The benches run the dev broker on jemalloc unless told `--broker-allocator glibc`; the layout
# columns show both (48 B apart: jemalloc's slots; 64 and 96 B: glibc's chunks).
#
# Usage: bench/mock_walks.sh target/release/sink_pipeline --part overhead --rounds 1
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)"
lib=$(ls "$here"/tools/.venv/lib/python3*/site-packages/confluent_kafka.libs/librdkafka-*.so* 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "no librdkafka in tools/.venv: run the test suite or the demo once to create it" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 2; }
version=$("$here"/tools/.venv/bin/python -c 'import confluent_kafka; print(confluent_kafka.libversion()[0])')
case "$version" in
  2.16.*) ;;
  *) echo "librdkafka $version in tools/.venv: the field offsets here are 2.16's; check them against its rdkafka_mock_int.h" >&2; exit 2 ;;
esac
out=$(mktemp -d)
trap 'perf probe -q -d "spillway_mock:*" 2>/dev/null || true; rm -rf "$out"' EXIT

# One event per partition answered: its walk bounds, its list, and the list's first six nodes.
node='+80(%si)'
nodes=""
for i in 1 2 3 4 5 6; do
  nodes="$nodes n$i=$node:x64"
  node="+0($node)"
done
# A run stopped short may have left the probe behind.
perf probe -q -d "spillway_mock:*" 2>/dev/null || true
perf probe -q -x "$lib" -a "spillway_mock:walk=rd_kafka_mock_sgrp_write_acquired_records_meta spso=+64(%si):s64 speo=+72(%si):s64 listed=+96(%si):s32 acquired=+100(%si):s32$nodes"
# A bench that misses a goal exits non-zero; its walks are still worth reading.
status=0
perf record -q -e spillway_mock:walk -a -o "$out/walks.data" -- "$@" || status=$?
perf script -i "$out/walks.data" 2>/dev/null | python3 -c '
import re, sys
from collections import OrderedDict
# The layout columns read lists of a whole fetch: max.poll.records, 500 in the benches.
WHOLE_FETCH = 500
mocks = OrderedDict()
pattern = re.compile(r"rdk:mock\s+(\d+).*spso=(-?\d+) speo=(-?\d+) listed=(\d+) acquired=(\d+)"
                     + "".join(r" n%d=(\S+)" % i for i in range(1, 7)))
for line in sys.stdin:
    m = pattern.search(line)
    if not m:
        continue
    s = mocks.setdefault(m.group(1), dict(answers=0, acquired=0, visits=0, pairs=0, packed=0, contiguous=0, interleaved=0, nodes=0, straddling=0))
    spso, speo, listed, acquired = (int(x) for x in m.groups()[1:5])
    s["answers"] += 1
    s["acquired"] += acquired
    # A lookup walks the list to the offset, or all of it when the offset holds no lock state.
    s["visits"] += max(0, speo - spso + 1) * listed
    if acquired >= WHOLE_FETCH:
        addrs = [int(x, 16) for x in m.groups()[5:]]
        s["pairs"] += 5
        # 48 B: slots of jemalloc for the 48-byte state, side by side.
        s["packed"] += sum(abs(b - a) == 48 for a, b in zip(addrs, addrs[1:]))
        # 64 B: chunks of glibc for the state (48 bytes and a header), side by side.
        s["contiguous"] += sum(abs(b - a) == 64 for a, b in zip(addrs, addrs[1:]))
        # 96 B: a node, then its own 23-byte copy of the member id, then the next node.
        s["interleaved"] += sum(abs(b - a) == 96 for a, b in zip(addrs, addrs[1:]))
        s["nodes"] += 6
        # next at +0 and offset at +16: a node 48 bytes into a cache line needs two lines.
        s["straddling"] += sum(a % 64 == 48 for a in addrs)
def share(part, whole):
    return "%.0f%%" % (100 * part / whole) if whole else "-"
# acquired: summed over answers, so a record still held at a later answer counts again.
print("mock thread | answers | acquired at answers | list nodes visited per record | first nodes 48 B apart | 64 B apart | 96 B apart | nodes across two cache lines")
for pid, s in mocks.items():
    per = s["visits"] / max(1, s["acquired"])
    print("%11s | %7d | %19d | %29.0f | %22s | %10s | %10s | %s" % (pid, s["answers"], s["acquired"], per,
          share(s["packed"], s["pairs"]), share(s["contiguous"], s["pairs"]), share(s["interleaved"], s["pairs"]),
          share(s["straddling"], s["nodes"])))
'
exit "$status"
