/*
 * The session loop's decisions (runpolicy.h): the reconnect backoff and its
 * jitter, stop signals, the step after a session, the failure's line and
 * metrics.  What the loop does with them on a live stack is
 * tests/integration's (t6100_operations.c test_sighup_rereads, t4000_poll.c
 * test_broker_down_sigterm, t7100_stops.c test_second_signal_exits_at_once).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/runpolicy.h"

static const uint32_t rnds[] = { 0, 1, 2, 99, 100, 101, 12345, 0x7fffffffU, 0xfffffffeU, 0xffffffffU };
#define NRNDS (sizeof(rnds) / sizeof(rnds[0]))

/* The cap of attempt: 200 ms doubled per attempt, at most 30 s. */
static int64_t
cap_of(int attempt)
{
	int64_t c = OBX_RECONNECT_MIN_MS;

	for (int i = 0; i < attempt; i++)
		c = c * 2 > OBX_RECONNECT_MAX_MS ? OBX_RECONNECT_MAX_MS : c * 2;
	return c;
}

static void
test_backoff_bounds(void **state)
{
	(void)state;
	for (int a = -3; a < 64; a++)
		for (size_t k = 0; k < NRNDS; k++) {
			int64_t d = obx_reconnect_delay_ms(a, false, rnds[k]);
			int64_t c = cap_of(a < 0 ? 0 : a);

			assert_true(d >= c / 2);
			assert_true(d <= c);
			assert_true(d >= OBX_RECONNECT_MIN_MS / 2);
			assert_true(d <= OBX_RECONNECT_MAX_MS);
		}
	/* the extremes of the jitter are reached */
	assert_int_equal(obx_reconnect_delay_ms(0, false, 0), 100);
	assert_int_equal(obx_reconnect_delay_ms(0, false, 100), 200);
	assert_int_equal(obx_reconnect_delay_ms(0, false, 101), 100);
	assert_int_equal(obx_reconnect_delay_ms(1000, false, 0), 15000);
	assert_int_equal(obx_reconnect_delay_ms(1000, false, 15000), 30000);
}

static void
test_backoff_grows(void **state)
{
	(void)state;
	/* with the same random value, the wait doubles per attempt until the cap */
	assert_int_equal(obx_reconnect_delay_ms(0, false, 0), 100);
	assert_int_equal(obx_reconnect_delay_ms(1, false, 0), 200);
	assert_int_equal(obx_reconnect_delay_ms(2, false, 0), 400);
	assert_int_equal(obx_reconnect_delay_ms(3, false, 0), 800);
	assert_int_equal(obx_reconnect_delay_ms(7, false, 0), 12800);
	assert_int_equal(obx_reconnect_delay_ms(8, false, 0), 15000);
	assert_int_equal(obx_reconnect_delay_ms(9, false, 0), 15000);
	for (int a = 0; a < 40; a++)
		assert_true(obx_reconnect_delay_ms(a + 1, false, 7) >= obx_reconnect_delay_ms(a, false, 7));
	/* INT_MAX attempts do not overflow */
	assert_int_equal(obx_reconnect_delay_ms(0x7fffffff, false, 0), 15000);
}

static void
test_backoff_standby(void **state)
{
	(void)state;
	/* a standby retries about every second, whatever the attempt */
	for (int a = 0; a < 20; a++)
		for (size_t k = 0; k < NRNDS; k++) {
			int64_t d = obx_reconnect_delay_ms(a, true, rnds[k]);

			assert_true(d >= OBX_STANDBY_RETRY_MS / 2);
			assert_true(d <= OBX_STANDBY_RETRY_MS);
		}
}

/* Only a session that confirmed something, waited as a standby or streamed long resets the backoff */
static void
test_session_progressed(void **state)
{
	(void)state;
	/* streamed and ended at once (a fatal producer error, a missing ACL): no progress */
	assert_false(obx_session_progressed(false, false, 0));
	assert_false(obx_session_progressed(false, false, 174));
	assert_false(obx_session_progressed(false, false, OBX_PROGRESS_STREAMED_MS - 1));
	assert_true(obx_session_progressed(false, true, 174));
	assert_true(obx_session_progressed(true, false, 0));
	/* a quiet database confirms nothing for long: a long session still counts */
	assert_true(obx_session_progressed(false, false, OBX_PROGRESS_STREAMED_MS));
}

static void
test_stops(void **state)
{
	struct obx_stops s = { 0 };

	(void)state;
	assert_false(obx_stops_abandoned(&s, 1000000, 30000));
	assert_int_equal(obx_stops_add(&s, 5000), OBX_STOP_DRAIN);
	assert_int_equal(s.count, 1);
	assert_int_equal(s.first_ms, 5000);
	assert_false(obx_stops_abandoned(&s, 5000, 30000));
	assert_false(obx_stops_abandoned(&s, 34999, 30000));
	assert_true(obx_stops_abandoned(&s, 35000, 30000)); /* the drain deadline */
	assert_int_equal(obx_stops_add(&s, 6000), OBX_STOP_NOW);
	assert_int_equal(s.first_ms, 5000); /* the first one's time stays */
	assert_true(obx_stops_abandoned(&s, 6000, 30000));
	assert_int_equal(obx_stops_add(&s, 7000), OBX_STOP_NOW);
	assert_int_equal(s.count, 3);
}

static void
test_next(void **state)
{
	(void)state;
	assert_int_equal(obx_run_next(OBX_RUN_STOP, 0), OBX_NEXT_STOPPED);
	assert_int_equal(obx_run_next(OBX_RUN_STOP, 1), OBX_NEXT_STOPPED);
	assert_int_equal(obx_run_next(OBX_RUN_FATAL, 0), OBX_NEXT_FATAL);
	assert_int_equal(obx_run_next(OBX_RUN_FATAL, 2), OBX_NEXT_FATAL); /* a fatal error is said, exit 1 */
	assert_int_equal(obx_run_next(OBX_RUN_RETRY, 0), OBX_NEXT_RETRY);
	assert_int_equal(obx_run_next(OBX_RUN_RETRY, 1), OBX_NEXT_INTERRUPTED);
}

static void
test_failure_line(void **state)
{
	(void)state;
	assert_int_equal(obx_failure_line("", "could not connect", false, false), OBX_FAILURE_NEW);
	assert_int_equal(obx_failure_line("could not connect", "could not connect", false, false),
	    OBX_FAILURE_AGAIN);
	assert_int_equal(obx_failure_line("could not connect", "lost the connection", false, false),
	    OBX_FAILURE_NEW);
	/* a standby says so once, whatever its reason */
	assert_int_equal(obx_failure_line("", "slot in use", true, false), OBX_FAILURE_STANDBY);
	assert_int_equal(obx_failure_line("slot in use", "slot in use", true, true), OBX_FAILURE_QUIET);
	assert_int_equal(obx_failure_line("slot in use", "other", true, true), OBX_FAILURE_QUIET);
	/* a standby that fails otherwise warns */
	assert_int_equal(obx_failure_line("slot in use", "could not connect", false, true), OBX_FAILURE_NEW);
}

static void
test_failure_metrics(void **state)
{
	struct obx_metrics m;
	char longer[400];

	(void)state;
	memset(&m, 0, sizeof(m));
	m.state = OBX_STATE_STREAMING;
	m.inflight_events = 5;
	m.inflight_bytes = 500;
	m.oldest_unacked_age_seconds = 2.5;
	obx_failure_metrics(&m, false, false, "could not connect");
	assert_int_equal(m.reconnects_postgres, 1);
	assert_int_equal(m.reconnects_kafka, 0);
	assert_int_equal(m.state, OBX_STATE_CONNECTING);
	assert_int_equal(m.not_ready, OBX_NOT_READY_POSTGRES);
	assert_string_equal(m.state_reason, "could not connect");
	assert_int_equal(m.inflight_events, 0);
	assert_int_equal(m.inflight_bytes, 0);
	assert_true(m.oldest_unacked_age_seconds == 0);
	obx_failure_metrics(&m, true, false, "producer fatal error");
	assert_int_equal(m.reconnects_postgres, 1);
	assert_int_equal(m.reconnects_kafka, 1);
	assert_int_equal(m.not_ready, OBX_NOT_READY_BROKER);
	obx_failure_metrics(&m, false, true, "slot in use");
	assert_int_equal(m.reconnects_postgres, 1);
	assert_int_equal(m.reconnects_kafka, 1);
	assert_int_equal(m.state, OBX_STATE_STANDBY);
	assert_int_equal(m.not_ready, OBX_NOT_READY_NONE);
	memset(longer, 'x', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	obx_failure_metrics(&m, false, false, longer);
	assert_int_equal(strlen(m.state_reason), sizeof(m.state_reason) - 1);
}

/* The server's numbers go stale after two status intervals and a second. */
static void
test_server_view_fresh(void **state)
{
	(void)state;
	assert_true(obx_server_view_fresh(true, 1000, 1000 + 21000, 10000));
	assert_false(obx_server_view_fresh(true, 1000, 1000 + 21001, 10000));
	assert_false(obx_server_view_fresh(false, 1000, 1000, 10000)); /* the read failed */
}

/* A standby tries a session at most every second, at once when the watch cannot tell. */
static void
test_standby_step(void **state)
{
	(void)state;
	/* the first second: wait, whatever the read says */
	assert_int_equal(obx_standby_step(false, 0, false, 5000, 5999), OBX_STANDBY_WAIT);
	/* the slot still held by another instance: wait on */
	assert_int_equal(obx_standby_step(true, 6500, true, 5000, 7000), OBX_STANDBY_WAIT);
	/* free or gone, in a read since the wait began: try */
	assert_int_equal(obx_standby_step(true, 6500, false, 5000, 7000), OBX_STANDBY_TRY);
	/* free, but the read is older than the wait: wait for a fresh one */
	assert_int_equal(obx_standby_step(true, 4000, false, 5000, 6000), OBX_STANDBY_WAIT);
	/* unreadable, or no read for 3 s: let the session find out */
	assert_int_equal(obx_standby_step(false, 6500, true, 5000, 7000), OBX_STANDBY_TRY);
	assert_int_equal(obx_standby_step(true, 6500, true, 5000, 9501), OBX_STANDBY_TRY);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backoff_bounds),
		cmocka_unit_test(test_backoff_grows),
		cmocka_unit_test(test_backoff_standby),
		cmocka_unit_test(test_session_progressed),
		cmocka_unit_test(test_stops),
		cmocka_unit_test(test_next),
		cmocka_unit_test(test_failure_line),
		cmocka_unit_test(test_failure_metrics),
		cmocka_unit_test(test_server_view_fresh),
		cmocka_unit_test(test_standby_step),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
