/*
 * acktrack.h - the ack tracker (pure): the only place that decides what may
 * be confirmed to the server.
 *
 * A commit-ordered queue of transactions that produced events, each with its
 * count of events the broker has not acknowledged yet.  The flushable LSN is
 * the end LSN of the last transaction T such that T and every transaction
 * before it are fully acknowledged (docs/internals/design.md, invariant 4).  Transactions without
 * events are complete on arrival; they are folded into the queue's tail so
 * the queue holds only transactions with events.  When no transaction is
 * open and nothing is outstanding, the flushable position follows the
 * server's WAL end from keepalives (docs/internals/design.md, invariant 5).
 *
 * Usage per transaction: begin, add_event for each event (the returned
 * ticket goes with the produced message), commit(end_lsn); ack(ticket) for
 * every delivery report that succeeded.
 */
#ifndef OBX_ACKTRACK_H
#define OBX_ACKTRACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/lsn.h"

struct obx_ack_txn {
	obx_lsn end_lsn; /* valid once committed */
	int64_t time;    /* the caller's timestamp for the transaction (its commit time) */
	uint32_t outstanding;
	bool committed;
};

struct obx_acktrack {
	struct obx_ack_txn *ring;
	size_t cap;
	size_t head;
	size_t count;
	uint64_t head_ticket; /* ticket of ring[head] */
	bool open;            /* Begin received, Commit not yet */
	size_t streams_open;  /* streamed transactions without Stream Commit/Abort yet */
	bool open_queued;     /* the open transaction has an entry (it has events) */
	int64_t open_time;
	obx_lsn flushable;
	uint64_t outstanding; /* unacknowledged events in all transactions */
};

/* Starts empty; flushable begins at start (the slot's confirmed_flush). */
void obx_ack_init(struct obx_acktrack *t, obx_lsn start);
/* Frees the queue; t may be re-initialised. */
void obx_ack_reset(struct obx_acktrack *t);

/* A transaction begins.  Returns 0, or OBX_ESTATE when one is already open. */
int obx_ack_begin(struct obx_acktrack *t);
/* The same, remembering time (e.g. the commit time) for the age queries below. */
int obx_ack_begin_at(struct obx_acktrack *t, int64_t time);

/* The time of the oldest transaction with unacknowledged events; false when none. */
bool obx_ack_oldest_time(const struct obx_acktrack *t, int64_t *time);

/* The time of ticket's transaction, or 0 when the ticket is unknown. */
int64_t obx_ack_ticket_time(const struct obx_acktrack *t, uint64_t ticket);

/*
 * Registers one more event of the open transaction; *ticket identifies its
 * transaction for obx_ack_ack().  Returns 0, OBX_ESTATE (no open
 * transaction), OBX_ENOMEM.
 */
int obx_ack_add_event(struct obx_acktrack *t, uint64_t *ticket);

/* The open transaction committed and ends at end_lsn.  Returns 0 or OBX_ESTATE. */
int obx_ack_commit(struct obx_acktrack *t, obx_lsn end_lsn);

/*
 * The broker acknowledged one event of the transaction with ticket.
 * Returns 0, or OBX_ENOENT when no event of that ticket is outstanding
 * (a report that cannot belong to this stream).
 */
int obx_ack_ack(struct obx_acktrack *t, uint64_t ticket);

/* A keepalive reported the server's WAL end; used only when idle. */
void obx_ack_keepalive(struct obx_acktrack *t, obx_lsn wal_end);

/* The highest LSN that may be confirmed as flushed. */
obx_lsn obx_ack_flushable(const struct obx_acktrack *t);

/*
 * n streamed transactions are in progress (Stream Start seen, Stream
 * Commit/Abort not yet).  Each counts as an open transaction: while n > 0
 * keepalives never advance the flushable position.  Transactions that
 * commit meanwhile are confirmed as usual; a streamed one enters the queue
 * at its Stream Commit (begin, add_event..., commit).
 */
void obx_ack_streams_open(struct obx_acktrack *t, size_t n);

/* True when no transaction (plain or streamed) is open and no event is outstanding. */
bool obx_ack_idle(const struct obx_acktrack *t);

#endif
