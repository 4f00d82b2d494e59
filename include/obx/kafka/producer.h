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
#include "obx/core/err.h"

/* Called from obx_kafka_poll() for each delivery report; m is borrowed. */
typedef void (*obx_delivery_fn)(void *ctx, uint64_t opaque, const rd_kafka_message_t *m);

struct obx_kafka {
	rd_kafka_t *rk;
	rd_kafka_queue_t *mainq;
	int wake[2]; /* pipe: librdkafka writes when the main queue gets an event */
	obx_delivery_fn on_delivery;
	void *ctx;
	bool fatal;
	bool fenced;             /* the fatal error says another producer took the transactional.id */
	bool gapless;            /* opened with enable.gapless.guarantee */
	bool stopped_at_refusal; /* the fatal error is that guarantee's: a record was refused */
	char fatal_reason[512];
	/* a login the broker refuses: who logs in, how (never the password), and when it was said */
	char login[200];
	int64_t login_said_ms;
	int64_t login_probed_ms;
	/* a broker certificate that fails verification: what was asked of it, and when it was said */
	char tls[600];
	int64_t tls_said_ms;
	_Atomic int tls_x509_error; /* OpenSSL's verdict on the last refused certificate (a broker thread's) */
	/* counts the error callback's codes (transport, all brokers down); NULL: not counted.
	 * Borrowed; the caller sets it after obx_kafka_open() */
	struct obx_metrics *metrics;

	/* exactly-once ([delivery] exactly_once): a transactional producer */
	bool transactional;
	bool txn_open;          /* begin_transaction done, commit or abort not yet */
	bool committing;        /* commit_transaction returned a retriable time-out: call it again */
	char txn_id[256];       /* the transactional.id */
	char producer_name[64]; /* wall-clock ms and pid at open: unique across restarts */
	uint64_t txn_count;
	char txn_name[96]; /* producer_name.txn_count: the txn header of the open transaction */
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

/* How conf logs in, for the line of a refused login: security.protocol, sasl.mechanisms and
 * sasl.username, never a secret. */
void obx_kafka_describe_login(const rd_kafka_conf_t *conf, char *out, size_t len);

/*
 * Creates the producer; with txn_id (NULL: none) a transactional one with
 * that transactional.id.  gapless (without txn_id): the producer stops at
 * the first record the broker refuses (enable.gapless.guarantee, a fatal
 * error): nothing after it in its partition is written, so what is sent
 * again lands in order.  Returns 0, or OBX_ECONFIG (a property) / OBX_EIO
 * with errbuf filled.
 */
int obx_kafka_open(struct obx_kafka *k, const struct obx_config *cfg, const char *txn_id, bool gapless,
    obx_delivery_fn fn, void *ctx, char *errbuf, size_t errlen);

/*
 * The transactional.id of [delivery] exactly_once: transactional_id when
 * set, else outboxd-<system identifier>-<database>-<slot>.  Slot names
 * repeat across databases (every one may keep the default); the system
 * identifier and the database make the id one source's, and stay the same
 * on a physical standby promoted in its place, so its instance fences the
 * old one's.
 */
void obx_kafka_txn_id(const struct obx_config *cfg, const char *sysid, const char *dbname, char *out, size_t len);

/*
 * Exactly-once: init_transactions, which fences every older producer with
 * the same transactional.id and waits until its open transaction is over.
 * Waits up to timeout_ms, in slices of at most 500 ms after each of which
 * tick(arg) is called (a true return gives up).  Returns 0, OBX_ETIMEDOUT
 * (still under way after timeout_ms, or tick gave up), OBX_EABORT (the
 * transaction cannot commit: abort it and rewind), OBX_EFENCED (another
 * producer with the same transactional.id took over) or OBX_EFATAL (the
 * producer is unusable: recreate it and rewind); errbuf is filled when it is
 * not 0.
 */
int obx_kafka_txn_init(struct obx_kafka *k, int timeout_ms, bool (*tick)(void *), void *arg, char *errbuf,
    size_t errlen);

/*
 * Commits the open transaction (flushing its records first; delivery
 * reports are served from inside the call), waiting at most timeout_ms:
 * returns as obx_kafka_txn_init(); OBX_ETIMEDOUT means call again to go
 * on.  0 with no transaction open too.
 */
int obx_kafka_txn_commit(struct obx_kafka *k, int timeout_ms, char *errbuf, size_t errlen);

/* Aborts the open transaction, if any (its records are purged), waiting at most timeout_ms; returns as obx_kafka_txn_init(). */
int obx_kafka_txn_abort(struct obx_kafka *k, int timeout_ms, char *errbuf, size_t errlen);

/*
 * Hands one record to the producer (copied), to partition (RD_KAFKA_PARTITION_UA:
 * the partitioner's choice).  A transactional producer begins a transaction
 * first when none is open.  Returns OBX_PRODUCE_OK (queued), or what the
 * refusal means to the delivery policy (delivery.h; the one classification
 * of librdkafka's errors, for every source): then errbuf gets librdkafka's
 * words for it, or that the Kafka transaction can take no more records
 * (none could begin), and *errname (errname NULL: not wanted) its short
 * name, for the metrics.
 */
enum obx_produce_result obx_kafka_produce(struct obx_kafka *k, const char *topic, int32_t partition,
    const void *key, size_t keylen, const void *value, size_t len, int64_t timestamp_ms,
    const struct obx_header *headers, size_t nheaders, const char *extra_name, const char *extra_value,
    uint64_t opaque, const char **errname, char *errbuf, size_t errlen);

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

/*
 * A delivery report as the delivery policy reads it: *rep describes m,
 * tagged opaque, with up to nhs of its headers in hs (read only when it
 * failed: they name the event).  rep borrows m and hs.
 */
void obx_kafka_report(const rd_kafka_message_t *m, uint64_t opaque, struct obx_header *hs, size_t nhs,
    struct obx_report *rep);

#endif
