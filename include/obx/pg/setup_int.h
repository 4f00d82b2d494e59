/*
 * pg/setup_int.h - what the files preparing the replication connection
 * share; pg/setup.h and pg/slot.h are their interface.  Not an interface:
 * only src/pg/ includes it.
 *
 *   setup_query.c    the escaped names and the two ways to run a command
 *   connect.c        connect, the server checks, IDENTIFY_SYSTEM
 *   publication.c    the publication
 *   publication_tables.c  the publication of several tables or a pattern
 *   slot.c           the slot: read, create, obx_pgsetup_slot()
 *   slot_guard.c     the guard's record in the publication's comment
 *   snapshot_mark.c  the marker of an unfinished snapshot and its lock
 *   failover.c       the slot's failover flag (PostgreSQL 17+)
 *
 * A replication=database connection speaks only the simple query protocol,
 * so every literal and identifier these files put in SQL goes through
 * PQescapeLiteral/PQescapeIdentifier.  Functions that can fail return 0 or
 * a negative OBX_E* code with one line in errbuf, as pg/setup.h says.
 */
#ifndef OBX_PGSETUP_INT_H
#define OBX_PGSETUP_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/lsn.h"
#include "obx/core/pgversion.h"
#include "obx/core/slotguard.h"
#include "obx/pg/setup.h"
#include "obx/pg/slot.h"

/*
 * A publication or slot created by a racing instance is read again; one
 * dropped again each time it was read is given up on after this many reads.
 */
#define OBX_PGSETUP_ATTEMPTS 3

/* Writes fmt to errbuf and returns code. */
int obx_pgsetup_failf(char *errbuf, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Escaped pieces of SQL for cfg's names, freed together. */
struct obx_pgsetup_names {
	char *pub_ident, *pub_lit, *slot_ident, *slot_lit, *schema_lit, *table_lit, *qualified;
};

/* Returns 0, or OBX_ENOMEM with errbuf filled (n is then empty). */
int obx_pgsetup_names_init(struct obx_pgsetup_names *n, PGconn *c, const struct obx_config *cfg, char *errbuf,
    size_t errlen);

/* Frees what n holds and empties it; an empty n is fine. */
void obx_pgsetup_names_free(struct obx_pgsetup_names *n);

/*
 * Runs sql expecting rows or a completed command.  Returns 0 with *out set
 * (the caller clears it), or OBX_EIO with the server's message in errbuf
 * and its SQLSTATE in sqlstate ("" when there is none; sqlstate may be NULL).
 */
int obx_pgsetup_query(PGconn *c, const char *sql, PGresult **out, char sqlstate[6], char *errbuf, size_t errlen);

/*
 * Runs sql like obx_pgsetup_query() for a command that may wait on the
 * server, ticking ctx about every second meanwhile.  After timeout_ms (0:
 * no limit), or when the tick asks to stop, the command is cancelled.
 * Returns 0 with *out set, OBX_EIO with the server's message in errbuf and
 * sqlstate set, OBX_EBUSY when the time ran out, or OBX_ESTATE when the
 * tick stopped it.
 */
int obx_pgsetup_query_waiting(PGconn *c, const char *sql, int timeout_ms, struct obx_pgsetup_ctx *ctx,
    PGresult **out, char sqlstate[6], char *errbuf, size_t errlen);

/* What pg_replication_slots says about the slot (columns the server lacks read false). */
struct obx_pgsetup_slotrow {
	obx_lsn confirmed;
	bool active;   /* a walsender streams from it */
	bool failover; /* synchronized to standbys that run slot synchronization (17) */
	bool synced;   /* made by slot synchronization from a primary (17) */
};

/* ---- publication.c, publication_tables.c ---- */

/*
 * Runs CREATE PUBLICATION sql; a racing instance that created it first is
 * no error, and *created says whether this call made it.  Returns 0 or
 * OBX_ECONFIG (errbuf).
 */
int obx_pgsetup_create_publication(PGconn *c, const struct obx_config *cfg, const char *sql, bool *created,
    char *errbuf, size_t errlen);

/*
 * Refuses a publication of cfg's table (nm) that would let its events be
 * confirmed unpublished: without the table, with a row filter, or with a
 * column list hiding a mapped column.  Returns 0, OBX_EIO, OBX_ECONFIG or
 * OBX_ENOMEM.
 */
int obx_pgsetup_check_columns(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    char *errbuf, size_t errlen);

/*
 * obx_pgsetup_publication() when [source] table names several tables or
 * holds a pattern (pg/tables.h).
 */
int obx_pgsetup_publication_tables(PGconn *c, const struct obx_config *cfg, bool in_recovery, char *errbuf,
    size_t errlen);

/* ---- slot_guard.c ---- */

/* The publication's comment and what it records of the slot. */
struct obx_pgsetup_guard {
	char *comment;            /* the whole comment, owned ("" when there is none) */
	struct obx_slotguard rec; /* the record of cfg's slot in it */
};

/*
 * Reads the guard's record of the slot from the publication's comment into
 * g (free g->comment with obx_pgsetup_guard_reset(), also after a failure).
 * Returns 0, OBX_EIO or OBX_ENOMEM.
 */
int obx_pgsetup_read_guard(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    struct obx_pgsetup_guard *g, char *errbuf, size_t errlen);

/* Frees g's comment (NULL after); g->rec stays. */
void obx_pgsetup_guard_reset(struct obx_pgsetup_guard *g);

/*
 * Adds (or replaces) the guard's record of the slot, created at lsn on
 * system sysid, in the publication's comment (the rest of comment is
 * kept).  A failure is logged, at debug when quiet (a standby adopting a
 * slot tries every second).  Returns 0, OBX_EIO or OBX_ENOMEM.
 */
int obx_pgsetup_record_marker(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const char *comment, const char *sysid, const char *lsn, bool quiet);

/*
 * Where the publication's comment cannot hold the record (another role
 * owns the publication: a superuser's FOR ALL TABLES): makes sure the
 * physical slot obx_snapmark_guard_name() names exists, reserving no WAL,
 * and says so once (ctx).  A failure is logged: the slot works without it.
 */
void obx_pgsetup_keep_guard_slot(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_ctx *ctx);

/*
 * On a hot standby, which cannot write the record: says once (ctx) which
 * line protects the slot when added to the comment on the primary.
 */
void obx_pgsetup_note_standby_guard(const struct obx_config *cfg, const char *sysid, const char *lsn,
    struct obx_pgsetup_ctx *ctx);

/*
 * The slot exists: sets *born to the creation point the guard recorded (0:
 * unknown), recording the slot at confirmed when the comment holds no
 * record of it (made outside outboxd).  Only logs what fails.
 */
void obx_pgsetup_adopt_slot(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const char *sysid, obx_lsn confirmed, bool in_recovery, struct obx_pgsetup_ctx *ctx, obx_lsn *born);

/* ---- snapshot_mark.c ([source] snapshot = pending) ---- */

/*
 * Opens snap->conn (an ordinary connection to the server c is connected
 * to) holding the session-level advisory lock of the slot's snapshot;
 * nothing when it is open already.  Returns 0, OBX_EBUSY (another instance
 * holds the lock), OBX_EIO or OBX_ENOMEM.
 */
int obx_pgsetup_snapshot_open(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_snapshot *snap,
    char *errbuf, size_t errlen);

/* Creates the marker slot, left behind by an earlier run or not.  Returns 0, OBX_EIO, OBX_ECONFIG or OBX_ENOMEM. */
int obx_pgsetup_create_snapmark(PGconn *c, const char *slot, const char *marker, char *errbuf, size_t errlen);

/*
 * Opens a read-only repeatable-read transaction on importer in the
 * snapshot name that the slot's creation exported.  Returns 0, OBX_EIO,
 * OBX_EPROTO (no snapshot name) or OBX_ENOMEM.
 */
int obx_pgsetup_import_snapshot(PGconn *importer, const struct obx_config *cfg, const char *name, char *errbuf,
    size_t errlen);

/*
 * The slot (row) exists: sets snap->wanted when its pending rows are still
 * to be published (its marker is there), under the snapshot's lock
 * (snap->conn).  Without snap->enabled a leftover marker is logged once
 * and waited on while another instance holds its lock.  Returns 0,
 * OBX_EBUSY, OBX_EIO, OBX_ECONFIG or OBX_ENOMEM.
 */
int obx_pgsetup_snapshot_wanted(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const struct obx_pgsetup_slotrow *row, bool in_recovery, struct obx_pgsetup_snapshot *snap,
    struct obx_pgsetup_ctx *ctx, char *errbuf, size_t errlen);

/*
 * A slot just created with its snapshot: names in snap->legacy the marker
 * an earlier version left under the old name when it can only have been
 * this slot's, so that it goes with the new one after the snapshot.
 */
void obx_pgsetup_adopt_legacy_mark(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_snapshot *snap);

/* ---- failover.c ---- */

/* Says once that [source] failover = on is ignored below PostgreSQL 17. */
void obx_pgsetup_note_failover_ignored(const struct obx_config *cfg, const struct obx_pgfacts *f,
    struct obx_pgsetup_ctx *ctx);

/* Says once that a hot standby's own slot goes without failover until a promotion. */
void obx_pgsetup_note_standby_failover(const struct obx_config *cfg, struct obx_pgsetup_ctx *ctx);

/* Says once that the slot was synchronized from a former primary, resuming at confirmed. */
void obx_pgsetup_note_synced(const struct obx_config *cfg, obx_lsn confirmed, struct obx_pgsetup_ctx *ctx);

/*
 * Makes the slot's failover flag [source] failover (PostgreSQL 17+).
 * Returns 0 (also when the server refused the change, which is only
 * logged), OBX_EBUSY (another instance took the slot meanwhile) or OBX_EIO
 * (the connection failed, or a stop signal came while waiting).
 */
int obx_pgsetup_match_failover(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const struct obx_pgsetup_slotrow *row, bool in_recovery, struct obx_pgsetup_ctx *ctx, char *errbuf,
    size_t errlen);

#endif
