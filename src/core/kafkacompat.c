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
obx_tls_verify_reason(int x509_error, char *buf, size_t len)
{
	/* OpenSSL's X509_V_ERR_* numbers (include/openssl/x509_vfy.h), stable across its releases */
	static const struct {
		int code;
		const char *why;
	} reasons[] = {
		{ 2, "no CA in ssl.ca.location signed it (unable to get issuer certificate)" },
		{ 18, "it is self-signed and not in ssl.ca.location" },
		{ 19, "its chain ends in a self-signed CA that is not in ssl.ca.location" },
		{ 20, "no CA in ssl.ca.location signed it (unable to get local issuer certificate)" },
		{ 21, "no CA in ssl.ca.location signed it (unable to verify the first certificate)" },
		{ 9, "it is not valid yet: check the clocks of this host and of the CA" },
		{ 10, "it has expired" },
		{ 23, "it has been revoked" },
		{ 26, "it is not meant for a TLS server (key usage)" },
		{ 62,
		    "it does not name the host outboxd connected to: that host name (bootstrap.servers, and the "
		    "listeners the broker advertises) must be among the certificate's subjectAltName entries" },
		{ 64,
		    "it does not name the IP address outboxd connected to: that address must be among the "
		    "certificate's subjectAltName entries" },
	};

	if (len > 0)
		buf[0] = '\0';
	if (x509_error == 0)
		return false;
	for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
		if (reasons[i].code == x509_error) {
			snprintf(buf, len,
			    "the broker's certificate was not accepted: %s (OpenSSL verify error %d)",
			    reasons[i].why, x509_error);
			return true;
		}
	snprintf(buf, len, "the broker's certificate was not accepted (OpenSSL verify error %d)", x509_error);
	return true;
}

const char *
obx_kafka_acl_hint(int code)
{
	switch (code) {
	case 29: /* TOPIC_AUTHORIZATION_FAILED */
		return "the principal needs WRITE on this topic (and READ and DESCRIBE for [delivery] dedupe)";
	case 31: /* CLUSTER_AUTHORIZATION_FAILED: InitProducerId of an idempotent producer */
		return "the principal may not get a producer id: grant it WRITE on the outbox topics (which "
		       "includes IDEMPOTENT_WRITE since Apache Kafka 3.0, KIP-679) or IDEMPOTENT_WRITE on the cluster";
	case 53: /* TRANSACTIONAL_ID_AUTHORIZATION_FAILED */
		return "the principal needs WRITE and DESCRIBE on the transactional id ([delivery] exactly_once)";
	default:
		return NULL;
	}
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
