/*
 * pg/setup.h - preparing the replication connection (I/O): connect with
 * replication=database, the server checks, IDENTIFY_SYSTEM, the publication
 * and then the slot, guarded against silently recreating a lost slot.
 * pg/stream.c calls these in that order and then starts streaming; the
 * order matters: a slot created before its publication breaks decoding.
 *
 * Return values.  Each function returns 0 or a negative OBX_E* code with
 * one line in errbuf (never a password).  The code tells the caller what
 * to do:
 *   OBX_EIO      transient (network, a restarting server, a failed read):
 *                reconnect with backoff;
 *   OBX_EBUSY    another instance holds or is creating the slot: wait as
 *                a standby;
 *   anything else, permanent: OBX_ECONFIG (the server, table, publication
 *                or slot is not as outboxd needs it and someone must act),
 *                OBX_EPROTO (a reply outboxd does not understand),
 *                OBX_ENOMEM.
 *
 * Ownership: the connection is the caller's; these functions run commands
 * on it and never close it.  Nothing is kept between calls.
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
#ifndef OBX_PGSETUP_H
#define OBX_PGSETUP_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/lsn.h"

/*
 * What the caller lends the setup for the life of the process: the lines
 * said once however many sessions there are (zero them before the first
 * session and keep the struct), and a tick that runs about every second
 * while a command waits on the server (a slot created on a hot standby, a
 * slot altered while another instance holds it).  The tick returns true to
 * give up waiting (a stop signal); it may be NULL.
 */
struct obx_pgsetup_ctx {
	bool (*tick)(void *arg);
	void *tick_arg;
	bool said_failover_ignored; /* [source] failover = on below PostgreSQL 17 */
	bool said_standby_guard;    /* the guard cannot record the slot on a hot standby */
	bool said_standby_failover; /* failover cannot be enabled on a hot standby */
	bool said_standby_create;   /* creating a slot on a hot standby waits for the primary */
	bool said_synced;           /* the slot was synchronized before this server's promotion */
	bool said_marker;           /* an unfinished snapshot's marker, with snapshot = none */
};

/*
 * Connects to conninfo with replication=database (and password, when
 * neither NULL nor "", over conninfo's).  Returns 0 with *out set
 * (the caller closes it with PQfinish()); otherwise *out is NULL and the
 * code is OBX_EIO (may heal: server down, network), OBX_ECONFIG (refused
 * for good: authentication, unknown host or database, TLS) or OBX_ENOMEM.
 */
int obx_pgsetup_connect(const char *conninfo, const char *password, PGconn **out, char *errbuf, size_t errlen);

/*
 * Checks the server release (PQserverVersion) against cfg and picks the
 * highest pgoutput protocol version it speaks (*proto_version).  *streaming
 * becomes want_streaming when the server can stream in-progress
 * transactions (14 and later; a warning is logged when it cannot).
 * Returns 0 or OBX_ECONFIG.
 */
int obx_pgsetup_protocol(int server_version, const struct obx_config *cfg, bool want_streaming,
    int *proto_version, bool *streaming, char *errbuf, size_t errlen);

/*
 * Runs IDENTIFY_SYSTEM: copies the system identifier into sysid and sets
 * *timeline and *xlogpos (the server's current WAL position: its flush
 * position; on a standby the greater of its receive and replay positions).
 * Returns 0, OBX_EIO, or OBX_EPROTO when the reply names no database (not a
 * logical replication connection) or is out of form.
 */
int obx_pgsetup_identify(PGconn *c, char *sysid, size_t sysidlen, int *timeline, obx_lsn *xlogpos,
    char *errbuf, size_t errlen);

/*
 * Checks wal_level = logical, reads the server's wal_sender_timeout into
 * *wal_sender_timeout_ms (0: disabled), which the caller's status interval
 * must stay below, and sets *in_recovery when the server is a hot standby
 * (pg_is_in_recovery()); a standby before PostgreSQL 16, which cannot
 * decode, is refused.  Returns 0, OBX_EIO, OBX_ECONFIG or OBX_EPROTO.
 */
int obx_pgsetup_check_server(PGconn *c, const struct obx_config *cfg, int *wal_sender_timeout_ms,
    bool *in_recovery, char *errbuf, size_t errlen);

/*
 * Makes sure cfg's publication exists (creating it when cfg allows and the
 * server is not in_recovery) and publishes the inserts of the outbox table
 * (through the partitioned root, with no row filter, with every mapped
 * column; a mapped column the table lacks is only logged).  Without the
 * table and with [source] messages = on, an empty publication is enough.
 * Two instances may race to create it; both succeed.  Returns 0, OBX_EIO,
 * OBX_ECONFIG (also: missing on a hot standby, naming what to run on the
 * primary) or OBX_ENOMEM.
 */
int obx_pgsetup_publication(PGconn *c, const struct obx_config *cfg, bool in_recovery,
    char *errbuf, size_t errlen);

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

/*
 * Makes sure cfg's logical pgoutput slot exists, creating it when cfg
 * allows and the slot guard agrees (recreate: --recreate-slot).  sysid
 * goes into the guard's record.  On PostgreSQL 17+ the slot's failover
 * flag is made [source] failover (created with FAILOVER, or changed with
 * ALTER_REPLICATION_SLOT when no other instance holds it); a standby's own
 * slot keeps failover off.  in_recovery: the server is a hot standby
 * (obx_pgsetup_check_server); a slot synchronized from the primary cannot
 * be used there until the server is promoted, which is waited for.  Sets
 * *confirmed to the slot's confirmed_flush (its consistent point when
 * created) and *created.  An instance racing to create the same slot makes
 * this one use it.  With snap->enabled, a slot created here exports its
 * snapshot, imported on snap->conn at once (nothing else runs on c
 * before), and an existing slot whose marker is still there wants its
 * pending rows published again; either way only under the snapshot's
 * lock, and OBX_EBUSY while another instance holds it.  Without, a
 * leftover marker is logged, and OBX_EBUSY while its lock is held.  ctx
 * is the caller's (see struct obx_pgsetup_ctx).
 * Returns 0, OBX_EIO (also: a synchronized slot on a standby in recovery,
 * a wait given up on a stop signal), OBX_EBUSY (another instance is
 * creating or holding it), OBX_ECONFIG (not a pgoutput slot, invalidated,
 * lost, or missing with create_slot = false), OBX_EPROTO or OBX_ENOMEM.
 */
int obx_pgsetup_slot(PGconn *c, const struct obx_config *cfg, const char *sysid, bool recreate,
    bool in_recovery, struct obx_pgsetup_ctx *ctx, struct obx_pgsetup_snapshot *snap,
    obx_lsn *confirmed, bool *created, obx_lsn *born, char *errbuf, size_t errlen);

/*
 * Drops snap's marker slot: the rows pending at the slot's creation are all
 * acknowledged; also snap->legacy, unless another slot may need it by now.
 * A marker already gone is fine.  Returns 0, OBX_EIO or OBX_ENOMEM.
 */
int obx_pgsetup_snapshot_done(PGconn *c, const struct obx_pgsetup_snapshot *snap, char *errbuf,
    size_t errlen);

#endif
