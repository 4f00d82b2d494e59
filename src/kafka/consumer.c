/*
 * kafka/consumer.c - the consumers outboxd reads its own topics back with
 * (restart de-duplication, exactly-once's progress record); see
 * kafka/consumer.h.
 */
#include <stdio.h>

#include <librdkafka/rdkafka.h>

#include "obx/core/config.h"
#include "obx/kafka/consumer.h"
#include "obx/sys/log.h"

static void
log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *msg)
{
	(void)rk;
	(void)level;
	/* the producer's properties that a consumer ignores, and connection trouble the
	 * producer reports too: nothing here is news */
	obx_log_debug("kafka (dedupe read-back) %s: %s", fac, msg);
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	(void)rk;
	(void)opaque;
	obx_log_debug("kafka (dedupe read-back): %s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

rd_kafka_t *
obx_kafka_consumer_new(const struct obx_config *cfg, const char *client_id, char *errbuf, size_t errlen)
{
	static const char *const own[][2] = {
		/* what a transaction that was aborted or is still open wrote is not read (progress) */
		{ "isolation.level", "read_committed" },
		{ "enable.partition.eof", "true" },
		{ "enable.auto.commit", "false" },
		{ "enable.auto.offset.store", "false" },
		{ "auto.offset.reset", "earliest" }, /* a window below the first offset starts there */
		/* a fetch at the end of a partition is answered at once, not held: it would delay
		 * every request behind it on the connection (metadata, watermarks) */
		{ "fetch.wait.max.ms", "0" },
		{ "fetch.max.bytes", "4194304" },
		{ "max.partition.fetch.bytes", "1048576" },
		{ "queued.max.messages.kbytes", "8192" },
	};
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char err[512];
	rd_kafka_t *rk;

	if (conf == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < cfg->n_kafka; i++)
		if (rd_kafka_conf_set(conf, cfg->kafka[i].key, cfg->kafka[i].value, err, sizeof(err)) !=
		    RD_KAFKA_CONF_OK) {
			snprintf(errbuf, errlen, "kafka property %s: %.300s", cfg->kafka[i].key,
			    obx_kafka_prop_is_secret(cfg->kafka[i].key) ? "invalid value" : err);
			goto fail;
		}
	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
		if (rd_kafka_conf_set(conf, own[i][0], own[i][1], err, sizeof(err)) != RD_KAFKA_CONF_OK) {
			snprintf(errbuf, errlen, "kafka property %s: %.300s", own[i][0], err);
			goto fail;
		}
	if (rd_kafka_conf_set(conf, "client.id", client_id, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
		snprintf(errbuf, errlen, "kafka property client.id: %.300s", err);
		goto fail;
	}
	rd_kafka_conf_set_log_cb(conf, log_cb);
	rd_kafka_conf_set_error_cb(conf, error_cb);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL) {
		snprintf(errbuf, errlen, "could not create a consumer: %.300s", err);
		goto fail;
	}
	return rk;
fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}

int
obx_kafka_slice(int64_t deadline)
{
	int64_t left = deadline - obx_mono_ms();

	return left <= 0 ? 0 : left < OBX_KAFKA_SLICE_MS ? (int)left : OBX_KAFKA_SLICE_MS;
}
