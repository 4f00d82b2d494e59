/*
 * Producer configuration: the guarantees are enforced, the defaults are
 * outboxd's, and keys land on the partitions Kafka's Java client picks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/config.h"
#include "obx/core/restart_dedupe.h"
#include "obx/kafka/producer.h"

static void
expect_prop(rd_kafka_conf_t *conf, const char *k, const char *want)
{
	char v[256];
	size_t len = sizeof(v);

	assert_int_equal(rd_kafka_conf_get(conf, k, v, &len), RD_KAFKA_CONF_OK);
	assert_string_equal(v, want);
}

static void
test_defaults_and_guarantees(void **state)
{
	struct obx_config cfg;
	rd_kafka_conf_t *conf;
	char err[512];

	(void)state;
	obx_config_init(&cfg);
	assert_int_equal(obx_config_set(&cfg, "kafka", "bootstrap.servers", "h:1", "t", false, err, sizeof(err)),
	    0);
	conf = obx_kafka_conf(&cfg, err, sizeof(err));
	assert_non_null(conf);
	expect_prop(conf, "enable.idempotence", "true");
	expect_prop(conf, "acks", "-1");
	expect_prop(conf, "message.timeout.ms", "0");
	expect_prop(conf, "linger.ms", "0"); /* an event leaves at once */
	expect_prop(conf, "partitioner", "murmur2_random");
	expect_prop(conf, "queue.buffering.max.messages", "9000"); /* 2 x max_inflight + 1000 */
	/* 2 x max_inflight_bytes + 64 MiB: two records of the default message.max.bytes fit */
	expect_prop(conf, "queue.buffering.max.kbytes", "73728");
	rd_kafka_conf_destroy(conf);

	/* a larger message.max.bytes: two such records fit beside what is in flight */
	assert_int_equal(
	    obx_config_set(&cfg, "kafka", "message.max.bytes", "200000000", "t", false, err, sizeof(err)), 0);
	conf = obx_kafka_conf(&cfg, err, sizeof(err));
	expect_prop(conf, "queue.buffering.max.kbytes", "398816"); /* 8192 + 2 x 195312 */
	rd_kafka_conf_destroy(conf);
	/* the user's own queue size is kept */
	assert_int_equal(obx_config_set(&cfg, "kafka", "queue.buffering.max.kbytes", "1000000", "t", false, err,
	                     sizeof(err)),
	    0);
	conf = obx_kafka_conf(&cfg, err, sizeof(err));
	expect_prop(conf, "queue.buffering.max.kbytes", "1000000");
	rd_kafka_conf_destroy(conf);

	/* user tuning wins where it does not weaken anything */
	assert_int_equal(
	    obx_config_set(&cfg, "kafka", "message.timeout.ms", "60000", "t", false, err, sizeof(err)), 0);
	assert_int_equal(obx_config_set(&cfg, "kafka", "linger.ms", "20", "t", false, err, sizeof(err)), 0);
	conf = obx_kafka_conf(&cfg, err, sizeof(err));
	expect_prop(conf, "message.timeout.ms", "60000");
	expect_prop(conf, "linger.ms", "20");
	expect_prop(conf, "enable.idempotence", "true");
	rd_kafka_conf_destroy(conf);
	obx_config_reset(&cfg);
}

/*
 * murmur2 values from Kafka's own Java client tests (UtilsTest.testMurmur2);
 * the Java DefaultPartitioner picks toPositive(murmur2(key)) % partitions.
 */
static void
test_murmur2_matches_java(void **state)
{
	static const struct {
		const char *key;
		int32_t murmur2;
	} cases[] = {
		{ "21", -973932308 },
		{ "foobar", -790332482 },
		{ "a-little-bit-long-string", -985981536 },
		{ "a-little-bit-longer-string", -1486304829 },
		{ "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971 },
		{ "abc", 479470107 },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		for (int32_t parts = 1; parts <= 64; parts *= 2) {
			int32_t want = (int32_t)(((uint32_t)cases[i].murmur2 & 0x7fffffff) % (uint32_t)parts);
			int32_t got = rd_kafka_msg_partitioner_murmur2_random(NULL, cases[i].key,
			    strlen(cases[i].key), parts, NULL, NULL);

			assert_int_equal(got, want);
		}
	}
}

/*
 * Restart de-duplication looks for a record in the partition the producer
 * put it in: its murmur2 must be librdkafka's own, for every key length,
 * the empty key included, and every partition count.
 */
static void
test_dedupe_partition_is_the_producers(void **state)
{
	uint32_t x = 2463534242u;

	(void)state;
	for (int i = 0; i < 20000; i++) {
		unsigned char key[64];
		size_t len = (size_t)(i % 41);
		int32_t parts = 1 + i % 97;

		for (size_t j = 0; j < len; j++) {
			x ^= x << 13;
			x ^= x >> 17;
			x ^= x << 5;
			key[j] = (unsigned char)x;
		}
		assert_int_equal(obx_dd_partition(key, len, parts),
		    rd_kafka_msg_partitioner_murmur2_random(NULL, key, len, parts, NULL, NULL));
		assert_int_equal(obx_dd_partition(key, len, parts),
		    rd_kafka_msg_partitioner_murmur2(NULL, key, len, parts, NULL, NULL));
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_and_guarantees),
		cmocka_unit_test(test_murmur2_matches_java),
		cmocka_unit_test(test_dedupe_partition_is_the_producers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
