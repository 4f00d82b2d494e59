/*
 * pg/slot.c - the logical slot: read as pg_replication_slots shows it,
 * created when the slot guard and cfg allow (exporting its snapshot with
 * [source] snapshot = pending), and obx_pgsetup_slot(), which runs the
 * slot's steps in their order (see pg/slot.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/pgversion.h"
#include "obx/core/slotguard.h"
#include "obx/core/snapmark.h"
#include "obx/pg/setup_int.h"
#include "obx/pg/util.h"
#include "obx/sys/log.h"

/*
 * Reads the slot.  Returns 0 with *row set when it exists and can be used,
 * OBX_ENOENT when there is none, else OBX_EIO (also: synchronized from the
 * primary while this server is in recovery, which heals on promotion),
 * OBX_EBUSY (being created), OBX_ECONFIG (not pgoutput, of another
 * database, invalidated) or OBX_EPROTO.
 */
static int
read_slot(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm, bool in_recovery,
    struct obx_pgsetup_slotrow *row, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char sql[1024], err[1024];
	const char *since;
	PGresult *res;
	int r = 0;

	memset(row, 0, sizeof(*row));
	snprintf(sql, sizeof(sql),
	    "SELECT confirmed_flush_lsn, plugin, slot_type, database, coalesce(wal_status, ''), "
	    "database = current_database(), current_database(), active, %s, %s, %s "
	    "FROM pg_replication_slots WHERE slot_name = %s",
	    f.standby_decoding ? "coalesce(conflicting, false)" : "false", f.failover_slots ? "failover" : "false",
	    f.failover_slots ? "synced" : "false", nm->slot_lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", cfg->slot, err);
	if (PQntuples(res) == 0) {
		PQclear(res);
		return OBX_ENOENT;
	}
	since = PQgetisnull(res, 0, 0) ? "its last position" : PQgetvalue(res, 0, 0);
	row->active = strcmp(PQgetvalue(res, 0, 7), "t") == 0;
	row->failover = strcmp(PQgetvalue(res, 0, 9), "t") == 0;
	row->synced = strcmp(PQgetvalue(res, 0, 10), "t") == 0;
	if (strcmp(PQgetvalue(res, 0, 2), "logical") != 0 || strcmp(PQgetvalue(res, 0, 1), "pgoutput") != 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s exists but is not a logical pgoutput slot (plugin %s)", cfg->slot,
		    PQgetvalue(res, 0, 1));
	else if (strcmp(PQgetvalue(res, 0, 5), "t") != 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s belongs to database %s, not %s: a logical slot decodes only its own "
		    "database; name another [source] slot or connect to %s",
		    cfg->slot, PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 6), PQgetvalue(res, 0, 3));
	else if (strcmp(PQgetvalue(res, 0, 8), "t") == 0)
		/* invalidated (16+: conflicting; on 16 also set when WAL was removed, so the
		 * line names both causes) */
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s is invalidated: %s; events committed after %s may have been lost; drop and "
		    "recreate the slot, then reconcile from the business tables",
		    cfg->slot,
		    strcmp(PQgetvalue(res, 0, 4), "lost") == 0 ?
		        "the server removed WAL it still needed "
		        "(wal_status = lost; see max_slot_wal_keep_size) or, on a standby, catalog rows it "
		        "needed (a conflict with recovery: give the standby a physical slot, primary_slot_name, "
		        "and hot_standby_feedback = on)" :
		        "a conflict with recovery: the primary removed "
		        "catalog rows it needed (give the standby a physical slot, primary_slot_name, and "
		        "hot_standby_feedback = on)",
		    since);
	else if (strcmp(PQgetvalue(res, 0, 4), "lost") == 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s is invalidated (wal_status = lost): the server removed WAL it still needed, "
		    "events committed after %s may have been lost; drop and recreate the slot, then "
		    "reconcile from the business tables",
		    cfg->slot, since);
	else if (in_recovery && row->synced)
		/* START_REPLICATION would fail with SQLSTATE 55000 until the promotion */
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
		    "slot %s on this server is synchronized from the primary and cannot be used while "
		    "the server is in recovery: waiting for its promotion (to follow the primary "
		    "instead, list both hosts in [source] conninfo with target_session_attrs=read-write)",
		    cfg->slot);
	else if (PQgetisnull(res, 0, 0))
		/* another instance is creating it right now: wait for it like for a slot in use */
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EBUSY, "slot %s is being created by another instance",
		    cfg->slot);
	else if (obx_lsn_parse(PQgetvalue(res, 0, 0), &row->confirmed) != 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EPROTO, "slot %s has a malformed confirmed position",
		    cfg->slot);
	PQclear(res);
	return r;
}

/* What create_slot() did. */
struct created {
	obx_lsn confirmed; /* its consistent point */
	char point[32];    /* the same, as the server wrote it */
	bool raced;        /* another instance created it first: this call made nothing */
	bool made;         /* the server created it */
};

/*
 * Creates the slot (without a snapshot, or exporting one that importer
 * takes over at once), with failover when [source] failover
 * asks for it and the server can (17, not on a standby).  On a hot standby
 * the server waits for the primary's next running-transactions record; the
 * wait ticks ctx.  Returns 0 with out->confirmed and out->point set, or
 * with out->raced set when another instance created it first; OBX_EIO (the
 * connection failed, or the wait was given up on a stop signal),
 * OBX_ECONFIG or OBX_EPROTO (errbuf).  out->made says whether the server
 * created it, also when what followed failed.
 */
static int
create_slot(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm, bool in_recovery,
    struct obx_pgsetup_ctx *ctx, PGconn *importer, struct created *out, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char sql[1024], err[1024], state[6] = "";
	PGresult *res;
	int r = 0;

	out->raced = out->made = false;
	if (f.slot_options)
		snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s'%s)",
		    nm->slot_ident, importer != NULL ? "export" : "nothing",
		    f.failover_slots && cfg->failover && !in_recovery ? ", FAILOVER" : "");
	else
		snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput %s", nm->slot_ident,
		    importer != NULL ? "EXPORT_SNAPSHOT" : "NOEXPORT_SNAPSHOT");
	if (in_recovery) {
		obx_log(ctx->said_standby_create ? OBX_LOG_DEBUG : OBX_LOG_INFO,
		    "creating slot %s on a hot standby: waiting for the primary's next running-transactions "
		    "record (SELECT pg_log_standby_snapshot() on the primary writes one at once)",
		    cfg->slot);
		ctx->said_standby_create = true;
		r = obx_pgsetup_query_waiting(c, sql, 0, ctx, &res, state, err, sizeof(err));
		if (r == OBX_ESTATE)
			return obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
			    "stopped while creating slot %s on the hot standby", cfg->slot);
	} else {
		/* waits for the transactions running now to end: a long or prepared one delays
		 * it; the wait keeps /healthz fresh and ends on SIGTERM */
		r = obx_pgsetup_query_waiting(c, sql, 0, ctx, &res, state, err, sizeof(err));
		if (r == OBX_ESTATE)
			return obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
			    "stopped while creating slot %s (it waits for "
			    "the transactions running when it started to end)",
			    cfg->slot);
	}
	if (r != 0) {
		if (PQstatus(c) != CONNECTION_OK)
			return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not create slot %s: %s",
			    cfg->slot, err);
		/* cancelled, a serialization or lock conflict, an object in use: may heal */
		if (strncmp(state, "40", 2) == 0 || strcmp(state, "57014") == 0 || strcmp(state, "55P03") == 0 ||
		    strcmp(state, "55006") == 0)
			return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not create slot %s: %s",
			    cfg->slot, err);
		if (strcmp(state, "42710") != 0)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG, "could not create slot %s: %s",
			    cfg->slot, err);
		out->raced = true;
		return 0;
	}
	out->made = true;
	if (PQntuples(res) < 1 || PQnfields(res) < 3 || obx_lsn_parse(PQgetvalue(res, 0, 1), &out->confirmed) != 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EPROTO, "slot %s: unexpected consistent point",
		    cfg->slot);
	else
		strlcpy(out->point, PQgetvalue(res, 0, 1), sizeof(out->point));
	/* the export lasts until c runs its next command: imported before anything else */
	if (r == 0 && importer != NULL)
		r = obx_pgsetup_import_snapshot(importer, cfg, PQgetisnull(res, 0, 2) ? "" : PQgetvalue(res, 0, 2),
		    errbuf, errlen);
	PQclear(res);
	return r;
}

/* A new slot starts at its creation point: says how many rows that leaves behind. */
static void
warn_unpublished_rows(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm)
{
	char sql[1024], err[1024];
	PGresult *res;

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM (SELECT 1 FROM %s LIMIT 1000001) x", nm->qualified);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return;
	if (strcmp(PQgetvalue(res, 0, 0), "0") != 0)
		obx_log_warn("%s row(s) already in %s.%s will not be published: a new slot starts "
		             "at its creation point ([source] snapshot = none; with pending, a new slot publishes "
		             "them first)",
		    PQgetvalue(res, 0, 0), cfg->table_schema, cfg->table_name);
	PQclear(res);
}

/* Says what was created; a recreated slot skipped what its predecessor had not confirmed. */
static void
log_created(const struct obx_config *cfg, const struct obx_slotguard *rec, const char *point, const char *how)
{
	if (rec->marked)
		obx_log_warn("recreated slot %s at %s%s (--recreate-slot); the previous slot was created at "
		             "%s: events committed between its last confirmed position and %s are not published",
		    cfg->slot, point, how, rec->lsn[0] != '\0' ? rec->lsn : "a position nothing recorded", point);
	else
		obx_log_info("created slot %s at %s%s", cfg->slot, point, how);
}

int
obx_pgsetup_slot(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_slot_args *a,
    struct obx_pgsetup_ctx *ctx, struct obx_pgsetup_snapshot *snap, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	const bool in_recovery = a->in_recovery;
	struct obx_pgsetup_guard g = { 0 };
	struct created cs = { .confirmed = 0 };
	char how[64];
	struct obx_pgsetup_names nm;
	struct obx_pgsetup_slotrow row;
	bool made_mark = false;
	int r;

	a->created = false;
	a->born = 0;
	snap->wanted = snap->imported = false;
	obx_snapmark_name(cfg->slot, snap->marker, sizeof(snap->marker));
	snprintf(snap->slot, sizeof(snap->slot), "%s", cfg->slot);
	snap->legacy[0] = '\0';
	obx_pgsetup_note_failover_ignored(cfg, &f, ctx);
	if ((r = obx_pgsetup_names_init(&nm, c, cfg, errbuf, errlen)) != 0)
		return r;
	for (int attempt = 0; attempt < OBX_PGSETUP_ATTEMPTS; attempt++) {
		r = read_slot(c, cfg, &nm, in_recovery, &row, errbuf, errlen);
		if (r == 0) {
			a->confirmed = row.confirmed;
			obx_pgsetup_adopt_slot(c, cfg, &nm, a->sysid, row.confirmed, in_recovery, ctx, &a->born);
			if (row.synced && !in_recovery)
				obx_pgsetup_note_synced(cfg, row.confirmed, ctx);
			if (f.failover_slots)
				r = obx_pgsetup_match_failover(c, cfg, &nm, &row, in_recovery, ctx, errbuf,
				    errlen);
			if (r == 0)
				r = obx_pgsetup_snapshot_wanted(c, cfg, &nm, &row, in_recovery, snap, ctx, errbuf,
				    errlen);
		}
		if (r != OBX_ENOENT)
			goto out;
		r = obx_pgsetup_read_guard(c, cfg, &nm, &g, errbuf, errlen);
		if (r == 0)
			r = obx_slotguard_may_create(&g.rec, cfg->slot, a->recreate, cfg->create_slot, errbuf,
			    errlen);
		if (r == 0 && snap->enabled && in_recovery)
			r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "[source] snapshot = pending: "
			    "slot %s would be created on a hot standby, which cannot export the snapshot of "
			    "the pending rows; start outboxd against the primary once, or set snapshot = none",
			    cfg->slot);
		/* the lock, then the marker: a crash after the slot's creation must find the marker */
		if (r == 0 && snap->enabled &&
		    (r = obx_pgsetup_snapshot_open(c, cfg, snap, errbuf, errlen)) == 0 &&
		    (r = obx_pgsetup_create_snapmark(c, cfg->slot, snap->marker, errbuf, errlen)) == 0)
			made_mark = true;
		if (r == 0) {
			cs.confirmed = a->confirmed;
			r = create_slot(c, cfg, &nm, in_recovery, ctx, snap->conn, &cs, errbuf, errlen);
			if (cs.made)
				a->confirmed = cs.confirmed;
		}
		if (r != 0 && made_mark && !cs.made && PQstatus(c) == CONNECTION_OK) {
			/* the server refused the slot (none free, say): the marker must not stay behind */
			char e2[256];

			(void)obx_pgsetup_snapshot_done(c, snap, e2, sizeof(e2));
		}
		if (r != 0)
			goto out;
		if (!cs.raced) {
			a->created = true;
			if (obx_lsn_parse(cs.point, &a->born) != 0)
				a->born = 0;
			snap->wanted = snap->imported = snap->enabled;
			snprintf(how, sizeof(how), "%s%s",
			    f.failover_slots && cfg->failover && !in_recovery ? " with failover" :
			        in_recovery                                   ? " on a hot standby" :
			                                                        "",
			    snap->wanted ? ", exporting its snapshot" : "");
			log_created(cfg, &g.rec, cs.point, how);
			if (in_recovery && f.failover_slots && cfg->failover)
				obx_pgsetup_note_standby_failover(cfg, ctx);
			/* a creation point no record keeps is known to this session only: every session of
			 * the slot says the same, 0/0 (exactly-once's source identity) */
			if (in_recovery) {
				obx_pgsetup_note_standby_guard(cfg, a->sysid, cs.point, ctx);
				a->born = 0;
			} else if (obx_pgsetup_record_marker(c, cfg, &nm, g.comment, a->sysid, cs.point, true) !=
			    0) {
				obx_pgsetup_keep_guard_slot(c, cfg, ctx);
				a->born = 0;
			}
			if (!snap->wanted)
				warn_unpublished_rows(c, cfg, &nm);
			else
				obx_pgsetup_adopt_legacy_mark(c, cfg, snap);
			goto out;
		}
		/* another instance created it a moment ago: use it */
		obx_log_info("slot %s was created concurrently", cfg->slot);
	}
	r = obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "slot %s was dropped each time another instance created it",
	    cfg->slot);
out:
	if (!snap->wanted || r != 0) {
		/* nothing to publish first: the lock goes with the connection */
		PQfinish(snap->conn);
		snap->conn = NULL;
		if (r != 0)
			snap->wanted = false;
	}
	obx_pgsetup_guard_reset(&g);
	obx_pgsetup_names_free(&nm);
	return r;
}
