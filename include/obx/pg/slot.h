/*
 * pg/slot.h - the logical slot of the replication connection (I/O): made
 * sure of after the publication (pg/setup.h), guarded against silently
 * recreating a lost slot, with its failover flag (PostgreSQL 17+) and, with
 * [source] snapshot = pending, the marker and snapshot of the rows pending
 * at its creation.  Returns, ownership and the context are as in
 * pg/setup.h.
 *
 * The slot guard.  When the setup creates the slot it adds the line
 * "outboxd-slot SLOT SYSID LSN" to the publication's comment.  Finding that
 * line while the slot is missing means the slot existed and was lost
 * (failover, DROP, restore of an older backup): events committed since its
 * last confirmed position may never be published, so obx_pgsetup_slot()
 * refuses to create it again unless told to (outboxd run --recreate-slot),
 * and then says what may have been skipped.  A slot synchronized to a
 * standby (PostgreSQL 17+, failover) is the same slot once that standby is
 * promoted: it exists there, so the guard has nothing to refuse
 * (docs/internals/design.md, "Slot guard").
 *
 * A hot standby as the source (PostgreSQL 16+).  The server is read-only:
 * the publication must come from the primary, the guard's record cannot be
 * written (it is read from the primary's copy), and failover cannot be
 * enabled on a standby's own slot.
 */
#ifndef OBX_PGSLOT_H
#define OBX_PGSLOT_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/lsn.h"
#include "obx/pg/setup.h"

/*
 * [source] snapshot = pending (docs/internals/design.md, "Rows pending at the slot's
 * creation").  While those rows are not all published, a physical slot
 * without WAL, the marker (SLOT_snapshot: obx_snapmark_name), exists beside the slot; it is
 * created before the slot and dropped only once every row is acknowledged,
 * so a crash in between leaves both and the next start publishes the
 * pending rows again before it streams.
 */
struct obx_pgsetup_snapshot {
	bool enabled;    /* in: [source] snapshot = pending */
	bool wanted;     /* out: the pending rows are to be published before streaming, on conn */
	bool imported;   /* out: conn is in a transaction in the slot's exported snapshot */
	PGconn *conn;    /* out while wanted: an ordinary connection to the same server that holds
	                  * the snapshot's advisory lock (the caller closes it with PQfinish) */
	char marker[64]; /* out: the marker slot's name (obx_snapmark_name) */
	char legacy[64]; /* out: a marker an earlier version named with the slot's first 54
	                  * characters, found to be this slot's and dropped with marker; "" if none */
	char slot[64];   /* out: the slot's name */
};

/* What obx_pgsetup_slot() is told, and what it answers. */
struct obx_pgsetup_slot_args {
	const char *sysid; /* in: the system identifier (IDENTIFY_SYSTEM), for the guard's record */
	bool recreate;     /* in: --recreate-slot: create a slot the guard says existed */
	bool in_recovery;  /* in: the server is a hot standby (obx_pgsetup_check_server) */
	obx_lsn confirmed; /* out: the slot's confirmed_flush (its consistent point when created) */
	bool created;      /* out: this call created the slot */
	obx_lsn born;      /* out: the slot's creation point from the guard's record; 0: unknown */
};

/*
 * Makes sure cfg's logical pgoutput slot exists, creating it when cfg
 * allows and the slot guard agrees (a->recreate).  a->sysid goes into the
 * guard's record.  On PostgreSQL 17+ the slot's failover flag is made
 * [source] failover (created with FAILOVER, or changed with
 * ALTER_REPLICATION_SLOT when no other instance holds it); a standby's own
 * slot keeps failover off.  On a hot standby (a->in_recovery) a slot
 * synchronized from the primary cannot be used until the server is
 * promoted, which is waited for.  Sets a->confirmed, a->created and
 * a->born.  An instance racing to create the same slot makes this one use
 * it.  With snap->enabled, a slot created here exports its snapshot,
 * imported on snap->conn at once (nothing else runs on c before), and an
 * existing slot whose marker is still there wants its pending rows
 * published again; either way only under the snapshot's lock, and
 * OBX_EBUSY while another instance holds it.  Without, a leftover marker is
 * logged, and OBX_EBUSY while its lock is held.  ctx is the caller's (see
 * struct obx_pgsetup_ctx).  Returns 0, OBX_EIO (also: a synchronized slot
 * on a standby in recovery, a wait given up on a stop signal), OBX_EBUSY
 * (another instance is creating or holding it), OBX_ECONFIG (not a pgoutput
 * slot, invalidated, lost, or missing with create_slot = false), OBX_EPROTO
 * or OBX_ENOMEM.
 */
int obx_pgsetup_slot(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_slot_args *a,
    struct obx_pgsetup_ctx *ctx, struct obx_pgsetup_snapshot *snap, char *errbuf, size_t errlen);

/*
 * Drops snap's marker slot: the rows pending at the slot's creation are all
 * acknowledged; also snap->legacy, unless another slot may need it by now.
 * A marker already gone is fine.  Returns 0, OBX_EIO or OBX_ENOMEM.
 */
int obx_pgsetup_snapshot_done(PGconn *c, const struct obx_pgsetup_snapshot *snap, char *errbuf, size_t errlen);

#endif
