/*
 * The delivery policy against the real stack (docs/internals/design.md,
 * "Delivery policy"): poison events under on_error = stop | dead_letter (a
 * row that cannot become an event, a NULL key, a reserved header name, a
 * topic the broker refuses), a topic the cluster does not have waited for,
 * and backpressure: the in-flight caps pause reading, and a long broker
 * outage stays within a memory bound.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

/*
 * The JSON line of R's log whose msg holds needle, parsed (the caller
 * frees it with json_decref()); fails when there is none.
 */
static json_t *
json_line(const char *needle)
{
	char line[8192];
	FILE *fp = fopen(R.log, "r");
	json_t *found = NULL;

	assert_non_null(fp);
	while (found == NULL && fgets(line, sizeof(line), fp) != NULL) {
		json_t *o = json_loads(line, 0, NULL);
		const char *msg = json_string_value(json_object_get(o, "msg"));

		if (msg != NULL && strstr(msg, needle) != NULL)
			found = o;
		else
			json_decref(o);
	}
	fclose(fp);
	if (found == NULL) {
		t_log_dump(&R);
		fail_msg("no JSON line with \"%s\"", needle);
	}
	return found;
}

static const char *
member(json_t *o, const char *key)
{
	const char *v = json_string_value(json_object_get(o, key));

	if (v == NULL)
		fail_msg("the line has no string member %s", key);
	return v;
}

static void
test_poison_stop_then_dead_letter(void **state)
{
	struct t_msg *m;
	size_t n;
	char *big, *after, *lsn_big;
	int st;

	(void)state;
	t_relay_setup(&R, "poison", 0);
	/* the producer's own size limit: the test broker has none */
	t_relay_config(&R, "[kafka]\nmessage.max.bytes = 2000\n");
	t_relay_start(&R, NULL, 1);
	lsn_big = t_exec_commit_bound(R.pg, &big,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p1', 'Big', jsonb_build_object('blob', repeat('x', 5000))) RETURNING id");
	after = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p1', 'After', '{}') RETURNING id");
	st = t_wait(R.pid, 20000);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	R.pid = 0;
	{
		char needle[128];

		snprintf(needle, sizeof(needle), "event id=%s at lsn", big);
		assert_int_equal(t_log_count(&R, needle), 1);
	}
	t_slot_wait_inactive(&R, 10000);
	assert_true(t_slot_confirmed(&R) <= t_lsn(lsn_big)); /* nothing past it confirmed */

	/* dead_letter: the row goes to the dead-letter topic, the next event flows; in JSON its
	 * line names the event, its topic, lsn and xid, and every line the slot */
	t_relay_config(&R,
	    "[kafka]\nmessage.max.bytes = 2000\n[delivery]\non_error = dead_letter\n"
	    "[log]\nformat = json\n");
	unlink(R.log);
	t_relay_start(&R, NULL, 1);
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "id"), big);
	assert_non_null(t_msg_header(&m[0], "error"));
	assert_string_equal(t_msg_header(&m[0], "original_topic"), "outbox.event.poison");
	t_msgs_free(m, n);
	n = t_consume(R.b.bootstrap, "outbox.event.poison", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "id"), after);
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 10000));
	{
		json_t *o = json_line("dead-lettering it to outbox.dead_letter");
		json_t *xid = json_object_get(o, "xid");
		uint64_t at;

		assert_string_equal(member(o, "event_id"), big);
		assert_string_equal(member(o, "topic"), "outbox.event.poison");
		at = t_lsn(member(o, "lsn"));
		assert_true(at >= t_lsn(lsn_big)); /* the commit record starts where the insert position was */
		assert_true(json_is_integer(xid) && json_integer_value(xid) > 0);
		assert_string_equal(member(o, "slot"), R.slot);
		assert_string_equal(member(o, "mode"), "logical");
		json_decref(o);
		o = json_line("streaming from slot");
		assert_string_equal(member(o, "slot"), R.slot);
		assert_true(t_lsn(member(o, "lsn")) > 0);
		json_decref(o);
	}
	free(big);
	free(after);
	free(lsn_big);
}

static void
test_topic_error_dead_letter(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "topicerr", 0);
	/*
	 * librdkafka 2.0.2 waits out a topic error in metadata (the mock's
	 * topic-error) until message.timeout.ms, so the broker rejects the
	 * Produce request itself, as a real broker does for an ACL denial.
	 */
	assert_int_equal(t_broker_cmd(&R.b, "produce-errors 1 TOPIC_AUTHORIZATION_FAILED"), 0);
	t_relay_config(&R, "[delivery]\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('denied', 'd1', 'X', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 60000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "original_topic"), "outbox.event.denied");
	assert_non_null(strstr(t_msg_header(&m[0], "error"), "uthoriz"));
	t_msgs_free(m, n);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('fine', 'f1', 'Y', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.fine", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
}

static void
test_backpressure(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "bp", 0);
	t_relay_config(&R, "[delivery]\nmax_inflight = 5\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('bp', 'w', 'W', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.bp", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	for (int i = 0; i < 40; i++)
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('bp', 'k%d', 'B', '{}')",
		    i % 3);
	sleep(2);
	assert_int_equal(t_log_count(&R, "pausing the replication stream"), 1);
	assert_int_equal(t_log_count(&R, "backpressure: 5 event(s)"), 1);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	n = t_consume(R.b.bootstrap, "outbox.event.bp", 41, 60000, &m);
	assert_int_equal(n, 41);
	t_msgs_free(m, n);
	assert_true(t_log_count(&R, "resuming the replication stream") >= 1);
}

/* A row with a NULL key: stop names LSN, xid and column; dead_letter keeps the whole row. */
static void
test_null_key_row(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "nullkey", 1);
	t_exec(R.pg,
	    "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text, "
	    "aggregateid text, type text, payload jsonb)");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('nk', NULL, 'T', '{\"x\": 1}')");
	st = t_wait(R.pid, 20000);
	R.pid = 0;
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(t_log_count(&R, "key column 'aggregateid' is NULL"), 1);
	assert_int_equal(t_log_count(&R, "(xid "), 1);
	t_slot_wait_inactive(&R, 10000);

	t_relay_config(&R, "[delivery]\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "error"), "key column 'aggregateid' is NULL");
	assert_non_null(strstr(m[0].value, "\"aggregateid\":null"));
	assert_non_null(strstr(m[0].value, "\"payload\":\"{\\\"x\\\": 1}\""));
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 10000));
}

/*
 * A row whose headers column holds "id", a header outboxd writes itself:
 * it cannot become an event (its id would shadow outboxd's, and two events
 * share one inbox key), so with on_error = dead_letter the row goes to the
 * dead-letter topic and the next event flows, with outboxd's own id.
 */
static void
test_reserved_header_row_dead_lettered(void **state)
{
	struct t_msg *m;
	char *id;
	size_t n;

	(void)state;
	t_relay_setup(&R, "reservedhdr", 1);
	t_exec(R.pg,
	    "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text, "
	    "aggregateid text, type text, payload jsonb, headers jsonb)");
	t_relay_config(&R, "[outbox]\nheaders = headers\n[delivery]\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) VALUES "
	    "('rh', 'k1', 'T', '{\"x\": 1}', '{\"id\": \"not-outboxd\", \"tenant\": \"t1\"}')");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) VALUES "
	    "('rh', 'k1', 'T', '{\"x\": 2}', '{\"tenant\": \"t1\"}')");
	id = t_query1(R.pg, "SELECT id FROM outbox WHERE payload = '{\"x\": 2}'");
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "error"),
	    "headers column 'headers' holds header 'id', a name "
	    "outboxd writes itself (reserved: id, type, lsn, seq, xid, commit_ts, txn, snapshot)");
	assert_non_null(strstr(m[0].value, "not-outboxd"));
	t_msgs_free(m, n);
	n = t_consume(R.b.bootstrap, "outbox.event.rh", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_non_null(strstr(m[0].value, "\"x\": 2"));
	assert_string_equal(t_msg_header(&m[0], "id"), id);
	t_msgs_free(m, n);
	free(id);
	assert_true(t_wait_confirmed_current(&R, 10000));
	assert_int_equal(t_log_count(&R, "holds header 'id'"), 1);
}

/*
 * A topic the cluster does not have yet (here hidden from metadata, as a
 * broker without auto-creation answers): waited for, not dead-lettered or
 * fatal, nothing confirmed past its event, said in the log and a metric;
 * published once it exists.  Past missing_topic_timeout, on_error applies.
 */
static void
test_missing_topic_waited_for(void **state)
{
	char body[1 << 16], *lsn;
	struct t_msg *m;
	size_t n;
	int64_t deadline;
	int port, st;

	(void)state;
	t_relay_setup(&R, "mtopic", 0);
	assert_int_equal(t_broker_cmd(&R.b, "topic outbox.event.late 2"), 0);
	assert_int_equal(t_broker_cmd(&R.b, "topic-error outbox.event.late UNKNOWN_TOPIC_OR_PART"), 0);
	t_relay_config(&R,
	    "[kafka]\ntopic.metadata.propagation.max.ms = 1000\n"
	    "[delivery]\nmissing_topic_timeout = 60s\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);
	lsn = t_exec_commit_bound(R.pg, NULL,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('late', 'l1', 'T', '{}')");
	deadline = t_now_ms() + 20000;
	while (t_log_count(&R, "topic outbox.event.late does not exist (yet)") == 0 && t_now_ms() < deadline)
		usleep(100000);
	if (t_log_count(&R, "topic outbox.event.late does not exist (yet)") == 0)
		t_log_dump(&R);
	assert_true(t_log_count(&R, "topic outbox.event.late does not exist (yet)") >= 1);
	usleep(3000000);
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_missing_topic_seconds{topic=\"outbox.event.late\"}") > 0);
	assert_true(t_slot_confirmed(&R) <= t_lsn(lsn));
	assert_int_equal(t_log_count(&R, "dead-lettering"), 0);
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */

	/* the topic appears */
	assert_int_equal(t_broker_cmd(&R.b, "topic-error outbox.event.late NO_ERROR"), 0);
	n = t_consume(R.b.bootstrap, "outbox.event.late", 1, 30000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(m[0].key, "l1");
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 20000));
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	free(lsn);

	/* missing for longer than the timeout: on_error = stop ends the run, naming it */
	assert_int_equal(t_broker_cmd(&R.b, "topic outbox.event.never 2"), 0);
	assert_int_equal(t_broker_cmd(&R.b, "topic-error outbox.event.never UNKNOWN_TOPIC_OR_PART"), 0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('never', 'n1', 'T', '{}')");
	t_relay_config(&R,
	    "[kafka]\ntopic.metadata.propagation.max.ms = 1000\n"
	    "[delivery]\nmissing_topic_timeout = 3s\n");
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 40000);
	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1)
		t_log_dump(&R);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(t_log_count(&R, "rejected by the broker for topic outbox.event.never"), 1);
}

static void
test_long_broker_outage_memory_bound(void **state)
{
	const long bound_kb = 64 * 1024;
	long hwm;
	int64_t t0;
	int i = 0;

	(void)state;
	t_relay_setup(&R, "outage", 0);
	R.bin = getenv("OBX_OUTBOXD_PLAIN"); /* RSS of a build without sanitizers */
	assert_non_null(R.bin);
	t_relay_config(&R, "[delivery]\nmax_inflight = 1000\nmax_inflight_bytes = 1MiB\n");
	t_relay_start(&R, NULL, 1);
	t_insert_events(&R, "outage", 0, 1);
	t_expect_all_published(&R, "outage", 15000);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	/* longer than 3 x wal_sender_timeout (10 s), with ~4 KiB events: ~40 MiB of backlog */
	for (t0 = t_now_ms(); t_now_ms() - t0 < 32000; i += 100) {
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "SELECT 'outage', 'k' || (g %% 13), 'Big', jsonb_build_object('pad', "
		    "(SELECT string_agg(md5(random()::text || x), '') FROM generate_series(1, 128) x), 'g', g) "
		    "FROM generate_series(%d, %d) g",
		    i, i + 99);
		usleep(50000);
	}
	hwm = t_vm_hwm_kb(R.pid);
	print_message("peak RSS during the outage: %ld KiB (bound %ld KiB), %d events committed\n", hwm, bound_kb,
	    i);
	assert_true(hwm > 0 && hwm < bound_kb);
	assert_int_equal(t_log_count(&R, "retrying"), 0); /* the connection survived */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	/* drain: 4 partitions x 5 MiB of broker memory hold this topic's ~40 MiB only partly,
	 * so check the slot instead of reading every record back */
	assert_true(t_wait_confirmed_current(&R, 120000));
	hwm = t_vm_hwm_kb(R.pid);
	print_message("peak RSS after draining: %ld KiB\n", hwm);
	assert_true(hwm < bound_kb);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_poison_stop_then_dead_letter, teardown),
		cmocka_unit_test_teardown(test_topic_error_dead_letter, teardown),
		cmocka_unit_test_teardown(test_backpressure, teardown),
		cmocka_unit_test_teardown(test_null_key_row, teardown),
		cmocka_unit_test_teardown(test_reserved_header_row_dead_lettered, teardown),
		cmocka_unit_test_teardown(test_missing_topic_waited_for, teardown),
		cmocka_unit_test_teardown(test_long_broker_outage_memory_bound, teardown),
	};

	return T_RUN_TESTS(tests);
}
