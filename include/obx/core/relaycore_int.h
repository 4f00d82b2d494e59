/*
 * relaycore_int.h - what the files of the relay core (src/core/relaycore*.c)
 * share among themselves; the loop never includes it (relaycore.h is the
 * contract).
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

#include "obx/core/relaycore.h"

/* A backpressure pause is logged at info at most this often. */
#define OBX_CORE_PAUSE_NOTE_MS 10000

/* relaycore.c */

/* A line for the log about f (NULL: nothing in particular), through ops->note. */
void obx_rc_note(struct obx_core *c, enum obx_log_level level, const struct obx_logfields *f,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* obx_core_fail() with what the reason concerns, for its line in the log. */
void obx_rc_fail_at(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* True once the session has an end (obx_core_fail()). */
bool obx_rc_ending(const struct obx_core *c);
/*
 * A transaction's events begin (Begin, or a Stream Commit about to publish
 * its rows).  Returns false, with the session ended, when one is open already.
 */
bool obx_rc_open_txn(struct obx_core *c, const char *what, obx_lsn commit_lsn, uint32_t xid,
    int64_t commit_time);

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
void obx_rc_remember_rejected(struct obx_core *c, const struct obx_record *rec, bool dl,
    const char *why);
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
