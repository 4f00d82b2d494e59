/*
 * pg/setup.h - preparing the replication connection (I/O): connect with
 * replication=database, the server checks, IDENTIFY_SYSTEM, the publication
 * and then the slot (pg/slot.h), guarded against silently recreating a lost
 * slot.  pg/stream.c calls these in that order and then starts streaming;
 * the order matters: a slot created before its publication breaks decoding.
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
 * The slot, its guard, the snapshot marker and a hot standby as the
 * source: pg/slot.h.
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
	bool said_guard_slot;       /* the guard slot records the slot (obx_pgsetup_keep_guard_slot()) */
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
int obx_pgsetup_protocol(int server_version, const struct obx_config *cfg, bool want_streaming, int *proto_version,
    bool *streaming, char *errbuf, size_t errlen);

/*
 * Runs IDENTIFY_SYSTEM: copies the system identifier into sysid and sets
 * *timeline and *xlogpos (the server's current WAL position: its flush
 * position; on a standby the greater of its receive and replay positions).
 * Returns 0, OBX_EIO, or OBX_EPROTO when the reply names no database (not a
 * logical replication connection) or is out of form.
 */
int obx_pgsetup_identify(PGconn *c, char *sysid, size_t sysidlen, int *timeline, obx_lsn *xlogpos, char *errbuf,
    size_t errlen);

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
int obx_pgsetup_publication(PGconn *c, const struct obx_config *cfg, bool in_recovery, char *errbuf,
    size_t errlen);

#endif
