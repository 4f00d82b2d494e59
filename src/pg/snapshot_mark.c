/*
 * pg/snapshot_mark.c - [source] snapshot = pending on the server's side
 * (docs/internals/design.md, "Rows pending at the slot's creation"): the
 * marker slot that says a slot's pending rows are not all published, the
 * advisory lock whoever publishes them holds, the connection that holds it
 * and imports the snapshot the slot's creation exported, and the marker
 * an earlier version named with the slot's first 54 characters (see
 * pg/slot.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/snapmark.h"
#include "obx/pg/setup_int.h"
#include "obx/pg/util.h"
#include "obx/sys/log.h"

/* the advisory lock class of a snapshot ("obxs"), keyed by hashtext(slot) */
#define SNAPSHOT_LOCK_CLASS "1868724339"

/*
 * Whether the marker slot exists.  Returns 0 with *exists set, OBX_EIO, or
 * OBX_ECONFIG when a slot of that name is not a marker (not physical).
 */
static int
read_snapmark(PGconn *c, const char *slot, const char *marker, bool *exists, char *errbuf, size_t errlen)
{
	char sql[512], err[1024], *lit;
	PGresult *res;
	int r = 0;

	*exists = false;
	if ((lit = PQescapeLiteral(c, marker, strlen(marker))) == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "SELECT slot_type FROM pg_replication_slots WHERE slot_name = %s", lit);
	PQfreemem(lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", marker, err);
	if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "physical") != 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s exists and is %s: outboxd keeps a physical "
		    "slot of that name while the rows pending at slot %s's creation are published; drop "
		    "it or rename [source] slot",
		    marker, PQgetvalue(res, 0, 0), slot);
	else
		*exists = PQntuples(res) == 1;
	PQclear(res);
	return r;
}

/* Creates the marker slot (no WAL reserved: it pins nothing). */
int
obx_pgsetup_create_snapmark(PGconn *c, const char *slot, const char *marker, char *errbuf, size_t errlen)
{
	char sql[256], err[1024], state[6] = "";
	PGresult *res;
	char *ident = PQescapeIdentifier(c, marker, strlen(marker));

	if (ident == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s PHYSICAL", ident);
	PQfreemem(ident);
	if (obx_pgsetup_query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		return 0;
	}
	if (strcmp(state, "42710") == 0) /* left by a run that died before creating the slot */
		return 0;
	return obx_pgsetup_failf(errbuf, errlen,
	    PQstatus(c) != CONNECTION_OK || strcmp(state, "53400") != 0 ? OBX_EIO : OBX_ECONFIG,
	    "could not create slot %s, which marks the snapshot of slot %s as "
	    "unfinished: %s",
	    marker, slot, err);
}

/*
 * The marker an earlier version made for a slot named over 54 characters,
 * named with the slot's first 54 (snap->legacy, obx_snapmark_legacy_name):
 * sets *exists when a physical slot of that name is there, and *ours when it
 * can be this slot's only: no other slot's name begins with those 54
 * characters and no other slot's snapshot is under way (an earlier version
 * takes that lock before it makes the marker, and makes the marker before
 * its slot).  Both false for a shorter name.  Returns 0, OBX_EIO or
 * OBX_ENOMEM.
 */
static int
read_legacy_mark(PGconn *c, const char *slot, const char *legacy, bool *exists, bool *ours, char *errbuf,
    size_t errlen)
{
	char sql[1024], err[1024], prefix[OBX_SNAPMARK_KEEP + 1];
	char *lslot, *llegacy, *lprefix;
	PGresult *res;
	int r = 0;

	*exists = *ours = false;
	if (legacy[0] == '\0')
		return 0;
	snprintf(prefix, sizeof(prefix), "%s", slot);
	lslot = PQescapeLiteral(c, slot, strlen(slot));
	llegacy = PQescapeLiteral(c, legacy, strlen(legacy));
	lprefix = PQescapeLiteral(c, prefix, strlen(prefix));
	if (lslot != NULL && llegacy != NULL && lprefix != NULL)
		snprintf(sql, sizeof(sql),
		    "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s "
		    "AND slot_type = 'physical'), NOT EXISTS (SELECT FROM pg_replication_slots WHERE "
		    "slot_name NOT IN (%s, %s) AND left(slot_name::text, %d) = %s) AND NOT EXISTS (SELECT "
		    "FROM pg_locks WHERE locktype = 'advisory' AND classid = " SNAPSHOT_LOCK_CLASS " AND "
		    "objsubid = 2 AND objid::bigint <> (hashtext(%s)::bigint & 4294967295))",
		    llegacy, lslot, llegacy, OBX_SNAPMARK_KEEP, lprefix, lslot);
	else
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	PQfreemem(lslot);
	PQfreemem(llegacy);
	PQfreemem(lprefix);
	if (r != 0)
		return r;
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", legacy, err);
	*exists = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	*ours = *exists && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	PQclear(res);
	return 0;
}

/* Drops slot name, gone already or not.  Returns 0 or OBX_EIO. */
static int
drop_snapmark(PGconn *c, const char *name, char *errbuf, size_t errlen)
{
	char sql[256], err[1024], state[6] = "";
	PGresult *res;
	char *ident = PQescapeIdentifier(c, name, strlen(name));

	if (ident == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "DROP_REPLICATION_SLOT %s", ident);
	PQfreemem(ident);
	if (obx_pgsetup_query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		return 0;
	}
	if (strcmp(state, "42704") == 0)
		return 0;
	return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not drop slot %s after the snapshot: %s", name,
	    err);
}

/*
 * Opens snap->conn: an ordinary connection to the server c is connected to
 * (not to another host of a multi-host conninfo), without the timeouts a
 * role may set that would end a long snapshot half-way, holding the
 * session-level advisory lock of the slot's snapshot.  Returns 0, OBX_EBUSY
 * (another instance holds the lock: it is publishing the pending rows),
 * OBX_EIO or OBX_ENOMEM.
 */
int
obx_pgsetup_snapshot_open(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_snapshot *snap, char *errbuf,
    size_t errlen)
{
	const char *kw[4], *val[4], *params[2] = { SNAPSHOT_LOCK_CLASS, cfg->slot };
	const char *host = PQhost(c), *addr = PQhostaddr(c), *port = PQport(c);
	char err[1024];
	PGresult *res;
	int n = 0, r;

	if (snap->conn != NULL)
		return 0;
	if (host != NULL && host[0] != '\0') {
		kw[n] = "host";
		val[n++] = host;
	}
	if (addr != NULL && addr[0] != '\0') {
		kw[n] = "hostaddr";
		val[n++] = addr;
	}
	if (port != NULL && port[0] != '\0') {
		kw[n] = "port";
		val[n++] = port;
	}
	kw[n] = val[n] = NULL;
	if (obx_pg_connect(cfg->conninfo, cfg->password, kw, val, "outboxd snapshot", &snap->conn, err,
	        sizeof(err)) != 0) {
		snap->conn = NULL;
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
		    "could not open the connection that reads the rows "
		    "pending at slot %s's creation: %s",
		    cfg->slot, err);
	}
	/* its transaction stays open while the broker acknowledges (or is down) */
	res = PQexec(snap->conn,
	    "SELECT set_config('idle_in_transaction_session_timeout', '0', false), "
	    "set_config('statement_timeout', '0', false); "
	    "SELECT set_config('idle_session_timeout', '0', false) "
	    "WHERE current_setting('server_version_num')::int >= 140000; "
	    "SELECT set_config('transaction_timeout', '0', false) "
	    "WHERE current_setting('server_version_num')::int >= 170000");
	PQclear(res);
	res = PQexecParams(snap->conn, "SELECT pg_try_advisory_lock($1::int, hashtext($2))", 2, NULL, params, NULL,
	    NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not take the lock of slot %s's snapshot: %s",
		    cfg->slot, obx_pg_result_error_line(res, err, sizeof(err)));
	else if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EBUSY,
		    "another instance is publishing the rows pending at "
		    "the creation of slot %s",
		    cfg->slot);
	else
		r = 0;
	PQclear(res);
	if (r != 0) {
		PQfinish(snap->conn);
		snap->conn = NULL;
	}
	return r;
}

/*
 * With [source] snapshot = none, a marker says another instance may be
 * publishing the pending rows right now: streaming meanwhile would put
 * newer events before them.  Returns 0 (nobody holds the lock), OBX_EBUSY
 * or OBX_EIO.
 */
static int
snapshot_lock_free(PGconn *c, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	char sql[512], err[1024], *lit = PQescapeLiteral(c, cfg->slot, strlen(cfg->slot));
	PGresult *res;
	int r;

	if (lit == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	/* taken and released within the statement: it only tells whether another session holds it */
	snprintf(sql, sizeof(sql), "SELECT pg_try_advisory_xact_lock(" SNAPSHOT_LOCK_CLASS ", hashtext(%s))", lit);
	PQfreemem(lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
		    "could not read the lock of slot %s's snapshot: %s", cfg->slot, err);
	r = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ?
	    0 :
	    obx_pgsetup_failf(errbuf, errlen, OBX_EBUSY,
	        "another instance is publishing the rows pending at the creation of slot %s", cfg->slot);
	PQclear(res);
	return r;
}

int
obx_pgsetup_snapshot_done(PGconn *c, const struct obx_pgsetup_snapshot *snap, char *errbuf, size_t errlen)
{
	bool exists, ours;
	int r;

	if ((r = drop_snapmark(c, snap->marker, errbuf, errlen)) != 0 || snap->legacy[0] == '\0')
		return r;
	/* an earlier version's marker goes too, unless another slot may have come to need it since */
	if ((r = read_legacy_mark(c, snap->slot, snap->legacy, &exists, &ours, errbuf, errlen)) != 0 || !ours)
		return r;
	return drop_snapmark(c, snap->legacy, errbuf, errlen);
}

/*
 * Opens a read-only repeatable-read transaction on importer in the snapshot
 * the slot's creation exported.  Returns 0 or OBX_EIO (the marker makes the
 * next session publish the pending rows from a fresh snapshot).
 */
int
obx_pgsetup_import_snapshot(PGconn *importer, const struct obx_config *cfg, const char *name, char *errbuf,
    size_t errlen)
{
	char sql[256], err[1024];
	PGresult *res;
	char *lit;

	if (name[0] == '\0')
		return obx_pgsetup_failf(errbuf, errlen, OBX_EPROTO,
		    "slot %s was created without the snapshot asked for", cfg->slot);
	if (obx_pgsetup_query(importer, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", &res, NULL, err,
	        sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not begin the snapshot of slot %s: %s",
		    cfg->slot, err);
	PQclear(res);
	if ((lit = PQescapeLiteral(importer, name, strlen(name))) == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "SET TRANSACTION SNAPSHOT %s", lit);
	PQfreemem(lit);
	if (obx_pgsetup_query(importer, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
		    "could not use the snapshot slot %s exported: %s", cfg->slot, err);
	PQclear(res);
	return 0;
}

/*
 * The slot exists: its pending rows are still wanted when its marker is
 * there (checked again under the snapshot's lock: the instance that held it
 * drops the marker first).  A slot synchronized from a former primary (17+)
 * comes without the marker, which is not synchronized: when it still sits
 * at the creation point the guard recorded, the snapshot may not have
 * finished there, so the rows are published again (duplicates, never a
 * loss).  Without [source] snapshot = pending a leftover marker is logged
 * (once), and waited on while another instance holds its lock.
 */
int
obx_pgsetup_snapshot_wanted(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    const struct obx_pgsetup_slotrow *row, bool in_recovery, struct obx_pgsetup_snapshot *snap,
    struct obx_pgsetup_ctx *ctx, char *errbuf, size_t errlen)
{
	struct obx_pgsetup_guard g = { 0 };
	char legacy[64];
	bool exists = false, old = false, ours = false;
	obx_lsn point;
	int r;

	if (in_recovery) /* a standby's slots are its own: no marker was made there */
		return 0;
	(void)obx_snapmark_legacy_name(cfg->slot, legacy, sizeof(legacy));
	if ((r = read_snapmark(c, cfg->slot, snap->marker, &exists, errbuf, errlen)) != 0 ||
	    (!exists && (r = read_legacy_mark(c, cfg->slot, legacy, &old, &ours, errbuf, errlen)) != 0))
		return r;
	if (!snap->enabled) {
		/* an earlier version's marker that may be another slot's says nothing of this one */
		if (!exists && !ours)
			return 0;
		if ((r = snapshot_lock_free(c, cfg, errbuf, errlen)) != 0)
			return r;
		if (!ctx->said_marker) {
			const char *m = exists ? snap->marker : legacy;

			ctx->said_marker = true;
			obx_log_warn(
			    "slot %s exists, so does %s: the rows pending when slot %s was created were "
			    "not all published; with [source] snapshot = pending they are published before "
			    "streaming, with none they are not (drop slot %s to stop this warning)",
			    cfg->slot, m, cfg->slot, m);
		}
		return 0;
	}
	if (!exists && !old && row->synced) {
		r = obx_pgsetup_read_guard(c, cfg, nm, &g, errbuf, errlen);
		obx_pgsetup_guard_reset(&g); /* the comment; g.rec stays */
		if (r != 0)
			return r;
		if (!g.rec.marked || obx_lsn_parse(g.rec.lsn, &point) != 0 || point != row->confirmed)
			return 0;
		obx_log_warn(
		    "slot %s was synchronized from the former primary and is still at its creation "
		    "point %s: its snapshot may not have finished there (its marker is not synchronized); "
		    "publishing the pending rows again (rows already published there are sent twice)",
		    cfg->slot, g.rec.lsn);
		if ((r = obx_pgsetup_snapshot_open(c, cfg, snap, errbuf, errlen)) != 0 ||
		    (r = obx_pgsetup_create_snapmark(c, cfg->slot, snap->marker, errbuf, errlen)) != 0)
			return r;
		snap->wanted = true;
		return 0;
	}
	if (!exists && !old)
		return 0;
	if ((r = obx_pgsetup_snapshot_open(c, cfg, snap, errbuf, errlen)) != 0 ||
	    (r = read_snapmark(c, cfg->slot, snap->marker, &exists, errbuf, errlen)) != 0 ||
	    (r = read_legacy_mark(c, cfg->slot, legacy, &old, &ours, errbuf, errlen)) != 0)
		return r;
	snap->wanted = exists || old;
	if (ours)
		snprintf(snap->legacy, sizeof(snap->legacy), "%s", legacy);
	else if (old)
		/* it may be this slot's: its rows are published (again), and it stays */
		obx_log_warn("slot %s, the marker an earlier version made for a slot whose name begins "
		             "with %.*s, may be slot %s's or another's (another such slot exists, or another "
		             "slot's snapshot is under way): publishing the rows pending at slot %s's creation "
		             "again, and leaving it; drop it once no slot sharing that beginning has a snapshot "
		             "left unfinished by an earlier version",
		    legacy, OBX_SNAPMARK_KEEP, cfg->slot, cfg->slot, cfg->slot);
	return 0;
}

/*
 * A slot just created with its snapshot: a marker an earlier version left
 * under the old name, when it can only have been this slot's (a slot of
 * the same name dropped since), goes with the new one after the snapshot,
 * else the next start would publish the pending rows again.  A failure to
 * read it leaves it, to the same effect.
 */
void
obx_pgsetup_adopt_legacy_mark(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_snapshot *snap)
{
	char legacy[64], err[256];
	bool old, ours;

	if (obx_snapmark_legacy_name(cfg->slot, legacy, sizeof(legacy)) &&
	    read_legacy_mark(c, cfg->slot, legacy, &old, &ours, err, sizeof(err)) == 0 && ours)
		snprintf(snap->legacy, sizeof(snap->legacy), "%s", legacy);
}
