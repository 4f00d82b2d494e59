/* What the linked librdkafka can do with the brokers: SCRAM before 2.6.1 and Apache Kafka 4; why a
 * broker's certificate was not accepted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/config.h"
#include "obx/core/kafkacompat.h"

static void
with_mechanism(struct obx_config *cfg, const char *mech)
{
	char err[256];

	obx_config_init(cfg);
	assert_int_equal(obx_config_set(cfg, "kafka", "bootstrap.servers", "h:1", "t", false, err, sizeof(err)),
	    0);
	assert_int_equal(
	    obx_config_set(cfg, "kafka", "security.protocol", "SASL_SSL", "t", false, err, sizeof(err)), 0);
	if (mech != NULL)
		assert_int_equal(
		    obx_config_set(cfg, "kafka", "sasl.mechanisms", mech, "t", false, err, sizeof(err)), 0);
}

/* SCRAM with Debian 12's 2.0.2 (and 2.6.0): the line names the version, the brokers and the fix. */
static void
test_scram_before_the_fix(void **state)
{
	struct obx_config cfg;
	char line[512];

	(void)state;
	with_mechanism(&cfg, "SCRAM-SHA-512");
	assert_true(obx_kafka_scram_too_old(&cfg, 0x020002ffu, line, sizeof(line)));
	assert_non_null(strstr(line, "librdkafka 2.0.2"));
	assert_non_null(strstr(line, "Apache Kafka 4.0 and later refuse"));
	assert_non_null(strstr(line, "2.6.1 or later"));
	assert_true(obx_kafka_scram_too_old(&cfg, 0x020600ffu, line, sizeof(line)));
	/* a pre-release of 2.6.1 is before the release */
	assert_true(obx_kafka_scram_too_old(&cfg, 0x020601c8u, line, sizeof(line)));
	obx_config_reset(&cfg);
	with_mechanism(&cfg, "scram-sha-256");
	assert_true(obx_kafka_scram_too_old(&cfg, 0x020002ffu, line, sizeof(line)));
	obx_config_reset(&cfg);
	/* librdkafka's alias sasl.mechanism */
	{
		char err[256];

		with_mechanism(&cfg, NULL);
		assert_int_equal(obx_config_set(&cfg, "kafka", "sasl.mechanism", "SCRAM-SHA-512", "t", false, err,
		                     sizeof(err)),
		    0);
		assert_true(obx_kafka_scram_too_old(&cfg, 0x020002ffu, line, sizeof(line)));
		/* over a protocol without SASL, no login uses it */
		assert_int_equal(
		    obx_config_set(&cfg, "kafka", "security.protocol", "SSL", "t", false, err, sizeof(err)), 0);
		assert_false(obx_kafka_scram_too_old(&cfg, 0x020002ffu, line, sizeof(line)));
		obx_config_reset(&cfg);
	}
}

/* 2.6.1 and later, or any other mechanism (or none): nothing to say. */
static void
test_nothing_to_say(void **state)
{
	struct obx_config cfg;
	char line[512] = "x";

	(void)state;
	with_mechanism(&cfg, "SCRAM-SHA-512");
	assert_false(obx_kafka_scram_too_old(&cfg, 0x020601ffu, line, sizeof(line)));
	assert_string_equal(line, "");
	assert_false(obx_kafka_scram_too_old(&cfg, 0x020800ffu, line, sizeof(line)));
	obx_config_reset(&cfg);
	with_mechanism(&cfg, "PLAIN");
	assert_false(obx_kafka_scram_too_old(&cfg, 0x020002ffu, line, sizeof(line)));
	obx_config_reset(&cfg);
	with_mechanism(&cfg, NULL);
	assert_false(obx_kafka_scram_too_old(&cfg, 0x020002ffu, line, sizeof(line)));
	obx_config_reset(&cfg);
}

/* OpenSSL's verification errors in words: the cause an operator acts on, and its number */
static void
test_tls_verify_reason(void **state)
{
	char buf[512];

	(void)state;
	assert_false(obx_tls_verify_reason(0, buf, sizeof(buf)));
	assert_string_equal(buf, "");
	/* X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY: the CA file lacks the signer */
	assert_true(obx_tls_verify_reason(20, buf, sizeof(buf)));
	assert_non_null(strstr(buf, "no CA in ssl.ca.location signed it"));
	assert_non_null(strstr(buf, "(OpenSSL verify error 20)"));
	/* X509_V_ERR_HOSTNAME_MISMATCH */
	assert_true(obx_tls_verify_reason(62, buf, sizeof(buf)));
	assert_non_null(strstr(buf, "does not name the host"));
	assert_non_null(strstr(buf, "subjectAltName"));
	/* X509_V_ERR_CERT_HAS_EXPIRED */
	assert_true(obx_tls_verify_reason(10, buf, sizeof(buf)));
	assert_non_null(strstr(buf, "expired"));
	/* a code without words keeps its number */
	assert_true(obx_tls_verify_reason(4711, buf, sizeof(buf)));
	assert_string_equal(buf, "the broker's certificate was not accepted (OpenSSL verify error 4711)");
	/* a short buffer is cut, never overrun */
	assert_true(obx_tls_verify_reason(62, buf, 8));
	assert_int_equal(strlen(buf), 7);
}

/* An authorization refusal names the ACL to grant; other codes have no hint */
static void
test_acl_hint(void **state)
{
	(void)state;
	assert_non_null(strstr(obx_kafka_acl_hint(29), "WRITE on this topic"));
	assert_non_null(strstr(obx_kafka_acl_hint(31), "IDEMPOTENT_WRITE on the cluster"));
	assert_non_null(strstr(obx_kafka_acl_hint(53), "transactional id"));
	assert_null(obx_kafka_acl_hint(0));
	assert_null(obx_kafka_acl_hint(10)); /* MSG_SIZE_TOO_LARGE */
}

static void
test_version_format(void **state)
{
	char v[32];

	(void)state;
	obx_kafka_version_format(0x020800ffu, v, sizeof(v));
	assert_string_equal(v, "2.8.0");
	obx_kafka_version_format(0x020002ffu, v, sizeof(v));
	assert_string_equal(v, "2.0.2");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scram_before_the_fix),
		cmocka_unit_test(test_nothing_to_say),
		cmocka_unit_test(test_version_format),
		cmocka_unit_test(test_tls_verify_reason),
		cmocka_unit_test(test_acl_hint),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
