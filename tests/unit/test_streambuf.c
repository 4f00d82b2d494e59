/* The stream buffer: rows of streamed transactions until Stream Commit or Abort. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/err.h"
#include "obx/core/streambuf.h"

static struct obx_relcol cols[] = { { "id", 25 }, { "payload", 3802 } };
static struct obx_rel rel = { 16384, "public", "outbox", 2, cols, 1, false };

/* A row whose id is text; the datums are on the stack: the buffer must copy them. */
static int
add(struct obx_streambuf *b, uint32_t xid, uint32_t subxid, const char *id)
{
	char copy[32];
	struct obx_pg_datum d[2];
	struct obx_pg_tuple t = { 2, d };
	int r;

	strcpy(copy, id);
	d[0] = (struct obx_pg_datum){ 't', (const uint8_t *)copy, (uint32_t)strlen(copy) };
	d[1] = (struct obx_pg_datum){ 'n', NULL, 0 };
	r = obx_streambuf_add(b, xid, subxid, &rel, &t);
	memset(copy, 'X', sizeof(copy));
	return r;
}

static void
expect_ids(const struct obx_sbuf_txn *t, const char *const *ids, size_t n)
{
	assert_non_null(t);
	assert_int_equal(t->nrows, n);
	for (size_t i = 0; i < n; i++) {
		const struct obx_pg_datum *d = &t->rows[i].tuple.cols[0];

		assert_int_equal(d->len, strlen(ids[i]));
		assert_memory_equal(d->data, ids[i], d->len);
		assert_int_equal(t->rows[i].tuple.cols[1].kind, 'n');
		assert_string_equal(t->rels[t->rows[i].rel].relname, "outbox");
	}
}

static void
test_interleaved_transactions_and_savepoints(void **state)
{
	struct obx_streambuf b;
	static const char *const t1[] = { "a1", "a3", "a5" };
	static const char *const t2[] = { "b1" };

	(void)state;
	obx_streambuf_init(&b, 1 << 20);
	assert_int_equal(add(&b, 10, 10, "early"), OBX_ESTATE); /* no Stream Start yet */
	assert_int_equal(obx_streambuf_start(&b, 10), 0);
	assert_int_equal(add(&b, 10, 10, "a1"), 0);
	assert_int_equal(add(&b, 10, 11, "a2"), 0); /* savepoint 11, rolled back below */
	assert_int_equal(obx_streambuf_start(&b, 20), 0);
	assert_int_equal(add(&b, 20, 20, "b1"), 0);
	assert_int_equal(obx_streambuf_start(&b, 10), 0); /* a later block of 10 */
	assert_int_equal(add(&b, 10, 12, "a3"), 0);       /* released savepoint 12: kept */
	assert_int_equal(add(&b, 10, 11, "a4"), 0);
	assert_int_equal(add(&b, 10, 10, "a5"), 0);
	assert_int_equal(obx_streambuf_open(&b), 2);
	assert_int_equal(obx_streambuf_abort(&b, 10, 11), 2);
	assert_int_equal(obx_streambuf_abort(&b, 10, 99), 0); /* a subtransaction with no rows */
	assert_int_equal(obx_streambuf_abort(&b, 77, 77), 0); /* unknown transaction */
	expect_ids(obx_streambuf_get(&b, 10), t1, 3);
	expect_ids(obx_streambuf_get(&b, 20), t2, 1);
	assert_int_equal(obx_streambuf_abort(&b, 20, 20), 1); /* whole rollback */
	assert_null(obx_streambuf_get(&b, 20));
	assert_int_equal(obx_streambuf_open(&b), 1);
	obx_streambuf_drop(&b, 10);
	assert_int_equal(obx_streambuf_open(&b), 0);
	assert_int_equal(b.bytes, 0); /* every byte accounted back */
	obx_streambuf_reset(&b);
}

static void
test_limit(void **state)
{
	struct obx_streambuf b;
	int i, r = 0;

	(void)state;
	obx_streambuf_init(&b, 4096);
	assert_int_equal(obx_streambuf_start(&b, 5), 0);
	for (i = 0; i < 1000 && (r = add(&b, 5, 5, "0123456789abcdef")) == 0; i++)
		;
	assert_int_equal(r, OBX_EFULL);
	assert_true(i > 10);
	assert_true(b.bytes <= 4096);
	assert_int_equal(obx_streambuf_get(&b, 5)->nrows, (size_t)i); /* nothing half-kept */
	assert_int_equal(obx_streambuf_abort(&b, 5, 5), (size_t)i);
	assert_int_equal(b.bytes, 0);
	obx_streambuf_reset(&b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_interleaved_transactions_and_savepoints),
		cmocka_unit_test(test_limit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
