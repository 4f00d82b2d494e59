/*
 * The protocol against a live server: streamed in-progress transactions
 * (with rolled-back savepoints, whole rollbacks and a crash mid-stream),
 * logical decoding messages as events (in such savepoints too), ALTER
 * TABLE on the outbox while outboxd runs, and values from 1 byte to 64 MiB
 * passed byte-exact.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

static double
metric_now(int port, const char *name)
{
	static char body[1 << 16];

	if (t_http_get(port, "/metrics", body, sizeof(body)) != 200)
		fail_msg("could not scrape /metrics");
	return t_metric(body, name);
}

/* Waits up to timeout_ms for metric name to be above min; returns its value. */
static double
wait_metric_above(int port, const char *name, double min, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;
	double v;

	while ((v = metric_now(port, name)) <= min && t_now_ms() < deadline)
		usleep(100000);
	return v;
}

/* The "n" of a payload {"n": N, ...}, or -1. */
static long
payload_n(const struct t_msg *m)
{
	const char *p = m->value ? strstr(m->value, "\"n\":") : NULL;

	return p ? strtol(p + 4, NULL, 10) : -1;
}

/* Inserts rows n = from..to of aggregate type at on c, keys k0..k9, ~400-byte payloads. */
static void
insert_rows(PGconn *c, const char *at, int from, int to)
{
	t_exec(c,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || (i %% 10), 'e', jsonb_build_object('n', i, 'pad', repeat('p', 400)) "
	    "FROM generate_series(%d, %d) i",
	    at, from, to);
}

/*
 * Checks that topic holds exactly the rows whose n is in the ranges (pairs,
 * terminated by 0), each at least once, nothing else, and that per key the
 * first occurrences come in increasing n.
 */
static void
expect_rows(const char *topic, const int *ranges, size_t want)
{
	struct t_msg *m;
	size_t n = t_consume(R.b.bootstrap, topic, want, 30000, &m);
	char *seen = calloc(200000, 1);
	long last[10];
	size_t distinct = 0;

	for (int i = 0; i < 10; i++)
		last[i] = -1;
	for (size_t i = 0; i < n; i++) {
		long v = payload_n(&m[i]);
		int ok = 0;

		for (const int *r = ranges; r[0] != 0; r += 2)
			ok |= v >= r[0] && v <= r[1];
		if (!ok)
			fail_msg("%s: unexpected record n=%ld (%s)", topic, v, m[i].value ? m[i].value : "null");
		if (!seen[v]) {
			int k = atoi(m[i].key + 1);

			seen[v] = 1;
			distinct++;
			if (v < last[k])
				fail_msg("%s: key %s out of order: n=%ld after n=%ld", topic, m[i].key, v,
				    last[k]);
			last[k] = v;
		}
	}
	if (distinct != want)
		fail_msg("%s: %zu distinct events of %zu (read %zu)", topic, distinct, want, n);
	t_msgs_free(m, n);
	free(seen);
}

/*
 * The start line of a relay with streaming = on: the pgoutput protocol of
 * the server's major and, from 14, streaming; on 13, whose pgoutput cannot
 * stream, the warning that says so and no streaming.  Returns 1 when the
 * relay streams.
 */
static int
expect_streaming_start(void)
{
	int major = t_pgmajor();
	char line[128];

	if (major < 14) {
		snprintf(line, sizeof(line), "pgoutput protocol %d, status every", t_pgproto(major));
		if (t_log_count(&R, "[source] streaming = on needs PostgreSQL 14 or later") != 1 ||
		    t_log_count(&R, line) != 1) {
			t_log_dump(&R);
			fail_msg("expected the streaming warning and \"%s\"", line);
		}
		return 0;
	}
	snprintf(line, sizeof(line), "pgoutput protocol %d, streaming in-progress transactions", t_pgproto(major));
	if (t_log_count(&R, line) != 1) {
		t_log_dump(&R);
		fail_msg("expected \"%s\"", line);
	}
	return 1;
}

/*
 * messages = on below 14, whose pgoutput has no logical decoding messages:
 * outboxd refuses to start, with one line and exit 1, and creates no slot.
 * Call it with R configured.  Returns 1 when the server has messages and
 * the test goes on; 0 after asserting the refusal.
 */
static int
messages_apply(void)
{
	int st;

	if (t_pg_has(14, "logical decoding messages as events"))
		return 1;
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 20000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 ||
	    t_log_count(&R, "[source] messages = on needs PostgreSQL 14 or later (server is ") != 1) {
		t_log_dump(&R);
		fail_msg("expected exit 1 refusing messages = on below 14 (status %d)", st);
	}
	R.pid = 0;
	{
		char *n = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'",
		    R.slot);

		assert_string_equal(n, "0");
		free(n);
	}
	return 0;
}

static void
expect_nothing(const char *topic)
{
	struct t_msg *m;
	size_t n = t_consume(R.b.bootstrap, topic, 1, 2000, &m);

	if (n != 0)
		fail_msg("%s: %zu record(s) published for a transaction that rolled back", topic, n);
	t_msgs_free(m, n);
}

/*
 * streaming = on with logical_decoding_work_mem at its 64 kB minimum: a
 * 1 MB transaction reaches outboxd before it commits; its events leave
 * only at Stream Commit, a rolled-back savepoint's rows never, a rolled-back
 * transaction's never; the slot does not follow the WAL end while it is in
 * progress; kill -9 in the middle of one loses nothing.
 */
static void
test_streaming(void **state)
{
	static const int big[] = { 1, 1000, 2001, 2500, 3001, 4000, 0 };
	static const int crash[] = { 1, 1500, 0 };
	PGconn *c1, *c2;
	int port;
	uint64_t before;

	(void)state;
	t_relay_setup(&R, "stream", 0);
	t_exec(R.pg, "ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", R.db);
	t_relay_config(&R, "[source]\nstreaming = on\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);
	if (!expect_streaming_start()) {
		t_pg_has(14, "streamed in-progress transactions");
		return;
	}

	c1 = t_pg(&R.st, R.db, 0);
	c2 = t_pg(&R.st, R.db, 0);
	t_exec(c1, "BEGIN");
	insert_rows(c1, "big", 1, 1000);
	t_exec(c1, "SAVEPOINT s1");
	insert_rows(c1, "big", 100001, 100500); /* rolled back below */
	t_exec(c1, "ROLLBACK TO SAVEPOINT s1");
	t_exec(c1, "SAVEPOINT s2");
	insert_rows(c1, "big", 2001, 2500);
	t_exec(c1, "RELEASE SAVEPOINT s2");
	insert_rows(c1, "big", 3001, 4000);

	t_exec(c2, "BEGIN");
	insert_rows(c2, "gone", 1, 1000);

	/* the server streamed the open transactions: outboxd holds their rows */
	if (wait_metric_above(port, "outboxd_stream_buffer_bytes", 0, 15000) <= 0)
		fail_msg("nothing was streamed (outboxd_stream_buffer_bytes stayed 0)");
	/* a small transaction committing meanwhile goes out and is confirmed at once */
	before = t_slot_confirmed(&R);
	insert_rows(R.pg, "small", 1, 1);
	{
		static const int one[] = { 1, 1, 0 };

		expect_rows("outbox.event.small", one, 1);
	}
	expect_nothing("outbox.event.big");
	{
		int64_t deadline = t_now_ms() + 10000;

		while (t_slot_confirmed(&R) <= before && t_now_ms() < deadline)
			usleep(100000);
		assert_true(t_slot_confirmed(&R) > before);
	}
	/* docs/internals/design.md, invariant 5: while they are in progress the slot must not follow the WAL end
	 * (a WAL switch moves the flushed end past the small commit, deterministically) */
	insert_rows(c2, "gone", 1001, 1200);
	free(t_query1(R.pg, "SELECT pg_switch_wal()"));
	if (t_wait_confirmed_current(&R, 3500) != 0) {
		t_log_dump(&R);
		fail_msg("the slot followed the WAL end while streamed transactions were open");
	}

	t_exec(c2, "ROLLBACK");
	t_exec(c1, "COMMIT");
	expect_rows("outbox.event.big", big, 2500);
	expect_nothing("outbox.event.gone");
	if (wait_metric_above(port, "outboxd_stream_aborted_events_total", 0, 5000) <= 0)
		fail_msg("no buffered event was discarded by a Stream Abort");
	/* the seq header numbers the 2,500 surviving events of the transaction */
	{
		struct t_msg *m;
		size_t n = t_consume(R.b.bootstrap, "outbox.event.big", 2500, 10000, &m);
		char *seen = calloc(2500, 1);

		for (size_t i = 0; i < n; i++) {
			long s = strtol(t_msg_header(&m[i], "seq"), NULL, 10);

			assert_true(s >= 0 && s < 2500);
			seen[s] = 1;
		}
		for (int i = 0; i < 2500; i++)
			if (!seen[i])
				fail_msg("seq %d missing", i);
		free(seen);
		t_msgs_free(m, n);
	}

	/* kill -9 while a streamed transaction is in progress: the server streams it again */
	t_exec(c1, "BEGIN");
	insert_rows(c1, "crash", 1, 1000);
	if (wait_metric_above(port, "outboxd_stream_buffer_bytes", 0, 15000) <= 0)
		fail_msg("the second transaction was not streamed");
	kill(R.pid, SIGKILL);
	t_wait(R.pid, 10000);
	R.pid = 0;
	insert_rows(c1, "crash", 1001, 1500);
	t_relay_start(&R, NULL, 1);
	t_exec(c1, "COMMIT");
	expect_rows("outbox.event.crash", crash, 1500);
	PQfinish(c1);
	PQfinish(c2);
	assert_int_equal(t_wait_confirmed_current(&R, 20000), 1);
}

/*
 * Liveness during an outage that begins at a large Stream Commit: the
 * rows wait on the in-flight caps, yet the loop keeps turning (/healthz
 * 200 past its 30 s staleness bound, the same walsender throughout, so
 * status updates flowed) and SIGTERM ends it within the drain deadline;
 * after the outage every event is published.
 */
static void
test_outage_at_large_commit_stays_live(void **state)
{
	static const int warm[] = { 5000, 5000, 0 };
	static const int all[] = { 1, 1000, 0 };
	char body[4096], *pid_before, *pid_after;
	int port, st;
	int64_t t0;
	PGconn *c;

	(void)state;
	t_relay_setup(&R, "live", 0);
	t_exec(R.pg, "ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", R.db);
	t_relay_config(&R, "[source]\nstreaming = on\n[delivery]\nmax_inflight = 50\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);
	insert_rows(R.pg, "livewarm", 5000, 5000);
	expect_rows("outbox.event.livewarm", warm, 1);
	pid_before = t_query1(R.pg, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '%s'",
	    R.slot);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	c = t_pg(&R.st, R.db, 0);
	t_exec(c, "BEGIN");
	insert_rows(c, "live", 1, 1000);
	t_exec(c, "COMMIT");
	PQfinish(c);
	t0 = t_now_ms();
	while (t_now_ms() - t0 < 40000) {
		int code = t_http_get(port, "/healthz", body, sizeof(body));

		if (code != 200) {
			t_log_dump(&R);
			fail_msg("/healthz answered %d after %lld ms of the outage", code,
			    (long long)(t_now_ms() - t0));
		}
		usleep(2000000);
	}
	pid_after = t_query1(R.pg, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '%s'",
	    R.slot);
	assert_string_equal(pid_before, pid_after);
	t0 = t_now_ms();
	st = t_relay_signal(&R, SIGTERM, 45000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		t_log_dump(&R);
	assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_true(t_now_ms() - t0 < 40000);
	assert_int_equal(t_log_count(&R, "unacknowledged after 30 s"), 1);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	t_relay_start(&R, NULL, 1);
	expect_rows("outbox.event.live", all, 1000);
	assert_int_equal(t_wait_confirmed_current(&R, 20000), 1);
	free(pid_before);
	free(pid_after);
}

/*
 * Invariant 4 with streaming on: a streamed transaction whose events the
 * broker cannot take is never confirmed, while the stream stays up.
 */
static void
test_streaming_broker_down(void **state)
{
	static const int warm[] = { 5000, 5000, 0 };
	PGconn *c;
	char *commit_lsn;
	int64_t t0;

	(void)state;
	t_relay_setup(&R, "streamdown", 0);
	t_exec(R.pg, "ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", R.db);
	t_relay_config(&R, "[source]\nstreaming = on\n");
	t_relay_start(&R, NULL, 1);
	insert_rows(R.pg, "sdwarm", 5000, 5000); /* warm up: the producer knows the brokers */
	expect_rows("outbox.event.sdwarm", warm, 1);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	c = t_pg(&R.st, R.db, 0);
	t_exec(c, "BEGIN");
	insert_rows(c, "sd", 1, 1000);
	t_exec(c, "COMMIT");
	commit_lsn = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	t0 = t_now_ms();
	while (t_now_ms() - t0 < 6000) {
		assert_true(t_slot_confirmed(&R) < t_lsn(commit_lsn));
		usleep(250000);
	}
	assert_int_equal(t_log_count(&R, "retrying"), 0);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	{
		static const int all[] = { 1, 1000, 0 };

		expect_rows("outbox.event.sd", all, 1000);
	}
	assert_int_equal(t_wait_confirmed_current(&R, 20000), 1);
	free(commit_lsn);
	PQfinish(c);
}

/*
 * A streamed transaction larger than [source] stream_buffer: outboxd
 * reconnects with streaming off, the server decodes it whole, nothing lost.
 */
static void
test_stream_buffer_overflow(void **state)
{
	static const int all[] = { 1, 2000, 0 };
	PGconn *c;

	(void)state;
	if (!t_pg_has(14, "a streamed transaction larger than stream_buffer"))
		skip();
	t_relay_setup(&R, "overflow", 0);
	t_exec(R.pg, "ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", R.db);
	t_relay_config(&R, "[source]\nstreaming = on\nstream_buffer = 256KiB\n");
	t_relay_start(&R, NULL, 1);
	c = t_pg(&R.st, R.db, 0);
	t_exec(c, "BEGIN");
	insert_rows(c, "over", 1, 1000);
	{
		int64_t deadline = t_now_ms() + 20000;

		while (t_log_count(&R, "reconnecting with streaming off") == 0 && t_now_ms() < deadline)
			usleep(100000);
		if (t_log_count(&R, "reconnecting with streaming off") == 0) {
			t_log_dump(&R);
			fail_msg("the stream buffer did not overflow");
		}
	}
	insert_rows(c, "over", 1001, 2000);
	t_exec(c, "COMMIT");
	expect_rows("outbox.event.over", all, 2000);
	assert_int_equal(t_wait_confirmed_current(&R, 20000), 1);
	PQfinish(c);
}

/*
 * [source] messages = on: transactional pg_logical_emit_message calls with
 * the prefix become events in their place in the transaction; rolled back,
 * non-transactional (refused, counted), other prefixes and bad content
 * (on_error) are handled; a streamed transaction's messages wait for its
 * commit.
 */
static void
test_messages(void **state)
{
	struct t_msg *m;
	size_t n;
	int port;

	(void)state;
	t_relay_setup(&R, "msgs", 0);
	t_exec(R.pg, "ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", R.db);
	t_relay_config(&R, "[source]\nmessages = on\nstreaming = on\n[delivery]\non_error = dead_letter\n");
	if (!messages_apply())
		return;
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);

	t_exec(R.pg, "BEGIN");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('m', 'k1', 'row', '{\"n\": 1}')");
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(true, 'outboxd', "
	    "'{\"id\": \"6f1c1f7e-0000-4000-8000-000000000002\", \"aggregatetype\": \"m\", "
	    "\"aggregateid\": \"k1\", \"type\": \"msg\", \"payload\": {\"n\": 2}}')");
	t_exec(R.pg, "SELECT pg_logical_emit_message(true, 'other', '{\"aggregatetype\": \"m\"}')");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('m', 'k1', 'row', '{\"n\": 3}')");
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(true, 'outboxd', "
	    "'{\"id\": \"6f1c1f7e-0000-4000-8000-000000000004\", \"aggregatetype\": \"m\", "
	    "\"aggregateid\": \"k1\", \"type\": \"msg\", \"payload\": \"plain text, n: 4\"}')");
	t_exec(R.pg, "COMMIT");
	t_exec(R.pg, "BEGIN");
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(true, 'outboxd', "
	    "'{\"id\": \"6f1c1f7e-0000-4000-8000-000000000099\", \"aggregatetype\": \"m\", "
	    "\"aggregateid\": \"k1\", \"type\": \"msg\", \"payload\": {\"n\": 99}}')");
	t_exec(R.pg, "ROLLBACK");
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(false, 'outboxd', "
	    "'{\"id\": \"6f1c1f7e-0000-4000-8000-000000000098\", \"aggregatetype\": \"m\", "
	    "\"aggregateid\": \"k1\", \"type\": \"msg\", \"payload\": {\"n\": 98}}')");
	t_exec(R.pg, "SELECT pg_logical_emit_message(true, 'outboxd', 'not json')");

	n = t_consume(R.b.bootstrap, "outbox.event.m", 4, 20000, &m);
	assert_int_equal(n, 4);
	assert_string_equal(m[0].value, "{\"n\": 1}");
	assert_string_equal(m[1].value, "{\"n\":2}");
	assert_string_equal(t_msg_header(&m[1], "id"), "6f1c1f7e-0000-4000-8000-000000000002");
	assert_string_equal(t_msg_header(&m[1], "type"), "msg");
	assert_string_equal(m[1].key, "k1");
	assert_string_equal(t_msg_header(&m[1], "seq"), "1");
	assert_string_equal(m[2].value, "{\"n\": 3}");
	assert_string_equal(m[3].value, "plain text, n: 4");
	assert_string_equal(t_msg_header(&m[3], "lsn"), t_msg_header(&m[0], "lsn"));
	t_msgs_free(m, n);

	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 20000, &m);
	assert_int_equal(n, 1);
	assert_non_null(strstr(t_msg_header(&m[0], "error"), "message content is not JSON"));
	t_msgs_free(m, n);
	if (wait_metric_above(port, "outboxd_messages_refused_total", 0, 5000) != 1)
		fail_msg("the non-transactional message was not counted as refused");
	assert_int_equal(t_log_count(&R, "non-transactional message with prefix 'outboxd'"), 1);

	/* a streamed transaction's messages: in order with its rows, at its commit */
	t_exec(R.pg, "BEGIN");
	insert_rows(R.pg, "s", 1, 300);
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(true, 'outboxd', "
	    "json_build_object('id', gen_random_uuid(), 'aggregatetype', 's', 'aggregateid', 'k3', "
	    "'type', 'msg', 'payload', json_build_object('n', 301))::text)");
	insert_rows(R.pg, "s", 302, 600);
	if (wait_metric_above(port, "outboxd_stream_buffer_bytes", 0, 15000) <= 0)
		fail_msg("nothing was streamed");
	t_exec(R.pg, "COMMIT");
	{
		static const int all[] = { 1, 600, 0 };

		expect_rows("outbox.event.s", all, 600);
	}
}

/*
 * A step of a savepoint scenario, run on one connection: a statement, an
 * event (an outbox row or a logical decoding message, published unless it
 * is written inside a savepoint that is rolled back), or filler rows in an
 * unpublished table, past logical_decoding_work_mem, so that the server
 * streams the open transaction at that point ('F': and the test waits
 * until it did, the scenario proving nothing otherwise).
 */
struct sp_step {
	char kind;        /* 's' statement, 'r' outbox row, 'm' message, 'f'/'F' filler */
	const char *text; /* the statement; for an event or 'F', where it is written */
	int n;            /* an event's number: the last digits of its id */
	const char *key;  /* an event's aggregateid */
	int kept;         /* an event that must be published */
};

#define SP_SQL(s)                                                                                                 \
	{                                                                                                         \
		's', s, 0, NULL, 0                                                                                \
	}
#define SP_ROW(n, key, kept, where)                                                                               \
	{                                                                                                         \
		'r', where, n, key, kept                                                                          \
	}
#define SP_MSG(n, key, kept, where)                                                                               \
	{                                                                                                         \
		'm', where, n, key, kept                                                                          \
	}
#define SP_FILL                                                                                                   \
	{                                                                                                         \
		'f', NULL, 0, NULL, 0                                                                             \
	}
#define SP_STREAMED(where)                                                                                        \
	{                                                                                                         \
		'F', where, 0, NULL, 0                                                                            \
	}
#define SP_EVENT(s) ((s)->kind == 'r' || (s)->kind == 'm')

static PGconn *SPC; /* the scenario's connection */

static int
sp_teardown(void **state)
{
	if (SPC != NULL)
		PQfinish(SPC);
	SPC = NULL;
	return teardown(state);
}

static void
sp_id(char *buf, size_t len, int n)
{
	snprintf(buf, len, "6f1c1f7e-0000-4000-8000-%012d", n);
}

/* The server's count of streamed blocks for the relay's slot. */
static long
slot_stream_count(void)
{
	char *v = t_query1(R.pg,
	    "SELECT coalesce((SELECT stream_count FROM pg_stat_replication_slots "
	    "WHERE slot_name = '%s'), 0)",
	    R.slot);
	long n = atol(v);

	free(v);
	return n;
}

static void
sp_run(const char *at, const struct sp_step *steps, size_t nsteps)
{
	PGconn *c = SPC = t_pg(&R.st, R.db, 0);

	for (size_t i = 0; i < nsteps; i++) {
		const struct sp_step *s = &steps[i];
		char id[40];

		sp_id(id, sizeof(id), s->n);
		if (s->kind == 's') {
			t_exec(c, "%s", s->text);
		} else if (s->kind == 'r') {
			t_exec(c,
			    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
			    "VALUES ('%s', '%s', '%s', 'row', '{\"n\": %d}')",
			    id, at, s->key, s->n);
		} else if (s->kind == 'm') {
			t_exec(c,
			    "SELECT pg_logical_emit_message(true, 'outboxd', '{\"id\": \"%s\", "
			    "\"aggregatetype\": \"%s\", \"aggregateid\": \"%s\", \"type\": \"msg\", "
			    "\"payload\": {\"n\": %d}}')",
			    id, at, s->key, s->n);
		} else {
			/* ~200 kB against 64 kB: the server streams the transaction as it
			 * decodes these, before anything that comes after them */
			long before = s->kind == 'F' ? slot_stream_count() : 0;
			int64_t deadline = t_now_ms() + 15000;

			t_exec(c, "INSERT INTO filler SELECT repeat('f', 500) FROM generate_series(1, 400)");
			while (s->kind == 'F' && slot_stream_count() <= before && t_now_ms() < deadline)
				usleep(100000);
			if (s->kind == 'F' && slot_stream_count() <= before) {
				t_log_dump(&R);
				fail_msg("the server did not stream the transaction %s", s->text);
			}
		}
	}
	PQfinish(c);
	SPC = NULL;
}

/*
 * Once outboxd confirmed everything, the topic must hold exactly the kept
 * events of steps, each once, per key in the order written; the failure
 * names every record published that was rolled back and every one missing.
 */
static void
sp_expect(const char *at, const struct sp_step *steps, size_t nsteps)
{
	char topic[64], bad[4096] = "", missing[4096] = "", order[512] = "";
	size_t n, want = 0, distinct = 0;
	struct t_msg *m;
	long *first;

	snprintf(topic, sizeof(topic), "outbox.event.%s", at);
	if (t_wait_confirmed_current(&R, 30000) != 1) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm the transaction");
	}
	first = calloc(nsteps, sizeof(*first));
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	for (size_t i = 0; i < nsteps; i++)
		first[i] = -1;
	for (size_t i = 0; i < n; i++) {
		const char *id = t_msg_header(&m[i], "id");
		size_t j;

		for (j = 0; j < nsteps; j++) {
			char sid[40];

			sp_id(sid, sizeof(sid), steps[j].n);
			if (SP_EVENT(&steps[j]) && id != NULL && strcmp(id, sid) == 0)
				break;
		}
		if (j == nsteps || !steps[j].kept) {
			snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad), "\n  id %s (%s %s)",
			    id ? id : "(none)",
			    j == nsteps              ? "unknown" :
			        steps[j].kind == 'r' ? "row" :
			                               "message",
			    j == nsteps ? (m[i].value ? m[i].value : "null") : steps[j].text);
			continue;
		}
		if (first[j] < 0) {
			first[j] = (long)i;
			distinct++;
		}
	}
	for (size_t j = 0; j < nsteps; j++) {
		char sid[40];

		if (!SP_EVENT(&steps[j]) || !steps[j].kept)
			continue;
		want++;
		sp_id(sid, sizeof(sid), steps[j].n);
		if (first[j] < 0)
			snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "\n  id %s (%s %s)",
			    sid, steps[j].kind == 'r' ? "row" : "message", steps[j].text);
	}
	/* per key, in the order written */
	for (size_t j = 0; j < nsteps && order[0] == '\0'; j++) {
		for (size_t k = j + 1; k < nsteps && order[0] == '\0'; k++) {
			if (first[j] >= 0 && first[k] >= 0 && strcmp(steps[j].key, steps[k].key) == 0 &&
			    first[k] < first[j])
				snprintf(order, sizeof(order),
				    "\nkey %s out of order: n=%d (%s) came before "
				    "n=%d (%s)",
				    steps[j].key, steps[k].n, steps[k].text, steps[j].n, steps[j].text);
		}
	}
	t_msgs_free(m, n);
	free(first);
	if (bad[0] != '\0' || missing[0] != '\0' || n != want || order[0] != '\0')
		fail_msg("%s: %zu record(s) published, %zu distinct of the %zu expected events;\n"
		         "published although rolled back:%s\nmissing:%s%s",
		    topic, n, distinct, want, bad[0] ? bad : " none", missing[0] ? missing : " none", order);
}

/*
 * A relay with messages = on and streaming = on, streaming past 64 kB, with
 * an unpublished filler table.  Returns 0 below 14, after asserting that
 * outboxd refuses messages = on there.
 */
static int
sp_setup(const char *prefix)
{
	t_relay_setup(&R, prefix, 0);
	t_exec(R.pg, "ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", R.db);
	t_exec(R.pg, "CREATE TABLE filler (pad text)");
	t_relay_config(&R, "[source]\nmessages = on\nstreaming = on\n");
	if (!messages_apply())
		return 0;
	t_relay_start(&R, NULL, 1);
	return expect_streaming_start();
}

/*
 * messages = on with streaming = on: nothing written inside a savepoint that
 * is rolled back is published, a message no more than a row, while the
 * server has already streamed it when the rollback comes (pgoutput sends
 * such a message under the top-level xid, unlike the rows of the
 * subtransaction, and the Stream Abort names the subtransaction only);
 * what is written before it, in a released savepoint and after it is
 * published, per key in order.
 */
static void
test_streaming_message_savepoint(void **state)
{
	static const struct sp_step steps[] = {
		SP_SQL("BEGIN"),
		SP_ROW(101, "k1", 1, "before the savepoints"),
		SP_MSG(102, "k2", 1, "before the savepoints"),
		SP_ROW(103, "k1", 1, "before the savepoints"),
		SP_MSG(104, "k1", 1, "before the savepoints"),
		SP_SQL("SAVEPOINT s1"),
		SP_ROW(901, "k1", 0, "inside s1, rolled back"),
		SP_MSG(902, "k1", 0, "inside s1, rolled back"),
		SP_MSG(903, "k2", 0, "inside s1, rolled back"),
		SP_STREAMED("while s1 was open"),
		SP_MSG(904, "k2", 0, "inside s1, rolled back"),
		SP_SQL("ROLLBACK TO SAVEPOINT s1"),
		SP_SQL("SAVEPOINT s2"),
		SP_MSG(201, "k2", 1, "inside s2, released"),
		SP_ROW(202, "k1", 1, "inside s2, released"),
		SP_FILL,
		SP_MSG(203, "k1", 1, "inside s2, released"),
		SP_SQL("RELEASE SAVEPOINT s2"),
		SP_MSG(301, "k1", 1, "after the rollback"),
		SP_ROW(302, "k2", 1, "after the rollback"),
		SP_MSG(303, "k2", 1, "after the rollback"),
		SP_SQL("COMMIT"),
	};
	size_t nsteps = sizeof(steps) / sizeof(steps[0]);

	(void)state;
	if (!sp_setup("msgsp"))
		return;
	sp_run("sp", steps, nsteps);
	sp_expect("sp", steps, nsteps);
	/* the savepoint could not be placed: decoded again whole, streaming off */
	assert_int_equal(t_log_count(&R, "which pgoutput does not tag with their subtransaction"), 1);
}

/* The same with the rolled-back savepoint nested in one that is released. */
static void
test_streaming_message_nested_savepoint(void **state)
{
	static const struct sp_step steps[] = {
		SP_SQL("BEGIN"),
		SP_MSG(101, "k1", 1, "before the savepoints"),
		SP_SQL("SAVEPOINT s1"),
		SP_ROW(102, "k1", 1, "inside s1, released"),
		SP_SQL("SAVEPOINT s2"),
		SP_MSG(901, "k1", 0, "inside s2 (in s1), rolled back"),
		SP_ROW(902, "k2", 0, "inside s2 (in s1), rolled back"),
		SP_STREAMED("while s2 was open"),
		SP_MSG(903, "k2", 0, "inside s2 (in s1), rolled back"),
		SP_SQL("ROLLBACK TO SAVEPOINT s2"),
		SP_MSG(103, "k1", 1, "inside s1 after the rollback of s2"),
		SP_SQL("RELEASE SAVEPOINT s1"),
		SP_MSG(104, "k2", 1, "after the savepoints"),
		SP_SQL("COMMIT"),
	};
	size_t nsteps = sizeof(steps) / sizeof(steps[0]);

	(void)state;
	if (!sp_setup("msgspn"))
		return;
	sp_run("spn", steps, nsteps);
	sp_expect("spn", steps, nsteps);
	/* the savepoint could not be placed: decoded again whole, streaming off */
	assert_int_equal(t_log_count(&R, "which pgoutput does not tag with their subtransaction"), 1);
}

/*
 * Logical decoding messages as the whole outbox: no table at all, an
 * empty publication.
 */
static void
test_messages_without_table(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "msgonly", 1);
	t_relay_config(&R, "[source]\nmessages = on\nmessage_prefix = orders\n");
	{
		/* check agrees: no table is fine with messages = on (which needs 14) */
		char *argv[] = { getenv("OBX_OUTBOXD"), "check", "-c", R.conf, NULL };
		char log[] = "/tmp/obx-check-msgonly.log";
		pid_t pid = t_spawn(argv, log);
		int st = t_wait(pid, 30000);
		int has = t_pgmajor() >= 14;
		char cmd[256];

		snprintf(cmd, sizeof(cmd), "grep -q '%s' %s",
		    has ? "logical decoding messages with prefix" :
		          "FAIL messages: \\[source\\] messages = on needs PostgreSQL 14 or later",
		    log);
		if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != (has ? 0 : 1) || system(cmd) != 0) {
			snprintf(cmd, sizeof(cmd), "cat %s", log);
			(void)system(cmd);
			fail_msg("outboxd check %s a messages-only set-up (status %d)",
			    has ? "refused" : "did not refuse", st);
		}
		unlink(log);
	}
	if (!messages_apply())
		return;
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "publishing logical decoding messages with prefix 'orders' only"), 1);
	t_exec(R.pg, "BEGIN");
	t_exec(R.pg, "CREATE TABLE orders (id int)");
	t_exec(R.pg, "INSERT INTO orders VALUES (1)");
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(true, 'orders', "
	    "'{\"id\": \"1\", \"aggregatetype\": \"order\", \"aggregateid\": \"o-1\", \"type\": \"created\", "
	    "\"payload\": {\"total\": 12.5}}')");
	t_exec(R.pg, "COMMIT");
	n = t_consume(R.b.bootstrap, "outbox.event.order", 1, 20000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(m[0].value, "{\"total\":12.5}");
	assert_string_equal(m[0].key, "o-1");
	t_msgs_free(m, n);
	assert_int_equal(t_wait_confirmed_current(&R, 20000), 1);
}

/*
 * ALTER TABLE on the outbox while outboxd runs: the server re-sends the
 * Relation message and the mapping follows.  An added column and a dropped
 * unmapped one change nothing; a renamed mapped column follows on_error.
 */
static void
test_schema_changes(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "alter", 0);
	t_relay_config(&R, "[outbox]\nheader.note = note\n");
	t_exec(R.pg, "ALTER TABLE outbox ADD COLUMN note text");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 1}', 'first')");
	t_exec(R.pg, "ALTER TABLE outbox ADD COLUMN extra int DEFAULT 7, ADD COLUMN more text");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note, more) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 2}', 'second', 'x')");
	t_exec(R.pg, "ALTER TABLE outbox DROP COLUMN more");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 3}', 'third')");
	/* the same in one transaction with the rows around it */
	t_exec(R.pg, "BEGIN");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 4}', 'fourth')");
	t_exec(R.pg, "ALTER TABLE outbox DROP COLUMN extra");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, note) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 5}', 'fifth')");
	t_exec(R.pg, "COMMIT");
	n = t_consume(R.b.bootstrap, "outbox.event.a", 5, 20000, &m);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < n; i++) {
		static const char *notes[] = { "first", "second", "third", "fourth", "fifth" };

		assert_int_equal(payload_n(&m[i]), (long)i + 1);
		assert_string_equal(t_msg_header(&m[i], "note"), notes[i]);
	}
	t_msgs_free(m, n);

	/* a renamed mapped column: the unmapped header column was fine, "type" is not */
	t_exec(R.pg, "ALTER TABLE outbox RENAME COLUMN type TO kind");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, kind, payload) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 6}')");
	st = t_wait(R.pid, 20000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || t_log_count(&R, "'type'") < 1) {
		t_log_dump(&R);
		fail_msg("expected on_error = stop to end the run naming column 'type' (status %d)", st);
	}
	R.pid = 0;
	/* under dead_letter the row goes aside and the next ones flow once it is renamed back */
	t_relay_config(&R, "[outbox]\nheader.note = note\n[delivery]\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg, "ALTER TABLE outbox RENAME COLUMN kind TO type");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('a', 'k', 'e', '{\"n\": 7}')");
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 20000, &m);
	assert_int_equal(n, 1);
	assert_non_null(strstr(m[0].value, "\"kind\""));
	t_msgs_free(m, n);
	n = t_consume(R.b.bootstrap, "outbox.event.a", 6, 20000, &m);
	assert_true(n >= 6); /* n = 5 may come again: the stop did not confirm it */
	assert_int_equal(payload_n(&m[n - 1]), 7);
	t_msgs_free(m, n);
	assert_int_equal(t_wait_confirmed_current(&R, 20000), 1);
}

/*
 * Values pass byte-exact: the record value equals the server's own text of
 * the payload, from 1 byte to 80 MiB (TOASTed), with escapes and non-BMP
 * characters; an empty string is not NULL (tombstone).  The in-flight byte
 * bound keeps its default (4 MiB), so the 80 MiB record is larger than both
 * it and the producer queue's fixed share (64 MiB): the queue must be sized
 * from message.max.bytes, else the record is refused as "queue full" for ever.
 */
static void
test_values(void **state)
{
	static const char *payloads[] = {
		"'1'",
		"'\"\"'",
		"'{\"s\": \"tab\\tnl\\nquote\\\"bs\\\\ \\u00e9 \\u20ac \\ud83d\\ude00 \\ud834\\udd1e\"}'",
		"'[\"caf\u00e9\", \"\U0001F600\", \"\"]'",
		"NULL",
		"jsonb_build_object('blob', (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 2700000) i))",
	};
	size_t np = sizeof(payloads) / sizeof(payloads[0]);
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "values", 0);
	/* text payloads too, where '' and NULL differ */
	t_exec(R.pg, "ALTER TABLE outbox ADD COLUMN body text");
	t_relay_config(&R, "[kafka]\nmessage.max.bytes = 200000000\n");
	t_relay_start(&R, NULL, 1);
	for (size_t i = 0; i < np; i++) {
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('v%zu', 'k', 'e', %s)",
		    i, payloads[i]);
	}
	for (size_t i = 0; i < np; i++) {
		char topic[32], *want;

		snprintf(topic, sizeof(topic), "outbox.event.v%zu", i);
		n = t_consume(R.b.bootstrap, topic, 1, 60000, &m);
		assert_int_equal(n, 1);
		want = t_query1(R.pg,
		    "SELECT coalesce(payload::text, '<null>') FROM outbox "
		    "WHERE aggregatetype = 'v%zu'",
		    i);
		if (strcmp(want, "<null>") == 0) {
			assert_null(m[0].value); /* NULL payload: a tombstone */
		} else {
			assert_non_null(m[0].value);
			if (m[0].len != strlen(want) || memcmp(m[0].value, want, m[0].len) != 0)
				fail_msg("%s: %zu bytes differ from the server's %zu", topic, m[0].len,
				    strlen(want));
		}
		if (i == np - 1 && m[0].len < 80u << 20)
			fail_msg("the large payload is only %zu bytes", m[0].len);
		free(want);
		t_msgs_free(m, n);
	}

	/* the empty string and NULL as text payloads */
	t_relay_signal(&R, SIGTERM, 20000);
	R.pid = 0;
	t_relay_config(&R, "[outbox]\npayload = body\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, body) VALUES "
	    "('t', 'k', 'e', ''), ('t', 'k', 'e', NULL), ('t', 'k', 'e', 'x'), "
	    "('t', 'k', 'e', 'line1' || chr(10) || 'tab' || chr(9) || '\u00e9\U0001F600')");
	n = t_consume(R.b.bootstrap, "outbox.event.t", 4, 20000, &m);
	assert_int_equal(n, 4);
	assert_non_null(m[0].value);
	assert_int_equal(m[0].len, 0);
	assert_null(m[1].value);
	assert_string_equal(m[2].value, "x");
	assert_string_equal(m[3].value, "line1\ntab\t\u00e9\U0001F600");
	t_msgs_free(m, n);
}

/* Waits up to timeout_ms for needle in the outboxd log; fails when it exits first. */
static void
wait_log(struct t_relay *r, const char *needle, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (t_log_count(r, needle) == 0) {
		if (t_now_ms() > deadline || waitpid(r->pid, NULL, WNOHANG) == r->pid) {
			t_log_dump(r);
			fail_msg("no \"%s\" in the outboxd log", needle);
		}
		usleep(20000);
	}
}

/* Stops R's outboxd with SIGTERM; it must exit 0. */
static void
stop_relay(void)
{
	int st = t_relay_signal(&R, SIGTERM, 20000);

	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop with status 0 (wait status %d)", st);
	}
}

/*
 * Inserts one row of aggregate type at whose payload columns hold the same
 * JSON document (with characters outside LATIN1 and backslashes): text t,
 * json j, jsonb payload, and bytea b (NUL, 0xff, a backslash and a quote
 * around the document's UTF-8 bytes); and float8 f = 0.1 + 0.2.
 */
static void
insert_typed_row(const char *at)
{
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, t, j, b, f, "
	    "created_at) SELECT '%s', 'k', 'e', v::jsonb, v, v::json, "
	    "'\\x00ff5c27'::bytea || convert_to(v, 'UTF8') || '\\x5c3030'::bytea, "
	    "0.1::float8 + 0.2::float8, '2026-03-04 05:06:07.089+00' "
	    "FROM (SELECT '{\"s\": \"caf' || chr(233) || ' ' || chr(8364) || ' ' || chr(128512) || "
	    "' \\\\ q\", \"n\": 1.5}' AS v) x",
	    at);
}

/* The record of aggregate type at must carry column col's value, byte for byte, and created_at. */
static void
check_typed_record(const char *at, const char *col)
{
	char topic[64], *want, *hex;
	struct t_msg *m;
	size_t n, len;
	unsigned char bytes[512];

	snprintf(topic, sizeof(topic), "outbox.event.%s", at);
	n = t_consume(R.b.bootstrap, topic, 1, 20000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	if (strcmp(col, "b") == 0) {
		hex = t_query1(R.pg, "SELECT encode(b, 'hex') FROM outbox WHERE aggregatetype = '%s'", at);
		len = strlen(hex) / 2;
		assert_true(len <= sizeof(bytes));
		for (size_t i = 0; i < len; i++)
			bytes[i] = (unsigned char)strtol((char[3]){ hex[2 * i], hex[2 * i + 1], '\0' }, NULL, 16);
		free(hex);
		want = malloc(len + 1);
		assert_non_null(want);
		memcpy(want, bytes, len);
	} else {
		want = t_query1(R.pg, "SELECT %s::text FROM outbox WHERE aggregatetype = '%s'", col, at);
		len = strlen(want);
	}
	assert_non_null(m[0].value);
	if (m[0].len != len || memcmp(m[0].value, want, len) != 0)
		fail_msg("%s (column %s): the record's %zu bytes differ from the server's %zu", topic, col,
		    m[0].len, len);
	/* [outbox] timestamp = created_at, read in ISO form whatever DateStyle says */
	assert_int_equal(m[0].timestamp, 1772600767089LL);
	/* header.f = f: a float8 with every digit, whatever extra_float_digits says */
	assert_non_null(t_msg_header(&m[0], "f"));
	assert_string_equal(t_msg_header(&m[0], "f"), "0.30000000000000004");
	free(want);
	t_msgs_free(m, n);
}

/*
 * A database whose settings change how values are rendered as text:
 * bytea_output = escape, client_encoding = LATIN1, DateStyle = SQL, DMY,
 * extra_float_digits = -3 (legacy applications need such settings).  Every
 * connection of outboxd pins its own, so bytea, text, json and jsonb
 * payloads arrive byte-exact and the created_at timestamp is read: streamed
 * (the walsender renders them), polled, and from the snapshot of pending
 * rows.
 */
static void
test_session_settings(void **state)
{
	static const char *const cols[] = { "b", "t", "j", "payload" };
	char extra[256], at[32];

	(void)state;
	t_relay_setup(&R, "sessset", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	t_exec(R.pg,
	    "ALTER TABLE outbox ADD COLUMN t text, ADD COLUMN j json, ADD COLUMN b bytea, "
	    "ADD COLUMN f float8");
	/* R.pg was opened before: it keeps the defaults the expected values are read with */
	t_exec(R.pg, "ALTER DATABASE %s SET bytea_output = 'escape'", R.db);
	t_exec(R.pg, "ALTER DATABASE %s SET client_encoding = 'LATIN1'", R.db);
	t_exec(R.pg, "ALTER DATABASE %s SET DateStyle = 'SQL, DMY'", R.db);
	t_exec(R.pg, "ALTER DATABASE %s SET extra_float_digits = -3", R.db);

	for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
		snprintf(extra, sizeof(extra),
		    "[outbox]\npayload = %s\ntimestamp = created_at\n"
		    "header.f = f\n",
		    cols[i]);
		t_relay_config(&R, extra);
		t_relay_start(&R, NULL, 1);
		snprintf(at, sizeof(at), "s_%s", cols[i]);
		insert_typed_row(at);
		check_typed_record(at, cols[i]);
		stop_relay();
	}
	t_exec(R.pg, "DELETE FROM outbox");
	for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
		snprintf(extra, sizeof(extra),
		    "[source]\nmode = poll\n[poll]\npoll_interval = 100ms\n"
		    "[outbox]\npayload = %s\ntimestamp = created_at\nheader.f = f\n",
		    cols[i]);
		t_relay_config(&R, extra);
		t_relay_start(&R, NULL, 0);
		wait_log(&R, "polling public.outbox", 20000);
		snprintf(at, sizeof(at), "p_%s", cols[i]);
		insert_typed_row(at);
		check_typed_record(at, cols[i]);
		stop_relay();
	}
	/* a new slot publishes the row pending at its creation from its snapshot */
	t_exec(R.pg, "UPDATE outbox SET published_at = now()");
	insert_typed_row("n_b");
	snprintf(R.slot, sizeof(R.slot), "%.40s_snap", R.db);
	t_relay_config(&R,
	    "[source]\nsnapshot = pending\n[outbox]\npayload = b\ntimestamp = created_at\n"
	    "header.f = f\n");
	t_relay_start(&R, NULL, 1);
	check_typed_record("n_b", "b");
	assert_int_equal(t_log_count(&R, ": publishing the rows of public.outbox"), 1);
	stop_relay();
	t_exec(R.pg, "ALTER DATABASE %s RESET ALL", R.db);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_streaming, teardown),
		cmocka_unit_test_teardown(test_streaming_broker_down, teardown),
		cmocka_unit_test_teardown(test_outage_at_large_commit_stays_live, teardown),
		cmocka_unit_test_teardown(test_stream_buffer_overflow, teardown),
		cmocka_unit_test_teardown(test_messages, teardown),
		cmocka_unit_test_teardown(test_streaming_message_savepoint, sp_teardown),
		cmocka_unit_test_teardown(test_streaming_message_nested_savepoint, sp_teardown),
		cmocka_unit_test_teardown(test_messages_without_table, teardown),
		cmocka_unit_test_teardown(test_schema_changes, teardown),
		cmocka_unit_test_teardown(test_values, teardown),
		cmocka_unit_test_teardown(test_session_settings, teardown),
	};

	/* OBX_TEST_FILTER=PATTERN[,PATTERN...] (* and ? wildcards) runs the matching cases only */
	return T_RUN_TESTS(tests);
}
