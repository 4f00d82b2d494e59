/*
 * Faults while streaming: the walsender terminated, a hung walsender
 * detected, a producer fatal error (a rewind), a server crash and restart
 * (-m immediate), a slot invalidated by max_slot_wal_keep_size.  Each
 * ends with every committed event published.
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

static void
test_walsender_terminated(void **state)
{
	(void)state;
	t_relay_setup(&R, "term", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	for (int round = 0; round < 3; round++) {
		t_insert_events(&R, "term", round * 50, round * 50 + 50);
		t_exec(R.pg,
		    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
		    "WHERE slot_name = '%s' AND active",
		    R.slot);
		usleep(300000);
	}
	t_insert_events(&R, "term", 150, 160);
	t_expect_all_published(&R, "term", 30000);
	assert_true(t_log_count(&R, "streaming from slot") >= 2);
	assert_true(t_wait_confirmed_current(&R, 15000));
}

/*
 * A walsender that hangs (SIGSTOP: its socket stays open, the kernel still
 * answers keepalive probes): outboxd, silent for wal_sender_timeout (10 s on
 * the test stack), treats the connection as dead and reconnects; the slot is
 * then held by the hung process, so it waits as a standby and takes over once
 * that process goes.
 */
static void
test_hung_walsender_detected(void **state)
{
	char *pid;
	int64_t deadline;

	(void)state;
	t_relay_setup(&R, "hung", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_insert_events(&R, "hung", 0, 10);
	t_expect_all_published(&R, "hung", 30000);
	pid = t_query1(R.pg, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
	assert_int_equal(kill((pid_t)atoi(pid), SIGSTOP), 0);
	deadline = t_now_ms() + 20000;
	while (t_log_count(&R, "treating the replication connection as dead") == 0 && t_now_ms() < deadline)
		usleep(100000);
	kill((pid_t)atoi(pid), SIGCONT);
	if (t_log_count(&R, "treating the replication connection as dead") != 1)
		t_log_dump(&R);
	assert_int_equal(t_log_count(&R, "treating the replication connection as dead"), 1);
	free(pid);
	t_insert_events(&R, "hung", 10, 20);
	t_expect_all_published(&R, "hung", 30000);
	assert_true(t_wait_confirmed_current(&R, 15000));
}

static void
test_server_crash_and_restart(void **state)
{
	(void)state;
	t_relay_setup(&R, "crash", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_insert_events(&R, "crash", 0, 100);
	PQfinish(R.pg);
	R.pg = NULL;
	assert_int_equal(t_pg_ctl(&R.st, "restart -m immediate"), 0);
	R.pg = t_pg(&R.st, R.db, 0);
	t_insert_events(&R, "crash", 100, 150);
	t_expect_all_published(&R, "crash", 60000);
	assert_true(t_log_count(&R, "streaming from slot") >= 2);
	/* one warning for the outage, not one per retry */
	assert_true(t_log_count(&R, "retrying") <= 3);
}

static void
test_producer_fatal_error_rewinds(void **state)
{
	(void)state;
	t_relay_setup(&R, "fatal", 0);
	t_relay_config(&R, NULL);
	setenv("OBX_TEST_FATAL_AFTER", "30", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_FATAL_AFTER");
	t_insert_txn(&R, "fatal", 100, 11);
	t_expect_all_published(&R, "fatal", 30000);
	/* one transaction: the next produce call mostly meets the fatal error before the error
	 * callback runs; either ends the session once, and the next starts a new producer from the slot */
	if (t_log_count(&R, "producer fatal error: ") != 1) {
		t_log_dump(&R);
		fail_msg("the test hook did not raise a fatal error once (is OBX_TEST_HOOKS on?)");
	}
	assert_int_equal(t_log_count(&R, "streaming from slot"), 2);
	assert_true(t_relay_metric(&R, "outboxd_kafka_errors_total{code=\"_FATAL\"}") >= 1);
	assert_true(t_wait_confirmed_current(&R, 15000));
}

static void
test_invalidated_slot(void **state)
{
	char *status = NULL;

	(void)state;
	t_relay_setup(&R, "lost", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_insert_events(&R, "lost", 0, 5);
	assert_true(t_wait_confirmed_current(&R, 10000));
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
	t_slot_wait_inactive(&R, 10000);
	t_exec(R.pg, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'");
	t_exec(R.pg, "SELECT pg_reload_conf()");
	for (int i = 0; i < 20; i++) {
		free(status);
		t_exec(R.pg, "CREATE TABLE IF NOT EXISTS filler (v text)");
		t_exec(R.pg, "INSERT INTO filler SELECT repeat('f', 1000) FROM generate_series(1, 3000)");
		t_exec(R.pg, "SELECT pg_switch_wal()");
		t_exec(R.pg, "CHECKPOINT");
		status = t_query1(R.pg,
		    "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
		if (strcmp(status, "lost") == 0)
			break;
	}
	t_exec(R.pg, "ALTER SYSTEM RESET max_slot_wal_keep_size");
	t_exec(R.pg, "SELECT pg_reload_conf()");
	assert_string_equal(status, "lost");
	free(status);
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	{
		int st = t_wait(R.pid, 20000);

		R.pid = 0;
		assert_true(st != -1 && WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 1);
	}
	assert_int_equal(t_log_count(&R, "is invalidated (wal_status = lost)"), 1);
	assert_int_equal(t_log_count(&R, "may have been lost"), 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_walsender_terminated, teardown),
		cmocka_unit_test_teardown(test_hung_walsender_detected, teardown),
		cmocka_unit_test_teardown(test_producer_fatal_error_rewinds, teardown),
		cmocka_unit_test_teardown(test_invalidated_slot, teardown),
		cmocka_unit_test_teardown(test_server_crash_and_restart, teardown),
	};

	return T_RUN_TESTS(tests);
}
