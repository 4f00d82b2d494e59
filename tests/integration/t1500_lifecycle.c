/*
 * The lives of tables against the real stack (docs/internals/design.md,
 * "Lifecycle edges", invariant 11): an outbox table dropped and created
 * again while outboxd streams, a listed table re-created among several, a
 * listed table missing at start while the publication exists and created
 * later, and a table swapped in by a rename.  A publication FOR TABLE holds
 * a table by oid, so the new table's rows are never decoded: outboxd must
 * stop, naming the table, before it confirms past them, and refuse to go
 * on until the publication holds the table again.
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
	t_relay_teardown(&R);
	return 0;
}

#define OUTBOX_COLUMNS                                                                                            \
	"(id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype varchar(255) NOT NULL, "                   \
	"aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, "                          \
	"created_at timestamptz NOT NULL DEFAULT now())"

static void
insert_into(const char *table, const char *agg, int n)
{
	t_exec(R.pg,
	    "INSERT INTO %s (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || g, 'T', jsonb_build_object('i', g) FROM generate_series(1, %d) g",
	    table, agg, n);
}

/* Waits up to timeout_ms for outboxd to exit; fails unless it exited 1 with needle in its log. */
static void
expect_stop(const char *needle, int timeout_ms, const char *what)
{
	int st = t_wait(R.pid, timeout_ms);

	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || t_log_count(&R, needle) < 1) {
		t_log_dump(&R);
		fail_msg("%s: outboxd %s, or its log has no \"%s\"", what,
		    st == -1                                  ? "kept running" :
		        WIFEXITED(st) && WEXITSTATUS(st) == 1 ? "exited 1" :
		                                                "ended otherwise",
		    needle);
	}
}

/* Starts outboxd and expects a refusal at start naming needle (exit 1). */
static void
expect_refused(const char *needle, const char *what)
{
	t_relay_start(&R, NULL, 0);
	expect_stop(needle, 60000, what);
}

/* Fails unless the slot is confirmed at or below bound ("X/X"). */
static void
expect_confirmed_at_most(const char *bound, const char *what)
{
	uint64_t c = t_slot_confirmed(&R);

	if (c > t_lsn(bound)) {
		t_log_dump(&R);
		fail_msg("%s: the slot is confirmed at %llX, past %s", what, (unsigned long long)c, bound);
	}
}

/*
 * The default set-up (one table, the publication outboxd made FOR TABLE): DROP and CREATE
 * while streaming, then rows.  outboxd stops naming the table without confirming past the
 * re-creation, refuses while the publication lacks the table, and streams again once it has it.
 */
static void
test_recreated_single_table(void **state)
{
	struct t_msg *m;
	char *bound;
	size_t n;

	(void)state;
	t_relay_setup(&R, "recreate", 0);
	t_relay_config(&R, "[outbox]\ntopic = events\n");
	t_relay_start(&R, NULL, 1);
	insert_into("outbox", "before", 5);
	n = t_consume(R.b.bootstrap, "events", 5, 20000, &m);
	assert_int_equal(n, 5);
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 30000));
	/* a migration: the table dropped and created again, with the same columns; then rows, whose
	 * commit the slot must not pass */
	t_exec(R.pg, "DROP TABLE outbox");
	t_exec(R.pg, "CREATE TABLE outbox " OUTBOX_COLUMNS);
	bound = t_exec_commit_bound(R.pg, NULL,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'after', 'k' || g, 'T', '{}' FROM generate_series(1, 3) g");
	expect_stop("outbox table public.outbox was dropped and created again", 30000, "re-created outbox table");
	assert_true(t_log_count(&R, "ALTER PUBLICATION outboxd ADD TABLE public.outbox") >= 1);
	expect_confirmed_at_most(bound, "re-created outbox table");
	free(bound);
	/* a restart refuses while the publication lacks the new table */
	expect_refused("does not publish table public.outbox", "restart with the table outside the publication");
	/* the operator adds it: rows from then on flow */
	t_exec(R.pg, "ALTER PUBLICATION outboxd ADD TABLE public.outbox");
	t_relay_start(&R, NULL, 1);
	insert_into("outbox", "fixed", 2);
	n = t_consume(R.b.bootstrap, "events", 7, 30000, &m);
	if (n != 7) {
		t_log_dump(&R);
		fail_msg("after ALTER PUBLICATION ... ADD TABLE: %zu records of 7", n);
	}
	t_msgs_free(m, n);
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
}

/* Several named tables: one of them re-created; the stop names it, the other one's rows arrived. */
static void
test_recreated_listed_table(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "recreate2", 0);
	t_exec(R.pg, "CREATE SCHEMA billing; CREATE TABLE billing.outbox " OUTBOX_COLUMNS);
	t_relay_config(&R, "[source]\ntable = public.outbox, billing.outbox\n[outbox]\ntopic = events\n");
	t_relay_start(&R, NULL, 1);
	insert_into("outbox", "o", 3);
	insert_into("billing.outbox", "b", 2);
	n = t_consume(R.b.bootstrap, "events", 5, 20000, &m);
	assert_int_equal(n, 5);
	t_msgs_free(m, n);
	t_exec(R.pg, "BEGIN; DROP TABLE billing.outbox; CREATE TABLE billing.outbox " OUTBOX_COLUMNS "; COMMIT");
	insert_into("billing.outbox", "b2", 3);
	insert_into("outbox", "o2", 2);
	expect_stop("outbox table billing.outbox was dropped and created again", 30000, "re-created listed table");
	assert_int_equal(t_log_count(&R, "outbox table public.outbox was"), 0);
}

/*
 * What keeps a table covered goes on without a stop: the migration that
 * re-creates the table and adds it to the publication in one transaction,
 * and (15+) the table's schema added on top of its own membership, then
 * its own membership dropped.  Every row arrives.
 */
static void
test_recreated_with_the_publication(void **state)
{
	struct t_msg *m;
	size_t n, want = 8;

	(void)state;
	t_relay_setup(&R, "recreate3", 0);
	t_relay_config(&R, "[outbox]\ntopic = events\n");
	t_relay_start(&R, NULL, 1);
	insert_into("outbox", "before", 3);
	t_exec(R.pg,
	    "BEGIN; DROP TABLE outbox; CREATE TABLE outbox " OUTBOX_COLUMNS
	    "; ALTER PUBLICATION outboxd ADD TABLE outbox; COMMIT");
	insert_into("outbox", "after", 3);
	/* two readings of the slot watch at least, each after the change */
	assert_true(t_wait_confirmed_current(&R, 30000));
	if (t_pg_has(15, "ADD TABLES IN SCHEMA")) {
		t_exec(R.pg, "ALTER PUBLICATION outboxd ADD TABLES IN SCHEMA public");
		insert_into("outbox", "schema", 1);
		assert_true(t_wait_confirmed_current(&R, 30000));
		t_exec(R.pg, "ALTER PUBLICATION outboxd DROP TABLE outbox");
		insert_into("outbox", "schema", 1);
		assert_true(t_wait_confirmed_current(&R, 30000));
	} else {
		want = 6;
	}
	n = t_consume(R.b.bootstrap, "events", want, 30000, &m);
	if (n != want) {
		t_log_dump(&R);
		fail_msg("re-created with its publication membership: %zu records of %zu", n, want);
	}
	t_msgs_free(m, n);
	assert_int_equal(t_log_count(&R, "outbox table public.outbox"), 0);
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
}

/*
 * A listed table missing when outboxd starts while the publication exists (dropped while it was
 * stopped), created later: a publication FOR TABLE does not hold it, so outboxd stops.
 */
static void
test_missing_at_start(void **state)
{
	struct t_msg *m;
	char *bound;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "missing", 0);
	t_exec(R.pg, "CREATE SCHEMA billing; CREATE TABLE billing.outbox " OUTBOX_COLUMNS);
	t_relay_config(&R, "[source]\ntable = public.outbox, billing.outbox\n[outbox]\ntopic = events\n");
	t_relay_start(&R, NULL, 1);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_exec(R.pg, "DROP TABLE billing.outbox");
	t_relay_start(&R, NULL, 1);
	assert_true(t_log_count(&R, "outbox table billing.outbox of [source] table does not exist") >= 1);
	insert_into("outbox", "o", 2);
	n = t_consume(R.b.bootstrap, "events", 2, 20000, &m);
	assert_int_equal(n, 2);
	t_msgs_free(m, n);
	t_exec(R.pg, "CREATE TABLE billing.outbox " OUTBOX_COLUMNS);
	bound = t_exec_commit_bound(R.pg, NULL,
	    "INSERT INTO billing.outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'b', 'k' || g, 'T', '{}' FROM generate_series(1, 3) g");
	expect_stop("outbox table billing.outbox was created while outboxd ran", 30000,
	    "listed table created after a start without it");
	expect_confirmed_at_most(bound, "listed table created after a start without it");
	free(bound);
}

/* A table swapped in by a rename: the old one renamed away, a new one created under the name. */
static void
test_swapped_by_rename(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "swap", 0);
	t_relay_config(&R, "[outbox]\ntopic = events\n");
	t_relay_start(&R, NULL, 1);
	insert_into("outbox", "before", 2);
	n = t_consume(R.b.bootstrap, "events", 2, 20000, &m);
	assert_int_equal(n, 2);
	t_msgs_free(m, n);
	t_exec(R.pg,
	    "BEGIN; ALTER TABLE outbox RENAME TO outbox_old; "
	    "CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL); COMMIT");
	insert_into("outbox", "after", 3);
	expect_stop("outbox table public.outbox was dropped and created again", 30000,
	    "table swapped by a rename");
}

/* No stop when nothing was missed: a listed table dropped for good, the other one streams on. */
static void
test_dropped_table_goes_on(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "dropped", 0);
	t_exec(R.pg, "CREATE SCHEMA billing; CREATE TABLE billing.outbox " OUTBOX_COLUMNS);
	t_relay_config(&R, "[source]\ntable = public.outbox, billing.outbox\n[outbox]\ntopic = events\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg, "DROP TABLE billing.outbox");
	insert_into("outbox", "o", 4);
	n = t_consume(R.b.bootstrap, "events", 4, 20000, &m);
	assert_int_equal(n, 4);
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Runs outboxd CMD on R's configuration; returns its exit status, what it printed in out. */
static int
run_cmd(const char *cmd, char *out, size_t len)
{
	char line[1024];

	snprintf(line, sizeof(line), "%s %s -c %s 2>&1", getenv("OBX_OUTBOXD"), cmd, R.conf);
	return t_run_capture(line, out, len);
}

static int
slot_count(const char *name)
{
	char *v = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'", name);
	int n = atoi(v);

	free(v);
	return n;
}

/*
 * A pattern, its publication FOR ALL TABLES made by the superuser, and
 * outboxd connecting as an ordinary role with REPLICATION, which cannot
 * comment on that publication; extra goes into the configuration.
 */
static void
pattern_setup(const char *name, const char *extra)
{
	char user[64], cfg[512];

	t_relay_setup(&R, name, 1);
	t_exec(R.pg, "CREATE SCHEMA tenant_a; CREATE TABLE tenant_a.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg,
	    "CREATE PUBLICATION outboxd FOR ALL TABLES WITH (publish = 'insert', "
	    "publish_via_partition_root = true)");
	t_exec(R.pg,
	    "DO $$ BEGIN CREATE ROLE obx_plain LOGIN REPLICATION; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
	t_exec(R.pg, "REVOKE \"%s\" FROM obx_plain", R.st.user);
	/* the configuration connects as that role; the test's own connections stay the superuser's */
	strlcpy(user, R.st.user, sizeof(user));
	strlcpy(R.st.user, "obx_plain", sizeof(R.st.user));
	snprintf(cfg, sizeof(cfg), "[source]\ntable = tenant_*.outbox\n[outbox]\ntopic = tenants\n%s", extra);
	t_relay_config(&R, cfg);
	strlcpy(R.st.user, user, sizeof(R.st.user));
}

/*
 * Exactly-once in pattern mode, where the guard slot records the slot: the
 * progress record names the same slot in every session, also once the role
 * may comment on the publication (made a member of its owner), so a restart
 * trusts its progress and publishes nothing twice.
 */
static void
test_exactly_once_with_pattern(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	pattern_setup("eospat", "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	assert_true(t_log_count(&R, "records it instead") >= 1);
	insert_into("tenant_a.outbox", "a", 3);
	assert_true(t_wait_confirmed_current(&R, 30000));
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);

	t_exec(R.pg, "GRANT \"%s\" TO obx_plain", R.st.user);
	t_relay_start(&R, NULL, 1);
	insert_into("tenant_a.outbox", "b", 2);
	assert_true(t_wait_confirmed_current(&R, 30000));
	st = t_relay_signal(&R, SIGTERM, 40000);
	t_exec(R.pg, "REVOKE \"%s\" FROM obx_plain", R.st.user);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (t_log_count(&R, "the slot was created at") != 0) {
		t_log_dump(&R);
		fail_msg("the restart distrusted its own progress record");
	}
	n = t_consume_all(R.b.bootstrap, "tenants", 10000, &m);
	(void)t_committed_only(R.b.bootstrap, R.slot, m, &n);
	assert_int_equal(n, 5);
	t_msgs_free(m, n);
}

/*
 * A pattern with a publication FOR ALL TABLES a superuser made, outboxd as an ordinary role with
 * REPLICATION: it cannot write the slot guard's line in the publication's comment, so a physical
 * guard slot records the slot.  The slot dropped while outboxd is stopped (a DBA, a failover
 * before 17) is refused at the next start, not created again silently; --recreate-slot creates
 * it; drop-slot drops the guard slot with it.
 */
static void
test_lost_slot_with_pattern(void **state)
{
	char guard[80], out[8192];
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	pattern_setup("lostpat", "");
	snprintf(guard, sizeof(guard), "%s_guard", R.slot);

	t_relay_start(&R, NULL, 1);
	assert_true(t_log_count(&R, "records it instead") >= 1);
	assert_int_equal(slot_count(guard), 1);
	insert_into("tenant_a.outbox", "a", 2);
	n = t_consume(R.b.bootstrap, "tenants", 2, 20000, &m);
	assert_int_equal(n, 2);
	t_msgs_free(m, n);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);

	/* stopped: a row committed, then the slot lost */
	insert_into("tenant_a.outbox", "lost", 1);
	t_exec(R.pg, "SELECT pg_drop_replication_slot('%s')", R.slot);
	expect_refused("is missing but existed before (physical slot", "a lost slot with a pattern");
	assert_int_equal(slot_count(R.slot), 0);

	/* the operator reconciled: one start with --recreate-slot */
	t_relay_start(&R, "--recreate-slot", 1);
	assert_true(t_log_count(&R, "recreated slot") >= 1);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);
	if (run_cmd("drop-slot --yes", out, sizeof(out)) != 0)
		fail_msg("drop-slot --yes failed:\n%s", out);
	assert_non_null(strstr(out, "the slot guard's record of slot"));
	assert_int_equal(slot_count(R.slot), 0);
	assert_int_equal(slot_count(guard), 0);
}

/*
 * snapshot = pending with two tables, the second renamed while the snapshot still works on the
 * first (held by a row whose topic is missing): the snapshot reads it by the OID it had, under
 * its new name, and publishes its pending rows, not "dropped since".
 */
static void
test_snapshot_reads_a_renamed_table(void **state)
{
	struct t_msg *m;
	size_t n;
	int waited = 0;

	(void)state;
	t_relay_setup(&R, "snaprename", 1);
	t_exec(R.pg, "CREATE SCHEMA s1; CREATE SCHEMA s2");
	t_exec(R.pg, "CREATE TABLE s1.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg, "CREATE TABLE s2.outbox " OUTBOX_COLUMNS);
	insert_into("s1.outbox", "late", 3);
	insert_into("s2.outbox", "moved", 20);
	assert_int_equal(t_broker_cmd(&R.b, "topic outbox.event.late 1"), 0);
	assert_int_equal(t_broker_cmd(&R.b, "topic-error outbox.event.late UNKNOWN_TOPIC_OR_PART"), 0);
	t_relay_config(&R,
	    "[kafka]\ntopic.metadata.propagation.max.ms = 1000\n"
	    "[source]\ntable = s1.outbox, s2.outbox\nsnapshot = pending\n");
	t_relay_start(&R, NULL, 0);
	while (t_log_count(&R, "the snapshot holds") < 1 && waited < 60000) {
		usleep(100 * 1000);
		waited += 100;
	}
	if (waited >= 60000) {
		t_log_dump(&R);
		fail_msg("the snapshot did not hold for the missing topic");
	}
	/* s2.outbox's turn has not come: renamed now, its rows are the snapshot's all the same */
	t_exec(R.pg, "ALTER TABLE s2.outbox RENAME TO outbox_moved");
	assert_int_equal(t_broker_cmd(&R.b, "topic-error outbox.event.late NO_ERROR"), 0);
	n = t_consume(R.b.bootstrap, "outbox.event.moved", 20, 60000, &m);
	if (n != 20 || t_log_count(&R, "has been renamed s2.outbox_moved") < 1 ||
	    t_log_count(&R, "was dropped since") != 0 ||
	    t_log_count(&R, "table s1.outbox has been renamed") != 0) {
		t_log_dump(&R);
		fail_msg("%zu of the renamed table's 20 pending rows published", n);
	}
	t_msgs_free(m, n);
	n = t_consume(R.b.bootstrap, "outbox.event.late", 3, 20000, &m);
	assert_int_equal(n, 3);
	t_msgs_free(m, n);
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
}

/* Fails unless the topic has want records within timeout_ms. */
static void
expect_records(const char *topic, size_t want, int timeout_ms, const char *what)
{
	struct t_msg *m;
	size_t n = t_consume(R.b.bootstrap, topic, want, timeout_ms, &m);

	t_msgs_free(m, n);
	if (n != want) {
		t_log_dump(&R);
		fail_msg("%s: %zu records of %zu", what, n, want);
	}
}

/*
 * Polling tenant_*.outbox as an ordinary role: a tenant whose migration forgot the grants is
 * left out, and a tenant locked by another session (ACCESS EXCLUSIVE, held) is passed over once
 * lock_timeout runs out; the other tenants flow meanwhile, the gauge says how many are out, and
 * each comes back once it can be read.
 */
static void
test_one_tenant_cannot_stop_the_others(void **state)
{
	char user[64], body[65536];
	PGconn *locker;

	(void)state;
	t_relay_setup(&R, "tenantpoll", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	t_exec(R.pg,
	    "DO $$ BEGIN CREATE ROLE obx_poller LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$");
	for (char c = 'a'; c <= 'c'; c++) {
		t_exec(R.pg,
		    "CREATE SCHEMA tenant_%c; CREATE TABLE tenant_%c.outbox (LIKE public.outbox INCLUDING ALL)", c,
		    c);
		if (c != 'b') /* tenant_b's migration forgot the grants */
			t_exec(R.pg,
			    "GRANT USAGE ON SCHEMA tenant_%c TO obx_poller; "
			    "GRANT SELECT, UPDATE ON tenant_%c.outbox TO obx_poller",
			    c, c);
	}
	insert_into("tenant_a.outbox", "a", 2);
	insert_into("tenant_b.outbox", "b", 2);
	insert_into("tenant_c.outbox", "c", 2);
	strlcpy(user, R.st.user, sizeof(user));
	strlcpy(R.st.user, "obx_poller", sizeof(R.st.user));
	t_relay_config(&R,
	    "[source]\nmode = poll\ntable = tenant_*.outbox\n[outbox]\ntopic = tenants\n[poll]\n"
	    "poll_interval = 200ms\n");
	strlcpy(R.st.user, user, sizeof(R.st.user));
	t_relay_start(&R, NULL, 0);
	expect_records("tenants", 4, 30000, "the readable tenants while one is refused");
	assert_true(t_log_count(&R, "tenant_b.outbox for polling: permission denied") >= 1);

	/* tenant_a locked by a migration that takes its time: tenant_c's rows still come */
	locker = t_pg(&R.st, R.db, 0);
	t_exec(locker, "BEGIN; LOCK TABLE tenant_a.outbox IN ACCESS EXCLUSIVE MODE");
	insert_into("tenant_c.outbox", "c2", 3);
	expect_records("tenants", 7, 30000, "a tenant's rows while another is locked");
	assert_int_equal(t_http_get(t_metrics_port(&R), "/metrics", body, sizeof(body)), 200);
	if (t_metric(body, "outboxd_poll_tables_left_out") < 1) {
		t_log_dump(&R);
		fail_msg("outboxd_poll_tables_left_out is %g with a tenant refused and one locked",
		    t_metric(body, "outboxd_poll_tables_left_out"));
	}
	t_exec(locker, "COMMIT");
	PQfinish(locker);
	insert_into("tenant_a.outbox", "a2", 2);
	expect_records("tenants", 9, 30000, "the locked tenant's rows once the lock is gone");
	assert_true(t_log_count(&R, "passed over this round") >= 1);

	/* the grants come: tenant_b joins within the 30 s it is left out */
	t_exec(R.pg,
	    "GRANT USAGE ON SCHEMA tenant_b TO obx_poller; GRANT SELECT, UPDATE ON tenant_b.outbox TO obx_poller");
	expect_records("tenants", 11, 60000, "the refused tenant's rows once granted");
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));

	/* a lock FOR UPDATE passes but an UPDATE waits for (SHARE: a CREATE INDEX in progress): the
	 * table is passed over before anything is claimed, never sent and then left unmarked */
	insert_into("tenant_c.outbox", "c3", 3);
	locker = t_pg(&R.st, R.db, 0);
	t_exec(locker, "BEGIN; LOCK TABLE tenant_c.outbox IN SHARE MODE");
	t_relay_start(&R, NULL, 0);
	usleep(12 * 1000 * 1000);
	t_exec(locker, "COMMIT");
	PQfinish(locker);
	expect_records("tenants", 14, 30000, "the SHARE-locked tenant's rows once the lock is gone");
	{
		struct t_msg *m;
		size_t n = t_consume_all(R.b.bootstrap, "tenants", 10000, &m);

		t_msgs_free(m, n);
		if (n != 14) {
			t_log_dump(&R);
			fail_msg("%zu records for 14 rows: a batch sent under the lock was sent again", n);
		}
	}
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
}

/*
 * Logical mode with a pattern: a tenant's unlogged outbox (FOR ALL TABLES never publishes it,
 * its rows are not in the WAL) is left out with a warning, the other tenants stream; once SET
 * LOGGED, its new rows are relayed too.
 */
static void
test_unlogged_tenant_left_out(void **state)
{
	(void)state;
	t_relay_setup(&R, "unlogged", 1);
	t_exec(R.pg, "CREATE SCHEMA tenant_a; CREATE TABLE tenant_a.outbox " OUTBOX_COLUMNS);
	t_exec(R.pg, "CREATE SCHEMA tenant_u; CREATE UNLOGGED TABLE tenant_u.outbox " OUTBOX_COLUMNS);
	t_relay_config(&R, "[source]\ntable = tenant_*.outbox\n[outbox]\ntopic = tenants\n");
	t_relay_start(&R, NULL, 1);
	if (t_log_count(&R, "outbox table tenant_u.outbox is not published (an unlogged table never is") < 1) {
		t_log_dump(&R);
		fail_msg("the unlogged tenant was not named");
	}
	insert_into("tenant_a.outbox", "a", 3);
	insert_into("tenant_u.outbox", "lost", 2);
	expect_records("tenants", 3, 30000, "the logged tenant's rows beside an unlogged one");
	t_exec(R.pg, "ALTER TABLE tenant_u.outbox SET LOGGED");
	insert_into("tenant_u.outbox", "u", 2);
	expect_records("tenants", 5, 30000, "the tenant's rows once SET LOGGED");
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_recreated_single_table, teardown),
		cmocka_unit_test_teardown(test_recreated_listed_table, teardown),
		cmocka_unit_test_teardown(test_recreated_with_the_publication, teardown),
		cmocka_unit_test_teardown(test_missing_at_start, teardown),
		cmocka_unit_test_teardown(test_swapped_by_rename, teardown),
		cmocka_unit_test_teardown(test_dropped_table_goes_on, teardown),
		cmocka_unit_test_teardown(test_lost_slot_with_pattern, teardown),
		cmocka_unit_test_teardown(test_exactly_once_with_pattern, teardown),
		cmocka_unit_test_teardown(test_snapshot_reads_a_renamed_table, teardown),
		cmocka_unit_test_teardown(test_one_tenant_cannot_stop_the_others, teardown),
		cmocka_unit_test_teardown(test_unlogged_tenant_left_out, teardown),
	};

	return T_RUN_TESTS(tests);
}
