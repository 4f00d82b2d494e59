/* core/kafkacompat.c - what the linked librdkafka can do with the brokers (see kafkacompat.h). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "obx/core/kafkacompat.h"

void
obx_kafka_version_format(unsigned version, char *buf, size_t len)
{
	snprintf(buf, len, "%u.%u.%u", (version >> 24) & 0xffu, (version >> 16) & 0xffu, (version >> 8) & 0xffu);
}

bool
obx_kafka_scram_too_old(const struct obx_config *cfg, unsigned version, char *buf, size_t len)
{
	const char *mech = obx_config_kafka_get(cfg, "sasl.mechanisms");
	const char *proto = obx_config_kafka_get(cfg, "security.protocol");
	char v[32];

	if (len > 0)
		buf[0] = '\0';
	if (mech == NULL)
		mech = obx_config_kafka_get(cfg, "sasl.mechanism"); /* librdkafka's alias */
	/* SASL is used only over SASL_PLAINTEXT or SASL_SSL; sasl.mechanisms takes one mechanism;
	 * librdkafka compares both without regard to case */
	if (proto == NULL || strncasecmp(proto, "SASL_", 5) != 0 || mech == NULL ||
	    (strcasecmp(mech, "SCRAM-SHA-256") != 0 && strcasecmp(mech, "SCRAM-SHA-512") != 0) ||
	    version >= OBX_RDKAFKA_SCRAM_FIXED)
		return false;
	obx_kafka_version_format(version, v, sizeof(v));
	snprintf(buf, len,
	    "[kafka] sasl.mechanisms = %s with librdkafka %s: Apache Kafka 4.0 and later refuse this library's "
	    "SCRAM login as invalid credentials (fixed in librdkafka 2.6.1); build outboxd against librdkafka "
	    "2.6.1 or later",
	    mech, v);
	return true;
}
