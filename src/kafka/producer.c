#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "obx/core/err.h"
#include "obx/core/kafkacompat.h"
#include "obx/kafka/producer.h"
#include "obx/sys/log.h"

#define LOGIN_SAY_MS 60000      /* a refused login is said again after this long */
#define LOGIN_PROBE_MS 15000    /* while refused, how often the cluster is asked whether it lets us in */
#define LOGIN_PROBE_WAIT_MS 200 /* how long such a question may hold the loop */

static int
conf_set(rd_kafka_conf_t *conf, const char *k, const char *v, char *errbuf, size_t errlen)
{
	char detail[512];

	if (rd_kafka_conf_set(conf, k, v, detail, sizeof(detail)) != RD_KAFKA_CONF_OK) {
		snprintf(errbuf, errlen, "kafka property %s: %s", k,
		    obx_kafka_prop_is_secret(k) ? "invalid value (not shown: secret)" : detail);
		return OBX_ECONFIG;
	}
	return 0;
}

rd_kafka_conf_t *
obx_kafka_conf(const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char num[32];
	size_t numlen = sizeof(num);
	long long msgs, kb, mmb, v;
	const char *bad = NULL;
	bool own_kb = false;

	if (conf == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return NULL;
	}
	/* the producer's own queue must never be the first limit: ours is */
	msgs = cfg->max_inflight * 2 + 1000;
	if (msgs > 10000000)
		msgs = 10000000;
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
	    conf_set(conf, "client.id", "outboxd", errbuf, errlen) != 0)
		goto fail;
	for (size_t i = 0; i < cfg->n_kafka; i++) {
		if (conf_set(conf, cfg->kafka[i].key, cfg->kafka[i].value, errbuf, errlen) != 0)
			goto fail;
		if (strcmp(cfg->kafka[i].key, "queue.buffering.max.kbytes") == 0)
			own_kb = true;
	}
	/*
	 * The byte bound lets one more record of any size through while it is not
	 * reached, and a record the producer accepts may be as large as
	 * message.max.bytes: the queue holds twice the bound plus two such records
	 * (one and a margin for its headers and a dead-letter copy).  Smaller, a
	 * record larger than the queue would be refused as "queue full" with
	 * nothing to wait for, for ever.
	 */
	if (!own_kb) {
		mmb = 1000000;
		if (rd_kafka_conf_get(conf, "message.max.bytes", num, &numlen) == RD_KAFKA_CONF_OK &&
		    (v = strtonum(num, 1, INT64_MAX, &bad), bad == NULL))
			mmb = v;
		kb = cfg->max_inflight_bytes / 1024 * 2 + (mmb / 1024 * 2 > 65536 ? mmb / 1024 * 2 : 65536);
		if (kb > 2147483647LL)
			kb = 2147483647LL;
		snprintf(num, sizeof(num), "%lld", kb);
		if (conf_set(conf, "queue.buffering.max.kbytes", num, errbuf, errlen) != 0)
			goto fail;
	}
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
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && k->metrics != NULL) {
		k->metrics->kafka_login_refused = false; /* an acknowledgement: logged in */
		k->metrics->kafka_tls_refused = false;
	}
	k->on_delivery(k->ctx, (uint64_t)(uintptr_t)m->_private, m);
}

void
obx_kafka_txn_id(const struct obx_config *cfg, const char *sysid, const char *dbname, char *out, size_t len)
{
	if (cfg->transactional_id != NULL && cfg->transactional_id[0] != '\0')
		snprintf(out, len, "%s", cfg->transactional_id);
	else
		snprintf(out, len, "outboxd-%s-%s-%s", sysid, dbname, cfg->slot);
}

void
obx_kafka_describe_login(const rd_kafka_conf_t *conf, char *out, size_t len)
{
	char proto[64] = "", mech[64] = "", user[128] = "";
	size_t n;

	n = sizeof(proto);
	(void)rd_kafka_conf_get(conf, "security.protocol", proto, &n);
	n = sizeof(mech);
	(void)rd_kafka_conf_get(conf, "sasl.mechanisms", mech, &n);
	n = sizeof(user);
	(void)rd_kafka_conf_get(conf, "sasl.username", user, &n);
	snprintf(out, len, "security.protocol %s, sasl.mechanisms %s, sasl.username %s", proto, mech,
	    user[0] != '\0' ? user : "(none)");
}

/* What TLS with the brokers checks, for the line that says a certificate was not accepted. */
static void
describe_tls(const rd_kafka_conf_t *conf, char *out, size_t len)
{
	char proto[64] = "", ca[400] = "", ident[32] = "";
	size_t n;

	n = sizeof(proto);
	(void)rd_kafka_conf_get(conf, "security.protocol", proto, &n);
	n = sizeof(ca);
	(void)rd_kafka_conf_get(conf, "ssl.ca.location", ca, &n);
	n = sizeof(ident);
	(void)rd_kafka_conf_get(conf, "ssl.endpoint.identification.algorithm", ident, &n);
	snprintf(out, len, "security.protocol %s, ssl.ca.location %s, ssl.endpoint.identification.algorithm %s",
	    proto, ca[0] != '\0' ? ca : "(the system's CAs)", ident);
}

/*
 * librdkafka asks this of every certificate of the broker's chain, with
 * OpenSSL's verdict in *x509_error: the verdict stands, and a failure gets
 * words that name its cause (OpenSSL's own message says only "certificate
 * verify failed", for a wrong CA and a wrong host name alike).
 */
static int
cert_verify_cb(rd_kafka_t *rk, const char *broker_name, int32_t broker_id, int *x509_error, int depth,
    const char *buf, size_t size, char *errstr, size_t errstr_size, void *opaque)
{
	struct obx_kafka *k = opaque;

	(void)rk;
	(void)broker_name;
	(void)broker_id;
	(void)depth;
	(void)buf;
	(void)size;
	if (!obx_tls_verify_reason(*x509_error, errstr, errstr_size)) {
		if (depth == 0)
			k->tls_x509_error = 0; /* a verified broker: an old verdict names no later failure */
		return 1;
	}
	k->tls_x509_error = *x509_error; /* for error_cb()'s line: librdkafka's own says "verify failed" */
	return 0;
}

/* The errors that say another producer with our transactional.id took over. */
static bool
is_fencing(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR__FENCED || err == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
	    err == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH;
}

/*
 * Records the producer's fatal error, once, whichever call met it first: the
 * error callback, a produce call or a transactional call.  A session ends on
 * it, and the next one starts a new producer.
 */
static void
latch_fatal(struct obx_kafka *k, rd_kafka_resp_err_t err)
{
	char buf[512];
	rd_kafka_resp_err_t code;
	const char *hint;

	if (k->fatal)
		return;
	code = rd_kafka_fatal_error(k->rk, buf, sizeof(buf));
	k->fenced = is_fencing(code) || is_fencing(err);
	k->stopped_at_refusal = code == RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE;
	hint = obx_kafka_acl_hint(code);
	if (hint != NULL) /* who it is and what to grant, within the reason's room */
		snprintf(k->fatal_reason, sizeof(k->fatal_reason), "%.140s (%.190s; %.170s)", buf, hint, k->login);
	else
		snprintf(k->fatal_reason, sizeof(k->fatal_reason), "%s", buf);
	k->fatal = true;
	/* a fence is counted as _FENCED where the exactly-once part acts on it (run/relay_eos.c) */
	if (k->metrics != NULL && !k->fenced)
		obx_metrics_kafka_error(k->metrics, "_FATAL");
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	struct obx_kafka *k = opaque;

	(void)rk;
	if (err == RD_KAFKA_RESP_ERR__FATAL) {
		latch_fatal(k, RD_KAFKA_RESP_ERR_NO_ERROR);
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__AUTHENTICATION) {
		/* librdkafka tries again by itself: one line a minute while it lasts, and not ready */
		int64_t now = obx_mono_ms();

		if (k->metrics != NULL)
			k->metrics->kafka_login_refused = true;
		if (k->login_said_ms == 0 || now - k->login_said_ms >= LOGIN_SAY_MS) {
			obx_log_error("kafka: the broker refused the login (%s): %s; nothing is published until a "
			              "login succeeds",
			    k->login, reason);
			k->login_said_ms = now;
		}
	}
	if (err == RD_KAFKA_RESP_ERR__SSL) {
		/* a certificate is not accepted (or TLS fails otherwise): librdkafka tries again by
		 * itself; one line a minute while it lasts, and not ready */
		int64_t now = obx_mono_ms();

		if (k->metrics != NULL)
			k->metrics->kafka_tls_refused = true;
		if (k->tls_said_ms == 0 || now - k->tls_said_ms >= LOGIN_SAY_MS) {
			char why[512];
			const char *colon = strstr(reason, ": ");

			/* reason is "<broker>: SSL handshake failed: ...": the broker, then the cause in words */
			if (obx_tls_verify_reason(k->tls_x509_error, why, sizeof(why)) && colon != NULL)
				obx_log_error(
				    "kafka: TLS with %.*s failed (%s): %s; nothing is published until it "
				    "succeeds",
				    (int)(colon - reason), reason, k->tls, why);
			else
				obx_log_error(
				    "kafka: TLS with the broker failed (%s): %s; nothing is published until it "
				    "succeeds",
				    k->tls, reason);
			k->tls_said_ms = now;
		}
	}
	/* transient: librdkafka retries by itself */
	if (k->metrics != NULL)
		obx_metrics_kafka_error(k->metrics, rd_kafka_err2name((rd_kafka_resp_err_t)err));
	obx_log_debug("kafka: %s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

static void
log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *msg)
{
	(void)rk;
	/* a refused login or certificate is error_cb()'s line, once a minute, not one per attempt */
	if (level <= 3 && strstr(msg, "SASL authentication error") == NULL &&
	    strstr(msg, "SSL handshake failed") == NULL && strstr(msg, "certificate verify failed") == NULL &&
	    strcmp(fac, "SSLCERTVRFY") != 0)
		obx_log_warn("kafka %s: %s", fac, msg);
	else
		obx_log_debug("kafka %s: %s", fac, msg);
}

int
obx_kafka_open(struct obx_kafka *k, const struct obx_config *cfg, const char *txn_id, bool gapless,
    obx_delivery_fn fn, void *ctx, char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf;
	char detail[512];

	memset(k, 0, sizeof(*k));
	k->wake[0] = k->wake[1] = -1;
	k->on_delivery = fn;
	k->ctx = ctx;
	k->transactional = txn_id != NULL;
	if (k->transactional) {
		struct timeval tv;

		snprintf(k->txn_id, sizeof(k->txn_id), "%s", txn_id);
		/* names this producer's transactions in their txn header: unique across restarts */
		gettimeofday(&tv, NULL);
		snprintf(k->producer_name, sizeof(k->producer_name), "%lld.%d",
		    (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000, (int)getpid());
	}
	conf = obx_kafka_conf(cfg, errbuf, errlen);
	if (conf == NULL)
		return OBX_ECONFIG;
	if (txn_id != NULL && conf_set(conf, "transactional.id", txn_id, errbuf, errlen) != 0) {
		rd_kafka_conf_destroy(conf);
		return OBX_ECONFIG;
	}
	k->gapless = gapless && txn_id == NULL;
	if (k->gapless && conf_set(conf, "enable.gapless.guarantee", "true", errbuf, errlen) != 0) {
		rd_kafka_conf_destroy(conf);
		return OBX_ECONFIG;
	}
	obx_kafka_describe_login(conf, k->login, sizeof(k->login));
	describe_tls(conf, k->tls, sizeof(k->tls));
	/* a build without TLS refuses the callback; it then has no certificate to check */
	(void)rd_kafka_conf_set_ssl_cert_verify_cb(conf, cert_verify_cb);
	rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
	rd_kafka_conf_set_error_cb(conf, error_cb);
	rd_kafka_conf_set_log_cb(conf, log_cb);
	rd_kafka_conf_set_opaque(conf, k);
	k->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, detail, sizeof(detail));
	if (k->rk == NULL) {
		rd_kafka_conf_destroy(conf);
		snprintf(errbuf, errlen, "could not create the Kafka producer: %s", detail);
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

/* Begins a transaction when none is open (a transactional producer); 0 or __STATE and the like. */
static rd_kafka_resp_err_t
txn_begin(struct obx_kafka *k)
{
	rd_kafka_error_t *e;

	if (!k->transactional || k->txn_open)
		return RD_KAFKA_RESP_ERR_NO_ERROR;
	if (k->committing)
		return RD_KAFKA_RESP_ERR__STATE;
	e = rd_kafka_begin_transaction(k->rk);
	if (e != NULL) {
		rd_kafka_resp_err_t err = rd_kafka_error_code(e);

		obx_log_debug("kafka: could not begin a transaction: %s", rd_kafka_error_string(e));
		if (rd_kafka_error_is_fatal(e)) /* the error callback may not have run yet */
			latch_fatal(k, err);
		rd_kafka_error_destroy(e);
		return err != RD_KAFKA_RESP_ERR_NO_ERROR ? err : RD_KAFKA_RESP_ERR__STATE;
	}
	k->txn_open = true;
	k->txn_count++;
	snprintf(k->txn_name, sizeof(k->txn_name), "%s.%" PRIu64, k->producer_name, k->txn_count);
	return RD_KAFKA_RESP_ERR_NO_ERROR;
}

static enum obx_produce_result produce_result(rd_kafka_resp_err_t err);
static enum obx_report_status report_status(rd_kafka_resp_err_t err);

/* err (not 0) as obx_kafka_produce() returns it, with errbuf and *errname filled. */
static enum obx_produce_result
refused(struct obx_kafka *k, rd_kafka_resp_err_t err, const char **errname, char *errbuf, size_t errlen)
{
	if (errname != NULL)
		*errname = rd_kafka_err2name(err);
	if (err == RD_KAFKA_RESP_ERR__FATAL)
		latch_fatal(k, err);
	if (k->fatal)
		snprintf(errbuf, errlen, "producer fatal error: %s", k->fatal_reason);
	else if (err == RD_KAFKA_RESP_ERR__STATE && k->transactional)
		snprintf(errbuf, errlen,
		    "the Kafka transaction can take no more records (the broker refused "
		    "part of it, it must be aborted)");
	else
		snprintf(errbuf, errlen, "%s", rd_kafka_err2str(err));
	return produce_result(err);
}

enum obx_produce_result
obx_kafka_produce(struct obx_kafka *k, const char *topic, int32_t partition, const void *key, size_t keylen,
    const void *value, size_t len, int64_t timestamp_ms, const struct obx_header *headers, size_t nheaders,
    const char *extra_name, const char *extra_value, uint64_t opaque, const char **errname, char *errbuf,
    size_t errlen)
{
	rd_kafka_headers_t *hdrs;
	rd_kafka_resp_err_t err;

	err = txn_begin(k);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		return refused(k, err, errname, errbuf, errlen);
	hdrs = rd_kafka_headers_new(nheaders + 2);
	for (size_t i = 0; i < nheaders; i++)
		rd_kafka_header_add(hdrs, headers[i].name, -1, headers[i].value,
		    headers[i].value ? (ssize_t)headers[i].len : 0);
	if (extra_name != NULL)
		rd_kafka_header_add(hdrs, extra_name, -1, extra_value, -1);
	if (k->transactional)
		rd_kafka_header_add(hdrs, "txn", -1, k->txn_name, -1);
	err = rd_kafka_producev(k->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
	    RD_KAFKA_V_KEY(key, keylen), RD_KAFKA_V_VALUE((void *)value, len),
	    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(timestamp_ms), RD_KAFKA_V_HEADERS(hdrs),
	    RD_KAFKA_V_OPAQUE((void *)(uintptr_t)opaque), RD_KAFKA_V_END);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
		rd_kafka_headers_destroy(hdrs); /* ownership passes only on success */
		return refused(k, err, errname, errbuf, errlen);
	}
	return OBX_PRODUCE_OK;
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
	if (k->metrics != NULL && (k->metrics->kafka_login_refused || k->metrics->kafka_tls_refused)) {
		/* nothing to acknowledge may come for long: ask the cluster every LOGIN_PROBE_MS,
		 * which only a logged-in connection answers */
		int64_t now = obx_mono_ms();

		if (now - k->login_probed_ms >= LOGIN_PROBE_MS) {
			const struct rd_kafka_metadata *md = NULL;

			k->login_probed_ms = now;
			if (rd_kafka_metadata(k->rk, 0, NULL, &md, LOGIN_PROBE_WAIT_MS) ==
			    RD_KAFKA_RESP_ERR_NO_ERROR) {
				rd_kafka_metadata_destroy(md);
				if (k->metrics->kafka_login_refused)
					obx_log_info("kafka: the broker accepted the login (%s)", k->login);
				else
					obx_log_info("kafka: TLS with the broker succeeded (%s)", k->tls);
				k->metrics->kafka_login_refused = false;
				k->metrics->kafka_tls_refused = false;
			}
		}
	}
}

int
obx_kafka_outq_len(const struct obx_kafka *k)
{
	return rd_kafka_outq_len(k->rk);
}

/* Turns a transactional call's error into what the caller does next; frees e. */
static int
txn_result(struct obx_kafka *k, rd_kafka_error_t *e, const char *what, char *errbuf, size_t errlen)
{
	rd_kafka_resp_err_t err;
	int res;

	if (e == NULL)
		return OBX_OK;
	err = rd_kafka_error_code(e);
	snprintf(errbuf, errlen, "could not %s the Kafka transaction: %s", what, rd_kafka_error_string(e));
	if (rd_kafka_error_is_fatal(e) || k->fatal) {
		latch_fatal(k, err);
		res = k->fenced || is_fencing(err) ? OBX_EFENCED : OBX_EFATAL;
		if (res == OBX_EFENCED)
			k->fenced = true;
	} else if (rd_kafka_error_txn_requires_abort(e)) {
		res = OBX_EABORT;
	} else if (rd_kafka_error_is_retriable(e)) {
		res = OBX_ETIMEDOUT;
	} else {
		res = OBX_EABORT;
	}
	rd_kafka_error_destroy(e);
	return res;
}

int
obx_kafka_txn_init(struct obx_kafka *k, int timeout_ms, bool (*tick)(void *), void *arg, char *errbuf,
    size_t errlen)
{
	struct timespec t0, t;
	int res;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		long long waited;

		res = txn_result(k, rd_kafka_init_transactions(k->rk, 500), "initialise", errbuf, errlen);
		if (res != OBX_ETIMEDOUT)
			return res;
		clock_gettime(CLOCK_MONOTONIC, &t);
		waited = (long long)(t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (waited >= timeout_ms || (tick != NULL && tick(arg)))
			return OBX_ETIMEDOUT;
	}
}

int
obx_kafka_txn_commit(struct obx_kafka *k, int timeout_ms, char *errbuf, size_t errlen)
{
	int res;
	char buf[256];

	if (!k->txn_open)
		return OBX_OK;
	while (read(k->wake[0], buf, sizeof(buf)) > 0)
		;
	k->committing = true;
	res = txn_result(k, rd_kafka_commit_transaction(k->rk, timeout_ms), "commit", errbuf, errlen);
	if (res != OBX_ETIMEDOUT)
		k->committing = false;
	if (res == OBX_OK)
		k->txn_open = false;
	return res;
}

int
obx_kafka_txn_abort(struct obx_kafka *k, int timeout_ms, char *errbuf, size_t errlen)
{
	int res;

	if (!k->txn_open || k->fatal)
		return k->fenced ? OBX_EFENCED : OBX_OK;
	res = txn_result(k, rd_kafka_abort_transaction(k->rk, timeout_ms), "abort", errbuf, errlen);
	k->txn_open = k->committing = false;
	return res;
}

void
obx_kafka_close(struct obx_kafka *k, int wait_ms)
{
	struct obx_metrics *m = k->metrics;

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
	if (m != NULL)
		m->kafka_login_refused = m->kafka_tls_refused = false; /* the next producer logs in afresh */
	memset(k, 0, sizeof(*k));
	k->wake[0] = k->wake[1] = -1;
}

/* True for errors that say the cluster does not have the topic (yet). */
static bool
err_is_missing_topic(rd_kafka_resp_err_t err)
{
	/* the broker's answer in a delivery report, and librdkafka's once its metadata says so */
	return err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART || err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
}

/* True for errors that will never succeed on retry (the event is poison). */
static bool
err_is_permanent(rd_kafka_resp_err_t err)
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

/*
 * Refusals a broker gives a whole produce request for one of its records: a
 * batch over the topic's max.message.bytes fails every record in it
 * (librdkafka does not split it), an invalid record its batch.
 */
static bool
refuses_whole_request(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE || err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE ||
	    err == RD_KAFKA_RESP_ERR_INVALID_RECORD;
}

/*
 * The one classification of the broker's and the producer's refusals for
 * the delivery policy (delivery.h), used by every source: what a produce
 * call's result means, and how a delivery report ended.
 */
static enum obx_produce_result
produce_result(rd_kafka_resp_err_t err)
{
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return OBX_PRODUCE_OK;
	if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
		return OBX_PRODUCE_QUEUE_FULL;
	if (err_is_missing_topic(err))
		return OBX_PRODUCE_MISSING_TOPIC;
	if (err_is_permanent(err) || err == RD_KAFKA_RESP_ERR__INVALID_ARG)
		return OBX_PRODUCE_PERMANENT;
	return OBX_PRODUCE_TRANSIENT;
}

static enum obx_report_status
report_status(rd_kafka_resp_err_t err)
{
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return OBX_REPORT_OK;
	if (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
		return OBX_REPORT_PURGED;
	if (err_is_missing_topic(err))
		return OBX_REPORT_MISSING_TOPIC;
	return err_is_permanent(err) ? OBX_REPORT_PERMANENT : OBX_REPORT_TRANSIENT;
}

void
obx_kafka_report(const rd_kafka_message_t *m, uint64_t opaque, struct obx_header *hs, size_t nhs,
    struct obx_report *rep)
{
	rd_kafka_headers_t *h = NULL;
	const char *name;
	const void *v;
	size_t sz, n = 0;
	/* a refusal for want of an ACL says which: the one line an operator reads names it */
	static _Thread_local char topic_denied[400];

	if (obx_kafka_acl_hint(m->err) != NULL)
		snprintf(topic_denied, sizeof(topic_denied), "%s: %s", rd_kafka_err2str(m->err),
		    obx_kafka_acl_hint(m->err));

	if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR && rd_kafka_message_headers(m, &h) == 0)
		for (size_t i = 0; n < nhs && rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0; i++)
			hs[n++] = (struct obx_header){ name, v, sz };
	*rep = (struct obx_report){ .opaque = opaque,
		.status = report_status(m->err),
		.error = obx_kafka_acl_hint(m->err) != NULL ? topic_denied : rd_kafka_err2str(m->err),
		.error_name = rd_kafka_err2name(m->err),
		.whole_request = refuses_whole_request(m->err),
		.record = { rd_kafka_topic_name(m->rkt), m->key, m->key_len, m->payload, m->len,
		    rd_kafka_message_timestamp(m, NULL), hs, n } };
}
