/*
 * relaycore.h - the relay's decisions (pure): what to publish, what to
 * dead-letter, what may be confirmed, when to read, when to stop.
 *
 * The core does no I/O, reads no clock and writes no log line.  Its inputs
 * are the replication stream's CopyData messages (or messages already
 * decoded), the result of each produce, delivery reports, timer ticks (the
 * caller's monotonic milliseconds) and stop signals.  Its outputs are calls
 * through struct obx_core_ops (produce this record, here is a line for the
 * log) and state the loop asks for: may it read the stream now, is a status
 * update due and with which flush LSN, has the session ended and why.  The
 * loop in relay.c performs the actions and nothing else; docs/internals/design.md
 * ("Relay core") describes the split.
 *
 * The core owns the ack tracker (the flush position, docs/internals/design.md invariant 4), the
 * stream buffer (streamed transactions until their Stream Commit or Abort),
 * the message-to-row path ([source] messages), on_error, restart
 * de-duplication (core/restart_dedupe.h) and the drain rules.  Every wait is a state,
 * never a loop inside the core: a produce the producer's queue refused, a
 * record waiting for its topic's read-back, the rows of a Stream Commit
 * still to publish and the in-flight caps all make obx_core_can_read()
 * false until obx_core_pump() (called by the loop on every turn) has moved
 * past them.
 *
 * Lifetime: obx_core_new() once per process, obx_core_session_start() and
 * obx_core_session_end() around every replication session,
 * obx_core_free() at exit.  The state is private to src/core/
 * (relaycore_int.h, which also says which file of the core does what).
 */
#ifndef OBX_RELAYCORE_H
#define OBX_RELAYCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/coverage.h"
#include "obx/core/restart_dedupe.h"
#include "obx/core/delivery.h"
#include "obx/core/logfields.h"
#include "obx/core/lsn.h"
#include "obx/core/metrics.h"
#include "obx/core/pgoutput.h"
#include "obx/core/eos_progress.h"

/* Status updates go out at most this often when only the flush position moved. */
#define OBX_CORE_STATUS_MIN_GAP_MS 100
/* SIGTERM: how long to wait for outstanding acknowledgements (every source's drain). */
#define OBX_CORE_DRAIN_TIMEOUT_MS OBX_DRAIN_TIMEOUT_MS
/* The most keys a logical decoding message's JSON object may have. */
#define OBX_CORE_MESSAGE_KEYS 64

/*
 * The actions.  produce hands a record to the producer (which copies it)
 * tagged with opaque, and writes why it failed into errbuf (not OK).  note
 * gives a line for the log and what it concerns (f: the event's lsn, xid,
 * id and topic, borrowed for the call; NULL: nothing in particular).  lookup starts reading topic back from the end
 * of its partitions down to floor, for restart de-duplication (core/restart_dedupe.h;
 * docs/internals/design.md, "Restart de-duplication"); the finished scan comes back
 * later through obx_core_lookup_done() with gen, never from inside the
 * call.  It returns false when the read-back cannot be started (the
 * topic's records are then published).  lookup may be NULL: no
 * de-duplication.  All are called only from inside core calls.
 */
struct obx_core_ops {
	enum obx_produce_result (*produce)(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf,
	    size_t errlen);
	void (*note)(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line);
	bool (*lookup)(void *ctx, const char *topic, const struct obx_dd_mark *floor, uint32_t gen);
};

/*
 * Exactly-once ([delivery] exactly_once; docs/internals/design.md, "Exactly-once"):
 * what one Kafka transaction holds, for its progress record.
 */
struct obx_core_progress {
	struct obx_dd_mark mark;  /* the last event it holds (lsn, seq); id_hash unused */
	int64_t mark_commit_time; /* commit time of the transaction at mark.lsn (0: unknown) */
	obx_lsn end_lsn;          /* the end of the last PostgreSQL transaction it completes (0/0: none) */
	int64_t commit_time;      /* that transaction's commit time, PostgreSQL epoch microseconds */
	uint64_t records;         /* records produced in it */
};

/* How a Kafka transaction's commit ended, as the loop reports it. */
enum obx_core_commit {
	OBX_CORE_COMMIT_OK,
	OBX_CORE_COMMIT_ABORT,  /* it cannot commit: the session ends and rewinds */
	OBX_CORE_COMMIT_FENCED, /* another instance took over the transactional.id: exit 1 (errbuf says so) */
	OBX_CORE_COMMIT_FATAL,  /* the producer is unusable: the session ends and rewinds */
};

enum obx_core_end {
	OBX_CORE_RUNNING = 0,
	OBX_CORE_END_STOP,  /* stopped on request: exit 0 */
	OBX_CORE_END_RETRY, /* transient: end the session, reconnect with backoff */
	OBX_CORE_END_FATAL, /* cannot heal: exit 1 */
};

/*
 * The relay core's state is private to src/core/ (relaycore_int.h): the
 * loop holds a pointer, drives the core through the calls below and reads
 * its figures through obx_core_stats() and the accessors at the end.
 */
struct obx_core;

/* What the loop reads of the core: its positions and counters, for status, metrics and logs. */
struct obx_core_stats {
	obx_lsn received;         /* the write position: the highest LSN read */
	obx_lsn sent_flush;       /* the highest flush position sent */
	obx_lsn server_wal_end;   /* the highest WAL end the server reported */
	int status_interval_ms;   /* this session's (obx_core_session_start()) */
	bool draining;            /* a first stop signal came: the session drains */
	bool backpressured;       /* obx_core_backpressured() */
	bool end_kafka;           /* the session ended because of the broker side */
	uint64_t published;       /* events acknowledged (not counting dead-lettered ones) */
	uint64_t inflight_events; /* records handed to the producer, not yet reported */
	uint64_t inflight_bytes;
	uint64_t txn_records;   /* exactly-once: records in the open Kafka transaction */
	uint64_t txn_committed; /* exactly-once: Kafka transactions committed */
	uint64_t txn_aborted;   /* exactly-once: ended without a commit (abort, rewind) */
	bool has_oldest;        /* an event is unacknowledged; oldest_time is valid */
	int64_t oldest_time;    /* the commit time of the oldest transaction with unacknowledged
	                              events, PostgreSQL epoch microseconds */
};

/*
 * Makes a core for cfg (borrowed) into *out.  ops and ctx receive the
 * actions, m the counters (all borrowed, outliving the core; none may be
 * NULL).  Returns 0, or OBX_ENOMEM with *out NULL.  The caller frees it
 * with obx_core_free().
 */
int obx_core_new(struct obx_core **out, const struct obx_config *cfg, const struct obx_core_ops *ops, void *ctx,
    struct obx_metrics *m);
/* Frees everything the core owns, and the core; obx_core_free(NULL) is a no-op. */
void obx_core_free(struct obx_core *c);

/*
 * A session starts streaming at start (the slot's confirmed_flush) with
 * pgoutput protocol proto; status updates are due every status_interval_ms.
 * A new generation begins: reports of earlier sessions are never counted.
 * Returns 0 or OBX_ENOMEM.
 */
int obx_core_session_start(struct obx_core *c, obx_lsn start, int proto, int status_interval_ms, int64_t now_ms);

/*
 * Exactly-once: this session publishes in Kafka transactions.  floor (NULL:
 * no progress record was found or it was not trusted, core/eos_progress.h) is the
 * last event of the last committed transaction and floor_time the commit
 * time of its PostgreSQL transaction; every replayed event at or below it
 * is skipped, acknowledged as found, once the replay shows that the floor
 * is of this history: a transaction committed at the floor's lsn at
 * floor_time.  Until the replay meets it, events below it are skipped but
 * the flush position stays at the session's start; a replay that passes
 * the floor's lsn without it (a transaction or a keepalive beyond) or meets
 * another commit time there ends the session to publish everything again,
 * and the floor is refused from then on.  Call after
 * obx_core_session_start(), before the first message.
 */
void obx_core_exactly_once(struct obx_core *c, const struct obx_dd_mark *floor, int64_t floor_time);

/*
 * Coverage (core/coverage.h; docs/internals/design.md, "Lifecycle edges"):
 * base is the publication's hold on the outbox tables as this session's
 * set-up read it (copied).  From now on the flush position never passes the
 * WAL position of the last reading obx_core_coverage() found consistent with
 * the reading before it (until the first, the session's start).  When an
 * earlier session of this core verified up to at least where this one starts,
 * base is judged against its last reading first, and a gap ends the session
 * (OBX_CORE_END_FATAL) as obx_core_coverage() does.  Call after
 * obx_core_session_start(); a session without it holds nothing back.
 * Returns 0 or OBX_ENOMEM.
 */
int obx_core_coverage_start(struct obx_core *c, const struct obx_cov *base);

/*
 * A reading of the catalog made after the server's WAL position lsn was read
 * (and after the last reading): the flush position may follow up to lsn, or,
 * when a table was not covered in between, the session ends (OBX_CORE_END_FATAL)
 * with a line naming the table, the last position verified and the fix.
 */
void obx_core_coverage(struct obx_core *c, const struct obx_cov *now, obx_lsn lsn);

/*
 * Exactly-once: true when the open Kafka transaction should commit now
 * ([delivery] transaction_max_*, idle: the loop found nothing more to read,
 * a drain, backpressure); *p says what it holds, for its progress record.
 * From then on the core produces nothing and reads nothing until
 * obx_core_commit_done().
 */
bool obx_core_commit_due(struct obx_core *c, int64_t now_ms, bool idle, struct obx_core_progress *p);

/*
 * Exactly-once: the commit asked for ended.  OK acknowledges every event
 * of the transaction (the flush position may move); the rest end the
 * session (reason, borrowed, says how).  now_us (PostgreSQL-epoch
 * microseconds) feeds the commit-to-acknowledgement histogram.
 */
void obx_core_commit_done(struct obx_core *c, enum obx_core_commit how, const char *reason, int64_t now_us);

/*
 * Exactly-once: the progress record of the transaction *p describes
 * (obx_core_commit_due()), in the history src of the session, into *out.
 */
void obx_core_progress_record(const struct obx_core_progress *p, const struct obx_progress_source *src,
    struct obx_progress *out);

/*
 * Exactly-once: how a session's start goes on after init_transactions
 * ended with res (0 or an OBX_E* code of obx_kafka_txn_init()).  Returns
 * OBX_CORE_RUNNING on 0;
 * OBX_CORE_END_FATAL when fenced (another producer of the id is newer:
 * never publish beside it); else OBX_CORE_END_RETRY.  errbuf holds the
 * producer's words on entry and is rewritten for a time-out (OBX_ETIMEDOUT after
 * budget_ms, or a stop that cut the wait short).
 */
enum obx_core_end obx_core_txn_init_end(int res, const char *txn_id, int budget_ms, char *errbuf, size_t errlen);

/*
 * Exactly-once: the broker refused this producer's epoch, and
 * connection_ours says whether the replication connection is still this
 * instance's (obx_progress_fenced()).  Returns OBX_CORE_END_FATAL (another
 * instance took over: stop, exit 1) or OBX_CORE_END_RETRY (a transaction
 * outlived transaction.timeout.ms: a new session goes on).  errbuf gets the
 * line.
 */
enum obx_core_end obx_core_fenced_end(bool connection_ours, const char *txn_id, const char *slot, char *errbuf,
    size_t errlen);

/*
 * Exactly-once: how a commit call that ended (res, 0 or an OBX_E* code of
 * obx_kafka_txn_commit(), is not OBX_ETIMEDOUT:
 * the commit goes on) is reported to obx_core_commit_done().  A fence
 * while the replication connection is still ours (connection_ours, only
 * looked at for OBX_EFENCED) is FATAL (a new session), else FENCED
 * (stop); errbuf holds the producer's words on entry and gets the fence's line
 * for OBX_EFENCED.
 */
enum obx_core_commit obx_core_commit_verdict(int res, bool connection_ours, const char *txn_id, const char *slot,
    char *errbuf, size_t errlen);

/*
 * The status interval of a session: [source] status_interval
 * (status_interval_ms), or a third of the server's wal_sender_timeout when
 * that is sooner (0: no timeout), so that an idle stream is never ended
 * by the server.
 */
int obx_core_status_interval(int status_interval_ms, int wal_sender_timeout_ms);

/*
 * The session is over (whatever the reason): forgets its transactions,
 * buffered rows, pending record and relations, and bumps the generation so
 * that reports served while the producer closes are ignored.
 */
void obx_core_session_end(struct obx_core *c);

/* True when the session should ask the server to stream in-progress transactions. */
bool obx_core_streaming_allowed(const struct obx_core *c);

/* One CopyData message ('w' XLogData or 'k' keepalive) of the replication stream. */
void obx_core_copydata(struct obx_core *c, const uint8_t *buf, size_t len);

/*
 * One decoded pgoutput message; data_start is its XLogData dataStart (0/0
 * when it has none).  Borrowed views in m are used only during the call.
 */
void obx_core_pgmsg(struct obx_core *c, const struct obx_pgmsg *m, obx_lsn data_start);

/* A keepalive: the server's WAL end, and whether it asks for a reply now. */
void obx_core_keepalive(struct obx_core *c, obx_lsn wal_end, bool reply_requested);

/* A delivery report; one of an earlier session (generation) is ignored. */
void obx_core_report(struct obx_core *c, const struct obx_report *r);

/*
 * The read-back of topic that ops->lookup started is over.  Takes
 * ownership of s (NULL: it could not be made, the topic's records are
 * published); one of an earlier session (generation) is freed unused.  The
 * records that waited for it move on at the next obx_core_pump().
 */
void obx_core_lookup_done(struct obx_core *c, uint32_t gen, const char *topic, struct obx_dd_scan *s);

/*
 * Moves pending work on as far as the in-flight caps allow: events found in
 * Kafka by de-duplication (acknowledged here, as a delivery report would),
 * a record the queue refused or that waits for its topic's read-back, the
 * rows of a Stream Commit, the drain rule.  Call on every turn of the
 * loop, after serving delivery reports.
 */
void obx_core_pump(struct obx_core *c, int64_t now_ms);

/* A stop signal: the first drains (up to OBX_CORE_DRAIN_TIMEOUT_MS), the second stops at once. */
void obx_core_signal(struct obx_core *c, int64_t now_ms);

/* n events of another source of the process (the snapshot of pending rows) were acknowledged. */
void obx_core_published_elsewhere(struct obx_core *c, uint64_t n);

/*
 * The session's producer stops at the first record the broker refuses
 * (librdkafka's enable.gapless.guarantee): an on_error copy then waits for
 * the next session's producer.  Set after obx_core_session_start().
 */
void obx_core_set_gapless(struct obx_core *c, bool gapless);

/*
 * The producer stopped at a refusal (its gap-less guarantee) whose
 * delivery reports did not come: ends the session, and what was read so far
 * is sent again one record at a time, so that the record the broker
 * refuses is found alone.
 */
void obx_core_refused_unseen(struct obx_core *c, const char *why);

/* Ends the session for a reason found outside the core (I/O). */
void obx_core_fail(struct obx_core *c, enum obx_core_end how, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* True when the loop may read the next replication message now. */
bool obx_core_can_read(const struct obx_core *c);

/* True when the in-flight caps hold the stream (for the state gauge). */
bool obx_core_backpressured(const struct obx_core *c);

/*
 * True when a standby status update is due at now_ms; *flush and *write
 * are what to send and *reply whether to ask the server for a keepalive
 * (idle, so the flush position may follow the WAL end).  After sending it
 * the loop calls obx_core_status_sent().
 */
bool obx_core_status_due(const struct obx_core *c, int64_t now_ms, obx_lsn *write, obx_lsn *flush, bool *reply);
void obx_core_status_sent(struct obx_core *c, obx_lsn flush, int64_t now_ms);

/*
 * Milliseconds until the core next needs a turn, >= 0: a status update,
 * the drain check (100 ms), a record the producer's queue refused (50 ms),
 * at once when a Stream Commit's rows may go on or skipped events wait to
 * be acknowledged.
 */
int64_t obx_core_wait_ms(const struct obx_core *c, int64_t now_ms);

/* OBX_CORE_RUNNING, or how the session ended; *reason (borrowed) says why. */
enum obx_core_end obx_core_ended(const struct obx_core *c, const char **reason);

/* The opaque carried by a stream record (delivery.h, obx_dlv_opaque()). */
uint64_t obx_core_opaque(uint32_t gen, uint64_t ticket, bool dead_letter);

/* The core's figures now (struct obx_core_stats). */
struct obx_core_stats obx_core_stats(const struct obx_core *c);

/*
 * What the reason of obx_core_ended() concerns (the event, the topic), for
 * its line in the log; borrowed, valid until the next session starts.
 */
const struct obx_logfields_kept *obx_core_reason_fields(const struct obx_core *c);

/*
 * The topics the cluster does not have, kept across sessions; borrowed,
 * valid while the core lives.  The snapshot shares them (one rule and one
 * gauge for the process).
 */
struct obx_topic_waits *obx_core_topic_waits(struct obx_core *c);

/* The current stream generation (docs/internals/design.md, invariant 8). */
uint32_t obx_core_generation(const struct obx_core *c);

#endif
