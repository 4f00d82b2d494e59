/*
 * Exactly-once mode against the real stack (docs/internals/design.md,
 * "Exactly-once"): a fenced zombie, a fence while the instance still holds
 * the slot, an abortable transaction that rewinds, a data directory
 * restored in place, a transactional_id shared by two databases, and
 * [source] messages toggled between sessions: each checks that every
 * committed event is in committed Kafka transactions (once where the
 * progress record is trusted).  The crash loop in this mode is
 * t2100_crash_loop.c.
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

/* Every outbox row of the database is in the committed records of topic exactly once. */
static void
expect_committed_once(const char *topic, size_t want)
{
	struct t_msg *m;
	size_t n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	PGresult *res;

	t_committed_only(R.b.bootstrap, R.slot, m, &n);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	assert_int_equal((size_t)PQntuples(res), want);
	for (int i = 0; i < PQntuples(res); i++)
		if (t_count_id(m, n, PQgetvalue(res, i, 0)) != 1)
			fail_msg("event %s is in committed Kafka transactions %zu time(s)", PQgetvalue(res, i, 0),
			    t_count_id(m, n, PQgetvalue(res, i, 0)));
	assert_int_equal(n, want);
	PQclear(res);
	t_msgs_free(m, n);
}

/*
 * A zombie: the active instance stops (SIGSTOP) with a Kafka transaction
 * open, the server ends its connection after wal_sender_timeout, a second
 * instance takes the slot, initialises transactions with the same
 * transactional.id and publishes from the last committed progress.  When
 * the first one wakes up it must publish nothing and exit 1 on the fencing
 * error.  The test broker does not fence an older producer (librdkafka's
 * mock cluster gives each InitProducerId a new producer id; README,
 * "Exactly-once"), so once the second instance is idle the test has the
 * broker answer Produce, AddPartitionsToTxn and EndTxn with
 * INVALID_PRODUCER_EPOCH, what a broker answers a fenced producer.
 */
static void
test_zombie_is_fenced(void **state)
{
	static const int apis[] = { 0 /* Produce */, 24 /* AddPartitionsToTxn */, 26 /* EndTxn */ };
	struct t_relay S;
	int64_t t0;
	int st;

	(void)state;
	t_relay_setup(&R, "eoszombie", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	t_insert_txn(&R, "zomb", 100, 10);
	assert_true(t_wait_confirmed_current(&R, 30000));

	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	for (t0 = t_now_ms(); t_log_count(&S, "standby:") == 0 && t_now_ms() - t0 < 15000;)
		usleep(50000);
	assert_int_equal(t_log_count(&S, "standby:"), 1);

	/* the next transaction stays open: the brokers answer late, and the instance stops */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 5000", b), 0);
	t_insert_txn(&R, "zomb", 100, 10);
	for (t0 = t_now_ms(); t_relay_metric(&R, "outboxd_inflight_events") == 0 && t_now_ms() - t0 < 15000;)
		usleep(20000);
	assert_true(t_relay_metric(&R, "outboxd_inflight_events") > 0);
	assert_int_equal(kill(R.pid, SIGSTOP), 0);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);

	/* wal_sender_timeout ends its connection; the standby takes over and publishes */
	for (t0 = t_now_ms(); t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 40000;)
		usleep(100000);
	if (t_log_count(&S, "taking over slot") != 1) {
		kill(R.pid, SIGCONT);
		t_log_dump(&S);
		fail_msg("the standby did not take over");
	}
	assert_true(t_wait_confirmed_current(&R, 30000));
	sleep(1); /* the standby is idle: what the broker answers next is the old instance's */

	for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
		assert_int_equal(t_broker_cmd(&R.b, "request-errors %d 1000 INVALID_PRODUCER_EPOCH", apis[i]), 0);
	assert_int_equal(kill(R.pid, SIGCONT), 0);
	st = t_wait(R.pid, 30000);
	if (st == -1 && t_log_count(&R, "standby:") > 0 && t_log_count(&R, "fenced") == 0) {
		/*
		 * On waking it read its lost connection before any answer of the broker
		 * arrived: its transaction ended with the session and it waits as a standby,
		 * holding nothing.  That it published nothing is checked below like the
		 * fenced path; it must stop cleanly.
		 */
		fprintf(stderr, "zombie: noticed its lost connection before the fence; waited as a standby\n");
		assert_int_equal(kill(R.pid, SIGTERM), 0);
		st = t_wait(R.pid, 30000);
		if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			t_log_dump(&R);
			fail_msg("the old instance waiting as a standby did not stop with 0 (wait status %d)", st);
		}
		R.pid = 0;
	} else if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1) {
		t_log_dump(&R);
		fail_msg("the fenced instance did not exit 1 (wait status %d)", st);
	} else {
		/* the id names the source: system identifier, database, slot */
		char *sysid = t_query1(R.pg, "SELECT system_identifier::text FROM pg_control_system()");
		char want[512];

		snprintf(want, sizeof(want),
		    "fenced: another instance took over transactional.id "
		    "outboxd-%s-%s-%s",
		    sysid, R.db, R.slot);
		free(sysid);
		R.pid = 0;
		assert_int_equal(t_log_count(&R, want), 1);
	}
	for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
		assert_int_equal(t_broker_cmd(&R.b, "clear %d", apis[i]), 0);

	/* the new instance goes on; every event is in committed transactions exactly once */
	t_insert_txn(&R, "zomb", 50, 10);
	assert_true(t_wait_confirmed_current(&R, 30000));
	expect_committed_once("outbox.event.zomb", 250);
	assert_int_equal(t_log_count(&S, "fenced"), 0);
	t_relay_twin_stop(&S);
}

/*
 * A transaction the broker refuses to extend (AddPartitionsToTxn answered
 * TOPIC_AUTHORIZATION_FAILED once: the transaction becomes abortable): the
 * session aborts it and rewinds to the slot, and what committed Kafka
 * transactions hold is every event once.
 */
static void
test_abortable_transaction_rewinds(void **state)
{
	(void)state;
	t_relay_setup(&R, "eosabort", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	t_insert_txn(&R, "eosab", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_broker_cmd(&R.b, "request-errors 24 1 TOPIC_AUTHORIZATION_FAILED"), 0);
	t_insert_txn(&R, "eosab", 50, 5);
	t_insert_txn(&R, "eosab", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	if (t_relay_metric(&R, "outboxd_kafka_transactions_aborted_total") < 1 ||
	    t_log_count(&R, "streaming from slot") < 2) {
		t_log_dump(&R);
		fail_msg("the injected error did not abort a transaction and rewind");
	}
	/* said in words: the commit failed, or the transaction took no more records */
	assert_int_equal(t_log_count(&R, "could not commit the Kafka transaction") +
	        t_log_count(&R, "the Kafka transaction can take no more records"),
	    1);
	assert_true(t_relay_metric(&R, "outboxd_kafka_transactions_committed_total") >= 2);
	expect_committed_once("outbox.event.eosab", 150);
}

/*
 * The broker fences the epoch while this instance still holds the slot
 * (what a broker does to a transaction that outlived transaction.timeout.ms):
 * nobody took over, so outboxd starts a new session instead of exiting, and
 * nothing is lost or duplicated in committed transactions.
 */
static void
test_fenced_while_holding_the_slot(void **state)
{
	(void)state;
	t_relay_setup(&R, "eosfence", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	t_insert_txn(&R, "eosfn", 40, 4);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_broker_cmd(&R.b, "request-errors 26 1 INVALID_PRODUCER_EPOCH"), 0);
	t_insert_txn(&R, "eosfn", 40, 4);
	t_insert_txn(&R, "eosfn", 40, 4);
	if (!t_wait_confirmed_current(&R, 30000) || t_log_count(&R, "while this instance still holds slot") != 1) {
		t_log_dump(&R);
		fail_msg("the fenced epoch did not start a new session");
	}
	assert_true(waitpid(R.pid, NULL, WNOHANG) == 0); /* still running */
	assert_int_equal(t_log_count(&R, "fenced: another instance took over"), 0);
	expect_committed_once("outbox.event.eosfn", 120);
}

/*
 * Every outbox row of aggregate type agg is in the committed records of its
 * topic exactly once (at least once unless exact), and nothing else is.
 */
static void
expect_agg_committed(const char *agg, size_t want, bool exact)
{
	char topic[128];
	struct t_msg *m;
	size_t n, total = 0;
	PGresult *res;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	t_committed_only(R.b.bootstrap, R.slot, m, &n);
	res = PQexecParams(R.pg, "SELECT id::text FROM outbox WHERE aggregatetype = $1", 1, NULL, &agg, NULL, NULL,
	    0);
	assert_int_equal((size_t)PQntuples(res), want);
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = t_count_id(m, n, PQgetvalue(res, i, 0));

		if (c == 0 || (exact && c != 1)) {
			t_log_dump(&R);
			fail_msg("event %s of %s is in committed Kafka transactions %zu time(s)",
			    PQgetvalue(res, i, 0), agg, c);
		}
		total += c;
	}
	assert_int_equal(n, total);
	PQclear(res);
	t_msgs_free(m, n);
}

/*
 * The data directory restored in place from an earlier copy (a volume
 * snapshot: the same system identifier, timeline and slot) while outboxd
 * was stopped, then 150 transactions committed: their commit LSNs run over
 * positions that the last progress record of the lost history already
 * covers.  None of them may be taken for a replay: every one is in
 * committed Kafka transactions, once.
 */
static void
test_restored_data_directory_publishes(void **state)
{
	uint64_t lost_end, first;
	char *v;

	(void)state;
	t_relay_setup(&R, "eosrestore", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	t_insert_txn(&R, "rsa", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	R.pid = 0;

	/* the copy; then a history that the restore will take away, published and marked */
	t_pg_save_data(&R.st);
	PQreset(R.pg);
	t_relay_start(&R, NULL, 1);
	for (int i = 0; i < 40; i++)
		t_insert_txn(&R, "rsb", 20, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	R.pid = 0;
	v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text");
	lost_end = t_lsn(v);
	free(v);

	/* the restore, and new transactions over the same positions */
	t_pg_restore_data(&R.st);
	PQreset(R.pg);
	assert_int_equal(PQstatus(R.pg), CONNECTION_OK);
	v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text");
	first = t_lsn(v);
	free(v);
	assert_true(first < lost_end); /* the restore went back */
	for (int i = 0; i < 150; i++)
		t_insert_txn(&R, "rsc", 1, 150);
	while (t_lsn(v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text")) <= lost_end) {
		free(v);
		t_insert_txn(&R, "rsd", 1, 1); /* the server's WAL goes past the lost history's end */
	}
	free(v);

	t_relay_start(&R, NULL, 1);
	if (!t_wait_confirmed_current(&R, 30000)) {
		t_log_dump(&R);
		fail_msg("the relay did not catch up after the restore");
	}
	expect_agg_committed("rsc", 150, true);
	/* the record was refused: what the replay holds of the common history may come again */
	expect_agg_committed("rsa", 50, false);
	assert_int_equal(t_log_count(&R, "is of another history"), 1);
}

static struct t_relay Q; /* a relay on a second cluster (test_shared_transactional_id) */
static char qstate[128];

static int
teardown_two_clusters(void **state)
{
	Q.b.pid = 0; /* R's broker, stopped with R */
	t_relay_teardown(&Q);
	memset(&Q, 0, sizeof(Q));
	if (qstate[0] != '\0') {
		t_stack_stop_extra(qstate);
		rmdir(qstate);
		qstate[0] = '\0';
	}
	return teardown(state);
}

/*
 * Two databases on two servers share one explicit [delivery]
 * transactional_id and the slot name (the default, say): the last progress
 * record is the other database's, with a mark far beyond this server's
 * positions.  It names another system and database, so this session skips
 * nothing: every one of its 100 events is in committed transactions (they
 * were all skipped as "replayed" before).
 */
static void
test_shared_transactional_id(void **state)
{
	char eos[256];
	const char *saved = getenv("OBX_STACK_ENV");
	char *keep = saved != NULL ? strdup(saved) : NULL, env[160];
	uint64_t b_lsn, a_mark;
	char *v;

	(void)state;
	t_relay_setup(&R, "eosshare", 0);
	/* the id holds the slot's name, which the tests' read-back of progress records matches */
	snprintf(eos, sizeof(eos), "[delivery]\nexactly_once = on\ntransactional_id = shared-%s\n", R.slot);
	t_relay_config(&R, eos);
	/* this server's positions well beyond the second one's: four WAL segments on */
	t_exec(R.pg, "CREATE TABLE walpad (x int)");
	for (int i = 0; i < 4; i++) {
		t_exec(R.pg, "INSERT INTO walpad VALUES (%d)", i);
		free(t_query1(R.pg, "SELECT pg_switch_wal()::text"));
	}
	t_relay_start(&R, NULL, 1);
	t_insert_txn(&R, "sharea", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	R.pid = 0;
	v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text");
	a_mark = t_lsn(v);
	free(v);

	/* the second server: a database, the same slot name, the same broker and transactional_id */
	snprintf(qstate, sizeof(qstate), "/tmp/obx-eosq-%d", (int)getpid());
	t_stack_start_extra(&Q.st, qstate, NULL);
	snprintf(env, sizeof(env), "%s/env", qstate);
	setenv("OBX_STACK_ENV", env, 1);
	t_relay_setup(&Q, "eosshareb", 0);
	if (keep != NULL)
		setenv("OBX_STACK_ENV", keep, 1);
	free(keep);
	t_broker_stop(&Q.b);
	Q.b = R.b;
	snprintf(Q.slot, sizeof(Q.slot), "%s", R.slot);
	t_relay_config(&Q, eos);
	t_relay_start(&Q, NULL, 1); /* creates the slot: nothing to skip */
	assert_int_equal(t_relay_signal(&Q, SIGTERM, 30000), 0);
	Q.pid = 0;
	for (int i = 0; i < 20; i++)
		t_exec(Q.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'shareb', "
		    "'k' || g, 'T', jsonb_build_object('i', g) FROM generate_series(1, 5) g");
	v = t_query1(Q.pg, "SELECT pg_current_wal_lsn()::text");
	b_lsn = t_lsn(v);
	free(v);
	assert_true(b_lsn < a_mark); /* the other server's mark lies beyond every event here */

	t_relay_start(&Q, NULL, 1);
	if (!t_wait_confirmed_current(&Q, 30000)) {
		t_log_dump(&Q);
		fail_msg("the second database's relay did not catch up");
	}
	{
		/* its events, read back through R's helpers (the same broker and slot name) */
		struct t_relay keep_r = R;

		R.pg = Q.pg;
		expect_agg_committed("shareb", 100, true);
		R = keep_r;
	}
	assert_int_equal(t_log_count(&Q, "was written for system "), 1);
}

/*
 * [source] messages toggled between two sessions changes what the seq
 * ordinals of a transaction count.  A transaction of a row, a message and
 * 1,000 rows, split over Kafka transactions (the in-flight cap of 50 makes
 * each commit early): outboxd dies right after the first commit (the hook),
 * then starts with messages off.  The progress record's mark must not be
 * read against the new numbering, where every row after the message has
 * one less: each row reaches committed transactions.
 */
static void
test_messages_toggled_keeps_every_row(void **state)
{
	int st;

	(void)state;
	t_relay_setup(&R, "eosmsgs", 0);
	t_relay_config(&R, "[source]\nmessages = on\n[delivery]\nexactly_once = on\nmax_inflight = 50\n");
	setenv("OBX_TEST_KILL_AFTER_ACKS", "1", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	t_exec(R.pg, "BEGIN");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('msgt', 'k1', 'row', '{\"n\": 0}')");
	t_exec(R.pg,
	    "SELECT pg_logical_emit_message(true, 'outboxd', '{\"id\": \"6f1c1f7e-0000-4000-8000-0000000000a1\", \"aggregatetype\": \"msgm\", "
	    "\"aggregateid\": \"k1\", \"type\": \"msg\", \"payload\": {\"n\": 1}}')");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'msgt', 'k' || (g %% 7), 'row', jsonb_build_object('n', g) FROM generate_series(2, 1001) g");
	t_exec(R.pg, "COMMIT");
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd did not kill itself after its first Kafka transaction");
	}
	R.pid = 0;
	t_slot_wait_inactive(&R, 15000);

	t_relay_config(&R, "[delivery]\nexactly_once = on\nmax_inflight = 50\n");
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 30000));
	expect_agg_committed("msgt", 1001, false);
	assert_int_equal(t_log_count(&R,
	                     "numbers the events of public.outbox+messages:outboxd, this "
	                     "session those of public.outbox"),
	    1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_zombie_is_fenced, teardown),
		cmocka_unit_test_teardown(test_restored_data_directory_publishes, teardown),
		cmocka_unit_test_teardown(test_messages_toggled_keeps_every_row, teardown),
		cmocka_unit_test_teardown(test_shared_transactional_id, teardown_two_clusters),
		cmocka_unit_test_teardown(test_abortable_transaction_rewinds, teardown),
		cmocka_unit_test_teardown(test_fenced_while_holding_the_slot, teardown),
	};

	return T_RUN_TESTS(tests); /* OBX_TEST_FILTER=a,b* runs the matching cases only */
}
