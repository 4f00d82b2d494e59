/*
 * kafka/consumer.h - a consumer without a group for reading outboxd's own
 * topics back (kafka/dedupe_lookup.c, kafka/progress_read.c).
 */
#ifndef OBX_KAFKA_CONSUMER_H
#define OBX_KAFKA_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "obx/core/config.h"

/* The longest a single call into librdkafka waits, so a stop or a budget ends a read promptly. */
#define OBX_KAFKA_SLICE_MS 200

/*
 * A consumer with the producer's connection settings ([kafka]), read_committed,
 * reporting partition ends, committing nothing, its fetches answered at once;
 * client_id names it.  NULL with errbuf filled (a secret property's value is
 * never in it).
 */
rd_kafka_t *obx_kafka_consumer_new(const struct obx_config *cfg, const char *client_id, char *errbuf,
    size_t errlen);

/* How long the next call may wait: OBX_KAFKA_SLICE_MS, less when deadline (obx_mono_ms()) is nearer; 0 past it. */
int obx_kafka_slice(int64_t deadline);

#endif
