/*
 * snapshot_table.c - one table's part of [source] snapshot = pending
 * (snapshot.c runs it for each outbox table): what the snapshot reads of
 * the table, the cursor over its pending rows in insertion order, each row
 * built by the event builder in the table's mapping and produced, or
 * dead-lettered when it cannot become a record.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/delivery.h"
#include "obx/core/err.h"
#include "obx/core/snapcore.h"
#include "obx/pg/stream.h"
#include "obx/pg/util.h"
#include "obx/run/poll.h"
#include "obx/run/snapshot.h"
#include "obx/run/snapshot_int.h"
#include "obx/sys/log.h"

/* each FETCH is read a row at a time (single-row mode): libpq holds one row, whatever the sizes */
#define FETCH_SQL "FETCH 500 FROM outboxd_snapshot"
#define CTID_COL "outboxd_snapshot_ctid"

/* obx_snapshot_describe(), the table read under the name now (NULL: the configuration's) */
static int
describe(PGconn *c, const struct obx_config *cfg, const char *now, char *table, size_t tlen, char *filter,
    size_t flen, char *order, size_t olen, char *errbuf, size_t errlen)
{
	char qpub[300] = "", qseq[300] = "", qcreated[300] = "", err[512];
	const char *params[4], *given = cfg->snapshot_filter;
	bool has_pub = false, has_seq = false, has_created = false, too_long;
	PGresult *res;

	table[0] = '\0';
	if (now != NULL)
		too_long = strlcpy(table, now, tlen) >= tlen;
	else
		too_long = obx_poll_quote_ident(cfg->table_schema, table, tlen) != 0 ||
		    strlcat(table, ".", tlen) >= tlen || obx_poll_quote_ident(cfg->table_name, table, tlen) != 0;
	if (too_long || obx_poll_quote_ident(cfg->col_published_at, qpub, sizeof(qpub)) != 0 ||
	    obx_poll_quote_ident(cfg->col_seq, qseq, sizeof(qseq)) != 0 ||
	    obx_poll_quote_ident(cfg->col_created_at, qcreated, sizeof(qcreated)) != 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: a table or column name is too long", cfg->slot);
		return OBX_ECONFIG;
	}
	params[0] = table;
	params[1] = cfg->col_published_at;
	params[2] = cfg->col_seq;
	params[3] = cfg->col_created_at;
	res = PQexecParams(c,
	    "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND "
	    "attnum > 0 AND NOT attisdropped AND attname IN ($2, $3, $4)",
	    4, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		char state[6];

		snprintf(state, sizeof(state), "%s", code != NULL ? code : "");
		snprintf(errbuf, errlen, "snapshot of slot %s: could not read table %s.%s: %s", cfg->slot,
		    cfg->table_schema, cfg->table_name, obx_pg_result_error_line(res, err, sizeof(err)));
		PQclear(res);
		return obx_snap_sql_class(c, state);
	}
	for (int i = 0; i < PQntuples(res); i++) {
		has_pub = has_pub || strcmp(PQgetvalue(res, i, 0), cfg->col_published_at) == 0;
		has_seq = has_seq || strcmp(PQgetvalue(res, i, 0), cfg->col_seq) == 0;
		has_created = has_created ||
		    (cfg->col_created_at[0] != '\0' && strcmp(PQgetvalue(res, i, 0), cfg->col_created_at) == 0);
	}
	PQclear(res);
#ifdef OBX_TEST_HOOKS
	/* test builds only: a filter the configuration would refuse, as if it reached the server */
	if (getenv("OBX_TEST_SNAPSHOT_FILTER") != NULL)
		given = getenv("OBX_TEST_SNAPSHOT_FILTER");
#endif
	if (given[0] != '\0')
		snprintf(filter, flen, "%s", given);
	else if (has_pub)
		snprintf(filter, flen, "%s IS NULL", qpub);
	else
		snprintf(filter, flen, "true");
	/* insertion order: the ordering column; else the creation time (a transaction's start,
	 * sql/001_outbox.sql's default), ties by position; else the position alone, which
	 * cleanup and VACUUM can make differ from insertion order */
	if (has_seq)
		snprintf(order, olen, "%s, ctid", qseq); /* seq is not unique: ties in one order (the re-read) */
	else if (has_created)
		snprintf(order, olen, "%s, ctid", qcreated);
	else
		snprintf(order, olen, "ctid");
	return 0;
}

int
obx_snapshot_describe(PGconn *c, const struct obx_config *cfg, char *table, size_t tlen, char *filter, size_t flen,
    char *order, size_t olen, char *errbuf, size_t errlen)
{
	return describe(c, cfg, NULL, table, tlen, filter, flen, order, olen, errbuf, errlen);
}

/*
 * The configured table as the snapshot saw it, by its OID, under its name now: a table
 * renamed since the snapshot was taken is read under its new name (its rows are the
 * snapshot's).  Returns 1 with now filled (*moved: the configured name is another table's now,
 * or none's); 0 when that table has been dropped since (its rows are gone with it); -1 when the
 * snapshot has no table of that name (now empty: the configuration's name is read, and says
 * what is wrong).
 */
static int
resolve_table(PGconn *c, const struct obx_config *cfg, char *now, size_t len, bool *moved)
{
	const char *params[2] = { cfg->table_schema, cfg->table_name };
	/* a query of pg_class sees the catalog as the transaction's snapshot does; regclass's
	 * output is the name the OID has now, or the bare number once no table has it */
	PGresult *res = PQexecParams(c,
	    "SELECT c.oid::regclass::text, to_regclass(quote_ident($1) || '.' || quote_ident($2)) IS "
	    "DISTINCT FROM c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
	    "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
	    2, NULL, params, NULL, NULL, 0);
	int r = -1;

	now[0] = '\0';
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
		const char *v = PQgetvalue(res, 0, 0);

		if (strspn(v, "0123456789") == strlen(v))
			r = 0; /* an identifier that starts with a digit is quoted: this is an OID */
		else if (strlcpy(now, v, len) < len) {
			r = 1;
			*moved = strcmp(PQgetvalue(res, 0, 1), "t") == 0;
		} else
			now[0] = '\0';
	}
	PQclear(res);
	return r;
}

/* The cursor's columns after the ctid, as a relation the event builder resolves by name. */
static int
build_rel(struct obx_snapshot *s, const PGresult *res)
{
	int n = PQnfields(res) - 1;

	obx_rel_free(&s->rel);
	free(s->datums);
	s->datums = calloc((size_t)n, sizeof(*s->datums));
	s->rel.cols = calloc((size_t)n, sizeof(*s->rel.cols));
	s->rel.nspname = strdup(s->cfg->table_schema);
	s->rel.relname = strdup(s->cfg->table_name);
	if (s->datums == NULL || s->rel.cols == NULL || s->rel.nspname == NULL || s->rel.relname == NULL)
		return OBX_ENOMEM;
	s->rel.natts = (uint16_t)n;
	for (int i = 0; i < n; i++) {
		if ((s->rel.cols[i].name = strdup(PQfname(res, i + 1))) == NULL)
			return OBX_ENOMEM;
		s->rel.cols[i].type_oid = PQftype(res, i + 1);
	}
	s->rel.version = 1;
	obx_event_builder_forget(&s->eb);
	return 0;
}

/*
 * A row that cannot become a record: dead-lettered as the JSON of its
 * columns, as the stream does ([delivery] on_error), or the end.
 */

static int
bad_row(struct obx_snapshot *s, const struct obx_pg_tuple *t, const char *table_ctid, const char *reason)
{
	char table[2 * 64 + 2];
	struct obx_header hs[3] = {
		{ "error", reason, strlen(reason) },
		{ "snapshot", s->point, strlen(s->point) },
		{ OBX_TABLE_HEADER, table, 0 },
	};
	struct obx_dlv_result res;
	struct obx_record rec;
	char *row;
	int r;

	if (s->cfg->on_error != OBX_ON_ERROR_DEAD_LETTER) {
		obx_snap_fail(s, OBX_ECONFIG,
		    "snapshot of slot %s: row %s of %s.%s cannot become an event: %s "
		    "([delivery] on_error = stop)",
		    s->cfg->slot, table_ctid, s->cfg->table_schema, s->cfg->table_name, reason);
		return s->end;
	}
	if ((row = obx_event_row_json(&s->rel, t)) == NULL) {
		obx_snap_fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	/* several tables: the copy says its table, like the stream's */
	snprintf(table, sizeof(table), "%s.%s", s->cfg->table_schema, s->cfg->table_name);
	hs[2].len = strlen(table);
	rec = (struct obx_record){ s->cfg->dead_letter_topic, NULL, 0, row, strlen(row), 0, hs,
		s->eb.table_header ? 3 : 2 };
	/* bounded like every record of the snapshot: at most max_inflight_bytes plus one row */
	if ((r = obx_snap_wait_reports(s, obx_snap_room_for, rec.len)) == 0 && obx_snap_holding(&s->hold)) {
		free(row);
		return 0; /* a report meanwhile held the run: this row is read again after it */
	}
	if (r == 0)
		r = obx_snap_delivered(s, obx_dlv_send(&s->dlv, &rec, s->rows, true, obx_mono_ms(), &res), &res);
	free(row);
	if (r == 0)
		obx_log_warn("snapshot of slot %s: row %s of %s.%s cannot become an event (%s): dead-lettering "
		             "it to %s",
		    s->cfg->slot, table_ctid, s->cfg->table_schema, s->cfg->table_name, reason,
		    s->cfg->dead_letter_topic);
	return r;
}

/* Produces row 0 of res (a single-row result).  Returns 0 or the run's end code. */
static int
produce_row(struct obx_snapshot *s, const PGresult *res)
{
	int nf = PQnfields(res) - 1;
	struct obx_txninfo txn = { 0, 0, obx_pg_now() };
	struct obx_pg_tuple t = { (uint16_t)nf, s->datums };
	struct obx_event ev;
	struct obx_record rec;
	struct obx_dlv_result dres;
	char errbuf[512];
	size_t nh;
	int r;

	for (int f = 0; f < nf; f++) {
		s->datums[f].kind = PQgetisnull(res, 0, f + 1) ? 'n' : 't';
		s->datums[f].data = (const uint8_t *)PQgetvalue(res, 0, f + 1);
		s->datums[f].len = (uint32_t)PQgetlength(res, 0, f + 1);
	}
	/* seq: the ordinal in this snapshot (uint32 in the mark; wraps past 4 billion rows) */
	r = obx_event_build(&s->eb, &s->rel, &t, &txn, (uint32_t)s->rows, &ev, errbuf, sizeof(errbuf));
	s->rows++;
	if (r == OBX_ENOMEM) {
		obx_snap_fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	if (r != 0)
		return bad_row(s, &t, PQgetvalue(res, 0, 0), errbuf);
	if (obx_snap_headers(&ev, s->point, &s->hdrs, &s->hdr_cap, &nh) != 0) {
		obx_snap_fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	/* what waits for the broker is bounded per record, as in the stream */
	if ((r = obx_snap_wait_reports(s, obx_snap_room_for, ev.len + ev.keylen)) != 0)
		return r;
	if (obx_snap_holding(&s->hold))
		return 0; /* a report meanwhile held the run: this row is read again after it */
	rec = (struct obx_record){ ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, s->hdrs, nh };
	r = obx_snap_delivered(s, obx_dlv_send(&s->dlv, &rec, s->rows, false, obx_mono_ms(), &dres), &dres);
	/* after a hold's resume, one record at a time until one past what the rounds before sent
	 * goes through (snapcore.h) */
	if (r == 0 && s->hold.probe && (r = obx_snap_wait_reports(s, obx_snap_all_reported, 0)) == 0) {
		obx_snap_settled(&s->hold, s->rows);
		if (!s->hold.probe)
			s->pause_ms = 0; /* through: the next hold waits a second again */
	}
	return r;
}

/*
 * One FETCH in single-row mode: each row is produced as it arrives, so
 * libpq holds one row at a time and the producer at most the in-flight
 * bounds (docs/internals/design.md, invariant 7), whatever the rows weigh.  *n counts
 * the rows.  Returns 0, the run's end code, or (errbuf filled) the class of
 * a failed read.  On a non-zero return the FETCH may be unfinished: the
 * caller ends the run, and the connection with it.
 */
static int
fetch_rows(struct obx_snapshot *s, PGconn *c, bool *built, int *n, char *errbuf, size_t errlen)
{
	char err[512], state[6];
	PGresult *res;
	int r;

	*n = 0;
	if (PQsendQuery(c, FETCH_SQL) == 0 || PQsetSingleRowMode(c) == 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: could not read the pending rows of %s.%s: %s",
		    s->cfg->slot, s->cfg->table_schema, s->cfg->table_name,
		    obx_pg_error_line(c, err, sizeof(err)));
		return OBX_EIO;
	}
	for (;;) {
		if ((r = obx_snap_wait_result(s, c)) != 0)
			return r;
		if ((res = PQgetResult(c)) == NULL)
			return 0;
		if (PQresultStatus(res) == PGRES_SINGLE_TUPLE) {
			if (!*built && (r = build_rel(s, res)) != 0) {
				PQclear(res);
				snprintf(errbuf, errlen, "out of memory");
				return r;
			}
			*built = true;
			(*n)++;
			/* a hold: the rest of the FETCH is read past, and read again after it */
			r = obx_snap_holding(&s->hold) ? 0 : produce_row(s, res);
			PQclear(res);
			if (r != 0)
				return r;
		} else if (PQresultStatus(res) == PGRES_TUPLES_OK) {
			PQclear(res); /* the FETCH's end; PQgetResult() says NULL next */
			if (obx_snap_holding(&s->hold))
				return OBX_ETIMEDOUT;
		} else {
			const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
			const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

			snprintf(state, sizeof(state), "%s", code != NULL ? code : "");
			snprintf(errbuf, errlen,
			    "snapshot of slot %s: could not read the pending rows of %s.%s: "
			    "%s",
			    s->cfg->slot, s->cfg->table_schema, s->cfg->table_name,
			    primary != NULL                  ? primary :
			        PQstatus(c) != CONNECTION_OK ? obx_pg_error_line(c, err, sizeof(err)) :
			                                       obx_pg_result_error_line(res, err, sizeof(err)));
			PQclear(res);
			return obx_snap_sql_class(c, state);
		}
	}
}


/*
 * Opens the cursor over the table's pending rows and moves it past skip of
 * them.  Returns 0 or (errbuf filled) the class of the failure.
 */
static int
open_cursor(struct obx_snapshot *s, PGconn *c, const char *filter, const char *order, uint64_t skip, char *errbuf,
    size_t errlen)
{
	char err[512], state[6], move[64];
	char *declare = NULL;
	int r;

	if (asprintf(&declare,
	        "DECLARE outboxd_snapshot NO SCROLL CURSOR FOR SELECT ctid AS " CTID_COL
	        ", * FROM %s WHERE (%s) ORDER BY %s",
	        s->table, filter, order) < 0) {
		snprintf(errbuf, errlen, "out of memory");
		return OBX_ENOMEM;
	}
	r = obx_snap_exec(c, declare, err, sizeof(err), state);
	free(declare);
	if (r != 0) {
		snprintf(errbuf, errlen,
		    "snapshot of slot %s: could not read the pending rows of %s.%s "
		    "(WHERE %s ORDER BY %s; [source] snapshot_filter): %s",
		    s->cfg->slot, s->cfg->table_schema, s->cfg->table_name, filter, order, err);
		return obx_snap_sql_class(c, state);
	}
	snprintf(move, sizeof(move), "MOVE FORWARD %" PRIu64 " FROM outboxd_snapshot", skip);
	if (skip > 0 && obx_snap_exec(c, move, err, sizeof(err), state) != 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: could not read the pending rows of %s.%s again: %s",
		    s->cfg->slot, s->cfg->table_schema, s->cfg->table_name, err);
		return obx_snap_sql_class(c, state);
	}
	return 0;
}

/* Closes the cursor.  Returns 0 or (errbuf filled) the class of the failure. */
static int
close_cursor(struct obx_snapshot *s, PGconn *c, char *errbuf, size_t errlen)
{
	char err[512], state[6];

	if (obx_snap_exec(c, "CLOSE outboxd_snapshot", err, sizeof(err), state) == 0)
		return 0;
	snprintf(errbuf, errlen, "snapshot of slot %s: could not close the cursor over %s.%s: %s", s->cfg->slot,
	    s->cfg->table_schema, s->cfg->table_name, err);
	return obx_snap_sql_class(c, state);
}

int
obx_snap_table(struct obx_snapshot *s, PGconn *c, bool imported, char *errbuf, size_t errlen)
{
	char filter[1024], order[300], now[sizeof(s->table)];
	uint64_t first = s->rows; /* the ordinal of the table's first row */
	bool moved = false;
	int r, found;

	errbuf[0] = '\0';
	if ((found = resolve_table(c, s->cfg, now, sizeof(now), &moved)) == 0) {
		obx_log_warn("snapshot of slot %s: table %s.%s was dropped since the slot's creation; its rows "
		             "are gone with it",
		    s->cfg->slot, s->cfg->table_schema, s->cfg->table_name);
		return 0;
	}
	if ((r = describe(c, s->cfg, found == 1 ? now : NULL, s->table, sizeof(s->table), filter, sizeof(filter),
	         order, sizeof(order), errbuf, errlen)) != 0)
		return r;
	if ((r = open_cursor(s, c, filter, order, 0, errbuf, errlen)) != 0)
		return r;
	if (found == 1 && moved)
		obx_log_info("snapshot of slot %s: table %s.%s has been renamed %s since the slot's creation; its "
		             "rows are read under that name",
		    s->cfg->slot, s->cfg->table_schema, s->cfg->table_name, now);
	if (imported)
		obx_log_info("snapshot of slot %s at %s: publishing the rows of %s.%s WHERE %s, ORDER BY %s, "
		             "before streaming",
		    s->cfg->slot, s->point, s->cfg->table_schema, s->cfg->table_name, filter, order);
	else
		obx_log_warn(
		    "snapshot of slot %s at %s did not finish: publishing the rows of %s.%s WHERE "
		    "%s, ORDER BY %s, as they are now, before streaming from %s; rows published before it "
		    "ended, and rows committed since %s that match, are published again",
		    s->cfg->slot, s->point, s->cfg->table_schema, s->cfg->table_name, filter, order, s->point,
		    s->point);
	for (bool built = false;;) {
		uint64_t from;
		int n;

		errbuf[0] = '\0';
		r = fetch_rows(s, c, &built, &n, errbuf, errlen);
		if (r != 0 && errbuf[0] != '\0')
			return r; /* the read failed: errbuf says how */
		if (r == 0 && n > 0)
			continue;
		/* the table's end, or a hold: its records report before the next table's go (a hold
		 * then concerns this table's rows only) */
		if (r == 0 || r == OBX_ETIMEDOUT)
			r = obx_snap_holding(&s->hold) ? obx_snap_pause(s) :
			                                 obx_snap_wait_reports(s, obx_snap_all_reported, 0);
		if (r != 0 || !obx_snap_holding(&s->hold))
			break;
		/* the same rows again (one transaction), from the first whose topic was missing */
		from = obx_snap_resume(&s->hold) - 1;
		if (from < first)
			from = first;
		if ((r = close_cursor(s, c, errbuf, errlen)) != 0 ||
		    (r = open_cursor(s, c, filter, order, from - first, errbuf, errlen)) != 0)
			return r;
		s->rows = from;
	}
	if (r == 0 && (r = close_cursor(s, c, errbuf, errlen)) != 0)
		return r;
	return r;
}
