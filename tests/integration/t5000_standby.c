/*
 * Hot standby on one slot: an instance that finds the slot in use waits,
 * takes over after kill -9 of the active one and publishes everything; two
 * instances starting together on a fresh database (one creates and
 * streams, one waits); a standby is ready (/readyz) and quiet (it does not
 * fill the server log while it waits).  Failover to a physical standby
 * server is t5100_failover.c; a standby taking over in the middle of a
 * snapshot is t3000_snapshot.c test_standby_takes_over.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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
test_standby_takes_over(void **state)
{
	struct t_relay S;
	int64_t t0, takeover;

	(void)state;
	t_relay_setup(&R, "standby", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_insert_events(&R, "standby", 0, 50);

	/* a second instance, same slot and config: it waits as a hot standby */
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	for (t0 = t_now_ms(); t_log_count(&S, "standby:") == 0 && t_now_ms() - t0 < 10000;)
		usleep(50000);
	assert_int_equal(t_log_count(&S, "standby:"), 1);
	sleep(3);
	assert_int_equal(t_log_count(&S, "standby:"), 1); /* said once, not per retry */
	assert_int_equal(t_log_count(&S, "streaming from slot"), 0);

	assert_true(t_relay_signal(&R, SIGKILL, 10000) != -1);
	t0 = t_now_ms();
	while (t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 20000)
		usleep(20000);
	takeover = t_now_ms() - t0;
	assert_int_equal(t_log_count(&S, "taking over slot"), 1);
	print_message("standby took over %lld ms after kill -9 of the active instance\n", (long long)takeover);
	assert_true(takeover < 10000);
	t_insert_events(&R, "standby", 50, 100);
	t_expect_all_published(&R, "standby", 30000);
	t_relay_twin_stop(&S);
}

/* Two instances starting together on a fresh database: one creates and streams, one waits. */
static void
test_two_instances_start_together(void **state)
{
	struct t_relay S;
	int64_t t0;
	int a, b;

	(void)state;
	t_relay_setup(&R, "together", 0);
	t_relay_config(&R, NULL);
	t_relay_twin(&R, &S, "second");
	t_relay_start(&R, NULL, 0);
	t_relay_start(&S, NULL, 0);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 20000; usleep(50000)) {
		a = t_log_count(&R, "streaming from slot") + t_log_count(&S, "streaming from slot");
		b = t_log_count(&R, "standby:") + t_log_count(&S, "standby:");
		if (a == 1 && b == 1)
			break;
	}
	if (a != 1 || b != 1) {
		t_log_dump(&R);
		t_log_dump(&S);
		fail_msg("expected one streaming and one standby instance (streaming %d, standby %d)", a, b);
	}
	assert_int_equal(t_log_count(&R, "could not create") + t_log_count(&S, "could not create"), 0);
	t_insert_events(&R, "together", 0, 20);
	t_expect_all_published(&R, "together", 20000);
	t_relay_twin_stop(&S);
}

static char body[1 << 20];

static void
test_standby_is_ready(void **state)
{
	struct t_relay S;
	int port;
	int64_t t0;

	(void)state;
	t_relay_setup(&R, "opsstandby", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	port = t_metrics_port(&S);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 10000; usleep(100000))
		if (t_http_get(port, "/readyz", body, sizeof(body)) == 200)
			break;
	assert_string_equal(body, "ready: standby\n");
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_state{state=\"standby\"}") == 1);
	assert_true(t_metric(body, "outboxd_state{state=\"streaming\"}") == 0);
	t_relay_twin_stop(&S);
}

/* Lines of the stack's server log from offset on that contain needle. */
static int
server_log_count(long offset, const char *needle)
{
	char path[600], line[4096];
	FILE *fp;
	int n = 0;

	snprintf(path, sizeof(path), "%s/server.log", R.st.root);
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s", path);
	fseek(fp, offset, SEEK_SET);
	while (fgets(line, sizeof(line), fp) != NULL)
		n += strstr(line, needle) != NULL;
	fclose(fp);
	return n;
}

static long
server_log_size(void)
{
	char path[600];
	FILE *fp;
	long size;

	snprintf(path, sizeof(path), "%s/server.log", R.st.root);
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s", path);
	fseek(fp, 0, SEEK_END);
	size = ftell(fp);
	fclose(fp);
	return size;
}

/*
 * A hot standby is quiet: while the active instance streams, the standby
 * asks the server once a second on an ordinary connection, so 40 s of
 * waiting add at most a handful of ERROR lines to the server's log (a
 * refused START_REPLICATION writes one each); it still takes over within
 * seconds when the active instance dies.
 */
static void
test_standby_is_quiet(void **state)
{
	struct t_relay S;
	long offset;
	int64_t t0;
	int errors;

	(void)state;
	t_relay_setup(&R, "opsquiet", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	offset = server_log_size();
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	sleep(40);
	errors = server_log_count(offset, "ERROR:");
	if (errors > 3 || t_log_count(&S, "standby:") != 1) {
		t_log_dump(&S);
		fail_msg("a standby waiting 40 s wrote %d ERROR line(s) to the server log", errors);
	}
	assert_int_equal(kill(R.pid, SIGKILL), 0);
	assert_true(t_wait(R.pid, 10000) != -1);
	R.pid = 0;
	for (t0 = t_now_ms(); t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 30000;)
		usleep(100000);
	if (t_log_count(&S, "taking over slot") != 1) {
		t_log_dump(&S);
		fail_msg("the standby did not take over within 30 s");
	}
	fprintf(stderr, "standby: took over %.1f s after the active instance died\n",
	    (double)(t_now_ms() - t0) / 1000.0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('opsq', 'k', 'T', '{}')");
	assert_true(t_wait_confirmed_current(&R, 20000));
	t_relay_twin_stop(&S);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_standby_takes_over, teardown),
		cmocka_unit_test_teardown(test_two_instances_start_together, teardown),
		cmocka_unit_test_teardown(test_standby_is_ready, teardown),
		cmocka_unit_test_teardown(test_standby_is_quiet, teardown),
	};

	return T_RUN_TESTS(tests);
}
