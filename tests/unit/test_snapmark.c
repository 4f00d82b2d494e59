/* The snapshot marker's name: unique per slot name, the old name kept where it was whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/snapmark.h"

/* A slot name of up to 54 characters keeps SLOT_snapshot, with no older name to look for. */
static void
test_short_names_keep_their_marker(void **state)
{
	char name[64], legacy[64], slot[64];

	(void)state;
	obx_snapmark_name("outboxd", name, sizeof(name));
	assert_string_equal(name, "outboxd_snapshot");
	assert_false(obx_snapmark_legacy_name("outboxd", legacy, sizeof(legacy)));
	assert_string_equal(legacy, "");
	memset(slot, 'a', OBX_SNAPMARK_KEEP);
	slot[OBX_SNAPMARK_KEEP] = '\0';
	obx_snapmark_name(slot, name, sizeof(name));
	assert_int_equal(strlen(name), 63);
	assert_memory_equal(name, slot, OBX_SNAPMARK_KEEP);
	assert_string_equal(name + OBX_SNAPMARK_KEEP, "_snapshot");
	assert_false(obx_snapmark_legacy_name(slot, legacy, sizeof(legacy)));
}

/*
 * Two 60-character slot names sharing their first 54 characters shared the
 * old marker; now each has its own, of 63 characters, unlike the old one
 * and unlike the 54-character slot's.  The name is fixed: a marker an
 * earlier run of this version left must be found again.
 */
static void
test_long_names_get_their_own(void **state)
{
	const char *a = "outboxd_orders_eu_west_1_production_cluster_primary_slot_a_01";
	const char *b = "outboxd_orders_eu_west_1_production_cluster_primary_slot_b_01";
	char na[64], nb[64], la[64], lb[64], nshort[64], shortslot[64];

	(void)state;
	assert_true(strlen(a) >= 60 && strncmp(a, b, 54) == 0 && strcmp(a, b) != 0);
	obx_snapmark_name(a, na, sizeof(na));
	obx_snapmark_name(b, nb, sizeof(nb));
	assert_string_equal(na, "outboxd_orders_eu_west_1_production_c_ab011d3a013b581a_snapshot");
	assert_string_not_equal(na, nb);
	assert_int_equal(strlen(na), 63);
	assert_int_equal(strlen(nb), 63);
	assert_true(obx_snapmark_legacy_name(a, la, sizeof(la)));
	assert_true(obx_snapmark_legacy_name(b, lb, sizeof(lb)));
	assert_string_equal(la, "outboxd_orders_eu_west_1_production_cluster_primary_sl_snapshot");
	assert_string_equal(la, lb);
	assert_string_not_equal(na, la);
	assert_string_not_equal(nb, la);
	snprintf(shortslot, sizeof(shortslot), "%.54s", a);
	obx_snapmark_name(shortslot, nshort, sizeof(nshort));
	assert_string_equal(nshort, la);
	assert_string_not_equal(nshort, na);
	/* one character past the old limit */
	snprintf(shortslot, sizeof(shortslot), "%.55s", a);
	obx_snapmark_name(shortslot, nshort, sizeof(nshort));
	assert_int_equal(strlen(nshort), 63);
	assert_string_not_equal(nshort, la);
	assert_string_not_equal(nshort, na);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_short_names_keep_their_marker),
		cmocka_unit_test(test_long_names_get_their_own),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
