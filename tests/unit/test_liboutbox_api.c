/* liboutbox without a server: versions, error names, defaults, argument checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "outbox.h"

static void
test_version_and_errors(void **state)
{
	char v[32];

	(void)state;
	snprintf(v, sizeof(v), "%d.%d.%d", OUTBOX_VERSION_MAJOR, OUTBOX_VERSION_MINOR, OUTBOX_VERSION_PATCH);
	assert_string_equal(outbox_version(), v);
	assert_string_equal(outbox_strerror(OUTBOX_OK), "ok");
	assert_string_equal(outbox_strerror(OUTBOX_DUPLICATE), "duplicate: already processed");
	assert_string_equal(outbox_strerror(OUTBOX_ERR_NOT_IN_TRANSACTION), "not inside a transaction block");
	assert_string_equal(outbox_strerror(12345), "unknown result");
}

static void
test_defaults_and_arguments(void **state)
{
	struct outbox_writer_config cfg;
	char err[256];

	(void)state;
	outbox_writer_config_init(&cfg);
	assert_string_equal(cfg.table, "outbox");
	assert_string_equal(cfg.col_key, "aggregateid");
	assert_string_equal(cfg.col_aggregate_type, "aggregatetype");
	assert_null(cfg.col_headers);
	assert_null(outbox_writer_new(NULL, &cfg, err, sizeof(err)));
	assert_non_null(strstr(err, "conn and cfg are required"));
	assert_null(outbox_consumer_new(NULL, NULL, "billing", NULL, err, sizeof(err)));
	assert_int_equal(outbox_write(NULL, NULL, NULL, 0, err, sizeof(err)), OUTBOX_ERR_INVALID);
	assert_int_equal(outbox_consume(NULL, NULL, NULL, NULL, err, sizeof(err)), OUTBOX_ERR_INVALID);
	assert_null(outbox_header(NULL, "id", err, sizeof(err)));
	outbox_writer_free(NULL);
	outbox_consumer_free(NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_and_errors),
		cmocka_unit_test(test_defaults_and_arguments),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
