/* The slot guard's decision: a missing slot is created only when nothing says it existed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/err.h"
#include "obx/core/slotguard.h"

/* No record: created when create_slot allows, whatever --recreate-slot says. */
static void
test_unrecorded_slot_follows_create_slot(void **state)
{
	struct obx_slotguard g = { .marked = false };
	char err[512] = "";

	(void)state;
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", false, true, err, sizeof(err)), 0);
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", true, true, err, sizeof(err)), 0);
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", false, false, err, sizeof(err)), OBX_ECONFIG);
	assert_string_equal(err, "replication slot outboxd does not exist and create_slot = false");
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", true, false, err, sizeof(err)), OBX_ECONFIG);
}

/*
 * A record says the slot existed: refused, naming the recorded position and
 * system and the way out, unless --recreate-slot; then created even with
 * create_slot = false, as before (the record is outboxd's own).
 */
static void
test_recorded_slot_needs_recreate(void **state)
{
	struct obx_slotguard g = { .marked = true, .sysid = "7301234567890123456", .lsn = "0/1A2B3C4" };
	char err[512] = "";

	(void)state;
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", false, true, err, sizeof(err)), OBX_ECONFIG);
	assert_non_null(strstr(err,
	    "replication slot outboxd is missing but existed before "
	    "(created at 0/1A2B3C4 on system 7301234567890123456)"));
	assert_non_null(strstr(err, "--recreate-slot"));
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", false, false, err, sizeof(err)), OBX_ECONFIG);
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", true, true, err, sizeof(err)), 0);
	assert_int_equal(obx_slotguard_may_create(&g, "outboxd", true, false, err, sizeof(err)), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unrecorded_slot_follows_create_slot),
		cmocka_unit_test(test_recorded_slot_needs_recreate),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
