/* The snapshot's decisions: what a delivery outcome means for the run, a snapshot record's headers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/err.h"
#include "obx/core/snapcore.h"

/* The run goes on for a record sent, settled, acknowledged or ignored; errbuf is left alone. */
static void
test_outcomes_that_go_on(void **state)
{
	const enum obx_dlv_outcome on[] = { OBX_DLV_SENT, OBX_DLV_SETTLED, OBX_DLV_ACKED, OBX_DLV_IGNORED };
	struct obx_snap_hold h = { 0 };
	char err[128];

	(void)state;
	for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
		snprintf(err, sizeof(err), "untouched");
		assert_int_equal(obx_snap_outcome(&h, on[i], 7, "s1", "why", err, sizeof(err)), 0);
		assert_string_equal(err, "untouched");
		assert_false(obx_snap_holding(&h));
	}
}

/*
 * A wait for a topic holds the run at its earliest record, whatever order
 * the reports come in; the resume reads again from there and probes until
 * a record past every one the first round produced goes through without a
 * hold: a second missing topic further on never sends a record a third time.
 */
static void
test_missing_topic_holds(void **state)
{
	struct obx_snap_hold h = { 0 };
	char err[128];

	(void)state;
	snprintf(err, sizeof(err), "untouched");
	for (uint64_t t = 9; t <= 20; t++)
		assert_int_equal(obx_snap_outcome(&h, OBX_DLV_SENT, t, "s1", "", err, sizeof(err)), 0);
	assert_int_equal(
	    obx_snap_outcome(&h, OBX_DLV_WAIT_TOPIC, 12, "s1", "topic t is missing", err, sizeof(err)), 0);
	assert_string_equal(err, "untouched");
	assert_true(obx_snap_holding(&h));
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_WAIT_TOPIC, 9, "s1", "t", err, sizeof(err)), 0);
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_WAIT_TOPIC, 15, "s1", "t", err, sizeof(err)), 0);
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_ACKED, 10, "s1", "t", err, sizeof(err)), 0);
	assert_int_equal(h.from, 9);
	assert_false(h.probe);
	assert_int_equal(obx_snap_resume(&h), 9);
	assert_false(obx_snap_holding(&h));
	assert_true(h.probe);
	/* the probe meets the topic still missing: held again, still probing */
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_WAIT_TOPIC, 9, "s1", "t", err, sizeof(err)), 0);
	obx_snap_settled(&h, 9);
	assert_true(h.probe);
	assert_int_equal(obx_snap_resume(&h), 9);
	/* it went through, but records the first round produced follow: still one at a time */
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_ACKED, 9, "s1", "t", err, sizeof(err)), 0);
	obx_snap_settled(&h, 9);
	assert_true(h.probe);
	obx_snap_settled(&h, 19);
	assert_true(h.probe);
	/* past them all: producing is free again */
	obx_snap_settled(&h, 20);
	assert_false(h.probe);
	assert_false(obx_snap_holding(&h));
}

/* The pauses of holds in a row: a second, doubling, at most 30 s. */
static void
test_hold_pauses(void **state)
{
	int64_t want[] = { 1000, 2000, 4000, 8000, 16000, 30000, 30000 }, ms = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		assert_int_equal(ms = obx_snap_pause_ms(ms), want[i]);
}

/* A transient failure: the next session starts the snapshot again. */
static void
test_outcomes_that_start_again(void **state)
{
	struct obx_snap_hold h = { 0 };
	char err[128];

	(void)state;
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_RETRY, 3, "s1", "queue full", err, sizeof(err)), OBX_EIO);
	assert_string_equal(err, "snapshot of slot s1: queue full; the snapshot starts again");
}

/* What on_error cannot take (a record rejected for good, on_error = stop) ends the run: exit 1. */
static void
test_outcomes_that_stop(void **state)
{
	struct obx_snap_hold h = { 0 };
	char err[128], small[16];

	(void)state;
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_REJECTED, 3, "s1", "record too large", err, sizeof(err)),
	    OBX_ECONFIG);
	assert_string_equal(err, "snapshot of slot s1: record too large");
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_STOP, 3, "s1", "on_error = stop", err, sizeof(err)),
	    OBX_ECONFIG);
	assert_string_equal(err, "snapshot of slot s1: on_error = stop");
	/* the reason is cut to the buffer, never overrun */
	assert_int_equal(obx_snap_outcome(&h, OBX_DLV_STOP, 3, "s1", "on_error = stop", small, sizeof(small)),
	    OBX_ECONFIG);
	assert_string_equal(small, "snapshot of slo");
}

/*
 * The builder's headers less xid and commit_ts (of its first six), then
 * snapshot: the creation point.  A later header of the same name (an
 * [outbox] one) stays.
 */
static void
test_headers(void **state)
{
	const struct obx_header in[] = {
		{ "id", "e1", 2 },
		{ "type", "Created", 7 },
		{ "lsn", "0/0", 3 },
		{ "seq", "4", 1 },
		{ "xid", "77", 2 },
		{ "commit_ts", "123", 3 },
		{ "tenant", "t1", 2 },
		{ "xid", "x", 1 },
	};
	const char *want[] = { "id", "type", "lsn", "seq", "tenant", "xid", "snapshot" };
	struct obx_event ev = { .headers = in, .nheaders = 8 };
	struct obx_header *h = NULL;
	size_t cap = 0, n = 0;

	(void)state;
	assert_int_equal(obx_snap_headers(&ev, "0/1A2B3C", &h, &cap, &n), 0);
	assert_int_equal(n, 7);
	assert_int_equal(cap, 9);
	for (size_t i = 0; i < n; i++)
		assert_string_equal(h[i].name, want[i]);
	assert_ptr_equal(h[0].value, in[0].value);
	assert_ptr_equal(h[5].value, in[7].value);
	assert_int_equal(h[6].len, 8);
	assert_memory_equal(h[6].value, "0/1A2B3C", 8);

	/* fewer headers: the array is reused as it is */
	ev.nheaders = 2;
	assert_int_equal(obx_snap_headers(&ev, "0/1", &h, &cap, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(cap, 9);
	assert_string_equal(h[1].name, "type");
	assert_string_equal(h[2].name, "snapshot");
	free(h);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_outcomes_that_go_on),
		cmocka_unit_test(test_missing_topic_holds),
		cmocka_unit_test(test_hold_pauses),
		cmocka_unit_test(test_outcomes_that_start_again),
		cmocka_unit_test(test_outcomes_that_stop),
		cmocka_unit_test(test_headers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
