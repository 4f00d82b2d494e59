/*
 * snapshot.c - [source] snapshot = pending: the rows already pending when
 * outboxd created its slot (docs/internals/design.md, "Rows pending at the slot's
 * creation").
 *
 * One repeatable-read transaction on an ordinary connection, in the
 * snapshot the slot exported (or a fresh one after a crash): a cursor over
 * the matching rows in table order, each row built into a record by the
 * event builder of the log-based source and produced; then every delivery
 * report is waited for.  Only then may the caller drop the marker and
 * stream, so the stream's first event follows the last snapshot record.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/delivery.h"
#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/pg/stream.h"
#include "obx/pg/util.h"
#include "obx/run/poll.h"
#include "obx/core/relaycore.h"
#include "obx/core/snapcore.h"
#include "obx/run/snapshot.h"

/* each FETCH is read a row at a time (single-row mode): libpq holds one row, whatever the sizes */
#define FETCH_SQL "FETCH 500 FROM outboxd_snapshot"
#define PROGRESS_MS 10000
#define CTID_COL "outboxd_snapshot_ctid"

static const struct obx_delivery_ops snapshot_ops;

int
obx_snapshot_init(struct obx_snapshot *s, const struct obx_config *cfg, struct obx_core *core,
    struct obx_kafka *kf, struct obx_metrics *m)
{
	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	s->core = core;
	s->kf = kf;
	s->m = m;
	if (obx_event_builder_init(&s->eb, cfg) != 0)
		return OBX_ENOMEM;
	s->eb_ready = true;
	/* the stream's missing-topic waits: one rule and one gauge for the process */
	obx_dlv_init(&s->dlv, cfg, OBX_DLV_SNAPSHOT, OBX_DLV_ON_ERROR, &snapshot_ops, s, m,
	    obx_core_topic_waits(core));
	obx_dlv_begin(&s->dlv, obx_core_generation(core), false);
	return 0;
}

void
obx_snapshot_reset(struct obx_snapshot *s)
{
	if (s->eb_ready)
		obx_event_builder_reset(&s->eb);
	obx_rel_free(&s->rel);
	free(s->datums);
	free(s->hdrs);
	obx_dlv_reset(&s->dlv);
	memset(s, 0, sizeof(*s));
}

static void fail(struct obx_snapshot *s, int end, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records the first failure of the run; later ones add nothing. */
static void
fail(struct obx_snapshot *s, int end, const char *fmt, ...)
{
	va_list ap;

	if (s->end != 0)
		return;
	s->end = end;
	va_start(ap, fmt);
	vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
	va_end(ap);
}

/* ---- the delivery policy's actions (delivery.h) ---- */

static enum obx_produce_result
snap_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct obx_snapshot *s = ctx;
	enum obx_produce_result res;
	const char *name;

	res = obx_kafka_produce(s->kf, rec->topic, RD_KAFKA_PARTITION_UA, rec->key, rec->keylen, rec->value,
	    rec->len, rec->timestamp_ms, rec->headers, rec->nheaders, NULL, NULL, opaque, &name, errbuf, errlen);
	if (res != OBX_PRODUCE_OK && res != OBX_PRODUCE_QUEUE_FULL)
		obx_metrics_kafka_error(s->m, name);
	return res;
}

static void
snap_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	struct obx_snapshot *s = ctx;

	obx_log_f(level, f, "snapshot of slot %s: %s", s->cfg->slot, line);
}

static const struct obx_delivery_ops snapshot_ops = { NULL, snap_produce, NULL, snap_note };

/*
 * What an outcome of the delivery policy means for the run (snapcore.h:
 * the next session starts the snapshot again, or exit 1).  Returns 0 or
 * the run's end code.
 */
static int
delivered(struct obx_snapshot *s, enum obx_dlv_outcome o, const struct obx_dlv_result *res)
{
	char errbuf[sizeof(s->reason)];
	int end = obx_snap_outcome(o, s->cfg->slot, res->reason, errbuf, sizeof(errbuf));

	if (end == 0)
		return 0;
	fail(s, end, "%s", errbuf);
	return s->end;
}

void
obx_snapshot_report(struct obx_snapshot *s, uint64_t opaque, const rd_kafka_message_t *m)
{
	struct obx_header hs[OBX_DLV_MAX_HEADERS];
	struct obx_report rep;
	struct obx_dlv_result res;
	enum obx_dlv_outcome o;

	obx_kafka_report(m, opaque, hs, OBX_DLV_MAX_HEADERS, &rep);
	o = obx_dlv_report(&s->dlv, &rep, obx_mono_ms(), &res);
	if (o != OBX_DLV_ACKED) {
		(void)delivered(s, o, &res);
		return;
	}
	s->acked++;
	if (res.dead_letter) {
		s->dead_lettered++;
		s->m->events_dead_lettered++;
	} else {
		obx_metrics_published(s->m, s->m->events_published + 1, obx_unix_seconds());
	}
#ifdef OBX_TEST_HOOKS
	if (s->kill_after > 0 && s->acked >= (uint64_t)s->kill_after) {
		obx_log_info("test hook: killing myself after %" PRIu64 " snapshot acknowledgement(s)", s->acked);
		raise(SIGKILL);
	}
#endif
}

/* ---- reading the rows ---- */

/*
 * Runs one statement: through the extended protocol, which refuses a string
 * of several ("cannot insert multiple commands into a prepared statement"),
 * so that nothing in [source] snapshot_filter can end the read-only
 * transaction or run a statement of its own.
 */
static int
exec_ok(PGconn *c, const char *sql, char *err, size_t errlen, char state[6])
{
	PGresult *res = PQexecParams(c, sql, 0, NULL, NULL, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);
	const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	if (state != NULL)
		snprintf(state, 6, "%s", code != NULL ? code : "");
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

		/* the message alone: a filter's error would otherwise span lines with its caret */
		if (primary != NULL)
			snprintf(err, errlen, "%s", primary);
		else
			obx_pg_result_error_line(res, err, errlen);
		if (err[0] == '\0')
			obx_pg_error_line(c, err, errlen);
		PQclear(res);
		return OBX_EIO;
	}
	PQclear(res);
	return 0;
}

/* A server error's class: a bad filter, table or column needs a person. */
static int
sql_class(PGconn *c, const char *state)
{
	if (PQstatus(c) != CONNECTION_OK)
		return OBX_EIO;
	/* 72000: snapshot too old (old_snapshot_threshold, 13-16): a retry meets it again */
	return strncmp(state, "42", 2) == 0 || strncmp(state, "22", 2) == 0 || strcmp(state, "72000") == 0 ?
	    OBX_ECONFIG :
	    OBX_EIO;
}

int
obx_snapshot_describe(PGconn *c, const struct obx_config *cfg, char *table, size_t tlen, char *filter, size_t flen,
    char *order, size_t olen, char *errbuf, size_t errlen)
{
	char qpub[300] = "", qseq[300] = "", qcreated[300] = "", err[512];
	const char *params[4], *given = cfg->snapshot_filter;
	bool has_pub = false, has_seq = false, has_created = false;
	PGresult *res;

	table[0] = '\0';
	if (obx_poll_quote_ident(cfg->table_schema, table, tlen) != 0 || strlcat(table, ".", tlen) >= tlen ||
	    obx_poll_quote_ident(cfg->table_name, table, tlen) != 0 ||
	    obx_poll_quote_ident(cfg->col_published_at, qpub, sizeof(qpub)) != 0 ||
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
		return sql_class(c, state);
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
		snprintf(order, olen, "%s", qseq);
	else if (has_created)
		snprintf(order, olen, "%s, ctid", qcreated);
	else
		snprintf(order, olen, "ctid");
	return 0;
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
static int wait_reports(struct obx_snapshot *s, bool (*room)(const struct obx_snapshot *, size_t), size_t bytes);
static bool room_for(const struct obx_snapshot *s, size_t bytes);

static int
bad_row(struct obx_snapshot *s, const struct obx_pg_tuple *t, const char *table_ctid, const char *reason)
{
	struct obx_header hs[2] = {
		{ "error", reason, strlen(reason) },
		{ "snapshot", s->point, strlen(s->point) },
	};
	struct obx_dlv_result res;
	struct obx_record rec;
	char *row;
	int r;

	if (s->cfg->on_error != OBX_ON_ERROR_DEAD_LETTER) {
		fail(s, OBX_ECONFIG,
		    "snapshot of slot %s: row %s of %s.%s cannot become an event: %s "
		    "([delivery] on_error = stop)",
		    s->cfg->slot, table_ctid, s->cfg->table_schema, s->cfg->table_name, reason);
		return s->end;
	}
	if ((row = obx_event_row_json(&s->rel, t)) == NULL) {
		fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	rec = (struct obx_record){ s->cfg->dead_letter_topic, NULL, 0, row, strlen(row), 0, hs, 2 };
	/* bounded like every record of the snapshot: at most max_inflight_bytes plus one row */
	if ((r = wait_reports(s, room_for, rec.len)) == 0)
		r = delivered(s, obx_dlv_send(&s->dlv, &rec, s->rows, true, obx_mono_ms(), &res), &res);
	free(row);
	if (r == 0)
		obx_log_warn("snapshot of slot %s: row %s of %s.%s cannot become an event (%s): dead-lettering "
		             "it to %s",
		    s->cfg->slot, table_ctid, s->cfg->table_schema, s->cfg->table_name, reason,
		    s->cfg->dead_letter_topic);
	return r;
}

/*
 * Serves delivery reports, and moves on what the producer's queue refused,
 * until room(s) holds; the tick runs about every 100 ms, also when nothing
 * has to wait.  Returns 0, the run's end code, or OBX_ESTATE when the tick
 * asks to stop.
 */
static int
wait_reports(struct obx_snapshot *s, bool (*room)(const struct obx_snapshot *, size_t), size_t bytes)
{
	struct obx_dlv_result res;

	while (s->end == 0) {
		obx_kafka_poll(s->kf, room(s, bytes) ? 0 : 100);
		if (delivered(s, obx_dlv_pump(&s->dlv, obx_mono_ms(), &res), &res) != 0)
			break;
		if (s->tick != NULL && obx_mono_ms() - s->ticked_ms >= 100) {
			s->ticked_ms = obx_mono_ms();
			if (s->tick(s->tick_arg)) {
				s->stopped = true;
				return OBX_ESTATE;
			}
		}
		if (room(s, bytes) || s->end != 0)
			break;
		if (obx_mono_ms() >= s->next_note_ms) {
			obx_log_info("snapshot of slot %s: %" PRIu64 " row(s) read, %" PRIu64 " acknowledged, "
			             "%.0f s so far",
			    s->cfg->slot, s->rows, s->acked, (double)(obx_mono_ms() - s->started_ms) / 1000);
			s->next_note_ms = obx_mono_ms() + PROGRESS_MS;
		}
	}
	return s->end;
}

/* Room for a record of bytes: the in-flight bounds hold with it (one record always goes). */
static bool
room_for(const struct obx_snapshot *s, size_t bytes)
{
	return obx_dlv_room_for(&s->dlv, bytes);
}

/* Nothing waits: every record produced has its report. */
static bool
all_reported(const struct obx_snapshot *s, size_t bytes)
{
	(void)bytes;
	return !obx_dlv_pending(&s->dlv) && s->dlv.inflight == 0;
}

/* Anything: a turn of the loop while the server works. */
static bool
any(const struct obx_snapshot *s, size_t bytes)
{
	(void)s, (void)bytes;
	return true;
}

/*
 * Waits for the connection's next result without blocking the rest:
 * delivery reports are served and the tick runs while the server works
 * (the first FETCH may sort every matching row).  Returns 0, OBX_ESTATE
 * when the tick asked to stop, or the run's end code once a report ended it.
 */
static int
wait_result(struct obx_snapshot *s, PGconn *c)
{
	while (PQisBusy(c)) {
		struct pollfd p = { PQsocket(c), POLLIN, 0 };
		int r = wait_reports(s, any, 0);

		if (r != 0)
			return r; /* stopped, or the run ended (a report): the FETCH is not waited for */
		if (poll(&p, 1, 100) < 0 && errno != EINTR)
			break;
		if (PQconsumeInput(c) == 0)
			break; /* the connection failed: PQgetResult() says how */
	}
	return 0;
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
		fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	if (r != 0)
		return bad_row(s, &t, PQgetvalue(res, 0, 0), errbuf);
	if (obx_snap_headers(&ev, s->point, &s->hdrs, &s->hdr_cap, &nh) != 0) {
		fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	/* what waits for the broker is bounded per record, as in the stream */
	if ((r = wait_reports(s, room_for, ev.len + ev.keylen)) != 0)
		return r;
	rec = (struct obx_record){ ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, s->hdrs, nh };
	return delivered(s, obx_dlv_send(&s->dlv, &rec, s->rows, false, obx_mono_ms(), &dres), &dres);
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
		if ((r = wait_result(s, c)) != 0)
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
			r = produce_row(s, res);
			PQclear(res);
			if (r != 0)
				return r;
		} else if (PQresultStatus(res) == PGRES_TUPLES_OK) {
			PQclear(res); /* the FETCH's end; PQgetResult() says NULL next */
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
			return sql_class(c, state);
		}
	}
}

int
obx_snapshot_run(struct obx_snapshot *s, PGconn *conn, bool imported, obx_lsn start, bool (*tick)(void *),
    void *arg, char *errbuf, size_t errlen)
{
	const struct obx_config *cfg = s->cfg;
	char err[512], state[6], filter[1024], order[300];
	char *declare = NULL;
	int r;

	/* [delivery] max_inflight and max_inflight_bytes bound what waits for the broker, as in
	 * the stream (docs/internals/design.md, invariant 7): obx_dlv_room_for() */
	s->tick = tick;
	s->tick_arg = arg;
	s->started_ms = obx_mono_ms();
	s->next_note_ms = s->started_ms + PROGRESS_MS;
	obx_lsn_format(start, s->point, sizeof(s->point));
	if (!imported &&
	    exec_ok(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", err, sizeof(err), NULL) != 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: could not begin: %s", cfg->slot, err);
		return OBX_EIO;
	}
	if ((r = obx_snapshot_describe(conn, cfg, s->table, sizeof(s->table), filter, sizeof(filter), order,
	         sizeof(order), errbuf, errlen)) != 0)
		return r;
	if (asprintf(&declare,
	        "DECLARE outboxd_snapshot NO SCROLL CURSOR FOR SELECT ctid AS " CTID_COL
	        ", * FROM %s WHERE (%s) ORDER BY %s",
	        s->table, filter, order) < 0) {
		snprintf(errbuf, errlen, "out of memory");
		return OBX_ENOMEM;
	}
	r = exec_ok(conn, declare, err, sizeof(err), state);
	free(declare);
	if (r != 0) {
		snprintf(errbuf, errlen,
		    "snapshot of slot %s: could not read the pending rows of %s.%s "
		    "(WHERE %s ORDER BY %s; [source] snapshot_filter): %s",
		    cfg->slot, cfg->table_schema, cfg->table_name, filter, order, err);
		return sql_class(conn, state);
	}
	if (imported)
		obx_log_info("snapshot of slot %s at %s: publishing the rows of %s.%s WHERE %s, ORDER BY %s, "
		             "before streaming",
		    cfg->slot, s->point, cfg->table_schema, cfg->table_name, filter, order);
	else
		obx_log_warn(
		    "snapshot of slot %s at %s did not finish: publishing the rows of %s.%s WHERE "
		    "%s, ORDER BY %s, as they are now, before streaming from %s; rows published before it "
		    "ended, and rows committed since %s that match, are published again",
		    cfg->slot, s->point, cfg->table_schema, cfg->table_name, filter, order, s->point, s->point);
	for (bool built = false;;) {
		int n;

		errbuf[0] = '\0';
		r = fetch_rows(s, conn, &built, &n, errbuf, errlen);
		if (r != 0 && errbuf[0] != '\0')
			return r; /* the read failed: errbuf says how */
		if (r != 0 || n == 0)
			break;
	}
	if (r == 0)
		r = wait_reports(s, all_reported, 0);
	if (r == OBX_ESTATE) {
		snprintf(errbuf, errlen,
		    "stopped during the snapshot of slot %s: %" PRIu64 " of its rows "
		    "acknowledged; the next start publishes its pending rows again",
		    cfg->slot, s->acked);
		return r;
	}
	if (r != 0) {
		snprintf(errbuf, errlen, "%s", s->reason);
		return r;
	}
	/* the connection (and the lock pg/snapshot_mark.c took on it) stays until the caller has
	 * dropped the marker: an instance that then finds the marker still finds the lock taken */
	obx_log_info("snapshot of slot %s at %s: %" PRIu64 " row(s) published in %.1f s; streaming "
	             "follows",
	    cfg->slot, s->point, s->acked - s->dead_lettered, (double)(obx_mono_ms() - s->started_ms) / 1000);
	if (s->dead_lettered > 0)
		obx_log_warn("snapshot of slot %s: %" PRIu64 " row(s) dead-lettered to %s", cfg->slot,
		    s->dead_lettered, cfg->dead_letter_topic);
	return 0;
}
