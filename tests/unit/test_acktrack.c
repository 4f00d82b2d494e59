/* The ack tracker: the flushable LSN never passes an unacknowledged transaction. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "obx/core/acktrack.h"
#include "obx/core/err.h"

/* One transaction with n events; tickets written to t[0..n-1]. */
static void
txn(struct obx_acktrack *a, int n, obx_lsn end, uint64_t *t)
{
	assert_int_equal(obx_ack_begin(a), 0);
	for (int i = 0; i < n; i++)
		assert_int_equal(obx_ack_add_event(a, &t[i]), 0);
	assert_int_equal(obx_ack_commit(a, end), 0);
}

static void
test_empty_transactions_advance_at_once(void **state)
{
	struct obx_acktrack a;

	(void)state;
	obx_ack_init(&a, 100);
	assert_int_equal(obx_ack_flushable(&a), 100);
	txn(&a, 0, 200, NULL);
	assert_int_equal(obx_ack_flushable(&a), 200);
	assert_true(obx_ack_idle(&a));
	obx_ack_reset(&a);
}

static void
test_ack_before_confirm_in_commit_order(void **state)
{
	struct obx_acktrack a;
	uint64_t t1[2], t2[1], t3[1];

	(void)state;
	obx_ack_init(&a, 0);
	txn(&a, 2, 100, t1);
	txn(&a, 1, 200, t2);
	txn(&a, 0, 250, NULL); /* no events, behind unacked ones */
	txn(&a, 1, 300, t3);
	assert_int_equal(obx_ack_flushable(&a), 0);
	assert_int_equal(a.outstanding, 4);
	/* later transactions acked first: nothing may be confirmed */
	assert_int_equal(obx_ack_ack(&a, t3[0]), 0);
	assert_int_equal(obx_ack_ack(&a, t2[0]), 0);
	assert_int_equal(obx_ack_flushable(&a), 0);
	assert_int_equal(obx_ack_ack(&a, t1[0]), 0);
	assert_int_equal(obx_ack_flushable(&a), 0); /* t1 still has one event out */
	/* a keepalive while work is outstanding changes nothing (docs/internals/design.md, invariant 5) */
	obx_ack_keepalive(&a, 10000);
	assert_int_equal(obx_ack_flushable(&a), 0);
	assert_int_equal(obx_ack_ack(&a, t1[1]), 0);
	/* all done: through the empty transaction folded into t2, and t3 */
	assert_int_equal(obx_ack_flushable(&a), 300);
	assert_true(obx_ack_idle(&a));
	obx_ack_keepalive(&a, 10000);
	assert_int_equal(obx_ack_flushable(&a), 10000);
	obx_ack_reset(&a);
}

static void
test_partial_progress(void **state)
{
	struct obx_acktrack a;
	uint64_t t1[1], t2[1];

	(void)state;
	obx_ack_init(&a, 0);
	txn(&a, 1, 100, t1);
	txn(&a, 0, 150, NULL);
	txn(&a, 1, 200, t2);
	assert_int_equal(obx_ack_ack(&a, t1[0]), 0);
	assert_int_equal(obx_ack_flushable(&a), 150); /* t1 and the empty one after it */
	obx_ack_reset(&a);
}

static void
test_open_transaction_blocks_keepalive(void **state)
{
	struct obx_acktrack a;
	uint64_t t;

	(void)state;
	obx_ack_init(&a, 50);
	assert_int_equal(obx_ack_begin(&a), 0);
	obx_ack_keepalive(&a, 1000); /* open, even without events yet */
	assert_int_equal(obx_ack_flushable(&a), 50);
	assert_false(obx_ack_idle(&a));
	assert_int_equal(obx_ack_add_event(&a, &t), 0);
	assert_int_equal(obx_ack_ack(&a, t), 0); /* acked but not committed */
	assert_int_equal(obx_ack_flushable(&a), 50);
	assert_int_equal(obx_ack_commit(&a, 400), 0);
	assert_int_equal(obx_ack_flushable(&a), 400);
	obx_ack_reset(&a);
}

static void
test_streamed_transaction_blocks_keepalive(void **state)
{
	struct obx_acktrack a;
	uint64_t t[2];

	(void)state;
	obx_ack_init(&a, 50);
	obx_ack_streams_open(&a, 1); /* Stream Start of a large transaction */
	obx_ack_keepalive(&a, 1000);
	assert_int_equal(obx_ack_flushable(&a), 50);
	assert_false(obx_ack_idle(&a));
	/* a small transaction committing meanwhile is confirmed as usual */
	txn(&a, 1, 300, t);
	assert_int_equal(obx_ack_ack(&a, t[0]), 0);
	assert_int_equal(obx_ack_flushable(&a), 300);
	obx_ack_keepalive(&a, 1000);
	assert_int_equal(obx_ack_flushable(&a), 300);
	/* Stream Commit: the streamed one enters the queue with its events */
	obx_ack_streams_open(&a, 0);
	txn(&a, 2, 900, t);
	obx_ack_keepalive(&a, 1000);
	assert_int_equal(obx_ack_flushable(&a), 300);
	assert_int_equal(obx_ack_ack(&a, t[1]), 0);
	assert_int_equal(obx_ack_ack(&a, t[0]), 0);
	assert_int_equal(obx_ack_flushable(&a), 900);
	assert_true(obx_ack_idle(&a));
	obx_ack_keepalive(&a, 1000);
	assert_int_equal(obx_ack_flushable(&a), 1000);
	obx_ack_reset(&a);
}

static void
test_state_errors_and_unknown_tickets(void **state)
{
	struct obx_acktrack a;
	uint64_t t;

	(void)state;
	obx_ack_init(&a, 0);
	assert_int_equal(obx_ack_add_event(&a, &t), OBX_ESTATE);
	assert_int_equal(obx_ack_commit(&a, 1), OBX_ESTATE);
	assert_int_equal(obx_ack_begin(&a), 0);
	assert_int_equal(obx_ack_begin(&a), OBX_ESTATE);
	assert_int_equal(obx_ack_add_event(&a, &t), 0);
	assert_int_equal(obx_ack_commit(&a, 10), 0);
	assert_int_equal(obx_ack_ack(&a, t + 1), OBX_ENOENT);
	assert_int_equal(obx_ack_ack(&a, t), 0);
	assert_int_equal(obx_ack_ack(&a, t), OBX_ENOENT); /* acked twice: refused */
	assert_int_equal(obx_ack_flushable(&a), 10);
	obx_ack_reset(&a);
}

static void
test_many_transactions_grow_and_wrap(void **state)
{
	struct obx_acktrack a;
	static uint64_t tickets[20000];

	(void)state;
	obx_ack_init(&a, 0);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 5000; i++)
			txn(&a, 1, (obx_lsn)(round * 100000 + i + 1) * 10, &tickets[i]);
		for (int i = 4999; i >= 1; i--)
			assert_int_equal(obx_ack_ack(&a, tickets[i]), 0);
		assert_int_equal(obx_ack_flushable(&a),
		    round == 0 ? 0 : (obx_lsn)((round - 1) * 100000 + 5000) * 10);
		assert_int_equal(obx_ack_ack(&a, tickets[0]), 0);
		assert_int_equal(obx_ack_flushable(&a), (obx_lsn)(round * 100000 + 5000) * 10);
	}
	obx_ack_reset(&a);
}

static void
test_times(void **state)
{
	struct obx_acktrack a;
	uint64_t t1, t2;
	int64_t when;

	(void)state;
	obx_ack_init(&a, 0);
	assert_false(obx_ack_oldest_time(&a, &when));
	assert_int_equal(obx_ack_begin_at(&a, 1000), 0);
	assert_int_equal(obx_ack_add_event(&a, &t1), 0);
	assert_int_equal(obx_ack_commit(&a, 10), 0);
	assert_int_equal(obx_ack_begin_at(&a, 2000), 0);
	assert_int_equal(obx_ack_add_event(&a, &t2), 0);
	assert_int_equal(obx_ack_commit(&a, 20), 0);
	assert_true(obx_ack_oldest_time(&a, &when));
	assert_int_equal(when, 1000);
	assert_int_equal(obx_ack_ticket_time(&a, t2), 2000);
	assert_int_equal(obx_ack_ack(&a, t1), 0);
	assert_true(obx_ack_oldest_time(&a, &when));
	assert_int_equal(when, 2000);
	assert_int_equal(obx_ack_ticket_time(&a, t1), 0);
	assert_int_equal(obx_ack_ack(&a, t2), 0);
	assert_false(obx_ack_oldest_time(&a, &when));
	obx_ack_reset(&a);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty_transactions_advance_at_once),
		cmocka_unit_test(test_ack_before_confirm_in_commit_order),
		cmocka_unit_test(test_partial_progress),
		cmocka_unit_test(test_open_transaction_blocks_keepalive),
		cmocka_unit_test(test_streamed_transaction_blocks_keepalive),
		cmocka_unit_test(test_state_errors_and_unknown_tickets),
		cmocka_unit_test(test_many_transactions_grow_and_wrap),
		cmocka_unit_test(test_times),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
