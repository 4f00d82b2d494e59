/*
 * Stop signals on every PostgreSQL major: a second SIGTERM exits at once
 * without confirming what is unacknowledged, and SIGTERM ends the wait for
 * slot creation behind an open transaction.  The first SIGTERM's drain is
 * t1000_relay.c test_sigterm_drains; SIGTERM in every mode and wait, on
 * PostgreSQL 15 alone, is t7200_stops_every_wait.c.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	unsetenv("OBX_TEST_FATAL_AFTER");
	return 0;
}

/*
 * Creating a slot waits for the transactions running when it started to
 * end.  A transaction left open must not make outboxd deaf to SIGTERM while
 * it waits (Kubernetes would have to kill it, again on every restart).
 */
static void
test_slot_creation_wait_ends_on_sigterm(void **state)
{
	PGconn *open_txn;
	int st;

	(void)state;
	t_relay_setup(&R, "slotwait", 0);
	open_txn = t_pg(&R.st, R.db, 0);
	t_exec(open_txn, "BEGIN");
	t_exec(open_txn, "CREATE TABLE held (v int)"); /* takes an xid */
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 0);
	sleep(3);
	assert_int_equal(t_log_count(&R, "streaming from slot"), 0); /* still waiting */
	st = t_relay_signal(&R, SIGTERM, 10000);
	if (st == -1 || !WIFEXITED(st)) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop on SIGTERM while creating its slot (status %d)", st);
	}
	t_exec(open_txn, "COMMIT");
	PQfinish(open_txn);
	/* and once the transaction is over, the slot is created and the relay streams */
	t_relay_start(&R, NULL, 1);
}

/* A second SIGTERM stops at once, without confirming what is not acknowledged. */
static void
test_second_signal_exits_at_once(void **state)
{
	char *before;
	int64_t t0;
	int st;

	(void)state;
	t_relay_setup(&R, "twice", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_insert_events(&R, "twice", 0, 1);
	t_expect_all_published(&R, "twice", 15000);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	before = t_exec_commit_bound(R.pg, NULL,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('twice', 'k1', 'E', '{}')");
	t_insert_events(&R, "twice", 2, 5);
	sleep(1);
	kill(R.pid, SIGTERM);
	sleep(2);
	assert_int_equal(waitpid(R.pid, &st, WNOHANG), 0); /* still draining */
	t0 = t_now_ms();
	st = t_relay_signal(&R, SIGTERM, 5000);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_true(t_now_ms() - t0 < 3000);
	assert_int_equal(t_log_count(&R, "second signal: stopping at once"), 1);
	t_slot_wait_inactive(&R, 10000);
	assert_true(t_slot_confirmed(&R) <= t_lsn(before));
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	free(before);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_second_signal_exits_at_once, teardown),
		cmocka_unit_test_teardown(test_slot_creation_wait_ends_on_sigterm, teardown),
	};

	return T_RUN_TESTS(tests);
}
