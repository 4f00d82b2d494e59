/*
 * bench_kafka - the broker side of the end-to-end benchmarks (bench/run.py).
 *
 *   bench_kafka produce BOOTSTRAP TOPIC COUNT SIZE KEYS
 *       The broker's limit: sends COUNT records of SIZE bytes over KEYS keys
 *       as fast as the producer allows, with outboxd's producer settings
 *       (idempotence, acks=all, linger.ms=0, murmur2_random, no message
 *       timeout), and
 *       prints "events_per_s=... seconds=..." once every record is
 *       acknowledged.
 *   bench_kafka rate BOOTSTRAP TOPIC RATE SECONDS SIZE
 *       An open-loop generator straight to the broker (the latency floor), a
 *       bare producer: librdkafka's defaults except acks=all, idempotence and
 *       linger.ms=0.  RATE records per second for SECONDS, each with a header "sent_us"
 *       (wall-clock microseconds at the produce call).
 *   bench_kafka latency BOOTSTRAP TOPIC SECONDS HEADER [PROGRESS_TOPIC]
 *       Consumes TOPIC from its end for SECONDS and prints, per record, the
 *       time from HEADER ("sent_us", or "commit_ts" as outboxd writes it) to
 *       receipt: "count=... p50_ms=... p90_ms=... p99_ms=... max_ms=...".
 *       Prints "ready" once it is assigned and positioned at the end; with
 *       OBX_BENCH_TRACE set, one line per record on stderr; with
 *       OBX_BENCH_SAMPLES=FILE, every latency (microseconds) into FILE.  With
 *       PROGRESS_TOPIC (outboxd's exactly-once mode) a record counts when the
 *       progress record of its Kafka transaction (the same txn header)
 *       arrives, when a read_committed consumer could first see it on a broker
 *       with transactions (the test broker has none: it hands the records out
 *       at once).
 *   bench_kafka topic BOOTSTRAP TOPIC PARTITIONS
 *       Creates TOPIC (replication 1, max.message.bytes 16 MiB: shape d's
 *       records are 1 MiB, over a broker's default) with the admin API and
 *       waits until every partition has a leader: a real broker's topics (the
 *       test broker's "topic" command does it there, without a size limit).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

static int64_t
wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static double
mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
die(const char *what, const char *reason)
{
	fprintf(stderr, "bench_kafka: %s: %s\n", what, reason);
	exit(1);
}

static void
set(rd_kafka_conf_t *c, const char *k, const char *v)
{
	char err[256];

	if (rd_kafka_conf_set(c, k, v, err, sizeof(err)) != RD_KAFKA_CONF_OK)
		die(k, err);
}

static long delivered, failed;

static void
on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void)rk;
	(void)opaque;
	if (m->err)
		failed++;
	else
		delivered++;
}

/*
 * bare: what a careful user writes to send one event, librdkafka's defaults
 * except acks=all, idempotence and linger.ms=0 (the latency floor).
 * Otherwise outboxd's own producer settings (src/kafka/producer.c), for the broker's
 * limit on the same records.
 */
static rd_kafka_t *
producer(const char *bootstrap, int bare)
{
	rd_kafka_conf_t *c = rd_kafka_conf_new();
	char err[256];
	rd_kafka_t *rk;

	set(c, "bootstrap.servers", bootstrap);
	set(c, "enable.idempotence", "true");
	set(c, "acks", "all");
	set(c, "linger.ms", "0");
	if (!bare) {
		set(c, "partitioner", "murmur2_random");
		set(c, "message.timeout.ms", "0");
		set(c, "queue.buffering.max.messages", "1000000");
	}
	if (getenv("BENCH_MESSAGE_MAX_BYTES") != NULL) /* records above the 1 MB default */
		set(c, "message.max.bytes", getenv("BENCH_MESSAGE_MAX_BYTES"));
	set(c, "log_level", "3");
	rd_kafka_conf_set_dr_msg_cb(c, on_dr);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof(err));
	if (rk == NULL)
		die("producer", err);
	return rk;
}

static char *
payload(size_t size)
{
	char *p = malloc(size + 1);

	/* incompressible enough: the producer does not compress by default anyway */
	for (size_t i = 0; i < size; i++)
		p[i] = "0123456789abcdef"[(i * 2654435761u >> 7) & 15];
	p[size] = '\0';
	return p;
}

static void
produce_one(rd_kafka_t *rk, const char *topic, const char *key, const char *value, size_t len, const char *hname,
    const char *hval)
{
	rd_kafka_resp_err_t e;

	for (;;) {
		if (hname != NULL)
			e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
			    RD_KAFKA_V_VALUE((void *)value, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
			    RD_KAFKA_V_HEADER(hname, hval, (ssize_t)strlen(hval)), RD_KAFKA_V_END);
		else
			e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
			    RD_KAFKA_V_VALUE((void *)value, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
			    RD_KAFKA_V_END);
		if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		rd_kafka_poll(rk, 10);
	}
	if (e)
		die("produce", rd_kafka_err2str(e));
}

static int
cmd_produce(const char *bootstrap, const char *topic, long count, size_t size, long keys)
{
	rd_kafka_t *rk = producer(bootstrap, 0);
	char *value = payload(size), key[32];
	double t0;

	/* connect and learn the topic's leaders before the clock starts */
	produce_one(rk, topic, "warm", value, size, NULL, NULL);
	while (delivered + failed < 1)
		rd_kafka_poll(rk, 10);
	delivered = 0;
	t0 = mono_s();
	for (long i = 0; i < count; i++) {
		snprintf(key, sizeof(key), "agg-%ld", i % keys);
		produce_one(rk, topic, key, value, size, NULL, NULL);
		rd_kafka_poll(rk, 0);
	}
	while (delivered + failed < count)
		rd_kafka_poll(rk, 10);
	printf("events_per_s=%.1f seconds=%.3f failed=%ld\n", (double)count / (mono_s() - t0), mono_s() - t0,
	    failed);
	rd_kafka_destroy(rk);
	free(value);
	return failed != 0;
}

static int
cmd_rate(const char *bootstrap, const char *topic, double rate, double seconds, size_t size)
{
	rd_kafka_t *rk = producer(bootstrap, 1);
	char *value = payload(size), key[32], sent[32];
	double t0;
	long i = 0;

	produce_one(rk, topic, "warm", value, size, "sent_us", "0");
	while (delivered + failed < 1)
		rd_kafka_poll(rk, 10);
	t0 = mono_s();
	for (;;) {
		double now = mono_s() - t0;
		long due = (long)(now * rate);

		if (now >= seconds)
			break;
		for (; i < due; i++) {
			snprintf(key, sizeof(key), "agg-%ld", i % 1000);
			snprintf(sent, sizeof(sent), "%" PRId64, wall_us());
			produce_one(rk, topic, key, value, size, "sent_us", sent);
		}
		rd_kafka_poll(rk, 0);
		usleep(200); /* open loop: the schedule, not the acks, sets the pace */
	}
	rd_kafka_flush(rk, 30000);
	printf("sent=%ld rate=%.1f\n", i, (double)i / seconds);
	rd_kafka_destroy(rk);
	free(value);
	return 0;
}

/* "2026-11-30T11:42:00.123456Z" -> Unix microseconds (UTC) */
static int64_t
iso_us(const char *s, size_t len)
{
	struct tm tm = { 0 };
	char buf[64];
	long frac = 0;

	if (len >= sizeof(buf))
		return 0;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (sscanf(buf, "%4d-%2d-%2dT%2d:%2d:%2d.%6ldZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
	        &tm.tm_min, &tm.tm_sec, &frac) != 7)
		return 0;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (int64_t)timegm(&tm) * 1000000 + frac;
}

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

/* Adds every partition of topic (waiting up to 10 s for it to exist) at its end to parts. */
static void
add_partitions_at_end(rd_kafka_t *rk, rd_kafka_topic_partition_list_t *parts, const char *topic)
{
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);

	for (int tries = 0; rd_kafka_metadata(rk, 0, rkt, &md, 5000) != 0 || md->topics[0].err ||
	     md->topics[0].partition_cnt == 0;
	     tries++) {
		if (md != NULL)
			rd_kafka_metadata_destroy(md);
		md = NULL;
		if (tries > 50)
			die(topic, "topic does not exist");
		usleep(200000);
	}
	for (int i = 0; i < md->topics[0].partition_cnt; i++)
		rd_kafka_topic_partition_list_add(parts, topic, i)->offset = RD_KAFKA_OFFSET_END;
	rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
}

/* A record read before its Kafka transaction's progress record: visible to read_committed later. */
struct held {
	char txn[96];
	int64_t at;
};

static int
cmd_latency(const char *bootstrap, const char *topic, double seconds, const char *header, const char *progress)
{
	struct held *held = NULL;
	size_t nheld = 0, heldcap = 0;
	rd_kafka_conf_t *c = rd_kafka_conf_new();
	rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(64);
	rd_kafka_t *rk;
	char err[256];
	int64_t *lat = NULL;
	size_t n = 0, cap = 0;
	double t0, first = 0, last = 0;
	int trace = getenv("OBX_BENCH_TRACE") != NULL; /* per record: time, latency, partition, offset */

	set(c, "bootstrap.servers", bootstrap);
	set(c, "group.id", "bench-latency");
	set(c, "enable.auto.commit", "false");
	set(c, "fetch.wait.max.ms", "5"); /* the consumer must not add its own wait */
	set(c, "fetch.min.bytes", "1");
	set(c, "log_level", "3");
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof(err));
	if (rk == NULL)
		die("consumer", err);
	add_partitions_at_end(rk, parts, topic);
	if (progress != NULL)
		add_partitions_at_end(rk, parts, progress); /* exactly-once: records count when it arrives */
	rd_kafka_assign(rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	/* positioned once a poll round has fetched the end offsets */
	for (double w = mono_s(); mono_s() - w < 1.0;) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 50);

		if (m != NULL)
			rd_kafka_message_destroy(m);
	}
	printf("ready\n");
	fflush(stdout);
	t0 = mono_s();
	while (mono_s() - t0 < seconds) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 50);
		int64_t now = wall_us(), at = 0;
		rd_kafka_headers_t *h = NULL;
		const void *v;
		size_t sz;

		if (m == NULL)
			continue;
		if (progress != NULL && m->err == 0 && strcmp(rd_kafka_topic_name(m->rkt), progress) == 0) {
			/* every held record of this transaction becomes visible now */
			if (rd_kafka_message_headers(m, &h) == 0 &&
			    rd_kafka_header_get_last(h, "txn", &v, &sz) == 0 && v != NULL) {
				for (size_t i = 0; i < nheld;) {
					if (strlen(held[i].txn) == sz && memcmp(held[i].txn, v, sz) == 0) {
						if (n == cap) {
							cap = cap ? cap * 2 : 4096;
							lat = realloc(lat, cap * sizeof(*lat));
						}
						lat[n++] = now - held[i].at;
						if (first == 0)
							first = mono_s();
						last = mono_s();
						held[i] = held[--nheld];
					} else {
						i++;
					}
				}
			}
			rd_kafka_message_destroy(m);
			continue;
		}
		if (m->err == 0 && rd_kafka_message_headers(m, &h) == 0 &&
		    rd_kafka_header_get_last(h, header, &v, &sz) == 0 && v != NULL) {
			at = strcmp(header, "sent_us") == 0 ? strtoll(v, NULL, 10) : iso_us(v, sz);
			if (at > 0 && progress != NULL) {
				const void *tv;
				size_t tsz;

				if (rd_kafka_header_get_last(h, "txn", &tv, &tsz) == 0 && tv != NULL &&
				    tsz < sizeof(held[0].txn)) {
					if (nheld == heldcap) {
						heldcap = heldcap ? heldcap * 2 : 1024;
						held = realloc(held, heldcap * sizeof(*held));
					}
					memcpy(held[nheld].txn, tv, tsz);
					held[nheld].txn[tsz] = '\0';
					held[nheld++].at = at;
				}
				at = 0;
			}
			if (at > 0) {
				if (n == cap) {
					cap = cap ? cap * 2 : 4096;
					lat = realloc(lat, cap * sizeof(*lat));
				}
				lat[n++] = now - at;
				if (trace)
					fprintf(stderr, "%.3f %.3f %d %" PRId64 "\n", mono_s() - t0,
					    (double)(now - at) / 1e3, (int)m->partition, m->offset);
				if (first == 0)
					first = mono_s();
				last = mono_s();
			}
		}
		rd_kafka_message_destroy(m);
	}
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	if (n == 0) {
		printf("count=0\n");
		return 1;
	}
	qsort(lat, n, sizeof(*lat), cmp_i64);
	if (getenv("OBX_BENCH_SAMPLES") != NULL) {
		/* every latency in microseconds, one per line: bench/run.py combines distributions */
		FILE *f = fopen(getenv("OBX_BENCH_SAMPLES"), "w");

		if (f == NULL)
			die("samples file", strerror(errno));
		for (size_t i = 0; i < n; i++)
			fprintf(f, "%" PRId64 "\n", lat[i]);
		if (fclose(f) != 0)
			die("samples file", strerror(errno));
	}
	printf("count=%zu rate=%.1f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f\n", n,
	    last > first ? (double)n / (last - first) : 0.0, lat[n / 2] / 1e3, lat[n * 9 / 10] / 1e3,
	    lat[n * 99 / 100] / 1e3, lat[n - 1] / 1e3);
	free(lat);
	free(held);
	return 0;
}

static int
cmd_topic(const char *bootstrap, const char *topic, int partitions)
{
	char err[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_NewTopic_t *nt;
	rd_kafka_queue_t *q;
	rd_kafka_event_t *ev;
	const rd_kafka_topic_result_t **res;
	size_t nres;

	if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof(err)) != RD_KAFKA_CONF_OK)
		die("bootstrap.servers", err);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		die("admin client", err);
	nt = rd_kafka_NewTopic_new(topic, partitions, 1, err, sizeof(err));
	if (nt == NULL)
		die("NewTopic", err);
	if (rd_kafka_NewTopic_set_config(nt, "max.message.bytes", "16777216") != RD_KAFKA_RESP_ERR_NO_ERROR)
		die("NewTopic", "max.message.bytes");
	q = rd_kafka_queue_new(rk);
	rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
	ev = rd_kafka_queue_poll(q, 30000);
	if (ev == NULL)
		die("CreateTopics", "no answer in 30 s");
	if (rd_kafka_event_error(ev) != RD_KAFKA_RESP_ERR_NO_ERROR)
		die("CreateTopics", rd_kafka_event_error_string(ev));
	res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &nres);
	for (size_t i = 0; i < nres; i++)
		if (rd_kafka_topic_result_error(res[i]) != RD_KAFKA_RESP_ERR_NO_ERROR &&
		    rd_kafka_topic_result_error(res[i]) != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
			die("CreateTopics", rd_kafka_topic_result_error_string(res[i]));
	rd_kafka_event_destroy(ev);
	rd_kafka_NewTopic_destroy(nt);
	rd_kafka_queue_destroy(q);
	/* right after CreateTopics a partition can lack a leader for a moment */
	for (double until = mono_s() + 30;;) {
		const struct rd_kafka_metadata *md = NULL;
		rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
		int ready = 0;

		if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
		    md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topics[0].partition_cnt == partitions) {
			ready = 1;
			for (int i = 0; i < partitions; i++)
				if (md->topics[0].partitions[i].leader < 0)
					ready = 0;
		}
		if (md != NULL)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
		if (ready)
			break;
		if (mono_s() > until)
			die(topic, "no leader for every partition 30 s after its creation");
		usleep(100000);
	}
	rd_kafka_destroy(rk);
	return 0;
}

int
main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "topic") == 0)
		return cmd_topic(argv[2], argv[3], atoi(argv[4]));
	if (argc == 7 && strcmp(argv[1], "produce") == 0)
		return cmd_produce(argv[2], argv[3], atol(argv[4]), (size_t)atol(argv[5]), atol(argv[6]));
	if (argc == 7 && strcmp(argv[1], "rate") == 0)
		return cmd_rate(argv[2], argv[3], atof(argv[4]), atof(argv[5]), (size_t)atol(argv[6]));
	if ((argc == 6 || argc == 7) && strcmp(argv[1], "latency") == 0)
		return cmd_latency(argv[2], argv[3], atof(argv[4]), argv[5], argc == 7 ? argv[6] : NULL);
	fprintf(stderr,
	    "usage: bench_kafka produce BOOTSTRAP TOPIC COUNT SIZE KEYS\n"
	    "       bench_kafka rate BOOTSTRAP TOPIC RATE SECONDS SIZE\n"
	    "       bench_kafka latency BOOTSTRAP TOPIC SECONDS HEADER [PROGRESS_TOPIC]\n"
	    "       bench_kafka topic BOOTSTRAP TOPIC PARTITIONS\n");
	return 2;
}
