/*
 * cmd/drop_slot.c - "outboxd drop-slot": decommissioning one instance's state on
 * the server, so a deleted deployment leaves no slot pinning WAL.
 *
 * What it drops: the logical slot, the marker slot of an unfinished
 * snapshot (obx_pgsetup_marker_name), and the slot guard's record of the
 * slot ("outboxd-slot SLOT SYSID LSN" in the publication comment, or the
 * physical guard slot SLOT_guard where the comment could not hold it), without
 * which a later run would take the missing slot for a lost one and refuse
 * to create it.  The publication only with --drop-publication: nothing
 * records whether outboxd or the table owner (sql/002_publication.sql)
 * created it, and it may serve other slots.
 *
 * It looks first and changes nothing until everything checks out: a slot
 * another instance streams from (active, naming its pid) is refused, so is
 * one whose instance lives without streaming (its slot watch's connection,
 * pg/slotwatch.h), and a publication this role cannot drop; without --yes
 * it only prints what it would drop.  It uses an ordinary
 * connection, like check and status.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/cmd/cli.h"
#include "obx/core/err.h"
#include "obx/pg/setup.h"
#include "obx/pg/slotwatch.h"
#include "obx/core/snapmark.h"
#include "obx/pg/util.h"

#define GUARD "outboxd-slot"

/* What the server holds of one instance. */
struct drop_plan {
	bool slot;            /* the logical slot exists */
	char confirmed[32];   /* its confirmed_flush_lsn, "" when NULL */
	char marker[80];      /* the snapshot marker's name */
	bool has_marker;      /* ... and it exists (a physical slot) */
	char guard_slot[80];  /* the guard slot's name (obx_snapmark_guard_name()) */
	bool has_guard_slot;  /* ... and it exists (a physical slot) */
	bool publication;     /* the publication exists */
	char *comment;        /* its comment ("" for none) */
	bool guard;           /* the comment records the slot */
	char *rest;           /* the comment without that record */
	int other_guards;     /* records of other slots in it */
	bool own_publication; /* this role may drop it (a member of its owner) */
	char pub_owner[128];
};

/*
 * Splits comment into the slot's guard record and the rest: *rest is the
 * comment without the line "outboxd-slot SLOT ..." (the caller frees it),
 * *found says whether it was there, *others counts the other slots'
 * records.  Returns 0 or OBX_ENOMEM.
 */
static int
split_guard(const char *comment, const char *slot, char **rest, bool *found, int *others)
{
	char prefix[160];
	size_t plen, len = 0;
	char *text = NULL;
	bool first = true;
	FILE *fp;

	*found = false;
	*others = 0;
	*rest = NULL;
	snprintf(prefix, sizeof(prefix), GUARD " %s ", slot);
	plen = strlen(prefix);
	if ((fp = open_memstream(&text, &len)) == NULL)
		return OBX_ENOMEM;
	for (const char *p = comment; p != NULL && *p != '\0';) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);

		if (n >= plen && strncmp(p, prefix, plen) == 0)
			*found = true;
		else if (n > 0) {
			if (n > strlen(GUARD " ") && strncmp(p, GUARD " ", strlen(GUARD " ")) == 0)
				(*others)++;
			fprintf(fp, "%s%.*s", first ? "" : "\n", (int)n, p);
			first = false;
		}
		p = nl ? nl + 1 : NULL;
	}
	if (fclose(fp) != 0) {
		free(text);
		return OBX_ENOMEM;
	}
	*rest = text;
	return 0;
}

/* Reads what there is to drop.  Returns OBX_EXIT_OK or, with one line on stderr, OBX_EXIT_FAILURE. */
static int
read_plan(PGconn *conn, const struct obx_config *cfg, struct drop_plan *pl)
{
	const char *p[3] = { cfg->slot, pl->marker, pl->guard_slot };
	const char *pub[1] = { cfg->publication };
	char err[1024];
	PGresult *res;
	int rc = OBX_EXIT_FAILURE;

	res = PQexecParams(conn,
	    "SELECT slot_name = $1, slot_type, coalesce(plugin, ''), coalesce(database::text, ''), "
	    "database IS NOT DISTINCT FROM current_database(), active, coalesce(active_pid::text, '?'), "
	    "coalesce(confirmed_flush_lsn::text, ''), current_database(), slot_name::text "
	    "FROM pg_replication_slots WHERE slot_name IN ($1, $2, $3)",
	    3, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		fprintf(stderr, "outboxd: could not read slot %s: %s\n", cfg->slot,
		    obx_pg_result_error_line(res, err, sizeof(err)));
		goto out;
	}
	for (int i = 0; i < PQntuples(res); i++) {
		bool ours = strcmp(PQgetvalue(res, i, 0), "t") == 0;
		bool guard = !ours && strcmp(PQgetvalue(res, i, 9), pl->guard_slot) == 0;
		const char *name = ours ? cfg->slot : guard ? pl->guard_slot : pl->marker;

		if (strcmp(PQgetvalue(res, i, 5), "t") == 0) {
			fprintf(stderr,
			    "outboxd: slot %s is active (pid %s streams from it): stop every "
			    "instance first (scale the Deployment to 0), then drop it\n",
			    name, PQgetvalue(res, i, 6));
			goto out;
		}
		if (ours &&
		    (strcmp(PQgetvalue(res, i, 1), "logical") != 0 ||
		        strcmp(PQgetvalue(res, i, 2), "pgoutput") != 0)) {
			fprintf(stderr,
			    "outboxd: slot %s is not a logical pgoutput slot (plugin %s): not "
			    "outboxd's, not dropped\n",
			    name, PQgetvalue(res, i, 2));
			goto out;
		}
		if (ours && strcmp(PQgetvalue(res, i, 4), "t") != 0) {
			fprintf(stderr,
			    "outboxd: slot %s belongs to database %s, not %s: connect to %s "
			    "to drop it\n",
			    name, PQgetvalue(res, i, 3), PQgetvalue(res, i, 8), PQgetvalue(res, i, 3));
			goto out;
		}
		if (ours) {
			pl->slot = true;
			strlcpy(pl->confirmed, PQgetvalue(res, i, 7), sizeof(pl->confirmed));
		} else if (strcmp(PQgetvalue(res, i, 1), "physical") == 0) {
			/* a logical slot of that name is neither: left alone */
			if (guard)
				pl->has_guard_slot = true;
			else
				pl->has_marker = true;
		}
	}
	PQclear(res);
	/* an instance that lives without streaming (in backoff, a standby, a snapshot) would create
	 * the slot again once it and its guard record are gone: its slot watch gives it away */
	{
		char app[64];
		const char *ap[1] = { app };

		obx_slotwatch_app_name(cfg->slot, app, sizeof(app));
		res = PQexecParams(conn,
		    "SELECT count(*), string_agg(pid::text || coalesce(' from ' || client_addr::text, ''), ', ') "
		    "FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
		    1, NULL, ap, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK) {
			fprintf(stderr, "outboxd: could not read pg_stat_activity: %s\n",
			    obx_pg_result_error_line(res, err, sizeof(err)));
			goto out;
		}
		if (strcmp(PQgetvalue(res, 0, 0), "0") != 0) {
			fprintf(stderr,
			    "outboxd: %s instance(s) of slot %s still run (the slot watch of pid %s): stop every "
			    "instance first (scale the Deployment to 0), then drop it\n",
			    PQgetvalue(res, 0, 0), cfg->slot, PQgetvalue(res, 0, 1));
			goto out;
		}
		PQclear(res);
	}
	res = PQexecParams(conn,
	    "SELECT coalesce(obj_description(oid, 'pg_publication'), ''), pg_has_role(pubowner, 'USAGE'), "
	    "pubowner::regrole::text FROM pg_publication WHERE pubname = $1",
	    1, NULL, pub, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		fprintf(stderr, "outboxd: could not read publication %s: %s\n", cfg->publication,
		    obx_pg_result_error_line(res, err, sizeof(err)));
		goto out;
	}
	pl->publication = PQntuples(res) > 0;
	pl->own_publication = pl->publication && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	if (pl->publication)
		strlcpy(pl->pub_owner, PQgetvalue(res, 0, 2), sizeof(pl->pub_owner));
	pl->comment = strdup(pl->publication ? PQgetvalue(res, 0, 0) : "");
	if (pl->comment == NULL ||
	    split_guard(pl->comment, cfg->slot, &pl->rest, &pl->guard, &pl->other_guards) != 0) {
		fprintf(stderr, "outboxd: out of memory\n");
		goto out;
	}
	rc = OBX_EXIT_OK;
out:
	PQclear(res);
	return rc;
}

/* Runs one command; returns 0, or -1 with the failure said on stderr (what names it). */
static int
exec_one(PGconn *conn, const char *sql, int nparams, const char *const *params, const char *what)
{
	PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	char err[1024];
	int r = 0;

	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
		fprintf(stderr, "outboxd: could not %s: %s\n", what,
		    obx_pg_result_error_line(res, err, sizeof(err)));
		r = -1;
	}
	PQclear(res);
	return r;
}

/* COMMENT ON PUBLICATION takes no parameters: the name and text are escaped here. */
static int
set_comment(PGconn *conn, const struct obx_config *cfg, const char *text)
{
	char *ident = PQescapeIdentifier(conn, cfg->publication, strlen(cfg->publication));
	char *lit = text[0] != '\0' ? PQescapeLiteral(conn, text, strlen(text)) : NULL;
	char *sql = NULL, what[200];
	int r = -1;

	snprintf(what, sizeof(what), "remove the guard record of slot %s from publication %s", cfg->slot,
	    cfg->publication);
	if (ident == NULL || (text[0] != '\0' && lit == NULL) ||
	    asprintf(&sql, "COMMENT ON PUBLICATION %s IS %s", ident, lit != NULL ? lit : "NULL") < 0) {
		sql = NULL;
		fprintf(stderr, "outboxd: could not %s: out of memory\n", what);
		goto out;
	}
	r = exec_one(conn, sql, 0, NULL, what);
out:
	free(sql);
	PQfreemem(lit);
	PQfreemem(ident);
	return r;
}

int
obx_cmd_drop_slot(const struct obx_config *cfg, bool yes, bool drop_publication)
{
	struct drop_plan pl;
	char err[1024], what[200];
	const char *verb = yes ? "dropped" : "would drop";
	PGconn *conn;
	int rc = OBX_EXIT_FAILURE, n = 0;

	memset(&pl, 0, sizeof(pl));
	if (cfg->mode == OBX_SOURCE_POLL) {
		fprintf(stderr, "outboxd: drop-slot: [source] mode = poll uses no slot: nothing to drop\n");
		return OBX_EXIT_USAGE;
	}
	obx_snapmark_name(cfg->slot, pl.marker, sizeof(pl.marker));
	obx_snapmark_guard_name(cfg->slot, pl.guard_slot, sizeof(pl.guard_slot));
	if (obx_pg_connect(cfg->conninfo, cfg->password, NULL, NULL, "outboxd drop-slot", &conn, err,
	        sizeof(err)) != 0) {
		fprintf(stderr, "outboxd: could not connect: %s\n", err);
		return OBX_EXIT_FAILURE;
	}
	if (read_plan(conn, cfg, &pl) != OBX_EXIT_OK)
		goto out;
	drop_publication = drop_publication && pl.publication;
	if (drop_publication && pl.other_guards > 0) {
		fprintf(stderr,
		    "outboxd: publication %s also records %d other slot(s) in its comment: "
		    "not dropped (drop-slot without --drop-publication leaves it)\n",
		    cfg->publication, pl.other_guards);
		goto out;
	}
	/* refused before anything is dropped: a slot gone and a publication that stays is half done */
	if (drop_publication && !pl.own_publication) {
		fprintf(stderr,
		    "outboxd: publication %s belongs to %s, which this role is not a member of: it cannot drop it; "
		    "nothing dropped (have %s drop it, or run drop-slot without --drop-publication)\n",
		    cfg->publication, pl.pub_owner, pl.pub_owner);
		goto out;
	}
	if (!pl.slot && !pl.has_marker && !pl.has_guard_slot && !pl.guard && !drop_publication) {
		printf("nothing to drop for slot %s\n", cfg->slot);
		rc = OBX_EXIT_OK;
		goto out;
	}

	/* the slot first: while it stands, its guard record must too */
	if (pl.slot) {
		const char *p[1] = { cfg->slot };

		snprintf(what, sizeof(what), "drop slot %s", cfg->slot);
		if (yes && exec_one(conn, "SELECT pg_drop_replication_slot($1)", 1, p, what) != 0)
			goto out;
		printf("%s slot %s (confirmed up to %s)\n", verb, cfg->slot,
		    pl.confirmed[0] != '\0' ? pl.confirmed : "nothing");
		n++;
	}
	if (pl.has_marker) {
		const char *p[1] = { pl.marker };

		snprintf(what, sizeof(what), "drop marker slot %s", pl.marker);
		if (yes && exec_one(conn, "SELECT pg_drop_replication_slot($1)", 1, p, what) != 0)
			goto out;
		printf("%s slot %s (the marker of an unfinished snapshot)\n", verb, pl.marker);
		n++;
	}
	if (pl.has_guard_slot) {
		const char *p[1] = { pl.guard_slot };

		snprintf(what, sizeof(what), "drop guard slot %s", pl.guard_slot);
		if (yes && exec_one(conn, "SELECT pg_drop_replication_slot($1)", 1, p, what) != 0)
			goto out;
		printf("%s slot %s (the slot guard's record of slot %s)\n", verb, pl.guard_slot, cfg->slot);
		n++;
	}
	if (drop_publication) {
		char *ident = PQescapeIdentifier(conn, cfg->publication, strlen(cfg->publication));
		char sql[300];
		int r;

		if (ident == NULL) {
			fprintf(stderr, "outboxd: out of memory\n");
			goto out;
		}
		snprintf(sql, sizeof(sql), "DROP PUBLICATION %s", ident);
		PQfreemem(ident);
		snprintf(what, sizeof(what), "drop publication %s", cfg->publication);
		r = yes ? exec_one(conn, sql, 0, NULL, what) : 0;
		if (r != 0)
			goto out;
		printf("%s publication %s%s\n", verb, cfg->publication,
		    pl.guard ? " (with the guard record of the slot)" : "");
		n++;
	} else if (pl.guard) {
		if (yes && set_comment(conn, cfg, pl.rest) != 0)
			goto out;
		printf("%s the guard record of slot %s in the comment of publication %s\n", verb, cfg->slot,
		    cfg->publication);
		n++;
	}
	if (!yes) {
		fprintf(stderr, "outboxd: nothing dropped: run again with --yes to drop the %d item(s) above\n",
		    n);
		rc = OBX_EXIT_USAGE;
		goto out;
	}
	rc = OBX_EXIT_OK;
out:
	free(pl.comment);
	free(pl.rest);
	PQfinish(conn);
	return rc;
}
