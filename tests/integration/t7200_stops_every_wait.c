/*
 * SIGTERM in every mode and every wait (docs/internals/design.md, "Relay core", the
 * table "SIGTERM in every mode and wait"; DESIGN.md invariant 7): while
 * outboxd waits on the broker, /healthz answers 200 before and after the
 * signal until the process is gone, the first SIGTERM ends it with status
 * 0 within the drain deadline (OBX_CORE_DRAIN_TIMEOUT_MS, 30 s) and a
 * margin, and nothing is lost: once the broker behaves again, the next run
 * publishes every committed row (the polling mode leaves the rows it did
 * not have acknowledged pending).  One case per combination:
 *
 *   - streaming, every broker slow (3 s round trips), events in flight;
 *   - streaming, the broker refusing every Produce request with a
 *     retriable error, events in flight;
 *   - [source] snapshot = pending, every broker down during the snapshot;
 *   - polling, the broker slow and refusing, a claimed batch in flight;
 *   - [delivery] exactly_once = on, a commit waiting on brokers that went
 *     down after the transaction's records were produced.
 *
 * Every case sets max.in.flight.requests.per.connection = 1: the test broker
 * (librdkafka's mock cluster) checks idempotent sequence numbers only for
 * transactional producers, so with slow or refused Produce requests and
 * more than one in flight it could itself reorder or duplicate records; one
 * in flight keeps what the read-back finds about outboxd (tests/chaos/chaos.c
 * does the same).
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* the drain deadline (OBX_CORE_DRAIN_TIMEOUT_MS) and a margin for the exit itself */
#define STOP_WITHIN_MS 40000
#define ONE_IN_FLIGHT "[kafka]\nmax.in.flight.requests.per.connection = 1\n"
/* more Produce refusals than the drain deadline can use up: the broker refuses throughout */
#define REFUSALS 100000

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	if (R.pid > 0)
		t_log_dump(&R);
	t_relay_teardown(&R);
	return 0;
}

/* One transaction of n events of aggregate type agg over nkeys keys; i counts from first. */
static void
insert_rows(const char *agg, int first, int n, int nkeys)
{
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || (g %% %d), 'T', jsonb_build_object('i', g) FROM generate_series(%d, %d) g",
	    agg, nkeys, first, first + n - 1);
}

/* Waits until the log holds more than before lines with needle; fails after timeout_ms or an exit. */
static void
wait_log(const char *needle, int before, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (t_log_count(&R, needle) <= before) {
		if (t_now_ms() > deadline || waitpid(R.pid, NULL, WNOHANG) == R.pid) {
			t_log_dump(&R);
			fail_msg("no new \"%s\" in the log within %d ms", needle, timeout_ms);
		}
		usleep(20000);
	}
}

/* A gauge of /metrics, -1 when absent; fails when /metrics does not answer 200. */
static double
metric(int port, const char *name)
{
	static char body[1 << 16];

	if (t_http_get(port, "/metrics", body, sizeof(body)) != 200) {
		t_log_dump(&R);
		fail_msg("/metrics did not answer 200");
	}
	return t_metric(body, name);
}

/* Waits until outboxd_inflight_events is above 0: events produced and not acknowledged. */
static void
wait_inflight(int port, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (metric(port, "outboxd_inflight_events") <= 0) {
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("no event in flight within %d ms", timeout_ms);
		}
		usleep(50000);
	}
}

/* Sends "verb ID" (or "verb ID arg") for each of the three brokers. */
static void
broker_all(const char *verb, const char *arg)
{
	for (int b = 1; b <= 3; b++)
		assert_int_equal(
		    t_broker_cmd(&R.b, "%s %d%s%s", verb, b, arg != NULL ? " " : "", arg != NULL ? arg : ""), 0);
}

/*
 * /healthz until the process is gone: a 200 is required; no answer is
 * accepted only when the process exits within 2 s of it (it closed its
 * listener on the way out).  Returns 1 when the process is gone (*st set).
 */
static int
health_or_gone(int port, const char *when, int *st)
{
	char body[512];
	int code = t_http_get(port, "/healthz", body, sizeof(body));

	if (code == 200)
		return 0;
	if (code == -1 && (*st = t_wait(R.pid, 2000)) != -1)
		return 1;
	t_log_dump(&R);
	fail_msg("/healthz answered %d %s: %s", code, when, code > 0 ? body : "(no answer)");
	return 0;
}

/*
 * Checks /healthz three times, sends SIGTERM, then checks it every second
 * until the process exits; fails unless it exits with status 0 within
 * STOP_WITHIN_MS.  Returns the milliseconds from the signal to the exit.
 */
static int64_t
sigterm_while_healthy(int port)
{
	int64_t t0, took;
	int st = -1;

	for (int i = 0; i < 3; i++) {
		if (health_or_gone(port, "before SIGTERM", &st))
			fail_msg("outboxd exited before SIGTERM (wait status %d)", st);
		usleep(300000);
	}
	t0 = t_now_ms();
	assert_int_equal(kill(R.pid, SIGTERM), 0);
	for (;;) {
		if ((st = t_wait(R.pid, 1000)) != -1)
			break;
		if (t_now_ms() - t0 > STOP_WITHIN_MS) {
			t_log_dump(&R);
			fail_msg("outboxd still running %d s after SIGTERM", STOP_WITHIN_MS / 1000);
		}
		if (health_or_gone(port, "after SIGTERM", &st))
			break;
	}
	took = t_now_ms() - t0;
	R.pid = 0;
	if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || took > STOP_WITHIN_MS) {
		t_log_dump(&R);
		fail_msg("SIGTERM: wait status %d after %.1f s (want exit 0 within %d s)", st,
		    (double)took / 1000.0, STOP_WITHIN_MS / 1000);
	}
	print_message("exit 0 %.1f s after SIGTERM\n", (double)took / 1000.0);
	return took;
}

/* How many records of m carry header id = id. */
static size_t
count_id(const struct t_msg *m, size_t n, const char *id)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++) {
		const char *v = t_msg_header(&m[i], "id");

		c += v != NULL && strcmp(v, id) == 0;
	}
	return c;
}

/*
 * Every row of aggregate type agg for which where holds (SQL, "true" for
 * all) is in m at least once (exactly once when exact); fails naming the
 * first that is not.  Returns the number of rows checked.
 */
static int
rows_in(const struct t_msg *m, size_t n, const char *agg, const char *where, bool exact)
{
	char sql[512];
	PGresult *res;
	int rows;

	snprintf(sql, sizeof(sql), "SELECT id::text FROM outbox WHERE aggregatetype = '%s' AND (%s)", agg, where);
	res = PQexec(R.pg, sql);
	assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
	rows = PQntuples(res);
	for (int r = 0; r < rows; r++) {
		size_t c = count_id(m, n, PQgetvalue(res, r, 0));

		if (c == 0 || (exact && c != 1)) {
			t_log_dump(&R);
			fail_msg("row %s of %s is in Kafka %zu time(s)", PQgetvalue(res, r, 0), agg, c);
		}
	}
	PQclear(res);
	return rows;
}

/*
 * Reads outbox.event.<agg> back whole (t_consume_all fails when a
 * partition's low watermark is above 0) and checks that every row of agg is
 * in it.  Returns the number of records.
 */
static size_t
expect_all_published(const char *agg)
{
	char topic[128];
	struct t_msg *m;
	size_t n;
	int rows;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	rows = rows_in(m, n, agg, "true", false);
	print_message("%d row(s) of %s, %zu record(s) in %s\n", rows, agg, n, topic);
	t_msgs_free(m, n);
	return n;
}

/* Restarts outboxd in logical mode and waits until everything committed is confirmed. */
static void
restart_and_catch_up(void)
{
	t_relay_start(&R, NULL, 1);
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("the restarted run did not confirm the current WAL position");
	}
}

/*
 * Streaming: a relay with rows of agg published and confirmed (the topic
 * exists, the producer has its metadata), config extra added.  Returns the
 * metrics port.
 */
static int
streaming_warm(const char *prefix, const char *agg, const char *extra)
{
	char text[1024];

	t_relay_setup(&R, prefix, 0);
	snprintf(text, sizeof(text), "%s%s", ONE_IN_FLIGHT, extra != NULL ? extra : "");
	t_relay_config(&R, text);
	t_relay_start(&R, NULL, 1);
	insert_rows(agg, 0, 20, 7);
	if (!t_wait_confirmed_current(&R, 20000)) {
		t_log_dump(&R);
		fail_msg("the warm-up rows were not confirmed");
	}
	return t_metrics_port(&R);
}

/* The drain began with events outstanding: the first SIGTERM found work in flight. */
static void
assert_drain_had_work(void)
{
	assert_int_equal(t_log_count(&R, "stopping: waiting up to 30 s for "), 1);
	assert_int_equal(t_log_count(&R, "stopping: waiting up to 30 s for 0 outstanding"), 0);
}

/*
 * 1. Streaming, every broker answering after 3 s, 600 events of 3
 * transactions in flight: /healthz 200 throughout, SIGTERM drains and
 * exits 0 within the deadline; the next run has every row in Kafka.
 */
static void
test_streaming_slow_broker(void **state)
{
	int port;

	(void)state;
	port = streaming_warm("stopslow", "stslow", NULL);
	broker_all("rtt", "3000");
	for (int t = 0; t < 3; t++)
		insert_rows("stslow", 20 + t * 200, 200, 7);
	wait_inflight(port, 15000);
	sigterm_while_healthy(port);
	assert_drain_had_work();
	print_message("unacknowledged at the deadline: %s\n",
	    t_log_count(&R, "unacknowledged after 30 s") > 0 ? "yes" : "no, drained");
	broker_all("rtt", "0");
	restart_and_catch_up();
	assert_true(expect_all_published("stslow") >= 620);
}

/*
 * 2. Streaming, every Produce request refused with NOT_ENOUGH_REPLICAS (a
 * retriable error: librdkafka retries, outboxd sets message.timeout.ms 0)
 * more often than the drain can use up, 600 events in flight: /healthz
 * 200, exit 0 at the drain deadline; with the refusals cleared the next
 * run has every row in Kafka.
 */
static void
test_streaming_refused(void **state)
{
	int port;

	(void)state;
	port = streaming_warm("stoprefuse", "strefuse", NULL);
	assert_int_equal(t_broker_cmd(&R.b, "produce-errors %d NOT_ENOUGH_REPLICAS", REFUSALS), 0);
	for (int t = 0; t < 3; t++)
		insert_rows("strefuse", 20 + t * 200, 200, 7);
	wait_inflight(port, 15000);
	sigterm_while_healthy(port);
	assert_drain_had_work();
	assert_int_equal(t_log_count(&R, "unacknowledged after 30 s"), 1); /* refused throughout */
	assert_int_equal(t_broker_cmd(&R.b, "clear"), 0);
	restart_and_catch_up();
	assert_true(expect_all_published("strefuse") >= 620);
}

/*
 * 3. [source] snapshot = pending, 4,000 rows pending before the slot
 * exists, every broker down once the snapshot is under way: /healthz 200,
 * exit 0 within the deadline, the slot and its marker kept; with the
 * brokers back the next start takes the snapshot again and every row is in
 * Kafka.
 */
static void
test_snapshot_brokers_down(void **state)
{
	int port;

	(void)state;
	t_relay_setup(&R, "stopsnap", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	insert_rows("stsnap", 1, 4000, 20);
	/* slow, so the snapshot is far from its end when the brokers go */
	broker_all("rtt", "500");
	t_relay_config(&R, ONE_IN_FLIGHT "[source]\nsnapshot = pending\n[delivery]\nmax_inflight = 50\n");
	t_relay_start(&R, NULL, 0);
	wait_log(": publishing the rows of public.outbox", 0, 20000);
	port = t_metrics_port(&R);
	usleep(1000000);
	broker_all("down", NULL);
	broker_all("rtt", "0");
	usleep(2000000);
	sigterm_while_healthy(port);
	assert_int_equal(t_log_count(&R, "stopped during the snapshot of slot "), 1);
	assert_int_equal(t_log_count(&R, "streaming from slot"), 0);
	broker_all("up", NULL);
	t_relay_start(&R, NULL, 0);
	wait_log("streaming from slot", 0, 60000);
	assert_int_equal(t_log_count(&R, ": publishing the rows of public.outbox"), 2);
	assert_true(expect_all_published("stsnap") >= 4000);
	assert_int_equal(kill(R.pid, SIGTERM), 0);
	assert_int_equal(t_wait(R.pid, 30000), 0);
	R.pid = 0;
}

/* Starts outboxd in polling mode and waits for its first poll; returns the metrics port. */
static int
poll_start(void)
{
	int64_t deadline = t_now_ms() + 20000;
	int before = t_log_count(&R, "polling public.outbox");

	t_relay_start(&R, NULL, 0);
	while (t_log_count(&R, "polling public.outbox") == before) {
		if (t_now_ms() > deadline || waitpid(R.pid, NULL, WNOHANG) == R.pid) {
			t_log_dump(&R);
			fail_msg("outboxd did not start polling");
		}
		usleep(20000);
	}
	return t_metrics_port(&R);
}

/* Waits until no row is pending; fails after timeout_ms. */
static void
wait_drained(int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (t_pending_rows(R.pg) != 0) {
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("%ld row(s) still pending after %d ms", t_pending_rows(R.pg), timeout_ms);
		}
		usleep(100000);
	}
}

/* Every row marked published is in outbox.event.<agg>; returns how many are marked. */
static int
marked_rows_published(const char *agg)
{
	char topic[128];
	struct t_msg *m;
	size_t n;
	int marked;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	marked = rows_in(m, n, agg, "published_at IS NOT NULL", false);
	t_msgs_free(m, n);
	return marked;
}

/*
 * 4. Polling, every broker answering after 3 s and refusing every Produce
 * request with NOT_ENOUGH_REPLICAS, a claimed batch of 2,000 rows in
 * flight: /healthz 200, exit 0 within the deadline; the rows not
 * acknowledged stay pending and every marked row is in Kafka; with the
 * broker healed the next run publishes and marks every row.
 */
static void
test_poll_slow_and_refused(void **state)
{
	int port, claims, marked;
	long pending;

	(void)state;
	t_relay_setup(&R, "stoppoll", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	/* t_relay_config writes [source] and [kafka] first: a second block of each adds to it */
	t_relay_config(&R, ONE_IN_FLIGHT "[source]\nmode = poll\n[poll]\npoll_interval = 100ms\n");
	port = poll_start();
	insert_rows("stpoll", 0, 1, 1);
	wait_drained(15000);
	broker_all("rtt", "3000");
	assert_int_equal(t_broker_cmd(&R.b, "produce-errors %d NOT_ENOUGH_REPLICAS", REFUSALS), 0);
	claims = t_log_count(&R, "claimed ");
	/*
	 * Statistics for the claim's plan.  Without them (a table that went from
	 * 1 pending row to 2,001 in one transaction, before autovacuum analyzes
	 * it) PostgreSQL 15 plans the claim's NOT EXISTS as nested loops over the
	 * locked rows: its run time grows with the cube of the pending rows
	 * (2,001: over 150 s), the poller waits inside that one statement and
	 * /healthz answers 503 after 30 s.  This case is about the wait on the
	 * broker that follows the claim.  In the rows' own transaction, so that no
	 * claim sees them before the statistics do.
	 */
	t_exec(R.pg, "BEGIN");
	insert_rows("stpoll", 1, 2000, 50);
	t_exec(R.pg, "ANALYZE outbox");
	t_exec(R.pg, "COMMIT");
	wait_log("claimed ", claims, 15000);
	usleep(2000000);
	sigterm_while_healthy(port);
	assert_int_equal(t_log_count(&R, "stopping at the drain deadline: "), 1);
	pending = t_pending_rows(R.pg);
	assert_true(pending > 0); /* the batch was still waiting on the broker */
	assert_int_equal(t_broker_cmd(&R.b, "clear"), 0);
	broker_all("rtt", "0");
	marked = marked_rows_published("stpoll");
	print_message("after the stop: %ld row(s) pending, %d marked (each in Kafka)\n", pending, marked);
	assert_int_equal(marked + pending, 2001);
	(void)poll_start();
	wait_drained(60000);
	assert_true(expect_all_published("stpoll") >= 2001);
}

/*
 * 4b. Polling, a claim the server takes long over (the table went from 1
 * pending row to 1,500 in one transaction and has no statistics, so
 * PostgreSQL 15 plans the claim's NOT EXISTS as nested loops: tens of
 * seconds): /healthz 200 while the server works, and SIGTERM cancels the
 * claim and exits 0 at once, every row still pending; with statistics the
 * next run publishes them all.
 */
static void
test_poll_slow_claim(void **state)
{
	int port, claims;

	(void)state;
	t_relay_setup(&R, "stopclaim", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	t_exec(R.pg, "ALTER TABLE outbox SET (autovacuum_enabled = off)"); /* no statistics meanwhile */
	t_relay_config(&R, "[source]\nmode = poll\n[poll]\npoll_interval = 100ms\n");
	port = poll_start();
	insert_rows("stclaim", 0, 1, 1);
	wait_drained(15000);
	claims = t_log_count(&R, "claimed ");
	t_exec(R.pg, "BEGIN");
	insert_rows("stclaim", 1, 1500, 50);
	t_exec(R.pg, "COMMIT");
	usleep(3000000);
	/* the claim is still under way: the condition this case is about */
	if (t_log_count(&R, "claimed ") != claims) {
		t_log_dump(&R);
		fail_msg("the claim of 1,500 rows without statistics finished within 3 s: nothing slow to stop");
	}
	assert_true(sigterm_while_healthy(port) < 5000);
	assert_int_equal(t_pending_rows(R.pg), 1500);
	t_exec(R.pg, "ANALYZE outbox");
	(void)poll_start();
	wait_drained(60000);
	assert_true(expect_all_published("stclaim") >= 1501);
}

/*
 * 5. Exactly-once, a Kafka transaction of 300 events produced while every
 * broker answers after 3 s, then every broker down: the transaction's
 * commit waits on the broker.  /healthz 200, exit 0 within the deadline
 * (the open transaction is given up); with the brokers back the next run
 * has every row in committed Kafka transactions exactly once.
 */
static void
test_exactly_once_commit_waits(void **state)
{
	struct t_msg *m;
	size_t n, all;
	int port, rows;

	(void)state;
	port = streaming_warm("stopeos", "steos", "[delivery]\nexactly_once = on\n");
	broker_all("rtt", "3000");
	insert_rows("steos", 20, 300, 7);
	wait_inflight(port, 15000);
	broker_all("down", NULL);
	usleep(1000000);
	sigterm_while_healthy(port);
	assert_drain_had_work();
	/* the commit was still waiting at the deadline: the transaction is given up */
	assert_int_equal(t_log_count(&R, "stopping with a Kafka transaction of "), 1);
	broker_all("up", NULL);
	broker_all("rtt", "0");
	restart_and_catch_up();
	all = n = t_consume_all(R.b.bootstrap, "outbox.event.steos", 20000, &m);
	(void)t_committed_only(R.b.bootstrap, R.slot, m, &n);
	rows = rows_in(m, n, "steos", "true", true);
	print_message("%d row(s), %zu record(s), %zu of committed transactions\n", rows, all, n);
	assert_int_equal(rows, 320);
	assert_int_equal(n, (size_t)rows);
	t_msgs_free(m, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_streaming_slow_broker, teardown),
		cmocka_unit_test_teardown(test_streaming_refused, teardown),
		cmocka_unit_test_teardown(test_snapshot_brokers_down, teardown),
		cmocka_unit_test_teardown(test_poll_slow_and_refused, teardown),
		cmocka_unit_test_teardown(test_poll_slow_claim, teardown),
		cmocka_unit_test_teardown(test_exactly_once_commit_waits, teardown),
	};

	return T_RUN_TESTS(tests); /* OBX_TEST_FILTER=a,b* runs the matching cases only */
}
