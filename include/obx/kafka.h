/*
 * kafka.h - the Kafka sink (I/O): an idempotent librdkafka producer whose
 * delivery reports wake the relay loop through a pipe.
 *
 * Every message carries a 64-bit opaque chosen by the caller (stream
 * generation, ack ticket, flags); delivery reports hand it back.
 */
#ifndef OBX_KAFKA_H
#define OBX_KAFKA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "obx/config.h"
#include "obx/event.h"

/* Called from obx_kafka_poll() for each delivery report; m is borrowed. */
typedef void (*obx_delivery_fn)(void *ctx, uint64_t opaque, const rd_kafka_message_t *m);

struct obx_kafka {
	rd_kafka_t *rk;
	rd_kafka_queue_t *mainq;
	int wake[2]; /* pipe: librdkafka writes when the main queue gets an event */
	obx_delivery_fn on_delivery;
	void *ctx;
	bool fatal;
	char fatal_reason[512];
};

/*
 * Builds the producer configuration from cfg: outboxd's defaults
 * (message.timeout.ms=0, partitioner=murmur2_random, queue bounds sized to
 * the in-flight caps), then the user's [kafka] properties, then the
 * guarantees (enable.idempotence=true, acks=all).  Returns a conf the
 * caller owns (rd_kafka_conf_destroy) or NULL with errbuf filled.
 */
rd_kafka_conf_t *obx_kafka_conf(const struct obx_config *cfg, char *errbuf, size_t errlen);

/* Creates the producer.  Returns 0, or OBX_ECONFIG (a property) / OBX_EIO with errbuf filled. */
int obx_kafka_open(struct obx_kafka *k, const struct obx_config *cfg, obx_delivery_fn fn,
    void *ctx, char *errbuf, size_t errlen);

/*
 * Hands one record to the producer (copied).  Returns librdkafka's
 * synchronous result: 0, or e.g. RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
 * RD_KAFKA_RESP_ERR__QUEUE_FULL.
 */
rd_kafka_resp_err_t obx_kafka_produce(struct obx_kafka *k, const char *topic, const void *key,
    size_t keylen, const void *value, size_t len, int64_t timestamp_ms,
    const struct obx_header *headers, size_t nheaders, const char *extra_name,
    const char *extra_value, uint64_t opaque);

/* The fd to poll for readability. */
int obx_kafka_fd(const struct obx_kafka *k);

/* Serves delivery reports and errors without blocking (timeout_ms 0) or up to timeout_ms. */
void obx_kafka_poll(struct obx_kafka *k, int timeout_ms);

/* Messages not yet delivered or failed (queued plus in flight). */
int obx_kafka_outq_len(const struct obx_kafka *k);

/*
 * Drops everything not yet delivered (reports come back as purged), waits up
 * to wait_ms for requests in flight to finish, and destroys the producer.
 */
void obx_kafka_close(struct obx_kafka *k, int wait_ms);

/* True for errors that say the cluster does not have the topic (yet). */
bool obx_kafka_err_is_missing_topic(rd_kafka_resp_err_t err);

/* True for errors that will never succeed on retry (the event is poison). */
bool obx_kafka_err_is_permanent(rd_kafka_resp_err_t err);

#endif
