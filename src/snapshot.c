/*
 * snapshot.c - [source] snapshot = pending: the rows already pending when
 * outboxd created its slot (docs/design.md, "Rows pending at the slot's
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

#include "obx/err.h"
#include "obx/log.h"
#include "obx/pgstream.h"
#include "obx/pgutil.h"
#include "obx/poll.h"
#include "obx/relaycore.h"
#include "obx/snapshot.h"

/* each FETCH is read a row at a time (single-row mode): libpq holds one row, whatever the sizes */
#define FETCH_SQL "FETCH 500 FROM outboxd_snapshot"
#define PROGRESS_MS 10000
#define OP_SNAPSHOT (1ULL << 62)
#define OP_DEAD_LETTER (1ULL << 61)
#define OP_BARE (1ULL << 60) /* a dead-letter copy of headers only */
#define CTID_COL "outboxd_snapshot_ctid"

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
	memset(s, 0, sizeof(*s));
}

static void
fail(struct obx_snapshot *s, int end, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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

/*
 * Produces, waiting while the producer's queue is full (the tick runs
 * meanwhile: a stop signal ends the wait).  Returns librdkafka's result.
 */
static rd_kafka_resp_err_t
produce(struct obx_snapshot *s, const char *topic, const void *key, size_t keylen, const void *value,
    size_t len, int64_t ts, const struct obx_header *h, size_t nh, uint64_t opaque)
{
	rd_kafka_resp_err_t err;

	while ((err = obx_kafka_produce(s->kf, topic, RD_KAFKA_PARTITION_UA, key, keylen, value, len, ts, h,
	    nh, NULL, NULL, opaque)) == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
		obx_kafka_poll(s->kf, 100);
		if (s->tick != NULL && s->tick(s->tick_arg)) {
			s->stopped = true;
			return RD_KAFKA_RESP_ERR__QUEUE_FULL;
		}
	}
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
		s->outstanding++;
		s->outstanding_bytes += len + keylen;
	}
	return err;
}

static bool
refused_for_good(rd_kafka_resp_err_t err)
{
	return (obx_kafka_err_is_permanent(err) || err == RD_KAFKA_RESP_ERR__INVALID_ARG ||
	    err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) && !obx_kafka_err_is_missing_topic(err);
}

/*
 * The dead-letter copy of a record refused for good ([delivery] on_error =
 * dead_letter, as for streamed events): the record with its headers plus
 * original_topic and error; when that copy is refused too (the record is
 * too large, say), its headers alone (bare).  A bare copy refused ends the
 * run: nothing more can be done with the row.
 */
static void
dead_letter(struct obx_snapshot *s, const char *topic, const void *key, size_t keylen,
    const void *value, size_t len, int64_t ts, const struct obx_header *hdrs, size_t nh,
    const char *why, bool bare)
{
	struct obx_header hs[66];
	size_t n = 0;
	rd_kafka_resp_err_t err;
	char id[128] = "";
	struct obx_logfields f = { .topic = topic, .event_id = id };

	for (size_t i = 0; i < nh; i++)
		if (strcmp(hdrs[i].name, "id") == 0 && hdrs[i].value != NULL)
			snprintf(id, sizeof(id), "%.*s", (int)hdrs[i].len, (const char *)hdrs[i].value);
	for (size_t i = 0; i < nh && n < 64; i++)
		if (strcmp(hdrs[i].name, "original_topic") != 0 && strcmp(hdrs[i].name, "error") != 0)
			hs[n++] = hdrs[i];
	hs[n++] = (struct obx_header){ "original_topic", topic, strlen(topic) };
	hs[n++] = (struct obx_header){ "error", why, strlen(why) };
	for (;; bare = true) {
		err = produce(s, s->cfg->dead_letter_topic, bare ? NULL : key, bare ? 0 : keylen,
		    bare ? NULL : value, bare ? 0 : len, ts, hs, n,
		    OP_SNAPSHOT | OP_DEAD_LETTER | (bare ? OP_BARE : 0));
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
			obx_log_f(OBX_LOG_WARN, &f, "snapshot of slot %s: a record for %s was refused (%s): dead-lettered to %s%s",
			    s->cfg->slot, topic, why, s->cfg->dead_letter_topic, bare ? " (headers only)" : "");
			return;
		}
		if (bare || s->stopped || !refused_for_good(err))
			break;
	}
	/* a missing dead-letter topic is not waited for: on_error has decided */
	if (!s->stopped)
		fail(s, refused_for_good(err) || obx_kafka_err_is_missing_topic(err) ? OBX_ECONFIG : OBX_EIO,
		    "snapshot of slot %s: could not dead-letter a record for %s that was refused (%s): %s",
		    s->cfg->slot, topic, why, rd_kafka_err2str(err));
}

/* Dead-letters the record of a delivery report that failed for good. */
static void
dead_letter_report(struct obx_snapshot *s, const rd_kafka_message_t *m, bool bare)
{
	struct obx_header hs[64];
	rd_kafka_headers_t *h = NULL;
	const char *name;
	const void *v;
	size_t sz, n = 0;
	char topic[256];

	snprintf(topic, sizeof(topic), "%s", rd_kafka_topic_name(m->rkt));
	if (rd_kafka_message_headers(m, &h) == 0)
		for (size_t i = 0; n < 64 && rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0; i++) {
			hs[n++] = (struct obx_header){ name, v, sz };
			/* a dead-letter copy names the record's own topic */
			if (bare && strcmp(name, "original_topic") == 0 && v != NULL)
				snprintf(topic, sizeof(topic), "%.*s", (int)sz, (const char *)v);
		}
	dead_letter(s, topic, m->key, m->key_len, m->payload, m->len,
	    rd_kafka_message_timestamp(m, NULL), hs, n, rd_kafka_err2str(m->err), bare);
}

/* The original topic a dead-letter copy names in its header, into buf ("?" when it has none). */
static const char *
topic_of_copy(const rd_kafka_message_t *m, char *buf, size_t len)
{
	rd_kafka_headers_t *h = NULL;
	const void *v = NULL;
	size_t sz = 0;

	if (rd_kafka_message_headers(m, &h) != 0 ||
	    rd_kafka_header_get_last(h, "original_topic", &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR || v == NULL)
		snprintf(buf, len, "?");
	else
		snprintf(buf, len, "%.*s", (int)sz, (const char *)v);
	return buf;
}

enum missing_verdict { MISSING_WAIT, MISSING_DEAD_LETTER, MISSING_STOP };

/*
 * A record for topic, which the cluster does not have: the core's rule
 * (obx_core_topic_missing()) says whether the wait goes on, the run then
 * ending so that the next session starts the snapshot again, or on_error
 * takes the record: a dead-letter copy (the caller sends it), or the end
 * of the run with exit 1.  The run's end is set here unless the verdict is
 * MISSING_DEAD_LETTER.
 */
static enum missing_verdict
missing_topic(struct obx_snapshot *s, const char *topic)
{
	if (obx_core_topic_missing(s->core, topic, obx_mono_ms())) {
		fail(s, OBX_EIO, "snapshot of slot %s: topic %s does not exist (yet): waiting up to %lld s for "
		    "it ([delivery] missing_topic_timeout) before on_error applies; the snapshot starts again",
		    s->cfg->slot, topic, s->cfg->missing_topic_timeout_ms / 1000);
		return MISSING_WAIT;
	}
	if (s->cfg->on_error == OBX_ON_ERROR_DEAD_LETTER)
		return MISSING_DEAD_LETTER;
	fail(s, OBX_ECONFIG, "snapshot of slot %s: topic %s still does not exist after [delivery] "
	    "missing_topic_timeout (%lld s): its record cannot be published ([delivery] on_error = stop)",
	    s->cfg->slot, topic, s->cfg->missing_topic_timeout_ms / 1000);
	return MISSING_STOP;
}

void
obx_snapshot_report(struct obx_snapshot *s, uint64_t opaque, const rd_kafka_message_t *m)
{
	bool dl = (opaque & OP_DEAD_LETTER) != 0;

	if ((opaque & OP_SNAPSHOT) == 0 || s->outstanding == 0)
		return;
	s->outstanding--;
	s->outstanding_bytes -= s->outstanding_bytes < m->len + m->key_len ? s->outstanding_bytes :
	    m->len + m->key_len;
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
		s->acked++;
		if (dl) {
			s->dead_lettered++;
			s->m->events_dead_lettered++;
		} else {
			obx_metrics_published(s->m, s->m->events_published + 1, obx_unix_seconds());
			obx_core_topic_present(s->core, rd_kafka_topic_name(m->rkt)); /* a wait for it is over */
		}
#ifdef OBX_TEST_HOOKS
		if (s->kill_after > 0 && s->acked >= (uint64_t)s->kill_after) {
			obx_log_info("test hook: killing myself after %" PRIu64 " snapshot acknowledgement(s)",
			    s->acked);
			raise(SIGKILL);
		}
#endif
		return;
	}
	obx_metrics_kafka_error(s->m, rd_kafka_err2name(m->err));
	if (dl && obx_kafka_err_is_missing_topic(m->err)) {
		char orig[256];

		/* the dead-letter topic itself is missing: nothing is waited for once on_error decided */
		fail(s, OBX_ECONFIG, "snapshot of slot %s: the dead-letter topic %s does not exist: a record "
		    "for %s cannot be set aside (create the topic, see [delivery] dead_letter_topic)",
		    s->cfg->slot, rd_kafka_topic_name(m->rkt), topic_of_copy(m, orig, sizeof(orig)));
		return;
	}
	if (refused_for_good(m->err) && (opaque & OP_BARE) == 0) {
		if (s->cfg->on_error == OBX_ON_ERROR_DEAD_LETTER)
			/* a refused dead-letter copy goes again as its headers alone */
			dead_letter_report(s, m, dl);
		else
			fail(s, OBX_ECONFIG, "snapshot of slot %s: the broker refused a record for %s: %s "
			    "([delivery] on_error = stop)", s->cfg->slot, rd_kafka_topic_name(m->rkt),
			    rd_kafka_err2str(m->err));
		return;
	}
	if (!dl && obx_kafka_err_is_missing_topic(m->err) &&
	    missing_topic(s, rd_kafka_topic_name(m->rkt)) == MISSING_DEAD_LETTER) {
		dead_letter_report(s, m, false);
		return;
	}
	/* the broker down past message.timeout.ms, a missing topic, a purge: the next session
	 * publishes the pending rows again; a bare dead-letter copy refused: nothing more to do */
	fail(s, refused_for_good(m->err) ? OBX_ECONFIG : OBX_EIO, "snapshot of slot %s: could not "
	    "publish a record to %s%s: %s", s->cfg->slot, rd_kafka_topic_name(m->rkt),
	    dl ? " (dead-letter copy)" : "", rd_kafka_err2str(m->err));
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
	return strncmp(state, "42", 2) == 0 || strncmp(state, "22", 2) == 0 ||
	    strcmp(state, "72000") == 0 ? OBX_ECONFIG : OBX_EIO;
}

int
obx_snapshot_describe(PGconn *c, const struct obx_config *cfg, char *table, size_t tlen,
    char *filter, size_t flen, char *order, size_t olen, char *errbuf, size_t errlen)
{
	char qpub[300] = "", qseq[300] = "", qcreated[300] = "", err[512];
	const char *params[4], *given = cfg->snapshot_filter;
	bool has_pub = false, has_seq = false, has_created = false;
	PGresult *res;

	table[0] = '\0';
	if (obx_poll_quote_ident(cfg->table_schema, table, tlen) != 0 ||
	    strlcat(table, ".", tlen) >= tlen ||
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
	res = PQexecParams(c, "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND "
	    "attnum > 0 AND NOT attisdropped AND attname IN ($2, $3, $4)", 4, NULL, params, NULL, NULL, 0);
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
		has_created = has_created || (cfg->col_created_at[0] != '\0' &&
		    strcmp(PQgetvalue(res, i, 0), cfg->col_created_at) == 0);
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
 * The builder's headers for a snapshot record: id, type and the [outbox]
 * ones; lsn 0/0 and seq the row's ordinal (below every streamed record's
 * mark, so restart de-duplication never skips a streamed event for them);
 * no xid or commit_ts (no transaction of the stream wrote them); snapshot
 * the slot's creation point.
 */
static int
snapshot_headers(struct obx_snapshot *s, const struct obx_event *ev, size_t *n)
{
	size_t o = 0;

	if (ev->nheaders + 1 > s->hdr_cap) {
		struct obx_header *h = reallocarray(s->hdrs, ev->nheaders + 1, sizeof(*h));

		if (h == NULL)
			return OBX_ENOMEM;
		s->hdrs = h;
		s->hdr_cap = ev->nheaders + 1;
	}
	for (size_t i = 0; i < ev->nheaders; i++) {
		/* the builder's first six are id, type, lsn, seq, xid, commit_ts (event.c) */
		if (i < 6 && (strcmp(ev->headers[i].name, "xid") == 0 ||
		    strcmp(ev->headers[i].name, "commit_ts") == 0))
			continue;
		s->hdrs[o++] = ev->headers[i];
	}
	s->hdrs[o++] = (struct obx_header){ "snapshot", s->point, strlen(s->point) };
	*n = o;
	return 0;
}

/*
 * A row that cannot become a record: dead-lettered as the JSON of its
 * columns, as the stream does ([delivery] on_error), or the end.
 */
static int
bad_row(struct obx_snapshot *s, const struct obx_pg_tuple *t, const char *table_ctid, const char *why)
{
	struct obx_header hs[2] = {
		{ "error", why, strlen(why) },
		{ "snapshot", s->point, strlen(s->point) },
	};
	rd_kafka_resp_err_t e;
	char *row;

	if (s->cfg->on_error != OBX_ON_ERROR_DEAD_LETTER) {
		fail(s, OBX_ECONFIG, "snapshot of slot %s: row %s of %s.%s cannot become an event: %s "
		    "([delivery] on_error = stop)", s->cfg->slot, table_ctid, s->cfg->table_schema,
		    s->cfg->table_name, why);
		return s->end;
	}
	if ((row = obx_event_row_json(&s->rel, t)) == NULL) {
		fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	e = produce(s, s->cfg->dead_letter_topic, NULL, 0, row, strlen(row), 0, hs, 2,
	    OP_SNAPSHOT | OP_DEAD_LETTER);
	free(row);
	if (s->stopped)
		return OBX_ESTATE;
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
		fail(s, OBX_EIO, "snapshot of slot %s: could not dead-letter row %s: %s", s->cfg->slot,
		    table_ctid, rd_kafka_err2str(e));
		return s->end;
	}
	obx_log_warn("snapshot of slot %s: row %s of %s.%s cannot become an event (%s): dead-lettered to "
	    "%s", s->cfg->slot, table_ctid, s->cfg->table_schema, s->cfg->table_name, why,
	    s->cfg->dead_letter_topic);
	return 0;
}

/*
 * Serves delivery reports until at most limit records (limit_bytes bytes)
 * are outstanding; the tick runs about every 100 ms, also when nothing has
 * to wait.  Returns 0, the run's end code, or OBX_ESTATE when the tick
 * asks to stop.
 */
static int
wait_reports(struct obx_snapshot *s, uint64_t limit, uint64_t limit_bytes)
{
	while (s->end == 0) {
		bool over = s->outstanding > limit || s->outstanding_bytes > limit_bytes;

		obx_kafka_poll(s->kf, over ? 100 : 0);
		if (s->tick != NULL && obx_mono_ms() - s->ticked_ms >= 100) {
			s->ticked_ms = obx_mono_ms();
			if (s->tick(s->tick_arg)) {
				s->stopped = true;
				return OBX_ESTATE;
			}
		}
		if ((s->outstanding <= limit && s->outstanding_bytes <= limit_bytes) || s->end != 0)
			break;
		if (obx_mono_ms() >= s->next_note_ms) {
			obx_log_info("snapshot of slot %s: %" PRIu64 " row(s) read, %" PRIu64 " acknowledged, "
			    "%.0f s so far", s->cfg->slot, s->rows, s->acked,
			    (double)(obx_mono_ms() - s->started_ms) / 1000);
			s->next_note_ms = obx_mono_ms() + PROGRESS_MS;
		}
	}
	return s->end;
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
		int r = wait_reports(s, UINT64_MAX, UINT64_MAX);

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
	char why[512];
	size_t nh;
	rd_kafka_resp_err_t err;
	int r;

	for (int f = 0; f < nf; f++) {
		s->datums[f].kind = PQgetisnull(res, 0, f + 1) ? 'n' : 't';
		s->datums[f].data = (const uint8_t *)PQgetvalue(res, 0, f + 1);
		s->datums[f].len = (uint32_t)PQgetlength(res, 0, f + 1);
	}
	/* seq: the ordinal in this snapshot (uint32 in the mark; wraps past 4 billion rows) */
	r = obx_event_build(&s->eb, &s->rel, &t, &txn, (uint32_t)s->rows, &ev, why, sizeof(why));
	s->rows++;
	if (r == OBX_ENOMEM) {
		fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	if (r != 0)
		return bad_row(s, &t, PQgetvalue(res, 0, 0), why);
	if (snapshot_headers(s, &ev, &nh) != 0) {
		fail(s, OBX_ENOMEM, "out of memory");
		return s->end;
	}
	/* what waits for the broker is bounded per record, as in the stream */
	if ((r = wait_reports(s, s->window - 1, s->window_bytes - (ev.len + ev.keylen < s->window_bytes ?
	    ev.len + ev.keylen : s->window_bytes))) != 0)
		return r;
	err = produce(s, ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, s->hdrs, nh,
	    OP_SNAPSHOT);
	if (s->stopped)
		return OBX_ESTATE;
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return 0;
	obx_metrics_kafka_error(s->m, rd_kafka_err2name(err));
	if (obx_kafka_err_is_missing_topic(err)) {
		if (missing_topic(s, ev.topic) == MISSING_DEAD_LETTER)
			dead_letter(s, ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, s->hdrs,
			    nh, rd_kafka_err2str(err), false);
		return s->stopped ? OBX_ESTATE : s->end;
	}
	if (refused_for_good(err) && s->cfg->on_error == OBX_ON_ERROR_DEAD_LETTER)
		dead_letter(s, ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, s->hdrs,
		    nh, rd_kafka_err2str(err), false);
	else
		fail(s, refused_for_good(err) ? OBX_ECONFIG : OBX_EIO, "snapshot of slot %s: could not "
		    "publish the event of row %s (id %s) to %s: %s%s", s->cfg->slot,
		    PQgetvalue(res, 0, 0), ev.id, ev.topic, rd_kafka_err2str(err),
		    refused_for_good(err) ? " ([delivery] on_error = stop)" : "");
	return s->stopped ? OBX_ESTATE : s->end;
}

/*
 * One FETCH in single-row mode: each row is produced as it arrives, so
 * libpq holds one row at a time and the producer at most the in-flight
 * bounds (docs/design.md, invariant 7), whatever the rows weigh.  *n counts
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
			snprintf(errbuf, errlen, "snapshot of slot %s: could not read the pending rows of %s.%s: "
			    "%s", s->cfg->slot, s->cfg->table_schema, s->cfg->table_name, primary != NULL ?
			    primary : PQstatus(c) != CONNECTION_OK ? obx_pg_error_line(c, err, sizeof(err)) :
			    obx_pg_result_error_line(res, err, sizeof(err)));
			PQclear(res);
			return sql_class(c, state);
		}
	}
}

int
obx_snapshot_run(struct obx_snapshot *s, PGconn *conn, bool imported, obx_lsn start,
    bool (*tick)(void *), void *arg, char *errbuf, size_t errlen)
{
	const struct obx_config *cfg = s->cfg;
	char err[512], state[6], filter[1024], order[300];
	char *declare = NULL;
	int r;

	/* [delivery] max_inflight and max_inflight_bytes bound what waits for the broker, as in
	 * the stream (docs/design.md, invariant 7) */
	s->window = (uint64_t)cfg->max_inflight;
	s->window_bytes = (uint64_t)cfg->max_inflight_bytes; /* at least 1024 (config.c) */
	s->tick = tick;
	s->tick_arg = arg;
	s->started_ms = obx_mono_ms();
	s->next_note_ms = s->started_ms + PROGRESS_MS;
	obx_lsn_format(start, s->point, sizeof(s->point));
	if (!imported && exec_ok(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", err,
	    sizeof(err), NULL) != 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: could not begin: %s", cfg->slot, err);
		return OBX_EIO;
	}
	if ((r = obx_snapshot_describe(conn, cfg, s->table, sizeof(s->table), filter, sizeof(filter),
	    order, sizeof(order), errbuf, errlen)) != 0)
		return r;
	if (asprintf(&declare, "DECLARE outboxd_snapshot NO SCROLL CURSOR FOR SELECT ctid AS " CTID_COL
	    ", * FROM %s WHERE (%s) ORDER BY %s", s->table, filter, order) < 0) {
		snprintf(errbuf, errlen, "out of memory");
		return OBX_ENOMEM;
	}
	r = exec_ok(conn, declare, err, sizeof(err), state);
	free(declare);
	if (r != 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: could not read the pending rows of %s.%s "
		    "(WHERE %s ORDER BY %s; [source] snapshot_filter): %s", cfg->slot, cfg->table_schema,
		    cfg->table_name, filter, order, err);
		return sql_class(conn, state);
	}
	if (imported)
		obx_log_info("snapshot of slot %s at %s: publishing the rows of %s.%s WHERE %s, ORDER BY %s, "
		    "before streaming", cfg->slot, s->point, cfg->table_schema, cfg->table_name, filter,
		    order);
	else
		obx_log_warn("snapshot of slot %s at %s did not finish: publishing the rows of %s.%s WHERE "
		    "%s, ORDER BY %s, as they are now, before streaming from %s; rows published before it "
		    "ended, and rows committed since %s that match, are published again", cfg->slot,
		    s->point, cfg->table_schema, cfg->table_name, filter, order, s->point, s->point);
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
		r = wait_reports(s, 0, 0);
	if (r == 0 && s->stopped)
		r = OBX_ESTATE; /* a stop while a copy waited for the queue: not every row is accounted for */
	if (r == OBX_ESTATE) {
		snprintf(errbuf, errlen, "stopped during the snapshot of slot %s: %" PRIu64 " of its rows "
		    "acknowledged; the next start publishes its pending rows again", cfg->slot, s->acked);
		return r;
	}
	if (r != 0) {
		snprintf(errbuf, errlen, "%s", s->reason);
		return r;
	}
	/* the connection (and the lock pgsetup.c took on it) stays until the caller has dropped
	 * the marker: an instance that then finds the marker still finds the lock taken */
	obx_log_info("snapshot of slot %s at %s: %" PRIu64 " row(s) published in %.1f s; streaming "
	    "follows", cfg->slot, s->point, s->acked - s->dead_lettered,
	    (double)(obx_mono_ms() - s->started_ms) / 1000);
	if (s->dead_lettered > 0)
		obx_log_warn("snapshot of slot %s: %" PRIu64 " row(s) dead-lettered to %s", cfg->slot,
		    s->dead_lettered, cfg->dead_letter_topic);
	return 0;
}
