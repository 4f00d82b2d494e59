/*
 * pgsetup.h - preparing the replication connection (I/O): connect with
 * replication=database, the server checks, IDENTIFY_SYSTEM, the publication
 * and then the slot, guarded against silently recreating a lost slot.
 * pgstream.c calls these in that order and then starts streaming; the
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
 * and then says what may have been skipped.
 */
#ifndef OBX_PGSETUP_H
#define OBX_PGSETUP_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/config.h"
#include "obx/lsn.h"

/*
 * Connects to conninfo with replication=database.  Returns 0 with *out set
 * (the caller closes it with PQfinish()); otherwise *out is NULL and the
 * code is OBX_EIO (may heal: server down, network), OBX_ECONFIG (refused
 * for good: authentication, unknown host or database, TLS) or OBX_ENOMEM.
 */
int obx_pgsetup_connect(const char *conninfo, PGconn **out, char *errbuf, size_t errlen);

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
 * *timeline.  Returns 0, OBX_EIO, or OBX_EPROTO when the reply names no
 * database (not a logical replication connection).
 */
int obx_pgsetup_identify(PGconn *c, char *sysid, size_t sysidlen, int *timeline, char *errbuf,
    size_t errlen);

/*
 * Checks wal_level = logical and reads the server's wal_sender_timeout into
 * *wal_sender_timeout_ms (0: disabled), which the caller's status interval
 * must stay below.  Returns 0, OBX_EIO, OBX_ECONFIG or OBX_EPROTO.
 */
int obx_pgsetup_check_server(PGconn *c, const struct obx_config *cfg, int *wal_sender_timeout_ms,
    char *errbuf, size_t errlen);

/*
 * Makes sure cfg's publication exists (creating it when cfg allows) and
 * publishes the inserts of the outbox table (through the partitioned root,
 * with no row filter, with every mapped column; a mapped column the table
 * lacks is only logged).  Without the table and with [source] messages =
 * on, an empty publication is enough.  Two instances may race to create
 * it; both succeed.  Returns 0, OBX_EIO, OBX_ECONFIG or OBX_ENOMEM.
 */
int obx_pgsetup_publication(PGconn *c, const struct obx_config *cfg, char *errbuf, size_t errlen);

/*
 * Makes sure cfg's logical pgoutput slot exists, creating it when cfg
 * allows and the slot guard agrees (recreate: --recreate-slot).  sysid
 * goes into the guard's record.  Sets *confirmed to the slot's
 * confirmed_flush (its consistent point when created) and *created.  An
 * instance racing to create the same slot makes this one use it.
 * Returns 0, OBX_EIO, OBX_EBUSY (another instance is creating it),
 * OBX_ECONFIG (not a pgoutput slot, invalidated, lost, or missing with
 * create_slot = false), OBX_EPROTO or OBX_ENOMEM.
 */
int obx_pgsetup_slot(PGconn *c, const struct obx_config *cfg, const char *sysid, bool recreate,
    obx_lsn *confirmed, bool *created, char *errbuf, size_t errlen);

#endif
