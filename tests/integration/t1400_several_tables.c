/*
 * Several outbox tables in one connector (docs/guide/several-tables.md)
 * against the real stack: named tables with their own mappings, in commit
 * order, each record saying its table; a pattern whose table is created,
 * filled and committed in one transaction while outboxd streams, with rows
 * before and after a restart and a table dropped while running (invariant
 * 1, no loss, for the first rows of a new tenant); restart de-duplication
 * across tables; and a publication that could miss a new table refused.
 */
#include <signal.h>
#include <stdbool.h>
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
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	t_relay_teardown(&R);
	return 0;
}

#define OUTBOX_COLUMNS                                                                                            \
	"(id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype varchar(255) NOT NULL, "                   \
	"aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, "                          \
	"created_at timestamptz NOT NULL DEFAULT now())"

/* Fails unless every row of table (schema.table, id column idcol) is among m[0..n), with its table header. */
static void
expect_rows_published_by(const char *table, const char *idcol, const struct t_msg *m, size_t n)
{
	PGresult *res;
	char sql[256];

	snprintf(sql, sizeof(sql), "SELECT %s::text FROM %s", idcol, table);
	res = PQexec(R.pg, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		fail_msg("%s: %s", sql, PQresultErrorMessage(res));
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = 0;

		for (size_t j = 0; j < n; j++)
			if (strcmp(t_msg_header(&m[j], "id"), PQgetvalue(res, i, 0)) == 0) {
				c++;
				if (t_msg_header(&m[j], "table") == NULL ||
				    strcmp(t_msg_header(&m[j], "table"), table) != 0)
					fail_msg("event %s of %s has table header %s", PQgetvalue(res, i, 0),
					    table,
					    t_msg_header(&m[j], "table") ? t_msg_header(&m[j], "table") :
					                                   "(none)");
			}
		if (c == 0) {
			t_log_dump(&R);
			fail_msg("committed event %s of %s never published (%zu records read)",
			    PQgetvalue(res, i, 0), table, n);
		}
	}
	PQclear(res);
}

static void
expect_rows_published(const char *table, const struct t_msg *m, size_t n)
{
	expect_rows_published_by(table, "id", m, n);
}

/* Runs outboxd check on R's configuration; returns its exit status, what it printed in out. */
static int
run_check(char *out, size_t len)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "%s check -c %s 2>&1", getenv("OBX_OUTBOXD"), R.conf);
	return t_run_capture(cmd, out, len);
}

static void
expect_in(const char *out, const char *want)
{
	if (strstr(out, want) == NULL)
		fail_msg("outboxd check printed no line with \"%s\":\n%s", want, out);
}

/*
 * Starts outboxd and expects it to refuse at start: a non-zero exit within 30 s and needle in its
 * log (exactly once when once, else at least once); what otherwise fails the test.
 */
static void
expect_refused(const char *needle, bool once, const char *what)
{
	int st;

	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 30000);
	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) == 0 ||
	    (once ? t_log_count(&R, needle) != 1 : t_log_count(&R, needle) < 1)) {
		t_log_dump(&R);
		fail_msg("%s", what);
	}
}

/* Named tables with their own mappings, a business table ignored, one stream in commit order. */
static void
test_named_tables_and_mappings(void **state)
{
	struct t_msg *orders, *billing;
	size_t no, nb;
	uint64_t last = 0;

	(void)state;
	t_relay_setup(&R, "tables", 1);
	t_exec(R.pg, "CREATE SCHEMA orders; CREATE SCHEMA billing");
	t_exec(R.pg, "CREATE TABLE orders.outbox " OUTBOX_COLUMNS);
	/* billing's outbox names its columns its own way */
	t_exec(R.pg,
	    "CREATE TABLE billing.outbox (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
	    "account text NOT NULL, kind text NOT NULL, body jsonb)");
	t_exec(R.pg, "CREATE TABLE public.business (v text)");
	t_relay_config(&R,
	    "[source]\ntable = orders.outbox, billing.outbox\n"
	    "[outbox]\ntopic = orders.events\n"
	    "[outbox.billing.outbox]\nid = event_id\nkey = account\ntype = kind\npayload = body\n"
	    "topic = billing.events\n");
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "created publication"), 1);
	{
		char out[8192];

		if (run_check(out, sizeof(out)) != 0)
			fail_msg("outboxd check failed:\n%s", out);
		expect_in(out, "table: billing.outbox exists (mapping: [outbox.billing.outbox])");
		expect_in(out, "table: orders.outbox exists (mapping: [outbox])");
		expect_in(out, "column: account (text) of billing.outbox");
		expect_in(out, "publication: outboxd publishes inserts of the outbox tables");
		expect_in(out, "0 failed");
	}
	/* interleaved in each transaction, with a business row that must not become an event */
	for (int t = 0; t < 20; t++)
		t_exec(R.pg,
		    "BEGIN; "
		    "INSERT INTO orders.outbox (aggregatetype, aggregateid, type, payload) VALUES ('o', 'o%d', 'T', '{}'); "
		    "INSERT INTO public.business VALUES ('x'); "
		    "INSERT INTO billing.outbox (account, kind, body) VALUES ('a%d', 'K', '{\"t\": %d}'); "
		    "INSERT INTO orders.outbox (aggregatetype, aggregateid, type, payload) VALUES ('o', 'o%d', 'T', '{}'); "
		    "COMMIT",
		    t % 3, t % 4, t, t % 3);
	if (!t_wait_confirmed_current(&R, 30000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm up to the server's WAL position");
	}
	no = t_consume_all(R.b.bootstrap, "orders.events", 20000, &orders);
	nb = t_consume_all(R.b.bootstrap, "billing.events", 20000, &billing);
	assert_int_equal(no, 40);
	assert_int_equal(nb, 20);
	expect_rows_published("orders.outbox", orders, no);
	expect_rows_published_by("billing.outbox", "event_id", billing, nb);
	/* billing's mapping: its key, type and payload columns */
	for (size_t i = 0; i < nb; i++) {
		assert_true(billing[i].key != NULL && billing[i].key[0] == 'a');
		assert_string_equal(t_msg_header(&billing[i], "type"), "K");
		assert_non_null(strstr(billing[i].value, "\"t\""));
	}
	/* one stream: a key's records in commit order, each transaction's lsn a commit of its own */
	for (size_t i = 0; i < nb; i++) {
		uint64_t l = t_lsn(t_msg_header(&billing[i], "lsn"));

		if (i > 0 && billing[i].partition == billing[i - 1].partition)
			assert_true(l > last);
		last = l;
	}
	t_msgs_free(orders, no);
	t_msgs_free(billing, nb);
	assert_int_equal(t_log_count(&R, "retrying"), 0);

	/* a listed table dropped, then the connection cut: the reconnect warns and goes on */
	t_exec(R.pg, "DROP TABLE billing.outbox");
	t_exec(R.pg, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '%s'",
	    R.slot);
	t_exec(R.pg,
	    "INSERT INTO orders.outbox (aggregatetype, aggregateid, type, payload) VALUES ('o', 'after', 'T', '{}')");
	no = t_consume(R.b.bootstrap, "orders.events", 41, 30000, &orders);
	if (no != 41 ||
	    t_log_count(&R, "outbox table billing.outbox of [source] table does not exist (dropped?)") < 1) {
		t_log_dump(&R);
		fail_msg("after a listed table was dropped and the connection cut: %zu records of 41", no);
	}
	t_msgs_free(orders, no);
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
}

/*
 * A pattern: a tenant's table created, filled and committed in one transaction while outboxd
 * streams; rows while it is stopped, a new tenant while it is stopped, and a table dropped
 * while it runs.
 */
static void
test_table_created_while_running(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "tenants", 1);
	t_exec(R.pg, "CREATE TABLE public.business (v text)");
	t_relay_config(&R, "[source]\ntable = tenant_*.outbox\n[outbox]\ntopic = tenants\n");
	{
		char out[8192];

		/* before the first start: the publication is outboxd's to create, by a superuser */
		run_check(out, sizeof(out));
		expect_in(out, "table: pattern tenant_*.outbox matches 0 table(s) now");
		expect_in(out, "outboxd creates it FOR ALL TABLES, which needs a superuser");
	}
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "created publication"), 1);
	/* the tenant appears: schema, table and its first rows in one transaction */
	t_exec(R.pg,
	    "BEGIN; CREATE SCHEMA tenant_a; CREATE TABLE tenant_a.outbox " OUTBOX_COLUMNS "; "
	    "INSERT INTO tenant_a.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'a', 'k' || (g %% 7), 'T', jsonb_build_object('i', g) FROM generate_series(1, 50) g; "
	    "CREATE TABLE tenant_a.other (v text); INSERT INTO tenant_a.other VALUES ('not an outbox'); "
	    "INSERT INTO public.business SELECT 'noise' FROM generate_series(1, 100); COMMIT");
	t_exec(R.pg,
	    "INSERT INTO tenant_a.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'a', 'k' || (g %% 7), 'T', jsonb_build_object('i', g) FROM generate_series(51, 60) g");
	n = t_consume(R.b.bootstrap, "tenants", 60, 20000, &m);
	assert_int_equal(n, 60);
	expect_rows_published("tenant_a.outbox", m, n);
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 30000));
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

	/* stopped: more rows, and a second tenant created with rows */
	t_exec(R.pg,
	    "INSERT INTO tenant_a.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'a', 'k' || (g %% 7), 'T', jsonb_build_object('i', g) FROM generate_series(61, 80) g");
	t_exec(R.pg,
	    "BEGIN; CREATE SCHEMA tenant_b; CREATE TABLE tenant_b.outbox " OUTBOX_COLUMNS "; "
	    "INSERT INTO tenant_b.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'b', 'k' || (g %% 5), 'T', jsonb_build_object('i', g) FROM generate_series(1, 30) g; COMMIT");
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "tenants", 20000, &m);
	assert_int_equal(n, 110); /* 80 + 30: a clean stop re-sends nothing */
	expect_rows_published("tenant_a.outbox", m, n);
	expect_rows_published("tenant_b.outbox", m, n);
	t_msgs_free(m, n);

	{
		char out[8192];

		if (run_check(out, sizeof(out)) != 0)
			fail_msg("outboxd check failed:\n%s", out);
		expect_in(out, "table: pattern tenant_*.outbox matches 2 table(s) now");
		expect_in(out, "publication: outboxd publishes inserts of every table");
	}
	{
		/* the table label: what this process read of each */
		char body[65536];
		int port = t_metrics_port(&R);

		assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
		assert_true(t_metric(body, "outboxd_table_events_total{table=\"tenant_a.outbox\"}") == 20);
		assert_true(t_metric(body, "outboxd_table_events_total{table=\"tenant_b.outbox\"}") == 30);
		assert_true(t_metric(body, "outboxd_table_events_total{table=\"public.business\"}") == -1);
	}
	/* a table dropped while running is not an error; the others go on */
	t_exec(R.pg, "DROP TABLE tenant_a.outbox");
	t_exec(R.pg,
	    "INSERT INTO tenant_b.outbox (aggregatetype, aggregateid, type, payload) VALUES ('b', 'late', 'T', '{}')");
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "tenants", 20000, &m);
	assert_int_equal(n, 111);
	expect_rows_published("tenant_b.outbox", m, n);
	t_msgs_free(m, n);
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */
	assert_int_equal(t_log_count(&R, "retrying"), 0);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Killed after the broker acknowledged events of two tables: the restart skips what Kafka holds. */
static void
test_restart_dedupe_across_tables(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "tabdd", 1);
	t_exec(R.pg, "CREATE SCHEMA m1; CREATE SCHEMA m2");
	t_exec(R.pg, "CREATE TABLE m1.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg, "CREATE TABLE m2.outbox " OUTBOX_COLUMNS);
	t_relay_config(&R, "[source]\ntable = m1.outbox, m2.outbox\n[outbox]\ntopic = modules\n");
	setenv("OBX_TEST_KILL_AFTER_ACKS", "200", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	t_exec(R.pg,
	    "BEGIN; "
	    "INSERT INTO m1.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'm', 'k' || (g %% 9), 'T', jsonb_build_object('i', g) FROM generate_series(1, 100) g; "
	    "INSERT INTO m2.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'm', 'k' || (g %% 9), 'T', jsonb_build_object('i', g) FROM generate_series(1, 100) g; "
	    "COMMIT");
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd was not killed after 200 acknowledgements");
	}
	R.pid = 0;
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "modules", 20000, &m);
	expect_rows_published("m1.outbox", m, n);
	expect_rows_published("m2.outbox", m, n);
	if (n != 200) {
		t_log_dump(&R);
		fail_msg("%zu records for 200 events: restart de-duplication did not skip across tables", n);
	}
	t_msgs_free(m, n);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/*
 * Exactly-once across two tables: killed after acknowledgements with a Kafka transaction open,
 * restarted: a read_committed reader sees every event of both tables once.
 */
static void
test_exactly_once_across_tables(void **state)
{
	const char *tables[] = { "e1.outbox", "e2.outbox" };
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "tabeos", 1);
	t_exec(R.pg, "CREATE SCHEMA e1; CREATE SCHEMA e2");
	t_exec(R.pg, "CREATE TABLE e1.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg, "CREATE TABLE e2.outbox " OUTBOX_COLUMNS);
	t_relay_config(&R,
	    "[source]\ntable = e1.outbox, e2.outbox\n[outbox]\ntopic = eos\n"
	    "[delivery]\nexactly_once = on\ntransaction_max_events = 50\n");
	setenv("OBX_TEST_KILL_AFTER_ACKS", "120", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	for (int t = 0; t < 10; t++)
		t_exec(R.pg,
		    "BEGIN; "
		    "INSERT INTO e1.outbox (aggregatetype, aggregateid, type, payload) "
		    "SELECT 'e', 'k' || (g %% 7), 'T', jsonb_build_object('i', g) FROM generate_series(1, 15) g; "
		    "INSERT INTO e2.outbox (aggregatetype, aggregateid, type, payload) "
		    "SELECT 'e', 'k' || (g %% 7), 'T', jsonb_build_object('i', g) FROM generate_series(1, 15) g; "
		    "COMMIT");
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd was not killed after 120 acknowledgements");
	}
	R.pid = 0;
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "eos", 20000, &m);
	t_committed_only(R.b.bootstrap, R.slot, m, &n);
	for (size_t k = 0; k < 2; k++) {
		PGresult *res;
		char sql[64];

		snprintf(sql, sizeof(sql), "SELECT id::text FROM %s", tables[k]);
		res = PQexec(R.pg, sql);
		assert_int_equal(PQntuples(res), 150);
		for (int i = 0; i < PQntuples(res); i++)
			if (t_count_id(m, n, PQgetvalue(res, i, 0)) != 1) {
				t_log_dump(&R);
				fail_msg("event %s of %s is in committed Kafka transactions %zu time(s)",
				    PQgetvalue(res, i, 0), tables[k], t_count_id(m, n, PQgetvalue(res, i, 0)));
			}
		PQclear(res);
	}
	assert_int_equal(n, 300);
	t_msgs_free(m, n);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/*
 * snapshot = pending with two tables: the rows already in each when outboxd creates its slot,
 * in each table's mapping, then the stream; every row once.
 */
static void
test_snapshot_pending_across_tables(void **state)
{
	struct t_msg *m;
	size_t n, snap = 0;
	int st;

	(void)state;
	t_relay_setup(&R, "tabsnap", 1);
	t_exec(R.pg, "CREATE SCHEMA s1; CREATE SCHEMA s2");
	t_exec(R.pg, "CREATE TABLE s1.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg,
	    "CREATE TABLE s2.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), who text, body jsonb)");
	t_exec(R.pg,
	    "INSERT INTO s1.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 's', 'k' || (g %% 5), 'T', jsonb_build_object('i', g) FROM generate_series(1, 30) g");
	t_exec(R.pg, "INSERT INTO s2.outbox (who, body) SELECT 'w' || g, '{}' FROM generate_series(1, 20) g");
	t_relay_config(&R,
	    "[source]\ntable = s1.outbox, s2.outbox\nsnapshot = pending\n[outbox]\ntopic = snap\n"
	    "[outbox.s2.outbox]\nkey = who\ntype = who\npayload = body\n");
	{
		char out[8192];

		run_check(out, sizeof(out));
		expect_in(out, "will publish the 30 row(s) of s1.outbox WHERE true");
		expect_in(out, "will publish the 20 row(s) of s2.outbox WHERE true");
	}
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO s1.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 's', 'k' || (g %% 5), 'T', jsonb_build_object('i', g) FROM generate_series(31, 35) g");
	t_exec(R.pg, "INSERT INTO s2.outbox (who, body) SELECT 'w' || g, '{}' FROM generate_series(21, 25) g");
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "snap", 20000, &m);
	expect_rows_published("s1.outbox", m, n);
	expect_rows_published("s2.outbox", m, n);
	for (size_t i = 0; i < n; i++)
		snap += t_msg_header(&m[i], "snapshot") != NULL;
	if (n != 60 || snap != 50) {
		t_log_dump(&R);
		fail_msg("%zu records (%zu from the snapshot) for 50 pending and 10 streamed rows", n, snap);
	}
	t_msgs_free(m, n);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/*
 * Polling several tables: a busy table does not starve a quiet one (one claim per table in
 * turn), a table created while polling joins, every row published once and marked.
 */
static void
test_polling_several_tables(void **state)
{
	struct t_msg *m;
	size_t n;
	char *busy_done, *quiet_done, cmd[512];
	int st;

	(void)state;
	t_relay_setup(&R, "tabpoll", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	t_exec(R.pg, "CREATE SCHEMA p1; CREATE SCHEMA p2; CREATE SCHEMA p3");
	t_exec(R.pg, "CREATE TABLE p1.outbox (LIKE public.outbox INCLUDING ALL)");
	t_exec(R.pg, "CREATE TABLE p2.outbox (LIKE public.outbox INCLUDING ALL)");
	t_exec(R.pg,
	    "INSERT INTO p1.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'p', 'k' || (g %% 13), 'T', jsonb_build_object('i', g) FROM generate_series(1, 600) g");
	t_exec(R.pg,
	    "INSERT INTO p2.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'p', 'q' || g, 'T', '{}' FROM generate_series(1, 5) g");
	/* the broker slow: each claim of 50 takes a round trip, so the order of the claims shows */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 100", b), 0);
	t_relay_config(&R,
	    "[source]\nmode = poll\ntable = p*.outbox\n[outbox]\ntopic = polled\n[poll]\nbatch = 50\n"
	    "poll_interval = 200ms\n");
	{
		char out[8192];

		if (run_check(out, sizeof(out)) != 0)
			fail_msg("outboxd check failed:\n%s", out);
		expect_in(out, "table: p1.outbox (mapping: [outbox])");
		expect_in(out, "table: p2.outbox (mapping: [outbox])");
		/* status: the sums and each table */
		snprintf(cmd, sizeof(cmd), "%s status -c %s 2>&1", getenv("OBX_OUTBOXD"), R.conf);
		if (t_run_capture(cmd, out, sizeof(out)) != 0)
			fail_msg("outboxd status failed:\n%s", out);
		expect_in(out, "pending_rows                605");
		expect_in(out, "p1.outbox: 600 pending");
		expect_in(out, "p2.outbox: 5 pending");
	}
	t_relay_start(&R, NULL, 0);
	/* a table created while polling joins the rotation; one without polling's columns (its
	 * migration not run yet) is left out, and the others go on */
	usleep(500000);
	t_exec(R.pg, "CREATE SCHEMA p4; CREATE TABLE p4.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg, "CREATE TABLE p3.outbox (LIKE public.outbox INCLUDING ALL)");
	t_exec(R.pg,
	    "INSERT INTO p3.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'p', 'r' || g, 'T', '{}' FROM generate_series(1, 7) g");
	n = t_consume(R.b.bootstrap, "polled", 612, 60000, &m);
	if (n != 612) {
		t_log_dump(&R);
		fail_msg("%zu records of 612", n);
	}
	expect_rows_published("p1.outbox", m, n);
	expect_rows_published("p2.outbox", m, n);
	expect_rows_published("p3.outbox", m, n);
	t_msgs_free(m, n);
	/* every row marked; the quiet table was done long before the busy one */
	{
		long deadline = (long)t_now_ms() + 20000;
		char *left = NULL;

		do {
			free(left);
			usleep(100000);
			left = t_query1(R.pg,
			    "SELECT (SELECT count(*) FROM p1.outbox WHERE published_at IS NULL) + "
			    "(SELECT count(*) FROM p2.outbox WHERE published_at IS NULL) + "
			    "(SELECT count(*) FROM p3.outbox WHERE published_at IS NULL)");
		} while (strcmp(left, "0") != 0 && (long)t_now_ms() < deadline);
		assert_string_equal(left, "0");
		free(left);
	}
	busy_done = t_query1(R.pg, "SELECT extract(epoch FROM max(published_at))::text FROM p1.outbox");
	quiet_done = t_query1(R.pg, "SELECT extract(epoch FROM max(published_at))::text FROM p2.outbox");
	if (strtod(quiet_done, NULL) >= strtod(busy_done, NULL)) {
		t_log_dump(&R);
		fail_msg("the quiet table was published last (at %s, the busy one at %s): not in turn", quiet_done,
		    busy_done);
	}
	free(busy_done);
	free(quiet_done);
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */
	if (t_log_count(&R, "could not read the outbox table p4.outbox for polling") < 1) {
		t_log_dump(&R);
		fail_msg("the table without polling's columns was not named");
	}
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

	/* a listed table that does not exist is refused at start, naming it */
	t_relay_config(&R, "[source]\nmode = poll\ntable = p1.outbox, p9.outbox\n");
	unlink(R.log);
	expect_refused("outbox table p9.outbox of [source] table does not exist", false,
	    "a missing listed table was not refused in polling mode");
}

/* Dead-lettering in a table's own mapping: a row its override's key column leaves NULL. */
static void
test_dead_letter_across_tables(void **state)
{
	struct t_msg *m;
	size_t n;
	char *bad;
	int st;

	(void)state;
	t_relay_setup(&R, "tabdl", 1);
	t_exec(R.pg, "CREATE SCHEMA d1; CREATE SCHEMA d2");
	t_exec(R.pg, "CREATE TABLE d1.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg,
	    "CREATE TABLE d2.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), account text, body jsonb)");
	t_relay_config(&R,
	    "[source]\ntable = d1.outbox, d2.outbox\n[outbox]\ntopic = dl\n"
	    "[outbox.d2.outbox]\nkey = account\ntype = account\npayload = body\n"
	    "[delivery]\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO d1.outbox (aggregatetype, aggregateid, type, payload) VALUES ('d', 'k1', 'T', '{}')");
	bad = t_query1(R.pg, "INSERT INTO d2.outbox (account, body) VALUES (NULL, '{}') RETURNING id");
	t_exec(R.pg, "INSERT INTO d2.outbox (account, body) VALUES ('a1', '{}')");
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "outbox.dead_letter", 15000, &m);
	assert_int_equal(n, 1);
	/* the row as JSON, with the reason in its mapping's words and its table */
	assert_non_null(strstr(m[0].value, bad));
	assert_string_equal(t_msg_header(&m[0], "table"), "d2.outbox");
	if (t_msg_header(&m[0], "error") == NULL || strstr(t_msg_header(&m[0], "error"), "account") == NULL) {
		t_log_dump(&R);
		fail_msg("dead-letter record error header: %s",
		    t_msg_header(&m[0], "error") ? t_msg_header(&m[0], "error") : "(none)");
	}
	t_msgs_free(m, n);
	n = t_consume_all(R.b.bootstrap, "dl", 15000, &m);
	assert_int_equal(n, 2);
	t_msgs_free(m, n);
	free(bad);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A pattern with a publication of named tables would miss a new tenant's first rows: refused. */
static void
test_pattern_refuses_named_publication(void **state)
{
	(void)state;
	t_relay_setup(&R, "tabpub", 0);
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	t_relay_config(&R, "[source]\ntable = public.outbox, tenant_*.outbox\n");
	expect_refused("names its tables, but [source] table has a pattern", true,
	    "a publication of named tables with a pattern was not refused with one line");
	/* FOR ALL TABLES without publish_via_partition_root: a partitioned tenant would arrive under
	 * its partitions' names */
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR ALL TABLES WITH (publish = 'insert')");
	unlink(R.log);
	expect_refused("lacks publish_via_partition_root = true", true,
	    "FOR ALL TABLES without publish_via_partition_root was not refused with a pattern");
	/* an unlogged listed table is never published: refused, naming the fix */
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	t_exec(R.pg, "CREATE UNLOGGED TABLE public.fast " OUTBOX_COLUMNS);
	t_exec(R.pg,
	    "CREATE PUBLICATION outboxd FOR ALL TABLES WITH (publish = 'insert', publish_via_partition_root = true)");
	t_relay_config(&R, "[source]\ntable = public.outbox, public.fast\n");
	unlink(R.log);
	expect_refused("does not publish table public.fast", true, "an unlogged outbox table was not refused");
	/* a listed table that does not exist is refused too, naming it */
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	unlink(R.log);
	t_relay_config(&R, "[source]\ntable = public.outbox, sales.outbox\n");
	expect_refused("outbox table sales.outbox of [source] table does not exist", true,
	    "a missing listed table was not refused with one line");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_named_tables_and_mappings, teardown),
		cmocka_unit_test_teardown(test_table_created_while_running, teardown),
		cmocka_unit_test_teardown(test_restart_dedupe_across_tables, teardown),
		cmocka_unit_test_teardown(test_exactly_once_across_tables, teardown),
		cmocka_unit_test_teardown(test_snapshot_pending_across_tables, teardown),
		cmocka_unit_test_teardown(test_polling_several_tables, teardown),
		cmocka_unit_test_teardown(test_dead_letter_across_tables, teardown),
		cmocka_unit_test_teardown(test_pattern_refuses_named_publication, teardown),
	};

	return T_RUN_TESTS(tests);
}
