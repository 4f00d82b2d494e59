/*
 * Start-up checks and policies: publication and slot guards, poison events
 * under on_error = stop | dead_letter (a reserved header name in the row among
 * them), backpressure, partitioned outboxes.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Runs outboxd with extra config; expects exit status 1 and needle in its log. */
static void
expect_refusal(const char *extra, const char *arg, const char *needle)
{
	int st;

	t_relay_config(&R, extra);
	unlink(R.log);
	t_relay_start(&R, arg, 0);
	st = t_wait(R.pid, 20000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || t_log_count(&R, needle) != 1) {
		t_log_dump(&R);
		fail_msg("expected exit 1 with \"%s\" (status %d)", needle, st);
	}
	R.pid = 0;
}

static void
test_publication_and_table_refusals(void **state)
{
	(void)state;
	t_relay_setup(&R, "refuse", 0);
	t_exec(R.pg, "CREATE TABLE other (id int)");

	expect_refusal("[source]\ncreate_publication = false\n", NULL,
	    "publication outboxd does not exist and create_publication = false");
	expect_refusal("[source]\ntable = public.nothere\n", NULL, "outbox table public.nothere does not exist");

	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE other");
	expect_refusal(NULL, NULL, "publication outboxd does not publish table public.outbox");
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'update, delete')");
	expect_refusal(NULL, NULL, "publication outboxd does not publish inserts");
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	if (t_pg_has(15, "publications with a row filter or a column list")) {
		t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WHERE (aggregatetype <> 'secret')");
		expect_refusal(NULL, NULL, "publication outboxd has a row filter on public.outbox");
		t_exec(R.pg, "DROP PUBLICATION outboxd");
		t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox (id, aggregateid, type, payload)");
		expect_refusal(NULL, NULL, "has a column list without the mapped column(s) aggregatetype");
		t_exec(R.pg, "DROP PUBLICATION outboxd");
	}
	/* no slot may have been created by any of the refused starts */
	{
		char *n = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);

		assert_string_equal(n, "0");
		free(n);
	}

	/* a partitioned outbox needs publish_via_partition_root */
	t_exec(R.pg, "DROP TABLE outbox");
	t_exec(R.pg, "CREATE TABLE outbox (id uuid DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, "
	    "aggregateid text NOT NULL, type text NOT NULL, payload jsonb) PARTITION BY HASH (aggregateid)");
	t_exec(R.pg, "CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)");
	t_exec(R.pg, "CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	expect_refusal(NULL, NULL, "is partitioned but publication outboxd lacks publish_via_partition_root = true");
}

static void
test_partitioned_outbox_created_publication(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "parts", 1);
	t_exec(R.pg, "CREATE TABLE outbox (id uuid DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, "
	    "aggregateid text NOT NULL, type text NOT NULL, payload jsonb) PARTITION BY HASH (aggregateid)");
	t_exec(R.pg, "CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)");
	t_exec(R.pg, "CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'part', 'k' || i, 'P', '{}' FROM generate_series(1, 10) i");
	n = t_consume(R.b.bootstrap, "outbox.event.part", 10, 15000, &m);
	assert_int_equal(n, 10);
	t_msgs_free(m, n);
}

static void
test_slot_guard(void **state)
{
	int st;

	(void)state;
	t_relay_setup(&R, "guard", 0);
	/* rows that exist before the slot cannot be published: say so */
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('g', 'old', 'O', '{}')");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "1 row(s) already in public.outbox will not be published"), 1);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);

	/* the slot vanishes (failover, drop, restore): refuse to recreate it silently */
	t_exec(R.pg, "SELECT pg_drop_replication_slot('%s')", R.slot);
	expect_refusal(NULL, NULL, "is missing but existed before");
	{
		char *n = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);

		assert_string_equal(n, "0");
		free(n);
	}
	/* an explicit --recreate-slot does it, with a warning naming the gap */
	unlink(R.log);
	t_relay_start(&R, "--recreate-slot", 1);
	assert_int_equal(t_log_count(&R, "recreated slot"), 1);

	/* ... once: the same slot lost again while that process runs is refused as usual */
	{
		int64_t deadline = t_now_ms() + 20000;
		char *dropped = NULL;

		while (t_now_ms() < deadline) {
			t_exec(R.pg, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
			    "WHERE slot_name = '%s' AND active_pid IS NOT NULL", R.slot);
			dropped = t_query1(R.pg, "SELECT count(pg_drop_replication_slot(slot_name)) FROM "
			    "pg_replication_slots WHERE slot_name = '%s' AND NOT active", R.slot);
			if (strcmp(dropped, "1") == 0)
				break;
			free(dropped);
			dropped = NULL;
			usleep(20000);
		}
		assert_non_null(dropped);
		free(dropped);
	}
	st = t_wait(R.pid, 20000);
	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1)
		t_log_dump(&R);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(t_log_count(&R, "is missing but existed before"), 1);
	assert_int_equal(t_log_count(&R, "recreated slot"), 1);
}

/*
 * A publication dropped and created again behind an existing slot is refused,
 * naming the recovery; a slot made outside outboxd, after its publication,
 * is adopted and recorded.
 */
static void
test_publication_recreated_behind_slot(void **state)
{
	struct t_msg *m;
	size_t n;
	char *gap;
	int st;

	(void)state;
	t_relay_setup(&R, "pubre", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	gap = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('pubre', 'gap', 'T', '{}')");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	/* the server cannot decode the gap without the publication (up to 17 it stops with an
	 * error, 18 warns and skips it): a stop naming the recovery, the gap not confirmed */
	expect_refusal(NULL, NULL, "the publication was dropped behind slot");
	assert_int_equal(t_log_count(&R, "retrying"), 0);
	if (t_slot_confirmed(&R) > t_lsn(gap)) {
		t_log_dump(&R);
		fail_msg("the slot was confirmed past the row written without the publication (at %s)", gap);
	}
	free(gap);
	/* the new publication had no record of the slot: written at start-up */
	assert_int_equal(t_log_count(&R, "(made outside outboxd?): recorded it"), 1);

	/* the recovery it names: drop the slot, start once with --recreate-slot */
	t_exec(R.pg, "SELECT pg_drop_replication_slot('%s')", R.slot);
	unlink(R.log);
	t_relay_start(&R, "--recreate-slot", 1);
	assert_int_equal(t_log_count(&R, "recreated slot"), 1);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('pubre', 'after', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.pubre", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(m[0].key, "after");
	t_msgs_free(m, n);
	{
		char *comment = t_query1(R.pg, "SELECT obj_description(oid, 'pg_publication') FROM pg_publication "
		    "WHERE pubname = 'outboxd'");

		assert_non_null(strstr(comment, "outboxd-slot"));
		free(comment);
	}
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
	lsn_big = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	big = t_query1(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p1', 'Big', jsonb_build_object('blob', repeat('x', 5000))) RETURNING id");
	after = t_query1(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
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
	t_relay_config(&R, "[kafka]\nmessage.max.bytes = 2000\n[delivery]\non_error = dead_letter\n"
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
		assert_true(at > t_lsn(lsn_big));
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
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('denied', 'd1', 'X', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 60000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "original_topic"), "outbox.event.denied");
	assert_non_null(strstr(t_msg_header(&m[0], "error"), "uthoriz"));
	t_msgs_free(m, n);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('fine', 'f1', 'Y', '{}')");
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
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('bp', 'w', 'W', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.bp", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	for (int i = 0; i < 40; i++)
		t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('bp', 'k%d', 'B', '{}')", i % 3);
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
	t_exec(R.pg, "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text, "
	    "aggregateid text, type text, payload jsonb)");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('nk', NULL, 'T', '{\"x\": 1}')");
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
	t_exec(R.pg, "CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text, "
	    "aggregateid text, type text, payload jsonb, headers jsonb)");
	t_relay_config(&R, "[outbox]\nheaders = headers\n[delivery]\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) VALUES "
	    "('rh', 'k1', 'T', '{\"x\": 1}', '{\"id\": \"not-outboxd\", \"tenant\": \"t1\"}')");
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) VALUES "
	    "('rh', 'k1', 'T', '{\"x\": 2}', '{\"tenant\": \"t1\"}')");
	id = t_query1(R.pg, "SELECT id FROM outbox WHERE payload = '{\"x\": 2}'");
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "error"), "headers column 'headers' holds header 'id', a name "
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
	t_relay_config(&R, "[kafka]\ntopic.metadata.propagation.max.ms = 1000\n"
	    "[delivery]\nmissing_topic_timeout = 60s\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);
	lsn = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('late', 'l1', 'T', '{}')");
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
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('never', 'n1', 'T', '{}')");
	t_relay_config(&R, "[kafka]\ntopic.metadata.propagation.max.ms = 1000\n"
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_publication_and_table_refusals, teardown),
		cmocka_unit_test_teardown(test_partitioned_outbox_created_publication, teardown),
		cmocka_unit_test_teardown(test_slot_guard, teardown),
		cmocka_unit_test_teardown(test_poison_stop_then_dead_letter, teardown),
		cmocka_unit_test_teardown(test_topic_error_dead_letter, teardown),
		cmocka_unit_test_teardown(test_backpressure, teardown),
		cmocka_unit_test_teardown(test_null_key_row, teardown),
		cmocka_unit_test_teardown(test_reserved_header_row_dead_lettered, teardown),
		cmocka_unit_test_teardown(test_missing_topic_waited_for, teardown),
		cmocka_unit_test_teardown(test_publication_recreated_behind_slot, teardown),
	};

	return T_RUN_TESTS(tests);
}
