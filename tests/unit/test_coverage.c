/*
 * Whether the publication kept covering every outbox table (core/coverage.h):
 * two catalog readings judged, for each way a table can leave a publication
 * FOR TABLE behind, and the memberships that cover a table from its creation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/coverage.h"
#include "obx/core/err.h"

static struct obx_config cfg;

static int
setup(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(obx_config_init(&cfg), 0);
	assert_int_equal(obx_config_set(&cfg, "source", "table", "public.outbox, tenant_*.outbox, billing.outbox",
	                     "test", false, err, sizeof(err)),
	    0);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	obx_config_reset(&cfg);
	return 0;
}

/* A reading of two exact tables (public.outbox, billing.outbox) in publication 100. */
static struct obx_cov
reading(struct obx_cov_table *t, struct obx_cov_table a, struct obx_cov_table b)
{
	t[0] = a;
	t[1] = b;
	return (struct obx_cov){ .read = true, .pubid = 100, .pub_insert = true, .n = 2, .t = t };
}

/* A table held by the pg_publication_rel row mem (0: not held). */
#define TBL(rel, mem) ((struct obx_cov_table){ .relid = (rel), .rel_row = (mem) })
/* A table held by the whole-schema or all-tables row mem. */
#define WHOLE(rel, mem, via) ((struct obx_cov_table){ .relid = (rel), .whole_row = (mem), .whole_via = (via) })

static void
test_entries_are_the_exact_ones(void **state)
{
	const struct obx_table_pat *p[4];

	(void)state;
	assert_int_equal(obx_cov_entries(&cfg, p, 4), 2);
	assert_string_equal(p[0]->name, "outbox");
	assert_string_equal(p[0]->schema, "public");
	assert_string_equal(p[1]->schema, "billing");
	assert_int_equal(obx_cov_entries(&cfg, NULL, 0), 2);
}

/* Nothing changed, or a table went away for good: covered. */
static void
test_same_or_gone_is_covered(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(16390, 501));
	struct obx_cov now = reading(nt, TBL(16385, 500), TBL(16390, 501));
	char err[512] = "";

	(void)state;
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	now = reading(nt, TBL(16385, 500), TBL(0, 0)); /* billing.outbox dropped */
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_string_equal(err, "");
}

/* Dropped and created again (or swapped by a rename): not held, or added after its creation. */
static void
test_recreated_is_a_gap(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(16390, 501));
	struct obx_cov now = reading(nt, TBL(16385, 500), TBL(16400, 0));
	char err[512] = "";

	(void)state;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err,
	    "outbox table billing.outbox was dropped and created again (oid 16400, before "
	    "16390) and publication outboxd does not hold the new table"));
	assert_non_null(strstr(err, "(ALTER PUBLICATION outboxd ADD TABLE billing.outbox)"));
	/* added again by the migration: the rows before the ADD were still not decoded */
	now = reading(nt, TBL(16385, 500), TBL(16400, 502));
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "took it in after its creation"));
	assert_null(strstr(err, "ADD TABLE"));
}

/* Missing at the base, created later: a publication FOR TABLE did not hold it from its creation. */
static void
test_created_later_is_a_gap(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(0, 0));
	struct obx_cov now = reading(nt, TBL(16385, 500), TBL(16400, 0));
	char err[512] = "";

	(void)state;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "outbox table billing.outbox was created while outboxd ran"));
	now = reading(nt, TBL(16385, 500), TBL(0, 0));
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
}

/* Taken out of the publication, or taken out and added again: a gap, the same oid. */
static void
test_left_the_publication_is_a_gap(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(16390, 501));
	struct obx_cov now = reading(nt, TBL(16385, 0), TBL(16390, 501));
	char err[512] = "";

	(void)state;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "outbox table public.outbox was taken out of publication outboxd"));
	now = reading(nt, TBL(16385, 510), TBL(16390, 501));
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "left and rejoined"));
}

/* FOR ALL TABLES or a schema's membership covers a table from its creation, whatever its oid. */
static void
test_whole_memberships_cover_new_tables(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov_table all0 = WHOLE(0, 100, OBX_COV_ALL), all1 = WHOLE(16385, 100, OBX_COV_ALL);
	struct obx_cov_table all2 = WHOLE(16400, 100, OBX_COV_ALL);
	struct obx_cov_table sch1 = WHOLE(16390, 700, OBX_COV_SCHEMA), sch2 = WHOLE(16401, 700, OBX_COV_SCHEMA);
	struct obx_cov base = reading(bt, all1, sch1);
	struct obx_cov now = reading(nt, all2, sch2);
	char err[512] = "";

	(void)state;
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	base = reading(bt, all0, sch1);
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	/* the schema left the publication and came back: another membership row */
	sch2.whole_row = 701;
	now = reading(nt, all2, sch2);
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	/* an unlogged table is never decoded, whatever the publication */
	all2.unlogged = true;
	now = reading(nt, all2, sch1);
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "outbox table public.outbox is unlogged"));
}

/*
 * A membership that changes kind between two readings while the other one
 * still holds the table: ADD TABLES IN SCHEMA on top of ADD TABLE, and the
 * schema taken out again while the table's own row stays.
 */
static void
test_membership_changes_kind(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov_table both = { .relid = 16385,
		.rel_row = 500,
		.whole_row = 700,
		.whole_via = OBX_COV_SCHEMA };
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(16390, 501));
	struct obx_cov now = reading(nt, both, TBL(16390, 501));
	char err[512] = "";

	(void)state;
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	base = reading(bt, both, TBL(16390, 501));
	now = reading(nt, TBL(16385, 500), TBL(16390, 501));
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	/* held by the schema only, then by a table row added after it left: not covered between */
	base = reading(bt, WHOLE(16385, 700, OBX_COV_SCHEMA), TBL(16390, 501));
	now = reading(nt, TBL(16385, 502), TBL(16390, 501));
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "outbox table public.outbox left and rejoined publication outboxd"));
}

/*
 * A migration that drops the table, creates it again and adds it to the
 * publication in one transaction keeps it covered from its first row; the
 * same row added by a later transaction does not.
 */
static void
test_recreated_and_added_in_one_transaction(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov_table born = { .relid = 16400, .rel_row = 510, .rel_born = true };
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(0, 0));
	struct obx_cov now = reading(nt, born, TBL(16390, 511));
	char err[512] = "";

	(void)state;
	/* public.outbox re-created; billing.outbox created, both with their rows */
	nt[1].rel_born = true;
	assert_true(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	nt[1].rel_born = false;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err,
	    "outbox table billing.outbox was created while outboxd ran and publication "
	    "outboxd took it in after its creation"));
	nt[0].rel_born = false;
	nt[1].rel_born = true;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err,
	    "outbox table public.outbox was dropped and created again (oid 16400, before "
	    "16385) and publication outboxd took it in after its creation"));
	assert_non_null(strstr(err, "in the same transaction"));
}

/* The publication itself: dropped, created again, no longer publishing inserts. */
static void
test_publication_changes(void **state)
{
	struct obx_cov_table bt[2], nt[2];
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(16390, 501));
	struct obx_cov now = reading(nt, TBL(16385, 500), TBL(16390, 501));
	char err[512] = "";

	(void)state;
	now.pubid = 0;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_string_equal(err, "publication outboxd no longer exists");
	now.pubid = 101;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "publication outboxd was dropped and created again"));
	now.pubid = 100;
	now.pub_insert = false;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
	assert_non_null(strstr(err, "no longer publishes inserts"));
	/* a reading that lacks a table judges nothing covered */
	now.pub_insert = true;
	now.n = 1;
	assert_false(obx_cov_judge(&cfg, &base, &now, err, sizeof(err)));
}

static void
test_copy_and_reset(void **state)
{
	struct obx_cov_table bt[2];
	struct obx_cov base = reading(bt, TBL(16385, 500), TBL(16390, 501));
	struct obx_cov c = { 0 };

	(void)state;
	assert_int_equal(obx_cov_copy(&c, &base), 0);
	assert_ptr_not_equal(c.t, base.t);
	assert_int_equal(c.t[1].relid, 16390);
	assert_int_equal(obx_cov_copy(&c, &base), 0); /* the earlier copy is freed */
	obx_cov_reset(&c);
	assert_null(c.t);
	obx_cov_reset(&c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_entries_are_the_exact_ones, setup, teardown),
		cmocka_unit_test_setup_teardown(test_same_or_gone_is_covered, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recreated_is_a_gap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_created_later_is_a_gap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_left_the_publication_is_a_gap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_whole_memberships_cover_new_tables, setup, teardown),
		cmocka_unit_test_setup_teardown(test_membership_changes_kind, setup, teardown),
		cmocka_unit_test_setup_teardown(test_recreated_and_added_in_one_transaction, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publication_changes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_and_reset, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
