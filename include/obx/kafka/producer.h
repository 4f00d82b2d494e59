/*
 * kafka/producer.h - the Kafka sink (I/O): an idempotent librdkafka producer whose
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

#include "obx/core/config.h"
#include "obx/core/delivery.h"
#include "obx/core/metrics.h"
#include "obx/core/event.h"
#include "obx/core/eos_progress.h" /* enum obx_txn_result */

/* Called from obx_kafka_poll() for each delivery report; m is borrowed. */
typedef void (*obx_delivery_fn)(void *ctx, uint64_t opaque, const rd_kafka_message_t *m);

struct obx_kafka {
	rd_kafka_t *rk;
	rd_kafka_queue_t *mainq;
	int wake[2]; /* pipe: librdkafka writes when the main queue gets an event */
	obx_delivery_fn on_delivery;
	void *ctx;
	bool fatal;
	bool fenced;       /* the fatal error says another producer took the transactional.id */
	char fatal_reason[512];
	/* counts the error callback's codes (transport, all brokers down); NULL: not counted.
	 * Borrowed; the caller sets it after obx_kafka_open() */
	struct obx_metrics *metrics;

	/* exactly-once ([delivery] exactly_once): a transactional producer */
	bool transactional;
	bool txn_open;     /* begin_transaction done, commit or abort not yet */
	bool committing;   /* commit_transaction returned a retriable time-out: call it again */
	char txn_id[256];  /* the transactional.id */
	char producer_name[64]; /* wall-clock ms and pid at open: unique across restarts */
	uint64_t txn_count;
	char txn_name[96];  /* producer_name.txn_count: the txn header of the open transaction */
};

/* The opaque of a progress record: its delivery report is not an event's. */
#define OBX_KAFKA_OPAQUE_PROGRESS UINT64_MAX

/*
 * Builds the producer configuration from cfg: outboxd's defaults
 * (message.timeout.ms=0, partitioner=murmur2_random, queue bounds sized to
 * the in-flight caps), then the user's [kafka] properties, then the
 * guarantees (enable.idempotence=true, acks=all).  Returns a conf the
 * caller owns (rd_kafka_conf_destroy) or NULL with errbuf filled.
 */
rd_kafka_conf_t *obx_kafka_conf(const struct obx_config *cfg, char *errbuf, size_t errlen);

/*
 * Creates the producer; with txn_id (NULL: none) a transactional one with
 * that transactional.id.  Returns 0, or OBX_ECONFIG (a property) / OBX_EIO
 * with errbuf filled.
 */
int obx_kafka_open(struct obx_kafka *k, const struct obx_config *cfg, const char *txn_id,
    obx_delivery_fn fn, void *ctx, char *errbuf, size_t errlen);

/*
 * The transactional.id of [delivery] exactly_once: transactional_id when
 * set, else outboxd-<system identifier>-<database>-<slot>.  Slot names
 * repeat across databases (every one may keep the default); the system
 * identifier and the database make the id one source's, and stay the same
 * on a physical standby promoted in its place, so its instance fences the
 * old one's.
 */
void obx_kafka_txn_id(const struct obx_config *cfg, const char *sysid, const char *dbname, char *out,
    size_t len);

/*
 * Exactly-once: init_transactions, which fences every older producer with
 * the same transactional.id and waits until its open transaction is over.
 * Waits up to timeout_ms, in slices of at most 500 ms after each of which
 * tick(arg) is called (a true return gives up).  Returns an obx_txn_result;
 * why is filled when it is not OBX_TXN_OK.
 */
enum obx_txn_result obx_kafka_txn_init(struct obx_kafka *k, int timeout_ms, bool (*tick)(void *),
    void *arg, char *why, size_t whylen);

/*
 * Commits the open transaction (flushing its records first; delivery
 * reports are served from inside the call), waiting at most timeout_ms:
 * OBX_TXN_PENDING means call again to go on.  OBX_TXN_OK with no
 * transaction open too.
 */
enum obx_txn_result obx_kafka_txn_commit(struct obx_kafka *k, int timeout_ms, char *why, size_t whylen);

/* Aborts the open transaction, if any (its records are purged), waiting at most timeout_ms. */
enum obx_txn_result obx_kafka_txn_abort(struct obx_kafka *k, int timeout_ms, char *why, size_t whylen);

/*
 * Hands one record to the producer (copied), to partition (RD_KAFKA_PARTITION_UA:
 * the partitioner's choice).  A transactional producer begins a transaction
 * first when none is open.  Returns librdkafka's synchronous result: 0, or
 * e.g. RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, RD_KAFKA_RESP_ERR__QUEUE_FULL,
 * RD_KAFKA_RESP_ERR__STATE (no transaction could begin).
 */
rd_kafka_resp_err_t obx_kafka_produce(struct obx_kafka *k, const char *topic, int32_t partition,
    const void *key, size_t keylen, const void *value, size_t len, int64_t timestamp_ms,
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

/*
 * The one classification of the broker's and the producer's refusals for
 * the delivery policy (delivery.h), used by every source: what a produce
 * call's result means, and how a delivery report ended.
 */
enum obx_produce_result obx_kafka_produce_result(rd_kafka_resp_err_t err);
enum obx_report_status obx_kafka_report_status(rd_kafka_resp_err_t err);

/*
 * A delivery report as the delivery policy reads it: *rep describes m,
 * tagged opaque, with up to nhs of its headers in hs (read only when it
 * failed: they name the event).  rep borrows m and hs.
 */
void obx_kafka_report(const rd_kafka_message_t *m, uint64_t opaque, struct obx_header *hs, size_t nhs,
    struct obx_report *rep);

#endif
