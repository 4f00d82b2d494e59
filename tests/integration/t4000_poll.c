/*
 * Polling mode ([source] mode = poll) against the real stack: the happy
 * path (records, headers, marking, NOTIFY, metrics), the broker down and
 * back, a poison row retried until max_attempts and then dead-lettered (or
 * only marked), and three replicas with concurrent writers and a kill -9.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "harness.h"

static struct t_relay R;
static struct t_relay T[3];

static int
teardown(void **state)
{
	(void)state;
	for (int i = 0; i < 3; i++)
		if (T[i].log[0] != '\0') /* a killed replica's log too */
			t_relay_twin_stop(&T[i]);
	if (R.pid > 0)
		t_log_dump(&R);
	t_relay_teardown(&R);
	memset(T, 0, sizeof(T));
	return 0;
}

/* A database with the outbox, the polling migration and (notify) the trigger; the config. */
static void
poll_setup(const char *prefix, int notify, const char *extra)
{
	char text[2048];

	t_relay_setup(&R, prefix, 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	if (notify)
		t_exec_file(R.pg, "sql/009_polling_notify.sql");
	snprintf(text, sizeof(text), "[source]\nmode = poll\n%s", extra != NULL ? extra : "");
	/* t_relay_config writes [source] first: a second [source] block adds to it */
	t_relay_config(&R, text);
}

/* Starts the relay r and waits for its first "polling" line. */
static void
poll_start(struct t_relay *r)
{
	int64_t deadline = t_now_ms() + 20000;

	t_relay_start(r, NULL, 0);
	while (t_log_count(r, "polling public.outbox") == 0) {
		if (t_now_ms() > deadline || waitpid(r->pid, NULL, WNOHANG) == r->pid) {
			t_log_dump(r);
			fail_msg("outboxd did not start polling");
		}
		usleep(20000);
	}
}

/* Runs cmd through the shell; its output goes to out.  Returns the exit status. */
static int
run_capture(const char *cmd, char *out, size_t len)
{
	return t_run_capture(cmd, out, len);
}

/*
 * 0. A table without the polling columns: check names the missing piece
 * and the migration; run stops with that one line and exit status 1.
 */
static void
test_unmigrated_table(void **state)
{
	char out[4096], cmd[1024];
	int st;

	(void)state;
	t_relay_setup(&R, "pollbare", 0);
	t_relay_config(&R, "[source]\nmode = poll\n");
	snprintf(cmd, sizeof(cmd), "%s check -c %s 2>&1", getenv("OBX_OUTBOXD"), R.conf);
	assert_int_equal(run_capture(cmd, out, sizeof(out)), 1);
	assert_non_null(strstr(out,
	    "FAIL polling: cannot read public.outbox: column o.seq does not exist "
	    "(apply sql/008_polling.sql, or map the columns in [outbox])"));
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 20000);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	R.pid = 0;
	assert_int_equal(t_log_count(&R,
	                     "could not read the outbox table public.outbox for polling: column "
	                     "o.seq does not exist (apply sql/008_polling.sql"),
	    1);
}

/* Waits until no row is pending; fails after timeout_ms. */
static void
wait_drained(int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	for (;;) {
		char *left = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE published_at IS NULL");
		int done = strcmp(left, "0") == 0;

		free(left);
		if (done)
			return;
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("rows still pending after %d ms", timeout_ms);
		}
		usleep(100000);
	}
}

/*
 * 1. The happy path: one record per committed row with the logical mode's
 * topic, key, value and partition, id and type headers, seq from the
 * ordering column and no lsn/xid; the row is marked; a rolled-back insert
 * publishes nothing; NOTIFY wakes the poller long before poll_interval;
 * the metrics say "not applicable" for the WAL and count pending rows.
 */
static void
test_happy_path(void **state)
{
	struct t_msg *m;
	size_t n;
	char *id, *seq, *stored, *marked, body[16384];
	const char *payload = "{\"total\": 12.5, \"note\": \"caf\\u00e9\"}";
	int64_t t0;
	int port;

	(void)state;
	poll_setup("pollhappy", 1, "[poll]\npoll_interval = 60s\n");
	poll_start(&R);
	t_exec(R.pg, "BEGIN");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('order', 'rolled-back', 'X', '{}')");
	t_exec(R.pg, "ROLLBACK");
	t0 = t_now_ms();
	id = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('order', 'order-1', 'OrderCreated', '%s') RETURNING id",
	    payload);
	seq = t_query1(R.pg, "SELECT seq FROM outbox WHERE id = '%s'", id);
	stored = t_query1(R.pg, "SELECT payload::text FROM outbox WHERE id = '%s'", id);

	n = t_consume(R.b.bootstrap, "outbox.event.order", 1, 15000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	/* woken by NOTIFY, not by the 60 s poll interval */
	assert_true(t_now_ms() - t0 < 10000);
	assert_string_equal(m[0].topic, "outbox.event.order");
	assert_string_equal(m[0].key, "order-1");
	assert_string_equal(m[0].value, stored);
	assert_string_equal(t_msg_header(&m[0], "id"), id);
	assert_string_equal(t_msg_header(&m[0], "type"), "OrderCreated");
	assert_string_equal(t_msg_header(&m[0], "seq"), seq);
	assert_null(t_msg_header(&m[0], "lsn"));
	assert_null(t_msg_header(&m[0], "xid"));
	assert_int_equal(m[0].partition, rd_kafka_msg_partitioner_murmur2(NULL, "order-1", 7, 4, NULL, NULL));
	t_msgs_free(m, n);

	wait_drained(10000);
	marked = t_query1(R.pg,
	    "SELECT (published_at IS NOT NULL) || ' ' || attempts || ' ' || "
	    "coalesce(last_error, '-') FROM outbox WHERE id = '%s'",
	    id);
	assert_string_equal(marked, "true 0 -");

	port = t_metrics_port(&R);
	assert_int_equal(t_http_get(port, "/readyz", body, sizeof(body)), 200);
	/* the stats refresh every 5 s */
	for (int i = 0; i < 80; i++) {
		assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
		if (t_metric(body, "outboxd_events_published_total") == 1 &&
		    t_metric(body, "outboxd_poll_pending_rows") == 0)
			break;
		usleep(100000);
	}
	assert_non_null(strstr(body, "\noutboxd_lag_bytes NaN\n"));
	assert_non_null(strstr(body, "\noutboxd_confirmed_flush_lsn NaN\n"));
	assert_true(t_metric(body, "outboxd_events_published_total") == 1);
	assert_true(t_metric(body, "outboxd_poll_pending_rows") == 0);
	assert_true(t_metric(body, "outboxd_poll_oldest_pending_age_seconds") == 0);
	assert_true(t_metric(body, "outboxd_poll_failed_attempts_total") == 0);
	assert_null(strstr(body, "outboxd_slot_retained_wal_bytes"));

	/* check and status speak of the table, not of a slot */
	{
		char out[4096], cmd[1024];

		snprintf(cmd, sizeof(cmd), "%s check -c %s 2>&1", getenv("OBX_OUTBOXD"), R.conf);
		assert_int_equal(run_capture(cmd, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "ok   polling: public.outbox has every mapped column"));
		assert_non_null(strstr(out, "ok   polling: 2 partial index(es) on the pending rows"));
		assert_non_null(strstr(out, "sooner on NOTIFY outboxd"));
		assert_null(strstr(out, "wal_level"));
		assert_null(strstr(out, "publication:"));
		assert_null(strstr(out, "slot:"));
		snprintf(cmd, sizeof(cmd), "%s status -c %s --json 2>&1", getenv("OBX_OUTBOXD"), R.conf);
		assert_int_equal(run_capture(cmd, out, sizeof(out)), 0);
		assert_non_null(strstr(out, "{\"mode\":\"poll\",\"pending_rows\":0,"));
	}

	/* nothing for the rolled-back row */
	n = t_consume_all(R.b.bootstrap, "outbox.event.order", 5000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);

	/* a NULL attempts (a nullable column mapped to [outbox] attempts) counts as none: the row
	 * is published and marked, and no batch fails on it */
	t_exec(R.pg, "ALTER TABLE outbox ALTER COLUMN attempts DROP NOT NULL");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, attempts) "
	    "VALUES ('order', 'order-null-attempts', 'OrderCreated', '{}', NULL)");
	n = t_consume(R.b.bootstrap, "outbox.event.order", 2, 15000, &m);
	if (n != 2)
		t_log_dump(&R);
	assert_int_equal(n, 2);
	assert_true(strcmp(m[0].key, "order-null-attempts") == 0 || strcmp(m[1].key, "order-null-attempts") == 0);
	t_msgs_free(m, n);
	wait_drained(10000);
	assert_int_equal(t_log_count(&R, "is NULL or not an integer"), 0);

	/* SIGTERM stops cleanly */
	assert_int_equal(t_relay_signal(&R, SIGTERM, 10000), 0);
	free(id);
	free(seq);
	free(stored);
	free(marked);
}

/* Per key, the values' "i" strictly increase in partition order; returns the records checked. */
static void
assert_key_order(const struct t_msg *m, size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++) {
			if (strcmp(m[i].key, m[j].key) != 0)
				continue;
			if (atoi(strstr(m[i].value, "\"i\": ") + 5) >= atoi(strstr(m[j].value, "\"i\": ") + 5))
				fail_msg("key %s: i %s before %s", m[i].key, m[i].value, m[j].value);
		}
}

/*
 * 2. The broker down, then back: rows stay pending (and locked by the
 * claimed batch) while it is down, none is marked, nothing counts as an
 * attempt; once it is back every row is published exactly once, in order
 * per key, and marked.
 */
static void
test_broker_down(void **state)
{
	struct t_msg *m;
	size_t n;
	char *left, *tried;

	(void)state;
	poll_setup("polldown", 0, "[poll]\npoll_interval = 100ms\n");
	poll_start(&R);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('down', 'w', 'W', '{\"i\": -1}')");
	n = t_consume(R.b.bootstrap, "outbox.event.down", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	wait_drained(10000);

	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	for (int i = 0; i < 60; i++) {
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('down', 'k%d', 'D', '{\"i\": %d}')",
		    i % 5, i);
		usleep(100000);
	}
	sleep(3);
	left = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE published_at IS NULL");
	assert_string_equal(left, "60");
	free(left);
	tried = t_query1(R.pg, "SELECT coalesce(sum(attempts), 0) FROM outbox");
	assert_string_equal(tried, "0");
	free(tried);
	assert_true(t_log_count(&R, "waiting for the broker to acknowledge") >= 1);

	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	wait_drained(60000);
	n = t_consume_all(R.b.bootstrap, "outbox.event.down", 20000, &m);
	assert_int_equal(n, 61);
	{
		PGresult *res = PQexec(R.pg, "SELECT id::text FROM outbox");

		for (int i = 0; i < PQntuples(res); i++)
			assert_int_equal(t_count_header(m, n, "id", PQgetvalue(res, i, 0)), 1);
		PQclear(res);
	}
	assert_key_order(m, n);
	t_msgs_free(m, n);
	tried = t_query1(R.pg, "SELECT coalesce(sum(attempts), 0) FROM outbox");
	assert_string_equal(tried, "0");
	free(tried);
}

/*
 * 2b. Default settings, 12,000 pending rows, every broker down: the loop
 * stays live (/healthz 200) and SIGTERM ends the process within the drain
 * deadline (30 s) with status 0; no row is marked and none counts as an
 * attempt.  A claim is cut to [delivery] max_inflight rows, which the
 * producer's queue holds, so producing never spins on a full queue.
 */
static void
test_broker_down_sigterm(void **state)
{
	static char body[1 << 16];
	int64_t t0;
	char *left, *tried;
	int st, port;

	(void)state;
	poll_setup("pollterm", 0, NULL);
	poll_start(&R);
	port = t_metrics_port(&R);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'term', 'k' || g, 'T', jsonb_build_object('i', g) FROM generate_series(1, 12000) g");
	/* the batch claimed and waiting for the broker (the claim itself can take seconds on a
	 * server other programs keep busy, and a stop during it has nothing to finish) */
	t0 = t_now_ms() + 60000;
	while (t_log_count(&R, "waiting for the broker to acknowledge") == 0) {
		if (t_now_ms() > t0) {
			t_log_dump(&R);
			fail_msg("the claimed batch never waited for the broker");
		}
		usleep(100000);
	}
	for (int i = 0; i < 3; i++) {
		assert_int_equal(t_http_get(port, "/healthz", body, sizeof(body)), 200);
		usleep(500000);
	}
	t0 = t_now_ms();
	assert_int_equal(kill(R.pid, SIGTERM), 0);
	sleep(2);
	assert_int_equal(t_http_get(port, "/healthz", body, sizeof(body)), 200); /* draining, still live */
	st = t_wait(R.pid, 40000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		t_log_dump(&R);
		fail_msg("SIGTERM with the broker down: wait status %d after %.1f s", st,
		    (double)(t_now_ms() - t0) / 1000.0);
	}
	R.pid = 0;
	assert_true(t_now_ms() - t0 < 35000);
	assert_int_equal(t_log_count(&R, "stopping at the drain deadline: "), 1);
	left = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE published_at IS NULL");
	assert_string_equal(left, "12000");
	free(left);
	tried = t_query1(R.pg, "SELECT coalesce(sum(attempts), 0) FROM outbox");
	assert_string_equal(tried, "0");
	free(tried);
}

/*
 * 3. A poison row (larger than the producer's message.max.bytes) fails,
 * is retried with backoff until max_attempts, then goes to the dead-letter
 * topic; the next row of its aggregate waits for it and follows; another
 * aggregate is not held up.  With exhausted = mark, a poison row is marked
 * without being sent anywhere.
 */
static void
test_poison_dead_letter(void **state)
{
	struct t_msg *m;
	size_t n;
	char *big, *after, *other, *row, *dl_at, *after_at;

	(void)state;
	poll_setup("pollpoison", 1,
	    "[poll]\npoll_interval = 100ms\nmax_attempts = 3\n"
	    "backoff_min = 200ms\nbackoff_max = 400ms\n[kafka]\nmessage.max.bytes = 2000\n");
	poll_start(&R);
	big = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p1', 'Big', jsonb_build_object('blob', repeat('x', 5000))) RETURNING id");
	after = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p1', 'After', '{}') RETURNING id");
	other = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p2', 'Other', '{}') RETURNING id");

	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 20000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "id"), big);
	assert_string_equal(t_msg_header(&m[0], "original_topic"), "outbox.event.poison");
	assert_non_null(strstr(t_msg_header(&m[0], "error"), "MSG_SIZE_TOO_LARGE"));
	t_msgs_free(m, n);
	wait_drained(15000);
	/* three attempts, each logged, then the dead-letter copy */
	assert_int_equal(t_log_count(&R, "failed (attempt 1 of 3)"), 1);
	assert_int_equal(t_log_count(&R, "failed (attempt 3 of 3)"), 1);
	assert_int_equal(t_log_count(&R, "failed (attempt 4 of 3)"), 0);
	row = t_query1(R.pg,
	    "SELECT attempts || ' ' || (published_at IS NOT NULL) || ' ' || "
	    "(last_error LIKE 'dead-lettered to outbox.dead_letter after 3 attempt(s): MSG_SIZE_TOO_LARGE%%') "
	    "FROM outbox WHERE id = '%s'",
	    big);
	assert_string_equal(row, "3 true true");
	free(row);
	/* the next row of p1 only after the poison row was dead-lettered; p2 at once */
	n = t_consume_all(R.b.bootstrap, "outbox.event.poison", 10000, &m);
	assert_int_equal(n, 2);
	assert_int_equal(t_count_header(m, n, "id", after), 1);
	assert_int_equal(t_count_header(m, n, "id", other), 1);
	t_msgs_free(m, n);
	dl_at = t_query1(R.pg, "SELECT published_at FROM outbox WHERE id = '%s'", big);
	after_at = t_query1(R.pg,
	    "SELECT (published_at >= '%s') || ' ' || (SELECT published_at < '%s' "
	    "FROM outbox WHERE id = '%s') FROM outbox WHERE id = '%s'",
	    dl_at, dl_at, other, after);
	assert_string_equal(after_at, "true true");
	free(dl_at);
	free(after_at);
	free(big);
	free(after);
	free(other);

	/* exhausted = mark: marked, never sent */
	assert_int_equal(t_relay_signal(&R, SIGTERM, 10000), 0);
	t_relay_teardown(&R);
	poll_setup("pollmark", 0,
	    "[poll]\npoll_interval = 100ms\nmax_attempts = 2\n"
	    "backoff_min = 100ms\nbackoff_max = 100ms\nexhausted = mark\n[kafka]\nmessage.max.bytes = 2000\n");
	poll_start(&R);
	big = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('poison', 'p1', 'Big', jsonb_build_object('blob', repeat('x', 5000))) RETURNING id");
	wait_drained(15000);
	row = t_query1(R.pg,
	    "SELECT attempts || ' ' || (last_error LIKE 'given up after 2 attempt(s): %%') "
	    "FROM outbox WHERE id = '%s'",
	    big);
	assert_string_equal(row, "2 true");
	assert_int_equal(t_log_count(&R, "marked published without sending"), 1);
	n = t_consume_all(R.b.bootstrap, "outbox.dead_letter", 3000, &m);
	assert_int_equal(n, 0);
	t_msgs_free(m, n);
	free(row);
	free(big);
}

/*
 * A producer fatal error met by the produce call itself, with nothing in flight: the batch
 * ends before any attempt is recorded and the session with it; a new producer publishes
 * every row, none is given up or dead-lettered.  Both exhausted modes, max_attempts = 1, so
 * one recorded attempt would have marked (or dead-lettered) a row without sending it.
 */
static void
test_producer_fatal_error(void **state)
{
	static const char *const modes[] = { "mark", "dead_letter" };

	(void)state;
	for (int k = 0; k < 2; k++) {
		struct t_msg *m;
		char extra[512], *row;
		size_t n;
		int st;

		snprintf(extra, sizeof(extra),
		    "[poll]\npoll_interval = 100ms\nmax_attempts = 1\nbackoff_min = 100ms\nbackoff_max = 100ms\n"
		    "exhausted = %s\n",
		    modes[k]);
		poll_setup(k == 0 ? "pollfatal" : "pollfataldl", 0, extra);
		setenv("OBX_TEST_FATAL_BEFORE", "1", 1);
		poll_start(&R);
		unsetenv("OBX_TEST_FATAL_BEFORE");
		t_insert_events(&R, "fatal", 0, 3);
		wait_drained(30000);
		n = t_consume(R.b.bootstrap, "outbox.event.fatal", 3, 20000, &m);
		if (n < 3 || t_log_count(&R, "test hook: raising a producer fatal error") != 1 ||
		    t_log_count(&R, "the Kafka producer failed") < 1) {
			t_log_dump(&R);
			fail_msg("exhausted = %s: %zu records of 3 after a producer fatal error", modes[k], n);
		}
		t_msgs_free(m, n);
		row = t_query1(R.pg,
		    "SELECT sum(attempts) || ' ' || count(*) FILTER (WHERE last_error IS NOT NULL) "
		    "FROM outbox");
		if (strcmp(row, "0 0") != 0) {
			t_log_dump(&R);
			fail_msg(
			    "exhausted = %s: attempts recorded for a producer's failure (sum, with errors: %s)",
			    modes[k], row);
		}
		free(row);
		assert_int_equal(t_log_count(&R, "marked published without sending"), 0);
		n = t_consume_all(R.b.bootstrap, "outbox.dead_letter", 2000, &m);
		assert_int_equal(n, 0);
		t_msgs_free(m, n);
		st = t_relay_signal(&R, SIGTERM, 20000);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		if (k == 0)
			t_relay_teardown(&R); /* the last one is the test's teardown's */
	}
}

/* The seq range of the last batch a replica claimed, from its debug log; 0 when none. */
static int
last_claim(const struct t_relay *r, long long *lo, long long *hi, int *committed_after)
{
	FILE *fp = fopen(r->log, "r");
	char line[4096];
	int found = 0;

	*committed_after = 0;
	if (fp == NULL)
		return 0;
	while (fgets(line, sizeof(line), fp) != NULL) {
		const char *p = strstr(line, " row(s), seq ");

		if (strstr(line, "claimed ") != NULL && p != NULL &&
		    sscanf(p, " row(s), seq %lld to %lld", lo, hi) == 2) {
			found = 1;
			*committed_after = 0;
		} else if (strstr(line, "committed: ") != NULL) {
			*committed_after = 1;
		}
	}
	fclose(fp);
	return found;
}

/*
 * 4. Three replicas, 20,000 events over 200 aggregates from concurrent
 * writers, one replica killed with SIGKILL in the middle of a batch: every
 * event is published; per aggregate, versions arrive in order (counting
 * each event's first delivery); an event is delivered twice only when the
 * killed replica had claimed it in the batch it died in.
 */
static void
test_replicas_kill9(void **state)
{
	struct t_msg *m;
	size_t n, want, dups = 0;
	char s1[64], cmd[2048], *cnt;
	long long lo = 0, hi = -1;
	int rc, mid = 0, st;
	PGresult *res;

	(void)state;
	poll_setup("pollrep", 1, "[poll]\npoll_interval = 200ms\nbatch = 200\n");
	t_exec(R.pg, "CREATE TABLE agg (id int PRIMARY KEY, version int NOT NULL)");
	t_exec(R.pg, "INSERT INTO agg SELECT g, 0 FROM generate_series(1, 200) g");
	/* a slower broker: batches of many rows, several of one aggregate, are in flight at once */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 50", b), 0);
	for (int i = 0; i < 3; i++) {
		char tag[8];

		snprintf(tag, sizeof(tag), "r%d", i);
		t_relay_twin(&R, &T[i], tag);
#ifdef OBX_TEST_HOOKS
		/* replica 1 kills itself between two acknowledgements: inside a batch for sure */
		if (i == 1)
			setenv("OBX_TEST_KILL_AFTER_ACKS", "3000", 1);
#endif
		poll_start(&T[i]);
		unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	}
	/* each transaction bumps one aggregate's version and writes its event: the order oracle */
	t_write_file(s1, sizeof(s1),
	    "\\set a random(1, 200)\n"
	    "BEGIN;\n"
	    "UPDATE agg SET version = version + 1 WHERE id = :a RETURNING version AS v \\gset\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('rep', :a, 'V', jsonb_build_object('version', :v));\n"
	    "COMMIT;\n");
	snprintf(cmd, sizeof(cmd),
	    "%s/pgbench -n -h %s -p %s -U %s -c 8 -j 2 -t 2500 -f %s %s "
	    ">/dev/null 2>&1",
	    R.st.pgbin, R.st.host, R.st.port, R.st.user, s1, R.db);
	rc = system(cmd);
	assert_int_equal(rc, 0);
	unlink(s1);
	cnt = t_query1(R.pg, "SELECT count(*) FROM outbox");
	want = (size_t)atoi(cnt);
	free(cnt);
	assert_int_equal(want, 20000);
	/* without the hook (or when it has not fired yet): kill -9 from outside */
	if (waitpid(T[1].pid, &st, WNOHANG) == 0) {
		kill(T[1].pid, SIGKILL);
		waitpid(T[1].pid, &st, 0);
	}
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	T[1].pid = 0;
	assert_true(last_claim(&T[1], &lo, &hi, &mid));
	print_message("replica 1 killed %s its batch of seq %lld..%lld\n", mid ? "after" : "inside", lo, hi);

	wait_drained(120000);
	n = t_consume_all(R.b.bootstrap, "outbox.event.rep", 30000, &m);
	assert_true(n >= want);
	/* every event; duplicates only from the killed replica's last batch */
	res = PQexec(R.pg, "SELECT id::text, seq FROM outbox ORDER BY id");
	assert_int_equal(PQntuples(res), (int)want);
	{
		char **ids = calloc(n, sizeof(char *));
		size_t k = 0;

		for (size_t i = 0; i < n; i++)
			ids[i] = (char *)t_msg_header(&m[i], "id");
		qsort(ids, n, sizeof(char *), t_cmp_str);
		for (int r = 0; r < PQntuples(res); r++) {
			size_t c = 0;
			long long seq = atoll(PQgetvalue(res, r, 1));

			while (k < n && strcmp(ids[k], PQgetvalue(res, r, 0)) < 0)
				k++;
			while (k < n && strcmp(ids[k], PQgetvalue(res, r, 0)) == 0) {
				c++;
				k++;
			}
			if (c == 0)
				fail_msg("event %s was committed but never published", PQgetvalue(res, r, 0));
			if (c > 1) {
				dups += c - 1;
				if (seq < lo || seq > hi)
					fail_msg("event %s (seq %lld) published %zu times, outside the killed "
					         "replica's last batch %lld..%lld",
					    PQgetvalue(res, r, 0), seq, c, lo, hi);
			}
		}
		free(ids);
	}
	PQclear(res);
	assert_true(dups <= (size_t)(hi - lo + 1));
	/* per aggregate, first deliveries carry versions 1, 2, 3, ... in partition order */
	{
		int last[201] = { 0 };

		for (size_t i = 0; i < n; i++) {
			int key = atoi(m[i].key);
			const char *v = strstr(m[i].value, "\"version\": ");
			int ver = v ? atoi(v + 11) : -1;

			assert_true(key >= 1 && key <= 200);
			if (ver <= last[key])
				continue; /* a re-delivery of the killed replica's batch */
			if (ver != last[key] + 1)
				fail_msg("key %d: version %d after %d", key, ver, last[key]);
			last[key] = ver;
		}
	}
	/* the survivors and the writer shared the work: each replica published */
	for (int i = 0; i < 3; i++)
		assert_true(t_log_count(&T[i], "committed: ") > 0);
	print_message("3 replicas: %zu records for %zu events, %zu re-delivered from the killed batch\n", n, want,
	    dups);
	t_msgs_free(m, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_unmigrated_table, teardown),
		cmocka_unit_test_teardown(test_happy_path, teardown),
		cmocka_unit_test_teardown(test_broker_down, teardown),
		cmocka_unit_test_teardown(test_broker_down_sigterm, teardown),
		cmocka_unit_test_teardown(test_poison_dead_letter, teardown),
		cmocka_unit_test_teardown(test_producer_fatal_error, teardown),
		cmocka_unit_test_teardown(test_replicas_kill9, teardown),
	};

	return T_RUN_TESTS(tests);
}
