/*
 * The C reference of the efficiency benchmarks (issue 18): librdkafka used directly, without
 * an interpreter in between, so that what it costs per record is the library's own cost.
 *
 *   share    BOOTSTRAP GROUP TOPIC RECORDS IDLE_MS MAX_POLL_RECORDS
 *            share consumer, explicit acknowledgement (ACCEPT each record), commit_sync per poll
 *   classic  BOOTSTRAP GROUP TOPIC RECORDS IDLE_MS
 *            classic consumer (subscribe, consumer_poll), offsets committed asynchronously
 *            every 500 records and synchronously at the end
 *   copy     BOOTSTRAP GROUP TOPIC RECORDS IDLE_MS DEST_TOPIC [DEST_BOOTSTRAP]
 *            classic consumer -> producer (acks=all, idempotent) to DEST_TOPIC, same partition,
 *            key, value, timestamp and headers (a replicator's copy, as MirrorMaker's); offsets
 *            committed once the copies before them are delivered; DEST_BOOTSTRAP names another cluster to copy to (a mirror flow)
 *
 * It stops after RECORDS records or IDLE_MS without records once the first one arrived, and
 * prints one JSON line: {"records":n,"seconds":s,"cpu_seconds":c,"cpu_before_first_seconds":f,
 * "peak_rss_bytes":b}, where seconds run from the first record received to the last one handled
 * and cpu_seconds are getrusage's user + system time of the whole process from before its
 * clients are made: the connector's and the mirror's CPU include making theirs (about 3 ms
 * here, librdkafka's first client in a process included). cpu_before_first_seconds is the part
 * of it spent before the first record came (making clients, joining): a cost per run, not per
 * record.
 *
 * The declarations below are our own, written from librdkafka 2.16's public API (rdkafka.h):
 * only the functions this program calls, with the handles kept opaque.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_share_s rd_kafka_share_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct rd_kafka_messages_s rd_kafka_messages_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;

typedef struct {
        int err;
        rd_kafka_topic_t *rkt;
        int32_t partition;
        void *payload;
        size_t len;
        void *key;
        size_t key_len;
        int64_t offset;
        void *private_;
} rd_kafka_message_t;

typedef struct {
        char *topic;
        int32_t partition;
        int64_t offset;
        void *metadata;
        size_t metadata_size;
        void *opaque;
        int err;
        void *private_;
} rd_kafka_topic_partition_t;

typedef struct {
        int cnt;
        int size;
        rd_kafka_topic_partition_t *elems;
} rd_kafka_topic_partition_list_t;

enum { KIND_PRODUCER = 0, KIND_CONSUMER = 1 };
enum { ACK_ACCEPT = 1 };
enum {
        V_END = 0,
        V_TOPIC = 1,
        V_PARTITION = 3,
        V_VALUE = 4,
        V_KEY = 5,
        V_MSGFLAGS = 7,
        V_TIMESTAMP = 8,
        V_HEADERS = 10
};
enum { MSG_F_COPY = 0x2 };
enum { ERR_QUEUE_FULL = -184 };
#define PARTITION_UA ((int32_t)-1)

rd_kafka_conf_t *rd_kafka_conf_new(void);
int rd_kafka_conf_set(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
void rd_kafka_conf_set_dr_msg_cb(rd_kafka_conf_t *,
                                 void (*)(rd_kafka_t *, const rd_kafka_message_t *, void *));
rd_kafka_t *rd_kafka_new(int, rd_kafka_conf_t *, char *, size_t);
void rd_kafka_destroy(rd_kafka_t *);
int rd_kafka_poll(rd_kafka_t *, int);
int rd_kafka_flush(rd_kafka_t *, int);
int rd_kafka_producev(rd_kafka_t *, ...);
int64_t rd_kafka_message_timestamp(const rd_kafka_message_t *, int *tstype);
int rd_kafka_poll_set_consumer(rd_kafka_t *);
int rd_kafka_subscribe(rd_kafka_t *, const rd_kafka_topic_partition_list_t *);
rd_kafka_message_t *rd_kafka_consumer_poll(rd_kafka_t *, int);
int rd_kafka_commit(rd_kafka_t *, const rd_kafka_topic_partition_list_t *, int);
int rd_kafka_consumer_close(rd_kafka_t *);
void rd_kafka_message_destroy(rd_kafka_message_t *);
int rd_kafka_message_detach_headers(rd_kafka_message_t *, rd_kafka_headers_t **);
void rd_kafka_headers_destroy(rd_kafka_headers_t *);
const char *rd_kafka_err2str(int);

rd_kafka_topic_partition_list_t *rd_kafka_topic_partition_list_new(int);
void *rd_kafka_topic_partition_list_add(rd_kafka_topic_partition_list_t *, const char *, int32_t);
void rd_kafka_topic_partition_list_destroy(rd_kafka_topic_partition_list_t *);

rd_kafka_share_t *rd_kafka_share_consumer_new(rd_kafka_conf_t *, char *, size_t);
int rd_kafka_share_subscribe(rd_kafka_share_t *, const rd_kafka_topic_partition_list_t *);
rd_kafka_error_t *rd_kafka_share_poll(rd_kafka_share_t *, int, rd_kafka_messages_t **);
size_t rd_kafka_messages_count(const rd_kafka_messages_t *);
rd_kafka_message_t *rd_kafka_messages_get(const rd_kafka_messages_t *, size_t);
void rd_kafka_messages_destroy(rd_kafka_messages_t *);
int rd_kafka_share_acknowledge_type(rd_kafka_share_t *, const rd_kafka_message_t *, int);
rd_kafka_error_t *rd_kafka_share_commit_sync(rd_kafka_share_t *, int,
                                             rd_kafka_topic_partition_list_t **);
rd_kafka_error_t *rd_kafka_share_consumer_close(rd_kafka_share_t *);
rd_kafka_error_t *rd_kafka_share_destroy(rd_kafka_share_t *);
const char *rd_kafka_error_string(const rd_kafka_error_t *);
void rd_kafka_error_destroy(rd_kafka_error_t *);

static double now_seconds(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static long peak_rss_bytes(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return ru.ru_maxrss * 1024L;
}

static void set(rd_kafka_conf_t *conf, const char *key, const char *value) {
        char errstr[512];
        if (rd_kafka_conf_set(conf, key, value, errstr, sizeof(errstr)) != 0) {
                fprintf(stderr, "config %s=%s: %s\n", key, value, errstr);
                exit(2);
        }
}

static rd_kafka_topic_partition_list_t *topic_list(const char *topic) {
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, topic, PARTITION_UA);
        return topics;
}

static void report(long records, double first, double last, double cpu_start, double cpu_first) {
        double seconds = first > 0 ? last - first : 0.0;
        printf("{\"records\":%ld,\"seconds\":%.6f,\"cpu_seconds\":%.6f,"
               "\"cpu_before_first_seconds\":%.6f,\"peak_rss_bytes\":%ld}\n",
               records, seconds, cpu_seconds() - cpu_start,
               first > 0 ? cpu_first - cpu_start : 0.0, peak_rss_bytes());
        fflush(stdout);
}

static int share_drain(const char *bootstrap, const char *group, const char *topic, long want,
                       double idle, const char *max_poll_records) {
        char errstr[512];
        double cpu_start = cpu_seconds();
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        set(conf, "bootstrap.servers", bootstrap);
        set(conf, "group.id", group);
        set(conf, "share.acknowledgement.mode", "explicit");
        set(conf, "max.poll.records", max_poll_records);
        set(conf, "log_level", "3");
        rd_kafka_share_t *share = rd_kafka_share_consumer_new(conf, errstr, sizeof(errstr));
        if (!share) {
                fprintf(stderr, "share consumer: %s\n", errstr);
                return 1;
        }
        rd_kafka_topic_partition_list_t *topics = topic_list(topic);
        int err = rd_kafka_share_subscribe(share, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (err) {
                fprintf(stderr, "share subscribe: %s\n", rd_kafka_err2str(err));
                return 1;
        }
        double first = 0, cpu_first = 0, last = now_seconds();
        long received = 0;
        while (received < want) {
                rd_kafka_messages_t *batch = NULL;
                rd_kafka_error_t *error = rd_kafka_share_poll(share, 200, &batch);
                if (error) {
                        fprintf(stderr, "share poll: %s\n", rd_kafka_error_string(error));
                        rd_kafka_error_destroy(error);
                        continue;
                }
                size_t count = rd_kafka_messages_count(batch);
                if (count == 0) {
                        rd_kafka_messages_destroy(batch);
                        if (first > 0 && now_seconds() - last > idle)
                                break;
                        continue;
                }
                if (first == 0) {
                        first = now_seconds();
                        cpu_first = cpu_seconds();
                }
                for (size_t i = 0; i < count; i++) {
                        rd_kafka_message_t *m = rd_kafka_messages_get(batch, i);
                        if (m->err) {
                                fprintf(stderr, "record error: %s\n", rd_kafka_err2str(m->err));
                                continue;
                        }
                        rd_kafka_share_acknowledge_type(share, m, ACK_ACCEPT);
                        received++;
                }
                rd_kafka_messages_destroy(batch);
                rd_kafka_topic_partition_list_t *results = NULL;
                error = rd_kafka_share_commit_sync(share, 30000, &results);
                if (error) {
                        fprintf(stderr, "share commit: %s\n", rd_kafka_error_string(error));
                        rd_kafka_error_destroy(error);
                }
                if (results) {
                        for (int i = 0; i < results->cnt; i++)
                                if (results->elems[i].err)
                                        fprintf(stderr, "commit %s[%d]: %s\n",
                                                results->elems[i].topic,
                                                results->elems[i].partition,
                                                rd_kafka_err2str(results->elems[i].err));
                        rd_kafka_topic_partition_list_destroy(results);
                }
                last = now_seconds();
        }
        report(received, first, last, cpu_start, cpu_first);
        rd_kafka_error_t *error = rd_kafka_share_consumer_close(share);
        if (error)
                rd_kafka_error_destroy(error);
        error = rd_kafka_share_destroy(share);
        if (error)
                rd_kafka_error_destroy(error);
        return 0;
}

/* Copies whose delivery is not confirmed yet (copy mode). */
static long undelivered;
static long delivery_failures;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
        (void)rk;
        (void)opaque;
        undelivered--;
        if (m->err) {
                delivery_failures++;
                fprintf(stderr, "delivery: %s\n", rd_kafka_err2str(m->err));
        }
}

static int classic_drain(const char *bootstrap, const char *group, const char *topic, long want,
                         double idle, const char *dest, const char *dest_bootstrap) {
        char errstr[512];
        double cpu_start = cpu_seconds();
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        set(conf, "bootstrap.servers", bootstrap);
        set(conf, "group.id", group);
        set(conf, "auto.offset.reset", "earliest");
        set(conf, "enable.auto.commit", "false");
        /* As Spillway's classic source sets it (kafka/src/classic.rs): with librdkafka's
         * 1 s default, a drain that empties a full prefetch queue waits out the rest of the
         * second, for both contenders alike. */
        set(conf, "fetch.queue.backoff.ms", "100");
        set(conf, "log_level", "3");
        rd_kafka_t *consumer = rd_kafka_new(KIND_CONSUMER, conf, errstr, sizeof(errstr));
        if (!consumer) {
                fprintf(stderr, "consumer: %s\n", errstr);
                return 1;
        }
        rd_kafka_poll_set_consumer(consumer);
        rd_kafka_t *producer = NULL;
        if (dest) {
                conf = rd_kafka_conf_new();
                set(conf, "bootstrap.servers", dest_bootstrap ? dest_bootstrap : bootstrap);
                set(conf, "enable.idempotence", "true");
                set(conf, "acks", "all");
                set(conf, "linger.ms", "5");
                set(conf, "log_level", "3");
                rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
                producer = rd_kafka_new(KIND_PRODUCER, conf, errstr, sizeof(errstr));
                if (!producer) {
                        fprintf(stderr, "producer: %s\n", errstr);
                        return 1;
                }
        }
        rd_kafka_topic_partition_list_t *topics = topic_list(topic);
        int err = rd_kafka_subscribe(consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (err) {
                fprintf(stderr, "subscribe: %s\n", rd_kafka_err2str(err));
                return 1;
        }
        double first = 0, cpu_first = 0, last = now_seconds();
        long received = 0, since_commit = 0, received_at_last = 0;
        while (received < want) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(consumer, 200);
                if (!m) {
                        /* The clock is read here, not per record: reading it per record
                         * is the harness's work, not the drain's, and it was charged to the
                         * reference. For the idle exit, `last` is the first empty poll after
                         * the last record, at most 200 ms late; the report's end is read
                         * after the loop. */
                        if (first > 0) {
                                double now = now_seconds();
                                if (received != received_at_last) {
                                        received_at_last = received;
                                        last = now;
                                } else if (now - last > idle) {
                                        break;
                                }
                        }
                        continue;
                }
                if (m->err) {
                        /* Partition EOF and transient errors: not records. */
                        rd_kafka_message_destroy(m);
                        continue;
                }
                if (first == 0) {
                        first = now_seconds();
                        cpu_first = cpu_seconds();
                }
                if (producer) {
                        /* A copy carries the record's headers, as a replicator's must (the
                         * mirror copies them). librdkafka parses a record's header block
                         * on this first request for it, even when it holds none. The
                         * producer owns the list once it accepted the copy. */
                        rd_kafka_headers_t *headers = NULL;
                        if (rd_kafka_message_detach_headers(m, &headers) != 0)
                                headers = NULL;
                        for (;;) {
                                err = rd_kafka_producev(
                                    producer, V_TOPIC, dest, V_PARTITION, m->partition,
                                    V_KEY, m->key, m->key_len, V_VALUE, m->payload, m->len,
                                    V_TIMESTAMP, rd_kafka_message_timestamp(m, NULL),
                                    V_HEADERS, headers, V_MSGFLAGS, MSG_F_COPY, V_END);
                                if (err != ERR_QUEUE_FULL)
                                        break;
                                rd_kafka_poll(producer, 10);
                        }
                        if (err) {
                                if (headers)
                                        rd_kafka_headers_destroy(headers);
                                fprintf(stderr, "produce: %s\n", rd_kafka_err2str(err));
                                return 1;
                        }
                        undelivered++;
                        rd_kafka_poll(producer, 0);
                }
                rd_kafka_message_destroy(m);
                received++;
                if (++since_commit >= 500) {
                        /* At least once: the copies are delivered before their source's offsets
                         * are committed. */
                        if (producer)
                                rd_kafka_flush(producer, 30000);
                        rd_kafka_commit(consumer, NULL, 1);
                        since_commit = 0;
                }
        }
        if (producer) {
                rd_kafka_flush(producer, 60000);
                if (undelivered != 0 || delivery_failures != 0) {
                        fprintf(stderr, "%ld copies undelivered, %ld failed\n", undelivered,
                                delivery_failures);
                        return 1;
                }
        }
        rd_kafka_commit(consumer, NULL, 0);
        last = now_seconds();
        report(received, first, last, cpu_start, cpu_first);
        rd_kafka_consumer_close(consumer);
        rd_kafka_destroy(consumer);
        if (producer)
                rd_kafka_destroy(producer);
        return 0;
}

int main(int argc, char **argv) {
        if (argc >= 7 && strcmp(argv[1], "share") == 0 && argc == 8)
                return share_drain(argv[2], argv[3], argv[4], atol(argv[5]), atol(argv[6]) / 1e3,
                                   argv[7]);
        if (argc == 7 && strcmp(argv[1], "classic") == 0)
                return classic_drain(argv[2], argv[3], argv[4], atol(argv[5]),
                                     atol(argv[6]) / 1e3, NULL, NULL);
        if ((argc == 8 || argc == 9) && strcmp(argv[1], "copy") == 0)
                return classic_drain(argv[2], argv[3], argv[4], atol(argv[5]),
                                     atol(argv[6]) / 1e3, argv[7], argc == 9 ? argv[8] : NULL);
        fprintf(stderr,
                "usage: %s share BOOTSTRAP GROUP TOPIC RECORDS IDLE_MS MAX_POLL_RECORDS\n"
                "       %s classic BOOTSTRAP GROUP TOPIC RECORDS IDLE_MS\n"
                "       %s copy BOOTSTRAP GROUP TOPIC RECORDS IDLE_MS DEST_TOPIC [DEST_BOOTSTRAP]\n",
                argv[0], argv[0], argv[0]);
        return 2;
}
