/*
 * kafkacompat.h - what the librdkafka outboxd runs with can do with the
 * configured brokers (pure): a version of the library, as rd_kafka_version()
 * gives it, against [kafka]'s properties.
 */
#ifndef OBX_KAFKACOMPAT_H
#define OBX_KAFKACOMPAT_H

#include <stdbool.h>
#include <stddef.h>

#include "obx/core/config.h"

/* librdkafka 2.6.1 as rd_kafka_version() gives it (0xMMmmrrpp): the first whose SCRAM
 * client-final message Apache Kafka 4 accepts (confluentinc/librdkafka#4895) */
#define OBX_RDKAFKA_SCRAM_FIXED 0x020601ffu

/*
 * Whether [kafka] sasl.mechanisms asks for SCRAM-SHA-256 or SCRAM-SHA-512
 * of a librdkafka older than 2.6.1 (version, rd_kafka_version()'s number),
 * whose SCRAM login Apache Kafka 4.0 and later refuse as invalid
 * credentials.  When it does, buf holds the one line that says so: the
 * library's version, what the brokers do, and the fix.
 */
bool obx_kafka_scram_too_old(const struct obx_config *cfg, unsigned version, char *buf, size_t len);

/*
 * Why the broker's certificate was not accepted, for OpenSSL's verification
 * error x509_error (as librdkafka's certificate callback passes it: 0 is no
 * error), in words an operator can act on: a CA that ssl.ca.location does
 * not hold, a host name the certificate does not carry, an expiry.  Writes
 * the phrase into buf; returns false (buf empty) for 0.
 */
bool obx_tls_verify_reason(int x509_error, char *buf, size_t len);

/*
 * What the principal lacks when the broker answers with authorization
 * error code (Kafka's protocol number, as librdkafka's rd_kafka_resp_err_t
 * gives it): the ACL to grant, in words; NULL for any other code.
 */
const char *obx_kafka_acl_hint(int code);

/* The version as "2.0.2" (rd_kafka_version_str()'s form for a release) into buf. */
void obx_kafka_version_format(unsigned version, char *buf, size_t len);

#endif
