/*
 * relaycore_int.h - the relay core's state, and what the files of the core
 * (src/core/relaycore*.c) share among themselves.  Only those files and the
 * unit tests include it (tests/unit/core_is_pure.sh checks); the loop
 * drives the core through relaycore.h and reads its figures there
 * (obx_core_stats()).
 *
 * The core is one module written in six files, one concern each:
 *   relaycore.c          lifetime, session state, the message dispatch, the
 *                        end of a session and the log lines
 *   relaycore_msgs.c     outbox rows and logical decoding messages into events
 *   relaycore_stream.c   streamed transactions: buffering, Stream Commit, Abort
 *   relaycore_reports.c  producing through the delivery policy, delivery
 *                        reports, restart de-duplication
 *   relaycore_eos.c      exactly-once: Kafka transactions, the floor, the verdicts
 *   relaycore_flow.c     flow control, status updates, the drain, the wait
 * None of these functions checks its arguments beyond what relaycore.h
 * promises; none is called from outside the core.
 */
#ifndef OBX_RELAYCORE_INT_H
#define OBX_RELAYCORE_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "obx/core/acktrack.h"
#include "obx/core/config.h"
#include "obx/core/coverage.h"
#include "obx/core/delivery.h"
#include "obx/core/event.h"
#include "obx/core/logfields.h"
#include "obx/core/lsn.h"
#include "obx/core/metrics.h"
#include "obx/core/pgoutput.h"
#include "obx/core/relaycore.h"
#include "obx/core/relcache.h"
#include "obx/core/restart_dedupe.h"
#include "obx/core/runpolicy.h"
#include "obx/core/streambuf.h"

/* A logical decoding message seen as a row of a relation with the message's keys. */
struct obx_core_msgrow {
	struct obx_rel rel;
	struct obx_relcol cols[OBX_CORE_MESSAGE_KEYS];
	struct obx_pg_datum dat[OBX_CORE_MESSAGE_KEYS];
	char *dumps[OBX_CORE_MESSAGE_KEYS];
	size_t ndumps;
	json_t *json;
	unsigned version;
};

struct obx_core {
	const struct obx_config *cfg; /* borrowed; outlives the core */
	const struct obx_core_ops *ops;
	void *ctx;
	struct obx_metrics *m; /* borrowed; counters the core updates */

	struct obx_pgoutput dec;
	struct obx_relcache rels;
	struct obx_event_builder eb;
	/* the metrics slot of the table an outbox row came from last (obx_metrics_table_slot()) */
	const struct obx_rel *mt_rel;
	unsigned mt_version;
	size_t mt_slot;
	struct obx_acktrack ack;
	struct obx_streambuf sbuf;
	struct obx_core_msgrow mrow;
	struct obx_rel msgrel; /* how a buffered message is kept: one column "content" */
	struct obx_relcol msgcol;

	uint32_t gen;       /* stream generation, bumped per session (docs/internals/design.md, invariant 8) */
	bool active;        /* between session_start and session_end */
	bool streaming_off; /* the process no longer asks for streaming */

	bool in_txn;    /* Begin (or a Stream Commit being published) seen, Commit not yet */
	bool in_stream; /* between Stream Start and Stream Stop */
	struct obx_txninfo txn;
	uint32_t txn_events;
	uint32_t stream_xid; /* the transaction of the current Stream Start block */

	/* a Stream Commit whose rows are being published */
	bool replaying;
	uint32_t replay_xid;
	size_t replay_next;
	obx_lsn replay_end_lsn;

	struct obx_delivery dlv; /* the delivery policy: pending records, in-flight counts, on_error */
	struct obx_topic_waits
	    waits; /* topics the cluster does not have (kept across sessions, shared with the snapshot) */

	struct obx_dedupe dd; /* restart de-duplication of this session (core/restart_dedupe.h) */
	bool dd_noted;        /* said once why de-duplication is off */
	uint64_t *skips;      /* tickets of events found in Kafka, acknowledged by the next pump */
	size_t nskips, skips_cap;

	obx_lsn received;   /* the write position: the highest LSN read */
	obx_lsn sent_flush; /* the highest flush position sent */
	obx_lsn server_wal_end;
	int64_t last_status_ms;
	bool status_now; /* the server asked for a reply */
	int status_interval_ms;

	uint64_t published;         /* events acknowledged (not counting dead-lettered ones) */
	bool paused;                /* the in-flight caps stop reading */
	int64_t last_pause_note_ms; /* backpressure lines at info at most every 10 s */
	bool pause_noted;           /* the current pause was logged at info */

	struct obx_stops stops; /* stop signals (runpolicy.h): the first drains, a later one stops */
	bool draining;

	int64_t now_ms; /* the caller's clock at the last pump or session start */

	/* exactly-once ([delivery] exactly_once; docs/internals/design.md, "Exactly-once") */
	bool eos;                     /* this session publishes in Kafka transactions */
	struct obx_dd_mark eos_floor; /* the last event of the last committed transaction: at or below, skip */
	bool eos_floor_set;
	int64_t eos_floor_time;         /* commit time of the floor's transaction */
	bool eos_checking;              /* the replay has not met the floor's transaction yet */
	bool eos_holding;               /* events skipped before that: the flush position stays */
	obx_lsn eos_hold_flush;         /* where it stays: the session's start */
	struct obx_dd_mark eos_refused; /* a floor the replay contradicted (kept across sessions) */
	int64_t eos_refused_time;
	bool eos_refused_set;
	uint64_t eos_skipped; /* replayed events at or below the floor this session */
	bool commit_wanted;   /* the open transaction takes nothing more; its commit waits for its reports */
	bool committing;      /* a commit was asked for and has not ended */
	uint64_t batch_records, batch_bytes;
	int64_t batch_since_ms; /* when the open transaction got its first record */
	struct obx_core_progress batch;
	uint64_t *batch_tickets; /* the tickets of its records, acknowledged when it commits */
	size_t nbatch, batch_cap;
	struct obx_core_rejected {
		struct obx_dd_mark mark;
		bool dead_letter;
		bool bare;        /* a record of headers only (no key, no value) */
		char reason[255]; /* the broker's words */
	} * rejected;             /* kept across sessions: on_error applies at the replay */
	size_t nrejected, rejected_cap;
	/* a refusal of records sent together: what was read up to it is sent again one record at a
	 * time (struct obx_delivery.solo), across sessions, until the stream passes this position */
	obx_lsn solo_until;
	bool solo_pending;    /* set by such a refusal, cleared once the stream reads past solo_until */
	uint64_t eos_commits; /* Kafka transactions committed */
	uint64_t eos_aborts;  /* ended without a commit (abort, rewind) */

	/* coverage (core/coverage.h, obx_core_coverage_start()): the flush position stays at or
	 * below the WAL position of the last catalog reading found consistent with the one before */
	bool cov_on;
	struct obx_cov cov_base; /* the last reading found consistent (kept across sessions) */
	obx_lsn cov_verified;    /* the WAL position read before it (kept across sessions) */
	int64_t cov_at_ms;       /* when it was last verified (the session's start at first) */
	bool cov_noted;          /* said that the readings stopped coming */

	enum obx_core_end end;
	bool end_kafka; /* the session ended because of the broker side */
	char reason[1024];
	struct obx_logfields_kept reason_fields; /* what reason concerns (the event, the topic), for its line */
};

/*
 * Prepares a core the caller holds (the unit tests; the loop uses
 * obx_core_new()) for cfg (borrowed).  ops and ctx receive the actions, m
 * the counters (all borrowed, outliving the core; none may be NULL).
 * Returns 0 or OBX_ENOMEM.  Pair with obx_core_reset().
 */
int obx_core_init(struct obx_core *c, const struct obx_config *cfg, const struct obx_core_ops *ops, void *ctx,
    struct obx_metrics *m);
/* Frees everything the core owns; a second reset is a no-op. */
void obx_core_reset(struct obx_core *c);

/* A backpressure pause is logged at info at most this often. */
#define OBX_CORE_PAUSE_NOTE_MS 10000

/* relaycore.c */

/* A line for the log about f (NULL: nothing in particular), through ops->note. */
void obx_rc_note(struct obx_core *c, enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* obx_core_fail() with what the reason concerns, for its line in the log. */
void obx_rc_fail_at(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* True once the session has an end (obx_core_fail()). */
bool obx_rc_ending(const struct obx_core *c);
/*
 * A transaction's events begin (Begin, or a Stream Commit about to publish
 * its rows).  Returns false, with the session ended, when one is open already.
 */
bool obx_rc_open_txn(struct obx_core *c, const char *what, obx_lsn commit_lsn, uint32_t xid, int64_t commit_time);

/* relaycore_msgs.c */

/* An Insert: published, buffered (inside Stream Start) or ignored (not the outbox table). */
void obx_rc_insert(struct obx_core *c, const struct obx_pgmsg *m);
/* A logical decoding message: with [source] messages = on, ours become events. */
void obx_rc_message(struct obx_core *c, const struct obx_pgmsg *m);
/* Publishes one outbox row of the current transaction. */
void obx_rc_publish_row(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *t);
/* Publishes one of our transactional messages as an event of the current transaction. */
void obx_rc_publish_message(struct obx_core *c, const uint8_t *content, uint32_t len);
/* Frees what the message row (c->mrow) holds. */
void obx_rc_message_row_free(struct obx_core *c);

/* relaycore_stream.c */

/* What adding a streamed change to the stream buffer returned (rc) means for the session. */
void obx_rc_buffer_result(struct obx_core *c, int rc);
/* Publishes the rows of the Stream Commit in progress as far as the caps allow. */
void obx_rc_replay(struct obx_core *c);
void obx_rc_stream_start(struct obx_core *c, const struct obx_pgmsg *m);
void obx_rc_stream_commit(struct obx_core *c, const struct obx_pgmsg *m);
void obx_rc_stream_abort(struct obx_core *c, const struct obx_pgmsg *m);

/* relaycore_reports.c */

/* The delivery policy's actions for the stream (delivery.h). */
extern const struct obx_delivery_ops obx_rc_dlv_ops;
/* Hands rec to the delivery policy (dl: rec is a dead-letter record already). */
void obx_rc_send_record(struct obx_core *c, const struct obx_record *rec, uint64_t ticket, bool dl);
/* An event found in Kafka: acknowledged by the next obx_core_pump(), never from here. */
void obx_rc_skip(struct obx_core *c, uint64_t ticket);
/* Sends pending records in order until the queue refuses one again. */
void obx_rc_pending_flush(struct obx_core *c);
/* Acknowledges the events found in Kafka since the last pump. */
void obx_rc_apply_skips(struct obx_core *c);
/* Restart de-duplication's lines for the log (restart_dedupe.h); ctx is the core. */
void obx_rc_dd_note(void *ctx, enum obx_log_level level, const char *line);

/* relaycore_eos.c */

/*
 * Exactly-once: true when the event with ticket, the last of the current
 * transaction, is at or below the floor (skipped, acknowledged by the next
 * pump); the first event above it ends the skipping.
 */
bool obx_rc_floor_skip(struct obx_core *c, uint64_t ticket);
/* Why the broker rejected rec in an earlier session's transaction, or NULL. */
const char *obx_rc_rejected_before(const struct obx_core *c, const struct obx_record *rec, bool dl);
/* Remembers that the broker rejected rec for good. */
void obx_rc_remember_rejected(struct obx_core *c, const struct obx_record *rec, bool dl, const char *reason);
/* A record went into the open Kafka transaction: its ticket waits for the commit. */
void obx_rc_batch_add(struct obx_core *c, const struct obx_record *rec, uint64_t ticket, bool dl);
/* The open Kafka transaction holds nothing (any more). */
void obx_rc_batch_clear(struct obx_core *c);
/* A PostgreSQL transaction ended at end_lsn: its progress record may name it. */
void obx_rc_batch_txn_done(struct obx_core *c, obx_lsn end_lsn);
/* The replay contradicts the floor (how says how): it is refused. */
void obx_rc_floor_refused(struct obx_core *c, const char *how);
/* A transaction at commit_lsn, commit_time begins while the floor is not met yet. */
void obx_rc_check_floor(struct obx_core *c, obx_lsn commit_lsn, int64_t commit_time);

/* relaycore_flow.c */

/* True when the in-flight caps hold the stream. */
bool obx_rc_backpressured(const struct obx_core *c);

#endif
