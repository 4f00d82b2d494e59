/*
 * Restart de-duplication against the real stack (docs/internals/design.md,
 * "Restart de-duplication"): every event of a transaction acknowledged but
 * not confirmed is found after a restart and skipped; and the fallbacks: a
 * record of another writer at the end of a partition, a partition count
 * changed between runs and a read-back that times out all make outboxd
 * publish (at-least-once), with one line naming what it met, and lose
 * nothing.  The crash loop is t2100_crash_loop.c.
 *
 * OBX_TEST_KILL_AFTER_ACKS (a test-build hook) makes outboxd kill itself
 * right after N acknowledgements, before a status update can confirm them.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	t_relay_teardown(&R);
	return 0;
}

/* ---- helpers ---- */

static rd_kafka_t *
producer(void)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char err[512];
	rd_kafka_t *rk;

	rd_kafka_conf_set(conf, "bootstrap.servers", R.b.bootstrap, err, sizeof(err));
	rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		fail_msg("producer: %s", err);
	return rk;
}

static void
produce_to(rd_kafka_t *rk, const char *topic, int32_t partition, const char *key, const char *value,
    const struct t_header *hs, size_t nh)
{
	rd_kafka_headers_t *h = rd_kafka_headers_new(nh + 1);

	for (size_t i = 0; i < nh; i++)
		rd_kafka_header_add(h, hs[i].name, -1, hs[i].value, hs[i].value ? -1 : 0);
	if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
	        RD_KAFKA_V_KEY(key, key ? strlen(key) : 0),
	        RD_KAFKA_V_VALUE((void *)value, value ? strlen(value) : 0),
	        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END) != 0)
		fail_msg("could not produce to %s [%d]", topic, partition);
}

static void
producer_done(rd_kafka_t *rk)
{
	if (rd_kafka_flush(rk, 15000) != 0)
		fail_msg("test producer could not flush");
	rd_kafka_destroy(rk);
}

/*
 * Every event of one transaction acknowledged, none confirmed (the hook),
 * then a restart: all of them are found and skipped, and the skip counts as
 * the acknowledgement that lets the slot move on.
 */
static void
test_restart_after_acks_skips_all(void **state)
{
	struct t_msg *m;
	size_t n;
	uint64_t confirmed;
	PGresult *res;

	(void)state;
	t_relay_setup(&R, "ddacks", 0);
	t_relay_config(&R, NULL);
	t_run_until_killed_after_acks(&R, 300, "ddacks", 40);
	confirmed = t_slot_confirmed(&R);
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 20000));
	assert_true(t_slot_confirmed(&R) > confirmed);
	assert_int_equal((int)t_relay_metric(&R, "outboxd_dedupe_skipped_total"), 300);
	assert_int_equal((int)t_relay_metric(&R, "outboxd_events_published_total"), 0);
	assert_int_equal(t_log_count(&R, "300 event(s) of topic outbox.event.ddacks were in Kafka already"), 1);
	n = t_consume_all(R.b.bootstrap, "outbox.event.ddacks", 20000, &m);
	assert_int_equal(n, 300);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++)
		assert_int_equal(t_count_id(m, n, PQgetvalue(res, i, 0)), 1);
	PQclear(res);
	t_msgs_free(m, n);
}

/*
 * A record without outboxd's headers at the end of one partition: that
 * partition is published again (at-least-once), named in one line; the
 * others are de-duplicated; nothing is lost.
 */
static void
test_foreign_record_falls_back(void **state)
{
	struct t_msg *m;
	size_t n, again = 0, once = 0;
	int32_t part;
	PGresult *res;
	rd_kafka_t *rk;
	char line[256];

	(void)state;
	t_relay_setup(&R, "ddforeign", 0);
	t_relay_config(&R, NULL);
	t_run_until_killed_after_acks(&R, 200, "ddforeign", 40);
	part = rd_kafka_msg_partitioner_murmur2(NULL, "k0", 2, 4, NULL, NULL);
	rk = producer();
	produce_to(rk, "outbox.event.ddforeign", part, "k0", "not from outboxd", NULL, 0);
	producer_done(rk);

	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 20000));
	snprintf(line, sizeof(line),
	    "de-duplication: topic outbox.event.ddforeign partition %d: the record at "
	    "offset",
	    part);
	assert_int_equal(t_log_count(&R, line), 1);
	assert_int_equal(t_log_count(&R,
	                     "has no lsn and seq headers of outboxd (another writer); publishing "
	                     "its events from the slot's position (at-least-once)"),
	    1);
	assert_int_equal((int)t_relay_metric(&R, "outboxd_dedupe_fallbacks_total"), 1);
	n = t_consume_all(R.b.bootstrap, "outbox.event.ddforeign", 20000, &m);
	res = PQexec(R.pg, "SELECT id::text, aggregateid FROM outbox");
	assert_int_equal(PQntuples(res), 200);
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = t_count_id(m, n, PQgetvalue(res, i, 0));
		const char *key = PQgetvalue(res, i, 1);
		bool in_part = rd_kafka_msg_partitioner_murmur2(NULL, key, strlen(key), 4, NULL, NULL) == part;

		assert_int_equal(c, in_part ? 2 : 1); /* nothing lost; only that partition again */
		if (in_part)
			again++;
		else
			once++;
	}
	PQclear(res);
	assert_true(again > 0 && once > 0);
	assert_int_equal((int)t_relay_metric(&R, "outboxd_dedupe_skipped_total"), (int)once);
	assert_int_equal(n, 200 + again + 1);
	t_msgs_free(m, n);
}

/*
 * The partition count changed between runs: the records already there were
 * placed among 4 partitions, the topic now has 8.  Detected (a key that
 * maps elsewhere), named in one line, everything published, nothing lost.
 * The test broker cannot add partitions to a topic, so the first run
 * writes to old.ddpc (4 partitions), the records are copied partition for
 * partition into new.ddpc (created with 8), and the second run's topic
 * template names new.ddpc.
 */
static void
test_partition_count_change_detected(void **state)
{
	struct t_msg *m, *m2;
	size_t n, n2;
	rd_kafka_t *rk;
	PGresult *res;

	(void)state;
	t_relay_setup(&R, "ddpc", 0);
	t_relay_config(&R, "[outbox]\ntopic = old.${aggregatetype}\n");
	t_run_until_killed_after_acks(&R, 100, "ddpc", 30);
	n = t_consume_all(R.b.bootstrap, "old.ddpc", 20000, &m);
	assert_int_equal(n, 100);
	assert_int_equal(t_broker_cmd(&R.b, "topic new.ddpc 8"), 0);
	rk = producer();
	for (size_t i = 0; i < n; i++)
		produce_to(rk, "new.ddpc", m[i].partition, m[i].key, m[i].value, m[i].headers, m[i].nheaders);
	producer_done(rk);
	t_msgs_free(m, n);

	t_relay_config(&R, "[outbox]\ntopic = new.${aggregatetype}\n");
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 20000));
	assert_int_equal(t_log_count(&R, "de-duplication: topic new.ddpc: the record at offset"), 1);
	assert_int_equal(t_log_count(&R, "of today's 8: the partition count changed since it was written"), 1);
	assert_int_equal((int)t_relay_metric(&R, "outboxd_dedupe_skipped_total"), 0);
	n2 = t_consume_all(R.b.bootstrap, "new.ddpc", 20000, &m2);
	assert_int_equal(n2, 200);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++)
		assert_int_equal(t_count_id(m2, n2, PQgetvalue(res, i, 0)), 2);
	PQclear(res);
	t_msgs_free(m2, n2);
}

/*
 * A read-back that cannot finish (every broker answers after 6 s, the
 * budget is 5 s): one line, the events are published, nothing is lost,
 * and the replication connection lives on meanwhile (status updates flow).
 */
static void
test_read_back_timeout_publishes(void **state)
{
	struct t_msg *m;
	size_t n;
	PGresult *res;
	int64_t deadline;

	(void)state;
	t_relay_setup(&R, "ddslow", 0);
	t_relay_config(&R, NULL);
	t_run_until_killed_after_acks(&R, 50, "ddslow", 10);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 6000", b), 0);
	t_relay_start(&R, NULL, 1);
	for (deadline = t_now_ms() + 30000; t_log_count(&R, "(at-least-once)") == 0;) {
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("no fallback line");
		}
		usleep(100000);
	}
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);
	assert_true(t_wait_confirmed_current(&R, 60000));
	assert_int_equal(t_log_count(&R,
	                     "de-duplication: topic outbox.event.ddslow: could not read its "
	                     "metadata"),
	    1);
	assert_int_equal(t_log_count(&R, "streaming from slot"), 2); /* the hooked run and this one */
	n = t_consume_all(R.b.bootstrap, "outbox.event.ddslow", 20000, &m);
	assert_int_equal(n, 100);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++)
		assert_int_equal(t_count_id(m, n, PQgetvalue(res, i, 0)), 2);
	PQclear(res);
	t_msgs_free(m, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_restart_after_acks_skips_all, teardown),
		cmocka_unit_test_teardown(test_foreign_record_falls_back, teardown),
		cmocka_unit_test_teardown(test_partition_count_change_detected, teardown),
		cmocka_unit_test_teardown(test_read_back_timeout_publishes, teardown),
	};

	return T_RUN_TESTS(tests); /* OBX_TEST_FILTER=a,b* runs the matching cases only */
}
