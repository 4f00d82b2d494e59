/*
 * delivery.h - the delivery policy of every source (pure): the stream's
 * events (relaycore_reports.c), the rows pending at a slot's creation
 * (snapshot.c) and the polling mode's rows (poll.c) are all handed to the
 * producer through one struct obx_delivery, which decides
 *   - the opaque every record carries (one layout for every source);
 *   - a record the producer's queue refused: kept, in order, as a pending
 *     state that obx_dlv_pump() moves on (never a loop waiting for room);
 *   - the in-flight counts and caps ([delivery] max_inflight, _bytes);
 *   - the missing-topic wait ([delivery] missing_topic_timeout), then on_error;
 *   - on_error: stop, or the dead-letter copy (the record with its headers
 *     plus original_topic and error), and that copy's headers alone when
 *     the copy is refused too;
 * The drain after a stop signal and its deadline are runpolicy.h's
 * (struct obx_stops), OBX_DRAIN_TIMEOUT_MS is their deadline.
 * A source keeps what is its own (acknowledging an LSN, marking a row) and
 * acts on the outcomes it gets back.  docs/internals/design.md, "Delivery
 * policy", gives the split.
 *
 * The module does no I/O, reads no clock and writes no log line: produce
 * and note are calls through struct obx_delivery_ops, the time is the
 * caller's monotonic milliseconds.
 */
#ifndef OBX_DELIVERY_H
#define OBX_DELIVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/event.h"
#include "obx/core/logfields.h"
#include "obx/core/metrics.h"

/* SIGTERM: how long a source may take to finish what it has in flight. */
#define OBX_DRAIN_TIMEOUT_MS 30000
/* Topics waited for at once (the cluster does not have them yet). */
#define OBX_DLV_MISSING_TOPICS 8
/* Headers a record may carry into its dead-letter copy. */
#define OBX_DLV_MAX_HEADERS 64

/* A Kafka record as a source hands it over; every pointer is borrowed for the call. */
struct obx_record {
	const char *topic;
	const void *key;
	size_t keylen;
	const void *value; /* NULL: tombstone */
	size_t len;
	int64_t timestamp_ms;
	const struct obx_header *headers;
	size_t nheaders;
};

/* What the producer said to one produce call (kafka/producer.c classifies librdkafka's errors). */
enum obx_produce_result {
	OBX_PRODUCE_OK,            /* queued; a delivery report will follow */
	OBX_PRODUCE_QUEUE_FULL,    /* not queued; try the same record again later */
	OBX_PRODUCE_PERMANENT,     /* this record can never be produced (too large, invalid) */
	OBX_PRODUCE_TRANSIENT,     /* not queued, for a reason a new session may cure */
	OBX_PRODUCE_MISSING_TOPIC, /* not queued: the cluster does not have the topic (yet) */
};

/* How a delivery report ended (kafka/producer.c classifies librdkafka's errors). */
enum obx_report_status {
	OBX_REPORT_OK,            /* acknowledged by the broker */
	OBX_REPORT_PURGED,        /* dropped by the producer while a session is torn down */
	OBX_REPORT_TRANSIENT,     /* failed, a retry in a new session may succeed */
	OBX_REPORT_PERMANENT,     /* the broker will never accept it: on_error decides */
	OBX_REPORT_MISSING_TOPIC, /* the cluster does not have the topic (yet): waited for, then on_error */
};

/* One delivery report; every pointer is borrowed for the call. */
struct obx_report {
	uint64_t opaque; /* as given to produce */
	enum obx_report_status status;
	const char *error;        /* text of the error (not OK) */
	const char *error_name;   /* its short code name, for the metrics (not OK) */
	bool whole_request;       /* PERMANENT for a reason a broker gives every record of a produce
	                           * request (a record over max.message.bytes), so perhaps another's */
	struct obx_record record; /* the record as the producer held it */
	int64_t now_us;           /* PostgreSQL-epoch microseconds now, for the latency histogram */
};

/* ---- the opaque: bit 63 dead-letter copy, 62 headers alone, 60..61 source, 44..59 generation, 0..43 ticket ---- */

enum obx_dlv_source {
	OBX_DLV_STREAM = 0,
	OBX_DLV_SNAPSHOT = 1,
	OBX_DLV_POLL = 2,
};

struct obx_dlv_tag {
	enum obx_dlv_source src;
	uint32_t gen;     /* the low 16 bits of the generation */
	uint64_t ticket;  /* the source's own number for the record */
	bool dead_letter; /* the record is a dead-letter copy */
	bool bare;        /* ... of headers alone */
};

uint64_t obx_dlv_opaque(const struct obx_dlv_tag *t);
/* Fills *t from opaque; false for an opaque no source made (the progress record's). */
bool obx_dlv_untag(uint64_t opaque, struct obx_dlv_tag *t);

/* ---- topics the cluster does not have, shared by the sources of one process ---- */

struct obx_topic_waits {
	struct {
		char name[250];
		int64_t since_ms;
		bool expired; /* waited the whole timeout: on_error applies until one is acknowledged */
	} t[OBX_DLV_MISSING_TOPICS];
};

/*
 * A record for topic was refused at now_ms because the cluster does not
 * have it.  Returns true while the wait goes on (timeout_ms counted from
 * the topic's first refusal, kept across sessions); false once it has
 * passed: on_error applies to the record and to every later one of the
 * topic, until a record of it is acknowledged (obx_topic_present()).
 * At most OBX_DLV_MISSING_TOPICS topics are waited for at once: a record of
 * another missing topic meets on_error at once (false).
 */
bool obx_topic_missing(struct obx_topic_waits *w, const char *topic, int64_t now_ms, int64_t timeout_ms);
void obx_topic_present(struct obx_topic_waits *w, const char *topic);
/* The longest wait into m's missing-topic gauge (none: an empty name). */
void obx_topic_gauge(const struct obx_topic_waits *w, int64_t now_ms, struct obx_metrics *m);

/* ---- one source's deliveries ---- */

/* What a source wants done with a record just before it is produced (struct obx_delivery_ops.gate). */
enum obx_dlv_gate {
	OBX_DLV_GATE_SEND,    /* produce it */
	OBX_DLV_GATE_HOLD,    /* not yet: keep it pending, in order (a read-back it waits for) */
	OBX_DLV_GATE_SETTLED, /* the source settled it without producing (found in Kafka already) */
	OBX_DLV_GATE_REFUSED, /* on_error applies now; errbuf says what refused it */
};

/*
 * The source's side.  gate (NULL: always send) is asked before every
 * produce of a record, its first and any later one from the pending
 * queue.  produce hands a record to the producer, which copies it, and
 * writes why into errbuf when it is not queued.  accepted (NULL: nothing) is
 * told of every record the producer queued.  note gives a line for the log
 * and what it concerns.  Called only from inside obx_dlv_* calls.
 */
struct obx_delivery_ops {
	enum obx_dlv_gate (*gate)(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl, char *errbuf,
	    size_t errlen);
	enum obx_produce_result (*produce)(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf,
	    size_t errlen);
	void (*accepted)(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl);
	void (*note)(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line);
};

/* What a record cannot be published means to its source. */
enum obx_dlv_policy {
	OBX_DLV_ON_ERROR, /* [delivery] on_error: stop, or the dead-letter copy */
	OBX_DLV_ATTEMPTS, /* the source counts attempts ([poll] max_attempts): a failure to try again,
	                    * and obx_dlv_dead_letter() once the source gives up */
};

/* What became of a record or of a report. */
enum obx_dlv_outcome {
	OBX_DLV_SENT,       /* with the producer or pending: a report, or a later pump, tells more */
	OBX_DLV_SETTLED,    /* the gate settled it (OBX_DLV_GATE_SETTLED) */
	OBX_DLV_ACKED,      /* acknowledged (dead_letter: it was its dead-letter copy) */
	OBX_DLV_WAIT_TOPIC, /* its topic does not exist (yet) and the wait goes on: try it again later */
	OBX_DLV_RETRY,      /* failed, for a reason a later try may cure */
	OBX_DLV_REJECTED,   /* refused for good inside a Kafka transaction, or alone by a gapless producer: rewind;
	                   * on_error applies at the replay */
	OBX_DLV_SOLO,       /* refused beside other records (a broker refuses a whole request): rewind, and send
	                   * what was in flight again one record at a time (struct obx_delivery.solo) */
	OBX_DLV_STOP,       /* cannot be published and on_error = stop, or even its headers were refused */
	OBX_DLV_IGNORED,    /* a report of an earlier generation, another source, or a purge */
};

/*
 * An outcome's details: the record it concerns and the line that says why.
 * Every obx_dlv_* call that takes one fills it (ticket and dead_letter of
 * the record the outcome is about; zeroed when it is about none).
 */
struct obx_dlv_result {
	uint64_t ticket;
	bool dead_letter;
	char reason[768];
	char why[256];          /* a report's refusal in the broker's words (and the record's size when alone) */
	struct obx_logfields f; /* what the record is: its id, lsn, xid and (original) topic */
	char f_id[128], f_topic[256];
};

/* A record the producer's queue refused, copied until it is accepted. */
struct obx_dlv_pending {
	bool dead_letter, bare;
	uint64_t ticket;
	char *topic;
	void *key, *value; /* value NULL with has_value false: tombstone */
	bool has_value;
	size_t keylen, len;
	int64_t timestamp_ms;
	struct obx_header *headers;
	char **hstore; /* owned copies of the header names and values */
	size_t nheaders;
};

struct obx_delivery {
	const struct obx_config *cfg; /* borrowed */
	const struct obx_delivery_ops *ops;
	void *ctx;
	struct obx_metrics *m;         /* borrowed: the Kafka error counters, the missing-topic gauge */
	struct obx_topic_waits *waits; /* borrowed: shared by the process's sources */
	enum obx_dlv_source src;
	enum obx_dlv_policy policy;
	bool transactional; /* records go into Kafka transactions */
	uint32_t gen;
	/*
	 * Finding the record a broker refuses.  A broker refuses a whole produce
	 * request (a record over max.message.bytes: every record beside it gets
	 * MSG_SIZE_TOO_LARGE too), so a refusal of a record that was not alone
	 * says nothing about that record.  find_alone: such a refusal is
	 * OBX_DLV_SOLO, not on_error (the source then sends again one at a
	 * time).  solo: one record in flight at a time, so a refusal is the
	 * record's own.  gapless: the producer stops at a refusal (librdkafka's
	 * enable.gapless.guarantee), so an on_error copy waits for the next
	 * producer (OBX_DLV_REJECTED).  The source sets them; obx_dlv_begin()
	 * keeps them.
	 */
	bool find_alone, solo, gapless;

	struct obx_dlv_pending *pend; /* what the producer's queue refused, in order */
	size_t npend, pend_cap;
	uint64_t inflight; /* records with the producer, no report yet */
	uint64_t inflight_bytes;
	int64_t now_ms;
};

/*
 * Prepares d for cfg (borrowed) as source src with policy.  ops, ctx, m
 * and waits are borrowed and outlive d.  Pair with obx_dlv_reset().
 */
void obx_dlv_init(struct obx_delivery *d, const struct obx_config *cfg, enum obx_dlv_source src,
    enum obx_dlv_policy policy, const struct obx_delivery_ops *ops, void *ctx, struct obx_metrics *m,
    struct obx_topic_waits *waits);
/* Frees the pending records. */
void obx_dlv_reset(struct obx_delivery *d);

/*
 * A new generation gen (a session, a batch): pending records are dropped,
 * the in-flight counts start at 0, and reports of earlier generations are
 * ignored from now on.  transactional: the records go into Kafka
 * transactions (a refusal is then OBX_DLV_REJECTED, not on_error at once).
 */
void obx_dlv_begin(struct obx_delivery *d, uint32_t gen, bool transactional);

/*
 * Hands rec (ticket: the source's number for it; dl: rec is a dead-letter
 * record already, a row that could not become an event) to the producer,
 * behind every pending record (order).  Returns SENT, SETTLED, or what
 * the refusal means (WAIT_TOPIC, RETRY, STOP; res says why); a
 * dead-letter copy sent instead is SENT.  now_ms is the caller's clock.
 */
enum obx_dlv_outcome obx_dlv_send(struct obx_delivery *d, const struct obx_record *rec, uint64_t ticket, bool dl,
    int64_t now_ms, struct obx_dlv_result *res);

/*
 * Sends rec's dead-letter copy (the source gave the record up: reason
 * says why), its headers alone when the copy is refused.  Returns as
 * obx_dlv_send(); RETRY or STOP when neither can be produced.
 */
enum obx_dlv_outcome obx_dlv_dead_letter(struct obx_delivery *d, const struct obx_record *rec, uint64_t ticket,
    const char *reason, int64_t now_ms, struct obx_dlv_result *res);

/*
 * Produces pending records in order until the queue refuses one again or
 * one must wait.  Returns SENT when nothing more can move now, else the
 * outcome of the record it stopped at (res); SETTLED ones are told through
 * the gate and do not stop it.
 */
enum obx_dlv_outcome obx_dlv_pump(struct obx_delivery *d, int64_t now_ms, struct obx_dlv_result *res);

/*
 * A delivery report.  Returns IGNORED (another generation or source, a
 * purge), ACKED (res->ticket, res->dead_letter), SENT (refused: its
 * dead-letter copy went out), or what the refusal means.
 */
enum obx_dlv_outcome obx_dlv_report(struct obx_delivery *d, const struct obx_report *r, int64_t now_ms,
    struct obx_dlv_result *res);

/* True while records wait for room in the producer's queue. */
bool obx_dlv_pending(const struct obx_delivery *d);
/*
 * True when the in-flight caps are reached: no more records now.  One
 * record is always let through, however large.
 */
bool obx_dlv_capped(const struct obx_delivery *d);
/* True when a new record may be handed over now: nothing pending, under the caps. */
bool obx_dlv_room(const struct obx_delivery *d);
/*
 * True when a record of bytes (key and value) may be handed over now and
 * the caps still hold with it: what is in flight stays within
 * max_inflight_bytes plus one record, whatever the sizes.
 */
bool obx_dlv_room_for(const struct obx_delivery *d, size_t bytes);

#endif
