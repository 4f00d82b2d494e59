/*
 * liboutbox without a server: versions, error names, defaults, argument
 * checks, and outbox_header() on a record librdkafka built (a producer
 * with no broker hands it back in a delivery report once purged).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
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

struct reported {
	int n;
	char id[64], type[64], empty[64];
	int id_small_null, missing_null, null_value_null;
};

static void
on_report(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	struct reported *r = opaque;
	char buf[64], small[4];

	(void)rk;
	r->n++;
	snprintf(r->id, sizeof(r->id), "%s", outbox_header(m, "id", buf, sizeof(buf)) ? buf : "(null)");
	snprintf(r->type, sizeof(r->type), "%s", outbox_header(m, "type", buf, sizeof(buf)) ? buf : "(null)");
	snprintf(r->empty, sizeof(r->empty), "%s", outbox_header(m, "empty", buf, sizeof(buf)) ? buf : "(null)");
	r->id_small_null = outbox_header(m, "id", small, sizeof(small)) == NULL;
	r->missing_null = outbox_header(m, "no-such-header", buf, sizeof(buf)) == NULL;
	r->null_value_null = outbox_header(m, "nothing", buf, sizeof(buf)) == NULL;
}

/*
 * outboxd writes its own headers first: a record that also carries a
 * later header of the same name (from an older outboxd, or another
 * writer) still yields outboxd's, as the relay's restart de-duplication
 * reads it.
 */
static void
test_header_reads_the_first_occurrence(void **state)
{
	struct reported seen = { 0 };
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_headers_t *h = rd_kafka_headers_new(8);
	char err[512];
	rd_kafka_t *rk;

	(void)state;
	assert_int_equal(rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err)), RD_KAFKA_CONF_OK);
	rd_kafka_conf_set_dr_msg_cb(conf, on_report);
	rd_kafka_conf_set_opaque(conf, &seen);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	assert_non_null(rk);
	rd_kafka_header_add(h, "id", -1, "relay-id", -1);
	rd_kafka_header_add(h, "type", -1, "OrderCreated", -1);
	rd_kafka_header_add(h, "empty", -1, "", 0);
	rd_kafka_header_add(h, "nothing", -1, NULL, 0);
	rd_kafka_header_add(h, "id", -1, "user-id", -1);
	rd_kafka_header_add(h, "type", -1, "Other", -1);
	assert_int_equal(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("t"), RD_KAFKA_V_VALUE("v", 1),
	                     RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END),
	    RD_KAFKA_RESP_ERR_NO_ERROR);
	assert_int_equal(rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE), RD_KAFKA_RESP_ERR_NO_ERROR);
	for (int i = 0; i < 50 && seen.n == 0; i++)
		rd_kafka_poll(rk, 100);
	rd_kafka_destroy(rk);
	assert_int_equal(seen.n, 1);
	assert_string_equal(seen.id, "relay-id");
	assert_string_equal(seen.type, "OrderCreated");
	assert_string_equal(seen.empty, "");
	assert_true(seen.id_small_null);
	assert_true(seen.missing_null);
	assert_true(seen.null_value_null);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_version_and_errors),
		cmocka_unit_test(test_defaults_and_arguments),
		cmocka_unit_test(test_header_reads_the_first_occurrence),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
