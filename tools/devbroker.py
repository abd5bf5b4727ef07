#!/usr/bin/env python3
"""Spillway's dev broker: librdkafka's mock cluster, started from the confluent-kafka wheel.

The mock cluster lives inside librdkafka (the shared library shipped in the PyPI wheel
confluent-kafka==2.16.1); the Python package does not wrap it, so this launcher reaches it with
ctypes.

Protocol with the parent process:
  * the first stdout line is the bootstrap list ("127.0.0.1:port,127.0.0.1:port,...");
  * then one JSON object per stdin line is a control command, answered by one JSON line on stdout:
    {"ok": true, ...} or {"ok": false, "error": "..."};
  * when stdin closes the cluster is destroyed and the launcher exits, so it never outlives its
    parent.

Commands (field "cmd"):
  create_topic            topic, partitions, [replication_factor=1]
  share_settings          any of: auto_offset_reset ("earliest"|"latest"), record_lock_duration_ms,
                          max_delivery_attempts, session_timeout_ms, heartbeat_interval_ms,
                          isolation_level ("read_committed"|"read_uncommitted"), max_record_locks,
                          max_size, max_fetch_sessions
  share_target_assignment group, assignments: {member_id: [[topic, partition], ...]}
  share_settings_in_force -> {"settings": {name: value, ...}}: what share_settings last set (or the
                          mock's default) for every setting, e.g. "auto_offset_reset": "latest"
  share_member_ids        group -> {"members": [...]}
  broker_down / broker_up broker
  broker_rtt              broker, rtt_ms
  push_request_errors     api_key, errors: [codes]          (next requests with that key, any broker)
  push_partition_request_errors  topic, partition, api_key, errors: [codes]
  broker_push_request_error_rtts broker, api_key, errors: [[code, rtt_ms], ...]
  clear_request_errors    api_key
  set_partition_leader    topic, partition, broker
  set_coordinator         key_type ("group"|"transaction"), key, broker
  set_api_version         api_key, min_version, max_version   (-1, -1: the brokers no longer
                          know the API and leave it out of ApiVersions, like an older broker)
  start_request_tracking  (records every request the brokers receive from now on)
  request_counts          -> {"counts": {api_key: n, ...}} since the last call or the start of
                          tracking, then forgets them
  ping
"""

import ctypes
import glob
import json
import os
import sys


def load_librdkafka():
    import confluent_kafka  # noqa: F401  (locates site-packages; also loads the library once)

    site = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    candidates = glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*"))
    if not candidates:
        raise SystemExit(
            "devbroker: librdkafka not found under %s/confluent_kafka.libs; "
            "install confluent-kafka==2.16.1 in this Python" % site
        )
    return ctypes.CDLL(candidates[0])


lib = load_librdkafka()
c_void_p = ctypes.c_void_p
c_int = ctypes.c_int
c_int16 = ctypes.c_int16
c_int32 = ctypes.c_int32
c_char_p = ctypes.c_char_p
c_size_t = ctypes.c_size_t


def declare(name, restype, argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


rd_kafka_conf_new = declare("rd_kafka_conf_new", c_void_p, [])
rd_kafka_conf_set = declare(
    "rd_kafka_conf_set", c_int, [c_void_p, c_char_p, c_char_p, c_char_p, c_size_t]
)
rd_kafka_new = declare("rd_kafka_new", c_void_p, [c_int, c_void_p, c_char_p, c_size_t])
rd_kafka_destroy = declare("rd_kafka_destroy", None, [c_void_p])
rd_kafka_err2str = declare("rd_kafka_err2str", c_char_p, [c_int])
mock_cluster_new = declare("rd_kafka_mock_cluster_new", c_void_p, [c_void_p, c_int])
mock_cluster_destroy = declare("rd_kafka_mock_cluster_destroy", None, [c_void_p])
mock_bootstraps = declare("rd_kafka_mock_cluster_bootstraps", c_char_p, [c_void_p])
mock_topic_create = declare("rd_kafka_mock_topic_create", c_int, [c_void_p, c_char_p, c_int, c_int])
mock_broker_down = declare("rd_kafka_mock_broker_set_down", c_int, [c_void_p, c_int32])
mock_broker_up = declare("rd_kafka_mock_broker_set_up", c_int, [c_void_p, c_int32])
mock_broker_rtt = declare("rd_kafka_mock_broker_set_rtt", c_int, [c_void_p, c_int32, c_int])
mock_push_errors = declare(
    "rd_kafka_mock_push_request_errors_array",
    None,
    [c_void_p, c_int16, c_size_t, ctypes.POINTER(c_int)],
)
mock_clear_errors = declare("rd_kafka_mock_clear_request_errors", None, [c_void_p, c_int16])
# Variadic: the error codes follow as ints (default argument promotion), so argtypes stop early.
mock_partition_push_errors = lib.rd_kafka_mock_partition_push_request_errors
mock_partition_push_errors.restype = c_int
mock_broker_push_error_rtts = lib.rd_kafka_mock_broker_push_request_error_rtts
mock_broker_push_error_rtts.restype = c_int
mock_partition_set_leader = declare(
    "rd_kafka_mock_partition_set_leader", c_int, [c_void_p, c_char_p, c_int32, c_int32]
)
mock_coordinator_set = declare(
    "rd_kafka_mock_coordinator_set", c_int, [c_void_p, c_char_p, c_char_p, c_int32]
)
mock_set_apiversion = declare(
    "rd_kafka_mock_set_apiversion", c_int, [c_void_p, c_int16, c_int16, c_int16]
)
mock_start_tracking = declare("rd_kafka_mock_start_request_tracking", None, [c_void_p])
mock_get_requests = declare(
    "rd_kafka_mock_get_requests", ctypes.POINTER(c_void_p), [c_void_p, ctypes.POINTER(c_size_t)]
)
mock_clear_requests = declare("rd_kafka_mock_clear_requests", None, [c_void_p])
mock_request_api_key = declare("rd_kafka_mock_request_api_key", c_int16, [c_void_p])
mock_request_destroy_array = declare(
    "rd_kafka_mock_request_destroy_array", None, [ctypes.POINTER(c_void_p), c_size_t]
)
tp_list_new = declare("rd_kafka_topic_partition_list_new", c_void_p, [c_int])
tp_list_add = declare("rd_kafka_topic_partition_list_add", c_void_p, [c_void_p, c_char_p, c_int32])
tp_list_destroy = declare("rd_kafka_topic_partition_list_destroy", None, [c_void_p])
mem_free = declare("rd_kafka_mem_free", None, [c_void_p, c_void_p])

SHARE_SETTERS = {
    "record_lock_duration_ms": "rd_kafka_mock_sharegroup_set_record_lock_duration",
    "max_delivery_attempts": "rd_kafka_mock_sharegroup_set_max_delivery_attempts",
    "session_timeout_ms": "rd_kafka_mock_sharegroup_set_session_timeout",
    "heartbeat_interval_ms": "rd_kafka_mock_sharegroup_set_heartbeat_interval",
    "max_record_locks": "rd_kafka_mock_sharegroup_set_max_record_locks",
    "max_size": "rd_kafka_mock_sharegroup_set_max_size",
    "max_fetch_sessions": "rd_kafka_mock_sharegroup_set_max_fetch_sessions",
    "auto_offset_reset": "rd_kafka_mock_sharegroup_set_auto_offset_reset",
    "isolation_level": "rd_kafka_mock_sharegroup_set_isolation_level",
}
# The mock's own defaults (rdkafka_mock_sharegrp.c), which equal Apache Kafka's.
SHARE_DEFAULTS = {
    "record_lock_duration_ms": 30000,
    "max_delivery_attempts": 5,
    "session_timeout_ms": 45000,
    "heartbeat_interval_ms": 5000,
    "max_record_locks": 2000,
    "max_size": 200,
    "max_fetch_sessions": 2000,
    "auto_offset_reset": "latest",
    "isolation_level": "read_uncommitted",
}
ENUM_SETTINGS = {
    "auto_offset_reset": {"latest": 0, "earliest": 1},
    "isolation_level": {"read_uncommitted": 0, "read_committed": 1},
}


class CommandError(Exception):
    pass


def check(err, what):
    if err != 0:
        raise CommandError("%s failed: %s (%d)" % (what, rd_kafka_err2str(err).decode(), err))


def field(cmd, name, kind):
    if name not in cmd:
        raise CommandError("command '%s' needs the field '%s'" % (cmd.get("cmd"), name))
    value = cmd[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise CommandError(
            "field '%s' of command '%s' must be %s, got %r"
            % (name, cmd.get("cmd"), kind.__name__, value)
        )
    return value


class DevBroker:
    def __init__(self, broker_count):
        errbuf = ctypes.create_string_buffer(512)
        conf = rd_kafka_conf_new()
        # The handle only hosts the mock cluster; keep its own logging quiet.
        rd_kafka_conf_set(conf, b"log_level", b"3", errbuf, len(errbuf))
        self.rk = rd_kafka_new(0, conf, errbuf, len(errbuf))
        if not self.rk:
            raise SystemExit("devbroker: rd_kafka_new failed: " + errbuf.value.decode())
        self.mc = mock_cluster_new(self.rk, broker_count)
        if not self.mc:
            raise SystemExit("devbroker: rd_kafka_mock_cluster_new(%d) failed" % broker_count)
        # The mock has no getters: what is in force is what was last set.
        self.share_in_force = dict(SHARE_DEFAULTS)

    def bootstraps(self):
        return mock_bootstraps(self.mc).decode()

    def close(self):
        mock_cluster_destroy(self.mc)
        rd_kafka_destroy(self.rk)

    def run(self, cmd):
        name = cmd.get("cmd")
        handler = getattr(self, "cmd_" + str(name), None)
        if handler is None:
            raise CommandError("unknown command %r" % name)
        return handler(cmd) or {}

    def cmd_ping(self, _cmd):
        return {"bootstrap": self.bootstraps()}

    def cmd_create_topic(self, cmd):
        topic = field(cmd, "topic", str)
        partitions = field(cmd, "partitions", int)
        rf = cmd.get("replication_factor", 1)
        check(mock_topic_create(self.mc, topic.encode(), partitions, rf), "create_topic " + topic)

    def cmd_share_settings(self, cmd):
        unknown = set(cmd) - set(SHARE_SETTERS) - {"cmd"}
        if unknown:
            raise CommandError(
                "unknown share setting(s) %s; expected %s"
                % (sorted(unknown), ", ".join(sorted(SHARE_SETTERS)))
            )
        for key, value in cmd.items():
            if key == "cmd":
                continue
            if key in ENUM_SETTINGS:
                allowed = ENUM_SETTINGS[key]
                if value not in allowed:
                    raise CommandError(
                        "share setting %s=%r; expected one of %s" % (key, value, ", ".join(allowed))
                    )
                raw = allowed[value]
            elif not isinstance(value, int) or isinstance(value, bool):
                raise CommandError("share setting %s must be an integer, got %r" % (key, value))
            else:
                raw = value
            setter = declare(SHARE_SETTERS[key], None, [c_void_p, c_int])
            setter(self.mc, raw)
            self.share_in_force[key] = value

    def cmd_share_settings_in_force(self, _cmd):
        return {"settings": dict(self.share_in_force)}

    def cmd_share_target_assignment(self, cmd):
        group = field(cmd, "group", str)
        assignments = field(cmd, "assignments", dict)
        members = list(assignments)
        lists = []
        try:
            for member in members:
                parts = assignments[member]
                tpl = tp_list_new(max(1, len(parts)))
                lists.append(tpl)
                for topic, partition in parts:
                    tp_list_add(tpl, topic.encode(), partition)
            member_arr = (c_char_p * len(members))(*[m.encode() for m in members])
            list_arr = (c_void_p * len(members))(*lists)
            fn = declare(
                "rd_kafka_mock_sharegroup_target_assignment",
                None,
                [c_void_p, c_char_p, c_void_p, c_void_p, c_size_t],
            )
            fn(self.mc, group.encode(), member_arr, list_arr, len(members))
        finally:
            for tpl in lists:
                tp_list_destroy(tpl)

    def cmd_share_member_ids(self, cmd):
        group = field(cmd, "group", str)
        out = ctypes.POINTER(c_char_p)()
        count = c_size_t(0)
        fn = declare(
            "rd_kafka_mock_sharegroup_get_member_ids",
            c_int,
            [c_void_p, c_char_p, ctypes.POINTER(ctypes.POINTER(c_char_p)), ctypes.POINTER(c_size_t)],
        )
        err = fn(self.mc, group.encode(), ctypes.byref(out), ctypes.byref(count))
        check(err, "share_member_ids " + group)
        members = []
        raw = ctypes.cast(out, ctypes.POINTER(c_void_p))
        for i in range(count.value):
            members.append(out[i].decode())
            mem_free(None, raw[i])
        if count.value:
            mem_free(None, raw)
        return {"members": members}

    def cmd_broker_down(self, cmd):
        broker = field(cmd, "broker", int)
        check(mock_broker_down(self.mc, broker), "broker_down %d" % broker)

    def cmd_broker_up(self, cmd):
        broker = field(cmd, "broker", int)
        check(mock_broker_up(self.mc, broker), "broker_up %d" % broker)

    def cmd_broker_rtt(self, cmd):
        broker = field(cmd, "broker", int)
        rtt = field(cmd, "rtt_ms", int)
        check(mock_broker_rtt(self.mc, broker, rtt), "broker_rtt %d" % broker)

    def cmd_push_request_errors(self, cmd):
        api_key = field(cmd, "api_key", int)
        errors = field(cmd, "errors", list)
        arr = (c_int * len(errors))(*errors)
        mock_push_errors(self.mc, api_key, len(errors), arr)

    def cmd_push_partition_request_errors(self, cmd):
        topic = field(cmd, "topic", str)
        partition = field(cmd, "partition", int)
        api_key = field(cmd, "api_key", int)
        errors = field(cmd, "errors", list)
        args = [c_int(e) for e in errors]
        err = mock_partition_push_errors(
            c_void_p(self.mc), topic.encode(), c_int32(partition), c_int16(api_key),
            c_size_t(len(errors)), *args,
        )
        check(err, "push_partition_request_errors %s[%d]" % (topic, partition))

    def cmd_broker_push_request_error_rtts(self, cmd):
        broker = field(cmd, "broker", int)
        api_key = field(cmd, "api_key", int)
        pairs = field(cmd, "errors", list)
        args = []
        for code, rtt in pairs:
            args += [c_int(code), c_int(rtt)]
        err = mock_broker_push_error_rtts(
            c_void_p(self.mc), c_int32(broker), c_int16(api_key), c_size_t(len(pairs)), *args
        )
        check(err, "broker_push_request_error_rtts broker %d" % broker)

    def cmd_clear_request_errors(self, cmd):
        mock_clear_errors(self.mc, field(cmd, "api_key", int))

    def cmd_start_request_tracking(self, _cmd):
        mock_start_tracking(self.mc)

    def cmd_request_counts(self, _cmd):
        count = c_size_t(0)
        requests = mock_get_requests(self.mc, ctypes.byref(count))
        counts = {}
        for i in range(count.value):
            key = mock_request_api_key(requests[i])
            counts[str(key)] = counts.get(str(key), 0) + 1
        if count.value:
            mock_request_destroy_array(requests, count)
        mock_clear_requests(self.mc)
        return {"counts": counts}

    def cmd_set_partition_leader(self, cmd):
        topic = field(cmd, "topic", str)
        partition = field(cmd, "partition", int)
        broker = field(cmd, "broker", int)
        err = mock_partition_set_leader(self.mc, topic.encode(), partition, broker)
        check(err, "set_partition_leader %s[%d] -> %d" % (topic, partition, broker))

    def cmd_set_coordinator(self, cmd):
        key_type = cmd.get("key_type", "group")
        if key_type not in ("group", "transaction"):
            raise CommandError("key_type must be 'group' or 'transaction', got %r" % key_type)
        key = field(cmd, "key", str)
        broker = field(cmd, "broker", int)
        err = mock_coordinator_set(self.mc, key_type.encode(), key.encode(), broker)
        check(err, "set_coordinator %s %s -> %d" % (key_type, key, broker))

    def cmd_set_api_version(self, cmd):
        api_key = field(cmd, "api_key", int)
        low = field(cmd, "min_version", int)
        high = field(cmd, "max_version", int)
        err = mock_set_apiversion(self.mc, api_key, low, high)
        check(err, "set_api_version %d [%d, %d]" % (api_key, low, high))


def parse_args(argv):
    brokers = 1
    topics = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--brokers" and i + 1 < len(argv):
            brokers = int(argv[i + 1])
            i += 2
        elif arg == "--topic" and i + 1 < len(argv):
            name, _, parts = argv[i + 1].partition(":")
            topics.append((name, int(parts or "1")))
            i += 2
        else:
            raise SystemExit("devbroker: unknown argument %r; usage: devbroker.py "
                             "[--brokers N] [--topic NAME:PARTITIONS ...]" % arg)
    if brokers < 1:
        raise SystemExit("devbroker: --brokers must be at least 1, got %d" % brokers)
    return brokers, topics


def main():
    brokers, topics = parse_args(sys.argv[1:])
    cluster = DevBroker(brokers)
    for name, partitions in topics:
        cluster.run({"cmd": "create_topic", "topic": name, "partitions": partitions})
    print(cluster.bootstraps(), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            if not isinstance(cmd, dict):
                raise CommandError("a command must be a JSON object, got %r" % line)
            reply = {"ok": True}
            reply.update(cluster.run(cmd))
        except (CommandError, ValueError, TypeError) as exc:
            reply = {"ok": False, "error": str(exc)}
        print(json.dumps(reply), flush=True)
    cluster.close()


if __name__ == "__main__":
    main()
