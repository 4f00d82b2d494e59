/*
 * pg/stream.h - the replication stream (I/O): a connection prepared by
 * pg/setup.h and pg/slot.h (connect with replication=database, server checks,
 * IDENTIFY_SYSTEM, publication first and then the slot), then
 * START_REPLICATION, CopyData in and standby status updates out.
 *
 * Ownership: the stream owns its connection and the last CopyData message;
 * obx_pgstream_close() frees both, also after a failed open.
 */
#ifndef OBX_PGSTREAM_H
#define OBX_PGSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/coverage.h"
#include "obx/core/lsn.h"
#include "obx/pg/setup.h"
#include "obx/pg/slot.h"

struct obx_pgstream {
	PGconn *conn;
	char sysid[32];
	int timeline;
	obx_lsn server_lsn;        /* IDENTIFY_SYSTEM's xlogpos at the session's start */
	obx_lsn slot_created;      /* the slot's creation point from the slot guard; 0: unknown */
	obx_lsn start_confirmed;   /* the slot's confirmed_flush before START_REPLICATION */
	int wal_sender_timeout_ms; /* 0: disabled */
	int server_version;
	int proto_version;                /* the pgoutput protocol version asked for */
	bool streaming;                   /* the server streams large in-progress transactions */
	bool slot_made;                   /* this run created the slot */
	bool in_recovery;                 /* the server is a hot standby (PostgreSQL 16+) */
	struct obx_pgsetup_snapshot snap; /* [source] snapshot = pending: snap.wanted until published */
	uint8_t *copybuf;                 /* the last CopyData message, owned (PQfreemem) */
	PQnoticeReceiver prev_notice;     /* libpq's receiver, for the notices pg/stream.c does not read */
	char pub_skipped[512];            /* "" or why the server decoded without the publication (pg/stream.c) */
	struct obx_cov cov_base;          /* the publication's hold on the outbox tables at the set-up */
};

/*
 * Connects and starts streaming with the highest pgoutput protocol version
 * the server speaks (s->proto_version); with s->snap.wanted set on return
 * it has not started yet (obx_pgstream_start()).  recreate_slot allows creating a
 * slot that this database records as having existed (the slot guard, see
 * pg/setup.h).  streaming asks for in-progress transactions (cfg->streaming
 * may be overridden by the caller after a buffer overflow); s->streaming
 * says whether it was requested.  ctx is the caller's for the life of the
 * process (struct obx_pgsetup_ctx).  Returns 0, or one of three codes with
 * errbuf filled (one line, no secrets): OBX_EIO for a transient failure
 * (reconnect with backoff), OBX_EBUSY when another instance holds or is
 * creating the slot (wait as a standby), OBX_EFATAL for any other (stop
 * with exit status 1).  Call
 * obx_pgstream_close() either way.
 */
int obx_pgstream_open(struct obx_pgstream *s, const struct obx_config *cfg, bool recreate_slot, bool streaming,
    struct obx_pgsetup_ctx *ctx, char *errbuf, size_t errlen);

/*
 * After obx_pgstream_open() left s->snap.wanted set (the rows pending at
 * the slot's creation are to be published first, on s->snap.conn): once
 * every one is acknowledged, closes that connection, drops the marker and
 * starts streaming from the slot's creation point.  Returns as
 * obx_pgstream_open().
 */
int obx_pgstream_start(struct obx_pgstream *s, const struct obx_config *cfg, char *errbuf, size_t errlen);

/* The socket to poll for reading (and writing while obx_pgstream_flush() returns 1). */
int obx_pgstream_fd(const struct obx_pgstream *s);

/*
 * Reads the next CopyData message without blocking.  Returns 1 with
 * buf and len set (borrowed until the next call), 0 when nothing is buffered,
 * OBX_EIO when the stream ended or failed (errbuf filled), OBX_ENOENT (errbuf filled) when
 * the server cannot decode the slot's backlog because the publication does
 * not exist at that point in the WAL: dropped (and maybe created again)
 * behind the slot, which no retry heals.  Before PostgreSQL 18 the server
 * ends the stream with that error; 18 warns and skips what it cannot
 * decode, and the stream ends at the warning.
 */
int obx_pgstream_read(struct obx_pgstream *s, const uint8_t **buf, size_t *len, char *errbuf, size_t errlen);

/* Reads what arrived on the socket into libpq's buffer.  Returns 0 or OBX_EIO (errbuf filled). */
int obx_pgstream_consume(struct obx_pgstream *s, char *errbuf, size_t errlen);

/* Queues a standby status update.  Returns 0 or OBX_EIO (errbuf filled). */
int obx_pgstream_send_status(struct obx_pgstream *s, obx_lsn write, obx_lsn flush, bool reply_requested,
    char *errbuf, size_t errlen);

/* Flushes queued output.  Returns 0 (all sent), 1 (more to send: poll for POLLOUT) or OBX_EIO. */
int obx_pgstream_flush(struct obx_pgstream *s);

/* Ends COPY politely when possible and closes the connection. */
void obx_pgstream_close(struct obx_pgstream *s);

/* Microseconds since 2000-01-01 (PostgreSQL's epoch), for status updates. */
int64_t obx_pg_now(void);

#endif
