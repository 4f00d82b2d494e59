#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/err.h"
#include "obx/kafka.h"
#include "obx/log.h"

static int
conf_set(rd_kafka_conf_t *conf, const char *k, const char *v, char *errbuf, size_t errlen)
{
	char why[512];

	if (rd_kafka_conf_set(conf, k, v, why, sizeof(why)) != RD_KAFKA_CONF_OK) {
		snprintf(errbuf, errlen, "kafka property %s: %s", k,
		    obx_kafka_prop_is_secret(k) ? "invalid value (not shown: secret)" : why);
		return OBX_ECONFIG;
	}
	return 0;
}

rd_kafka_conf_t *
obx_kafka_conf(const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char num[32];
	long long msgs, kb;

	if (conf == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return NULL;
	}
	/* the producer's own queue must never be the first limit: ours is */
	msgs = cfg->max_inflight * 2 + 1000;
	if (msgs > 10000000)
		msgs = 10000000;
	kb = cfg->max_inflight_bytes / 1024 * 2 + 65536;
	if (kb > 2147483647LL)
		kb = 2147483647LL;
	/*
	 * linger.ms 0: an outbox event leaves at once.  The relay hands records
	 * over in bursts as the stream delivers them, and librdkafka batches
	 * whatever queues while a request is in flight, so a backlog still
	 * drains in full batches (bench/run.py measures both; README,
	 * "Benchmarks").  A user may set it higher.
	 */
	if (conf_set(conf, "linger.ms", "0", errbuf, errlen) != 0 ||
	    conf_set(conf, "message.timeout.ms", "0", errbuf, errlen) != 0 ||
	    conf_set(conf, "partitioner", "murmur2_random", errbuf, errlen) != 0 ||
	    (snprintf(num, sizeof(num), "%lld", msgs),
	     conf_set(conf, "queue.buffering.max.messages", num, errbuf, errlen)) != 0 ||
	    (snprintf(num, sizeof(num), "%lld", kb),
	     conf_set(conf, "queue.buffering.max.kbytes", num, errbuf, errlen)) != 0 ||
	    conf_set(conf, "client.id", "outboxd", errbuf, errlen) != 0)
		goto fail;
	for (size_t i = 0; i < cfg->n_kafka; i++)
		if (conf_set(conf, cfg->kafka[i].key, cfg->kafka[i].value, errbuf, errlen) != 0)
			goto fail;
	if (conf_set(conf, "enable.idempotence", "true", errbuf, errlen) != 0 ||
	    conf_set(conf, "acks", "all", errbuf, errlen) != 0)
		goto fail;
	return conf;
fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	struct obx_kafka *k = opaque;

	(void)rk;
	k->on_delivery(k->ctx, (uint64_t)(uintptr_t)m->_private, m);
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	struct obx_kafka *k = opaque;
	char buf[512];

	if (err == RD_KAFKA_RESP_ERR__FATAL) {
		rd_kafka_fatal_error(rk, buf, sizeof(buf));
		k->fatal = true;
		snprintf(k->fatal_reason, sizeof(k->fatal_reason), "%s", buf);
		return;
	}
	/* transient: librdkafka retries by itself */
	obx_log_debug("kafka: %s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

static void
log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *msg)
{
	(void)rk;
	if (level <= 3)
		obx_log_warn("kafka %s: %s", fac, msg);
	else
		obx_log_debug("kafka %s: %s", fac, msg);
}

int
obx_kafka_open(struct obx_kafka *k, const struct obx_config *cfg, obx_delivery_fn fn, void *ctx,
    char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf;
	char why[512];

	memset(k, 0, sizeof(*k));
	k->wake[0] = k->wake[1] = -1;
	k->on_delivery = fn;
	k->ctx = ctx;
	conf = obx_kafka_conf(cfg, errbuf, errlen);
	if (conf == NULL)
		return OBX_ECONFIG;
	rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
	rd_kafka_conf_set_error_cb(conf, error_cb);
	rd_kafka_conf_set_log_cb(conf, log_cb);
	rd_kafka_conf_set_opaque(conf, k);
	k->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why));
	if (k->rk == NULL) {
		rd_kafka_conf_destroy(conf);
		snprintf(errbuf, errlen, "could not create the Kafka producer: %s", why);
		return OBX_ECONFIG;
	}
	if (pipe2(k->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
		snprintf(errbuf, errlen, "could not create pipe: %s", strerror(errno));
		rd_kafka_destroy(k->rk);
		k->rk = NULL;
		return OBX_EIO;
	}
	k->mainq = rd_kafka_queue_get_main(k->rk);
	rd_kafka_queue_io_event_enable(k->mainq, k->wake[1], "1", 1);
	{
		/*
		 * Learn the cluster's topics now: a producer that meets a topic
		 * for the first time holds its records until a metadata refresh
		 * places them (most of a second with librdkafka 2.0), while a
		 * topic already in the metadata cache is placed at once.  A broker
		 * that does not answer soon is not waited for.
		 */
		const struct rd_kafka_metadata *md = NULL;

		if (rd_kafka_metadata(k->rk, 1, NULL, &md, 1000) == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
	}
	return 0;
}

rd_kafka_resp_err_t
obx_kafka_produce(struct obx_kafka *k, const char *topic, const void *key, size_t keylen,
    const void *value, size_t len, int64_t timestamp_ms, const struct obx_header *headers,
    size_t nheaders, const char *extra_name, const char *extra_value, uint64_t opaque)
{
	rd_kafka_headers_t *hdrs = rd_kafka_headers_new(nheaders + 1);
	rd_kafka_resp_err_t err;

	for (size_t i = 0; i < nheaders; i++)
		rd_kafka_header_add(hdrs, headers[i].name, -1, headers[i].value,
		    headers[i].value ? (ssize_t)headers[i].len : 0);
	if (extra_name != NULL)
		rd_kafka_header_add(hdrs, extra_name, -1, extra_value, -1);
	err = rd_kafka_producev(k->rk, RD_KAFKA_V_TOPIC(topic),
	    RD_KAFKA_V_KEY(key, keylen), RD_KAFKA_V_VALUE((void *)value, len),
	    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(timestamp_ms),
	    RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_OPAQUE((void *)(uintptr_t)opaque), RD_KAFKA_V_END);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		rd_kafka_headers_destroy(hdrs); /* ownership passes only on success */
	return err;
}

int
obx_kafka_fd(const struct obx_kafka *k)
{
	return k->wake[0];
}

void
obx_kafka_poll(struct obx_kafka *k, int timeout_ms)
{
	char buf[256];

	while (read(k->wake[0], buf, sizeof(buf)) > 0)
		;
	rd_kafka_poll(k->rk, timeout_ms);
}

int
obx_kafka_outq_len(const struct obx_kafka *k)
{
	return rd_kafka_outq_len(k->rk);
}

void
obx_kafka_close(struct obx_kafka *k, int wait_ms)
{
	if (k->rk == NULL)
		return;
	rd_kafka_purge(k->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	for (int waited = 0; rd_kafka_outq_len(k->rk) > 0 && waited < wait_ms; waited += 50)
		rd_kafka_poll(k->rk, 50);
	rd_kafka_queue_io_event_enable(k->mainq, -1, NULL, 0);
	rd_kafka_queue_destroy(k->mainq);
	rd_kafka_destroy(k->rk);
	close(k->wake[0]);
	close(k->wake[1]);
	memset(k, 0, sizeof(*k));
	k->wake[0] = k->wake[1] = -1;
}

bool
obx_kafka_err_is_missing_topic(rd_kafka_resp_err_t err)
{
	/* the broker's answer in a delivery report, and librdkafka's once its metadata says so */
	return err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART || err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
}

bool
obx_kafka_err_is_permanent(rd_kafka_resp_err_t err)
{
	switch (err) {
	case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
	case RD_KAFKA_RESP_ERR_INVALID_MSG:
	case RD_KAFKA_RESP_ERR_INVALID_RECORD:
	case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
	case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
	case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
	case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
	case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
	case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		return true;
	default:
		return false;
	}
}
