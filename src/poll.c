/*
 * poll.c - the loop of "outboxd run" in polling mode ([source] mode = poll).
 * docs/design.md, "Polling mode", gives the cycle and why it keeps
 * per-aggregate order with several replicas; pollsql.c holds the SQL.
 *
 * One cycle, in one transaction on an ordinary connection:
 *   1. claim: lock up to [poll] batch due rows, SKIP LOCKED, in order, keeping
 *      a row only when no older pending row of its key is outside the batch;
 *   2. produce each row's record (the event builder and the Kafka sink of
 *      the log-based source); a row that cannot be built or produced holds
 *      back the later rows of its key in the batch;
 *   3. wait for every delivery report;
 *   4. record failures (attempts + 1, last_error, next_attempt_at with
 *      backoff), mark the acknowledged rows published, COMMIT.
 * A row that failed [poll] max_attempts times is dead-lettered (or only
 * marked) on its next claim.  A crash anywhere before the COMMIT leaves the
 * rows pending and unlocked: the next claim publishes them again (the only
 * duplicates), each with its id header.
 *
 * pollcore.c (pure) decides each row's fate, what a delivery report does,
 * when the wait ends and what is marked; this file performs it with libpq
 * and librdkafka.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "obx/err.h"
#include "obx/event.h"
#include "obx/kafka.h"
#include "obx/log.h"
#include "obx/metrics.h"
#include "obx/pgutil.h"
#include "obx/poll.h"
#include "obx/pollcore.h"
#include "obx/relaycore.h"
#include "obx/relcache.h"
#include "obx/runner.h"
#include "obx/walmsg.h"

#define STATS_INTERVAL_MS 5000
#define SLOW_ACK_MS 5000
struct poller {
	const struct obx_config *cfg;
	const struct obx_run_opts *opts;
	PGconn *pg;
	struct obx_kafka kf;
	bool kf_open;
	struct obx_event_builder eb;
	struct obx_poll_sql sql;
	struct obx_rel rel;       /* the claim's result columns, built once per connection */
	bool rel_built;
	unsigned rel_version;
	struct obx_pg_datum *datums;
	struct obx_header *hdrs;
	size_t hdr_cap;
	struct obx_pollcore pc;   /* the claimed batch and its decisions */
	bool pg_busy;             /* an early marking UPDATE is running (wait_acks) */
	struct obx_metrics m;
	struct obx_runner run;    /* HTTP, heartbeat, title, signals, the session loop */
	int signals;              /* stop signals received: the runner's count, kept here for the batch */
	int64_t stop_ms;          /* when the first one came (the runner's, for the batch) */
	int rc;                   /* how the session ended: 0 stopped, else a negative OBX_E* */
	uint64_t published_at_open; /* events published when the session opened: did it progress */
	bool listening;
	int64_t next_stats_ms;
	char reason[1024];
	enum obx_log_level log_level;
#ifdef OBX_TEST_HOOKS
	long test_kill_after;     /* OBX_TEST_KILL_AFTER_ACKS: SIGKILL itself after that many acks */
	long test_acks;
#endif
};

/* ---- signals and title: the runner's (runner.h) ---- */

/* SIGHUP: the log level takes effect at once; the runner names the other changes. */
static const char *const poll_live[] = { "[log] level" };

static void
poll_reload(void *ctx, const struct obx_config *fresh)
{
	struct poller *p = ctx;

	if (fresh->log_level != p->log_level) {
		p->log_level = fresh->log_level;
		obx_log_setup(p->log_level, p->cfg->log_format);
		obx_log_info("SIGHUP: log level %s", obx_log_level_name(p->log_level));
	}
}

/* A stop signal: the first finishes the claimed batch (obx_pollcore_drain() says until when). */
static void
poll_stop(void *ctx, enum obx_stop_verdict v, int64_t now_ms)
{
	struct poller *p = ctx;

	p->signals = obx_runner_stops(&p->run);
	if (v != OBX_STOP_DRAIN)
		return;
	p->stop_ms = now_ms;
	obx_log_info("stopping: finishing the claimed batch for up to %d s (a second signal "
	    "abandons it)", OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
}

static void
poll_title(void *ctx, char *buf, size_t len)
{
	struct poller *p = ctx;

	snprintf(buf, len, "%s (polling %s.%s)", obx_state_name(p->m.state), p->cfg->table_schema,
	    p->cfg->table_name);
}

/* Sets the state, /readyz's phrase for it and the full reason (logged by the caller). */
static void
set_state(struct poller *p, enum obx_state s, enum obx_not_ready why, const char *reason)
{
	p->m.state = s;
	p->m.not_ready = why;
	snprintf(p->m.state_reason, sizeof(p->m.state_reason), "%.*s", (int)sizeof(p->m.state_reason) - 1,
	    reason != NULL ? reason : "");
	obx_runner_publish(&p->run);
}

/* ---- delivery reports ---- */

static void
on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *km)
{
	struct poller *p = ctx;
	bool ok = km->err == RD_KAFKA_RESP_ERR_NO_ERROR;

	switch (obx_pollcore_report(&p->pc, opaque, ok ? NULL : rd_kafka_err2name(km->err),
	    ok ? NULL : rd_kafka_err2str(km->err))) {
	case OBX_POLL_REPORT_STALE:
		return; /* an abandoned batch's report */
	case OBX_POLL_REPORT_FAILED:
		obx_metrics_kafka_error(&p->m, rd_kafka_err2name(km->err));
		return;
	case OBX_POLL_REPORT_DEAD_LETTERED:
		p->m.events_dead_lettered++;
		break;
	case OBX_POLL_REPORT_ACKED:
		obx_metrics_published(&p->m, p->m.events_published + 1, obx_unix_seconds());
		break;
	}
#ifdef OBX_TEST_HOOKS
	if (p->test_kill_after > 0 && ++p->test_acks == p->test_kill_after) {
		obx_log_info("test hook: killing myself after %ld acknowledgement(s)", p->test_acks);
		raise(SIGKILL);
	}
#endif
}

/* ---- one batch ---- */

/* The claim's result columns as a relation the event builder resolves by name. */
static int
build_rel(struct poller *p, const PGresult *res)
{
	int n = PQnfields(res);

	obx_rel_free(&p->rel);
	free(p->datums);
	p->datums = NULL;
	p->rel.cols = calloc((size_t)n, sizeof(*p->rel.cols));
	p->rel.nspname = strdup(p->cfg->table_schema);
	p->rel.relname = strdup(p->cfg->table_name);
	p->datums = calloc((size_t)n, sizeof(*p->datums));
	if (p->rel.cols == NULL || p->rel.nspname == NULL || p->rel.relname == NULL || p->datums == NULL)
		return OBX_ENOMEM;
	p->rel.natts = (uint16_t)n;
	for (int i = 0; i < n; i++) {
		if ((p->rel.cols[i].name = strdup(PQfname(res, i))) == NULL)
			return OBX_ENOMEM;
		p->rel.cols[i].type_oid = PQftype(res, i);
	}
	p->rel.version = ++p->rel_version;
	obx_event_builder_forget(&p->eb);
	p->rel_built = true;
	return 0;
}

/*
 * Copies the builder's headers, keeping id and type and the [outbox]
 * header.* and headers-column ones; lsn, xid and commit_ts do not exist
 * here, and seq becomes the ordering column's value.
 */
static int
poll_headers(struct poller *p, const struct obx_event *ev, const char *seq, size_t *n)
{
	size_t o = 0;

	if (ev->nheaders > p->hdr_cap) {
		struct obx_header *h = reallocarray(p->hdrs, ev->nheaders, sizeof(*h));

		if (h == NULL)
			return OBX_ENOMEM;
		p->hdrs = h;
		p->hdr_cap = ev->nheaders;
	}
	for (size_t i = 0; i < ev->nheaders; i++) {
		const struct obx_header *h = &ev->headers[i];

		/* the builder's first six are id, type, lsn, seq, xid, commit_ts (event.c) */
		if (i < 6 && (strcmp(h->name, "lsn") == 0 || strcmp(h->name, "xid") == 0 ||
		    strcmp(h->name, "commit_ts") == 0))
			continue;
		p->hdrs[o] = *h;
		if (i < 6 && strcmp(h->name, "seq") == 0) {
			p->hdrs[o].value = seq;
			p->hdrs[o].len = strlen(seq);
		}
		o++;
	}
	*n = o;
	return 0;
}

/*
 * Produces, waiting while the producer's queue is full (a claim sends at
 * most [delivery] max_inflight rows, which the queue holds twice over by
 * count; its bytes, cut by the rows' stored size, can still fill it with
 * payloads that compress well), with signals read and the heartbeat
 * published meanwhile.  Returns librdkafka's result; QUEUE_FULL once a stop
 * signal came (the row is then left pending).
 */
static rd_kafka_resp_err_t
produce(struct poller *p, const char *topic, const void *key, size_t keylen, const void *value,
    size_t len, int64_t ts, const struct obx_header *h, size_t nh, uint64_t opaque)
{
	rd_kafka_resp_err_t err;

	while ((err = obx_kafka_produce(&p->kf, topic, RD_KAFKA_PARTITION_UA, key, keylen, value, len, ts, h,
	    nh, NULL, NULL, opaque)) == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
		struct pollfd fd = { p->opts->signal_fd, POLLIN, 0 };

		obx_kafka_poll(&p->kf, 0);
		if (poll(&fd, 1, 100) > 0)
			obx_runner_read_signals(&p->run);
		obx_runner_publish(&p->run); /* the loop is turning: /healthz stays green */
		if (p->signals > 0)
			break;
	}
	return err;
}

/*
 * Sends the dead-letter copy of row i: the record with its headers plus
 * original_topic and error, or (when the row cannot become a record) the
 * row as JSON with seq and error.  The row is then in flight, or failed
 * with row->error filled.
 */
static void
dead_letter(struct poller *p, size_t i, const struct obx_event *ev, bool built, const char *seq)
{
	const struct obx_prow *row = obx_pollcore_row(&p->pc, i);
	const char *last = row->error != NULL ? row->error : "unknown";
	char why[512];
	rd_kafka_resp_err_t err;
	size_t nh = 0;

	if (built) {
		struct obx_header *hs = calloc(ev->nheaders + 2, sizeof(*hs));
		int r = hs == NULL ? OBX_ENOMEM : poll_headers(p, ev, seq, &nh);

		if (r != 0) {
			free(hs);
			snprintf(why, sizeof(why), "out of memory");
			goto failed;
		}
		memcpy(hs, p->hdrs, nh * sizeof(*hs));
		hs[nh++] = (struct obx_header){ "original_topic", ev->topic, strlen(ev->topic) };
		hs[nh++] = (struct obx_header){ "error", last, strlen(last) };
		err = produce(p, p->cfg->dead_letter_topic, ev->key, ev->keylen, ev->value, ev->len,
		    ev->timestamp_ms, hs, nh, obx_pollcore_opaque(&p->pc, i, true));
		if (err != RD_KAFKA_RESP_ERR_NO_ERROR && !(err == RD_KAFKA_RESP_ERR__QUEUE_FULL && p->signals > 0))
			/* too large, say: the headers alone */
			err = produce(p, p->cfg->dead_letter_topic, NULL, 0, NULL, 0, ev->timestamp_ms, hs,
			    nh, obx_pollcore_opaque(&p->pc, i, true));
		free(hs);
	} else {
		const char *params[1] = { seq };
		PGresult *res = PQexecParams(p->pg, p->sql.row_json, 1, NULL, params, NULL, NULL, 0);
		struct obx_header hs[2] = {
			{ "seq", seq, strlen(seq) },
			{ "error", last, strlen(last) },
		};

		if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
			char pgerr[400];

			snprintf(why, sizeof(why), "could not read the row as JSON: %s",
			    obx_pg_result_error_line(res, pgerr, sizeof(pgerr)));
			PQclear(res);
			goto failed;
		}
		err = produce(p, p->cfg->dead_letter_topic, NULL, 0, PQgetvalue(res, 0, 0),
		    (size_t)PQgetlength(res, 0, 0), 0, hs, 2, obx_pollcore_opaque(&p->pc, i, true));
		PQclear(res);
	}
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
		obx_pollcore_sent(&p->pc, i, true);
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && p->signals > 0)
		return; /* a stop signal while the queue was full: pending, no attempt */
	snprintf(why, sizeof(why), "dead-letter copy: %s", rd_kafka_err2str(err));
failed:
	(void)obx_pollcore_failed(&p->pc, i, OBX_POLL_FAILED_DEAD_LETTER, why);
}

/* The warning for an exhausted row: dead-lettered (dl), or marked without a send. */
static void
log_exhausted(const struct poller *p, const struct obx_prow *row, const struct obx_event *ev,
    const char *seq, bool dl)
{
	struct obx_logfields lf = { .event_id = ev != NULL ? ev->id : NULL,
		.topic = ev != NULL ? ev->topic : NULL };
	const char *last = row->error != NULL ? row->error : "unknown";

	if (dl)
		obx_log_f(OBX_LOG_WARN, &lf, "row seq %s (id %s) failed %lld time(s): dead-lettering it to "
		    "%s: %s", seq, ev != NULL ? ev->id : "?", row->attempts, p->cfg->dead_letter_topic, last);
	else
		obx_log_f(OBX_LOG_WARN, &lf, "row seq %s (id %s) failed %lld time(s): marked published "
		    "without sending ([poll] exhausted = mark): %s", seq, ev != NULL ? ev->id : "?",
		    row->attempts, last);
}

/*
 * Builds row i of res and performs what pollcore decides for it: produce
 * its record or its dead-letter copy, give it up, or record its failure.
 * Returns 0 or OBX_ENOMEM.
 */
static int
produce_row(struct poller *p, const PGresult *res, size_t i)
{
	const struct obx_prow *row = obx_pollcore_row(&p->pc, i);
	int k = (int)i, nf = PQnfields(res), r;
	struct obx_pg_tuple t = { (uint16_t)nf, p->datums };
	struct obx_txninfo txn = { 0, 0, 0 };
	struct obx_event ev;
	const char *seq = PQgetvalue(res, k, 0);
	char why[512];
	rd_kafka_resp_err_t err;
	size_t nh;

	for (int f = 0; f < nf; f++) {
		p->datums[f].kind = PQgetisnull(res, k, f) ? 'n' : 't';
		p->datums[f].data = (const uint8_t *)PQgetvalue(res, k, f);
		p->datums[f].len = (uint32_t)PQgetlength(res, k, f);
	}
	/* no commit time here: the row's created_at, else now, unless [outbox] timestamp says */
	if (!PQgetisnull(res, k, 3))
		txn.commit_time = strtoll(PQgetvalue(res, k, 3), NULL, 10) - OBX_PG_EPOCH_OFFSET_US;
	else
		txn.commit_time = (int64_t)time(NULL) * 1000000 - OBX_PG_EPOCH_OFFSET_US;
	if ((r = obx_event_build(&p->eb, &p->rel, &t, &txn, 0, &ev, why, sizeof(why))) == OBX_ENOMEM)
		return r;
	switch (obx_pollcore_decide(&p->pc, i, r == 0)) {
	case OBX_POLL_HOLD: /* never: obx_pollcore_next() passed the held rows over */
		return 0;
	case OBX_POLL_GIVE_UP:
		log_exhausted(p, row, r == 0 ? &ev : NULL, seq, false);
		obx_pollcore_give_up(&p->pc, i);
		return 0;
	case OBX_POLL_DEAD_LETTER:
		log_exhausted(p, row, r == 0 ? &ev : NULL, seq, true);
		dead_letter(p, i, &ev, r == 0, seq);
		return 0;
	case OBX_POLL_FAIL:
		return obx_pollcore_failed(&p->pc, i, OBX_POLL_FAILED_BUILD, why);
	case OBX_POLL_SEND:
		break;
	}
	if ((r = poll_headers(p, &ev, seq, &nh)) != 0)
		return r;
	err = produce(p, ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, p->hdrs, nh,
	    obx_pollcore_opaque(&p->pc, i, false));
	if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
		return 0; /* a stop signal while the queue was full: pending, not an attempt */
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
		obx_metrics_kafka_error(&p->m, rd_kafka_err2name(err));
		snprintf(why, sizeof(why), "%s: %s", rd_kafka_err2name(err), rd_kafka_err2str(err));
		return obx_pollcore_failed(&p->pc, i, OBX_POLL_FAILED_PRODUCE, why);
	}
	obx_pollcore_sent(&p->pc, i, false);
	return 0;
}

/*
 * Starts the batch of res's rows and produces them, in seq order, as
 * pollcore decides: a row that cannot be built or whose produce call fails
 * holds back the later rows of its key in this batch (they stay pending and
 * are claimed after it); a stop signal leaves the rest unsent.  Returns 0
 * or OBX_ENOMEM.
 */
static int
produce_batch(struct poller *p, const PGresult *res)
{
	int n = PQntuples(res), kcol, r;
	char quoted[256] = "";
	size_t i;

	obx_poll_quote_ident(p->cfg->col_key, quoted, sizeof(quoted));
	kcol = PQfnumber(res, quoted);
	if ((r = obx_pollcore_begin(&p->pc, p->cfg, (size_t)n)) != 0)
		return r;
	for (int k = 0; k < n; k++) {
		const char *key = kcol >= 0 && !PQgetisnull(res, k, kcol) ? PQgetvalue(res, k, kcol) : NULL;

		if ((r = obx_pollcore_add(&p->pc, strtoll(PQgetvalue(res, k, 0), NULL, 10),
		    strtoll(PQgetvalue(res, k, 1), NULL, 10), key,
		    key != NULL ? (size_t)PQgetlength(res, k, kcol) : 0,
		    PQgetisnull(res, k, 2) ? NULL : PQgetvalue(res, k, 2))) != 0)
			return r;
	}
	obx_pollcore_stop(&p->pc, p->signals, p->stop_ms);
	while (obx_pollcore_next(&p->pc, &i)) {
		if ((r = produce_row(p, res, i)) != 0)
			return r;
		obx_pollcore_stop(&p->pc, p->signals, p->stop_ms); /* produce() reads signals */
	}
	return 0;
}

/* Appends "v" to a PostgreSQL array literal under construction ("{a,b"). */
static int
array_add(char **buf, size_t *len, size_t *cap, const char *v)
{
	size_t need = *len + strlen(v) + 2;

	if (need > *cap) {
		size_t nc = *cap ? *cap * 2 : 256;
		char *q;

		while (nc < need)
			nc *= 2;
		if ((q = realloc(*buf, nc)) == NULL)
			return OBX_ENOMEM;
		*buf = q;
		*cap = nc;
	}
	if (*len > 0)
		(*buf)[(*len)++] = ',';
	memcpy(*buf + *len, v, strlen(v) + 1);
	*len += strlen(v);
	return 0;
}

/* A text[] literal element: double-quoted, with backslash and quote escaped. */
static char *
array_text(const char *s)
{
	size_t n = strlen(s);
	char *o = malloc(n * 2 + 3), *q = o;

	if (o == NULL)
		return NULL;
	*q++ = '"';
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			*q++ = '\\';
		*q++ = *s;
	}
	*q++ = '"';
	*q = '\0';
	return o;
}

/* Runs stmt with the rows in state as arrays (seq, error[, delay]).  Returns 0 or OBX_EIO. */
static int
record_rows(struct poller *p, const char *stmt, enum obx_prow_state state, bool with_delay)
{
	char *a[3] = { NULL, NULL, NULL };
	size_t len[3] = { 0, 0, 0 }, cap[3] = { 0, 0, 0 };
	const char *params[3];
	size_t count = 0;
	char num[32], err[512];
	PGresult *res;
	int r = OBX_ENOMEM;

	for (size_t i = 0; i < p->pc.nrows; i++) {
		const struct obx_prow *row = obx_pollcore_row(&p->pc, i);
		char *t;

		if (row->state != state)
			continue;
		snprintf(num, sizeof(num), "%" PRId64, row->seq);
		if (array_add(&a[0], &len[0], &cap[0], num) != 0)
			goto out;
		if ((t = array_text(row->error != NULL ? row->error : "")) == NULL ||
		    array_add(&a[1], &len[1], &cap[1], t) != 0) {
			free(t);
			goto out;
		}
		free(t);
		if (with_delay) {
			int64_t d = obx_pollcore_backoff_ms(&p->pc, i, arc4random());

			snprintf(num, sizeof(num), "%" PRId64, d);
			if (array_add(&a[2], &len[2], &cap[2], num) != 0)
				goto out;
			obx_log_warn("row seq %" PRId64 " failed (attempt %lld of %lld), next in %" PRId64 " ms: %s",
			    row->seq, row->attempts + 1, p->cfg->poll_max_attempts, d,
			    row->error != NULL ? row->error : "unknown");
		}
		count++;
	}
	r = 0;
	if (count == 0)
		goto out;
	for (int k = 0; k < 3; k++) {
		char *w;

		if (a[k] == NULL)
			continue;
		if ((w = malloc(len[k] + 3)) == NULL) {
			r = OBX_ENOMEM;
			goto out;
		}
		snprintf(w, len[k] + 3, "{%s}", a[k]);
		free(a[k]);
		a[k] = w;
	}
	params[0] = a[0];
	params[1] = a[1];
	params[2] = a[2];
	res = PQexecParams(p->pg, stmt, with_delay ? 3 : 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		snprintf(p->reason, sizeof(p->reason), "could not record %zu row(s): %s", count,
		    obx_pg_result_error_line(res, err, sizeof(err)));
		r = OBX_EIO;
	} else if (with_delay) {
		p->m.poll_failed_attempts += count;
	}
	PQclear(res);
out:
	for (int k = 0; k < 3; k++)
		free(a[k]);
	return r;
}

/*
 * Builds the marking UPDATE for the acknowledged rows not yet marked (and
 * flags them marked), followed by "; COMMIT" when commit.  Returns the
 * malloc'd statement, or NULL when out of memory; *count says how many
 * rows it marks.
 */
static char *
mark_statement(struct poller *p, bool commit, size_t *count)
{
	size_t head = strlen(p->sql.mark_head), tail = strlen(p->sql.mark_tail);
	size_t cap = head + tail + p->pc.nrows * 21 + 16, len = head;
	char *q = malloc(cap);

	*count = 0;
	if (q == NULL)
		return NULL;
	memcpy(q, p->sql.mark_head, head);
	for (size_t i = 0; i < p->pc.nrows; i++) {
		if (!obx_pollcore_take_mark(&p->pc, i))
			continue;
		len += (size_t)snprintf(q + len, cap - len, "%s%" PRId64, *count > 0 ? "," : "",
		    obx_pollcore_row(&p->pc, i)->seq);
		(*count)++;
	}
	snprintf(q + len, cap - len, "%s%s", p->sql.mark_tail, commit ? "; COMMIT" : "");
	return q;
}

/*
 * Serves the result of an early marking UPDATE without blocking (block:
 * waits for it).  Returns 0, or OBX_EIO with reason filled.
 */
static int
mark_result(struct poller *p, bool block)
{
	PGresult *res;
	char err[512];
	int r = 0;

	if (!p->pg_busy)
		return 0;
	if (!block && PQconsumeInput(p->pg) == 0) {
		snprintf(p->reason, sizeof(p->reason), "lost the connection: %s",
		    obx_pg_error_line(p->pg, err, sizeof(err)));
		return OBX_EIO;
	}
	while (block || !PQisBusy(p->pg)) {
		if ((res = PQgetResult(p->pg)) == NULL) {
			p->pg_busy = false;
			break;
		}
		if (PQresultStatus(res) != PGRES_COMMAND_OK && r == 0) {
			snprintf(p->reason, sizeof(p->reason), "could not mark rows published: %s",
			    obx_pg_result_error_line(res, err, sizeof(err)));
			r = OBX_EIO;
		}
		PQclear(res);
	}
	return r;
}

/*
 * While the last reports of a batch are awaited, marks the rows already
 * acknowledged (inside the same transaction, so nothing is published
 * before the COMMIT): the UPDATE's work overlaps the wait.  At most one
 * statement runs at a time.  Returns 0, or OBX_EIO/OBX_ENOMEM.
 */
static int
mark_early(struct poller *p)
{
	size_t count;
	char *q, err[512];

	if (p->pg_busy || !obx_pollcore_mark_early(&p->pc))
		return 0;
	if ((q = mark_statement(p, false, &count)) == NULL)
		return OBX_ENOMEM;
	if (PQsendQuery(p->pg, q) == 0) {
		snprintf(p->reason, sizeof(p->reason), "could not mark rows published: %s",
		    obx_pg_error_line(p->pg, err, sizeof(err)));
		free(q);
		return OBX_EIO;
	}
	free(q);
	p->pg_busy = true;
	return 0;
}

/* Marks the remaining acknowledged rows published and commits.  Returns 0 or OBX_EIO/OBX_ENOMEM. */
static int
mark_and_commit(struct poller *p)
{
	size_t count;
	char *q, err[512];
	PGresult *res;
	int r;

	if ((r = mark_result(p, true)) != 0)
		return r;
	if ((q = mark_statement(p, true, &count)) == NULL)
		return OBX_ENOMEM;
	res = PQexec(p->pg, count > 0 ? q : "COMMIT");
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		snprintf(p->reason, sizeof(p->reason), "could not mark the batch published: %s",
		    obx_pg_result_error_line(res, err, sizeof(err)));
		r = OBX_EIO;
	}
	PQclear(res);
	free(q);
	return r;
}

/*
 * Waits for every delivery report of the batch.  Returns 0, or OBX_ESTATE
 * when a second stop signal abandons the batch or the producer failed
 * fatally (reason filled).
 */
static int
wait_acks(struct poller *p)
{
	int64_t start = obx_mono_ms();
	bool slow = false;

	obx_kafka_poll(&p->kf, 0);
	while (!obx_pollcore_finished(&p->pc)) {
		struct pollfd fds[3] = {
			{ obx_kafka_fd(&p->kf), POLLIN, 0 },
			{ p->opts->signal_fd, POLLIN, 0 },
			{ p->pg_busy ? PQsocket(p->pg) : -1, POLLIN, 0 },
		};
		enum obx_poll_drain d;
		int r;

		if ((r = mark_early(p)) != 0)
			return r;
		if (p->pg_busy)
			fds[2].fd = PQsocket(p->pg);
		if (poll(fds, 3, 1000) < 0 && errno != EINTR) {
			snprintf(p->reason, sizeof(p->reason), "could not poll: %s", strerror(errno));
			return OBX_EIO;
		}
		obx_kafka_poll(&p->kf, 0);
		if ((fds[2].revents & (POLLIN | POLLERR | POLLHUP)) && (r = mark_result(p, false)) != 0)
			return r;
		if (fds[1].revents & POLLIN)
			obx_runner_read_signals(&p->run);
		obx_pollcore_stop(&p->pc, p->signals, p->stop_ms);
		if ((d = obx_pollcore_drain(&p->pc, obx_mono_ms())) == OBX_POLL_DRAIN_ABANDON) {
			snprintf(p->reason, sizeof(p->reason), "stopped: %zu event(s) of the batch unacknowledged, "
			    "their rows stay pending", p->pc.outstanding);
			return OBX_ESTATE;
		}
		if (d == OBX_POLL_DRAIN_DEADLINE) {
			/* the drain deadline: what was acknowledged is marked, the rest stays pending */
			obx_log_warn("stopping at the drain deadline: %zu event(s) of the batch unacknowledged, "
			    "their rows stay pending; the acknowledged ones are marked", p->pc.outstanding);
			break;
		}
		if (p->kf.fatal) {
			snprintf(p->reason, sizeof(p->reason), "the Kafka producer failed: %s", p->kf.fatal_reason);
			return OBX_ESTATE;
		}
		if (!slow && obx_mono_ms() - start > SLOW_ACK_MS) {
			char why[160];

			slow = true;
			snprintf(why, sizeof(why), "waiting for the broker to acknowledge %zu event(s)",
			    p->pc.outstanding);
			obx_log_warn("%s; the claimed rows stay locked until then", why);
			set_state(p, OBX_STATE_BACKPRESSURED, OBX_NOT_READY_NONE, why);
		}
		p->m.inflight_events = p->pc.outstanding;
		obx_runner_publish(&p->run);
	}
	p->m.inflight_events = 0;
	if (slow && obx_pollcore_finished(&p->pc)) {
		obx_log_info("the broker acknowledged the batch after %.1f s", (double)(obx_mono_ms() - start) / 1000.0);
		set_state(p, OBX_STATE_STREAMING, OBX_NOT_READY_NONE, NULL);
	}
	return 0;
}

/*
 * One cycle.  Returns the number of rows claimed (>= 0), or a negative
 * OBX_E* code with p->reason filled (the session ends).
 */
static int
cycle(struct poller *p)
{
	PGresult *res = PQexec(p->pg, p->sql.claim);
	char err[512];
	int n, r;

	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		snprintf(p->reason, sizeof(p->reason), "could not claim rows: %s",
		    obx_pg_result_error_line(res, err, sizeof(err)));
		PQclear(res);
		return OBX_EIO;
	}
	n = PQntuples(res);
	if (n == 0) {
		PQclear(res);
		res = PQexec(p->pg, "COMMIT");
		r = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : OBX_EIO;
		if (r != 0)
			snprintf(p->reason, sizeof(p->reason), "could not end the claim: %s",
			    obx_pg_result_error_line(res, err, sizeof(err)));
		PQclear(res);
		return r;
	}
	obx_log_debug("claimed %d row(s), seq %s to %s", n, PQgetvalue(res, 0, 0), PQgetvalue(res, n - 1, 0));
	if (!p->rel_built && (r = build_rel(p, res)) != 0) {
		PQclear(res);
		snprintf(p->reason, sizeof(p->reason), "out of memory");
		return r;
	}
	p->m.poll_batches++;
	r = produce_batch(p, res);
	PQclear(res);
	if (r == 0)
		r = wait_acks(p);
	if (r == 0)
		r = mark_result(p, true); /* an early marking UPDATE still running */
	if (r == 0)
		r = record_rows(p, p->sql.fail, OBX_PROW_FAILED, true);
	if (r == 0)
		r = record_rows(p, p->sql.give_up, OBX_PROW_GIVEN_UP, false);
	if (r == 0)
		r = mark_and_commit(p);
	if (r == 0 && obx_log_enabled(OBX_LOG_DEBUG)) {
		size_t count[OBX_PROW_NSTATES];

		obx_pollcore_count(&p->pc, count);
		obx_log_debug("committed: %zu published, %zu failed, %zu given up, %zu held back",
		    count[OBX_PROW_ACKED], count[OBX_PROW_FAILED], count[OBX_PROW_GIVEN_UP],
		    count[OBX_PROW_SKIPPED]);
	}
	if (r == OBX_ENOMEM)
		snprintf(p->reason, sizeof(p->reason), "out of memory");
	obx_pollcore_end(&p->pc);
	return r < 0 ? r : n;
}

/* ---- between cycles ---- */

static void
stats(struct poller *p)
{
	PGresult *res = PQexec(p->pg, p->sql.stats);

	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
		p->m.poll_pending_rows = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		p->m.poll_oldest_pending_age_seconds = strtod(PQgetvalue(res, 0, 1), NULL);
		p->m.poll_retrying_rows = strtoll(PQgetvalue(res, 0, 2), NULL, 10);
		p->m.poll_max_attempts_pending = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
	}
	PQclear(res);
	p->next_stats_ms = obx_mono_ms() + STATS_INTERVAL_MS;
}

/*
 * Sleeps up to ms, or until a notification on the channel, a signal or the
 * connection's failure.  Returns 0, or OBX_EIO with reason filled.
 */
static int
idle_wait(struct poller *p, int ms)
{
	int64_t until = obx_mono_ms() + ms;
	PGnotify *nt;
	bool woken = false;

	while (!woken && p->signals == 0) {
		int64_t left = until - obx_mono_ms();
		struct pollfd fds[3] = {
			{ PQsocket(p->pg), POLLIN, 0 },
			{ p->opts->signal_fd, POLLIN, 0 },
			{ obx_kafka_fd(&p->kf), POLLIN, 0 },
		};

		if (left <= 0)
			break;
		if (poll(fds, 3, (int)(left < 1000 ? left : 1000)) < 0 && errno != EINTR) {
			snprintf(p->reason, sizeof(p->reason), "could not poll: %s", strerror(errno));
			return OBX_EIO;
		}
		if (fds[1].revents & POLLIN)
			obx_runner_read_signals(&p->run);
		if (fds[2].revents & POLLIN)
			obx_kafka_poll(&p->kf, 0);
		if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
			char err[512];

			if (PQconsumeInput(p->pg) == 0) {
				snprintf(p->reason, sizeof(p->reason), "lost the connection: %s",
				    obx_pg_error_line(p->pg, err, sizeof(err)));
				return OBX_EIO;
			}
		}
		while ((nt = PQnotifies(p->pg)) != NULL) {
			woken = true;
			PQfreemem(nt);
		}
		obx_runner_publish(&p->run);
	}
	return 0;
}

/* Connects, checks the table and LISTENs.  Returns 0 or a negative code with reason filled. */
static int
session_open(struct poller *p)
{
	char err[512];
	PGresult *res;

	if (obx_pg_connect(p->cfg->conninfo, p->cfg->password, NULL, NULL, "outboxd", &p->pg, err, sizeof(err)) != 0) {
		snprintf(p->reason, sizeof(p->reason), "could not connect to the server: %s", err);
		return OBX_EIO;
	}
	res = PQexec(p->pg, p->sql.check);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		bool missing = state != NULL && (strcmp(state, "42703") == 0 || strcmp(state, "42P01") == 0);

		const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

		snprintf(p->reason, sizeof(p->reason), "could not read the outbox table %s.%s for polling: "
		    "%s%s", p->cfg->table_schema, p->cfg->table_name,
		    primary != NULL ? primary : obx_pg_result_error_line(res, err, sizeof(err)),
		    missing ? " (apply sql/008_polling.sql, or map the columns in [outbox])" : "");
		PQclear(res);
		return missing ? OBX_ECONFIG : OBX_EIO;
	}
	PQclear(res);
	p->listening = false;
	if (p->cfg->poll_notify_channel[0] != '\0') {
		char chan[256] = "", q[300];

		if (obx_poll_quote_ident(p->cfg->poll_notify_channel, chan, sizeof(chan)) == 0) {
			snprintf(q, sizeof(q), "LISTEN %s", chan);
			res = PQexec(p->pg, q);
			p->listening = PQresultStatus(res) == PGRES_COMMAND_OK;
			if (!p->listening)
				obx_log_warn("could not listen on channel %s, polling every %d ms only: %s",
				    p->cfg->poll_notify_channel, p->cfg->poll_interval_ms,
				    obx_pg_result_error_line(res, err, sizeof(err)));
			PQclear(res);
		}
	}
	p->rel_built = false;
	return 0;
}

static void
session_close(struct poller *p)
{
	PQfinish(p->pg);
	p->pg = NULL;
	p->pg_busy = false;
}

/* ---- one session, as the runner drives it ---- */

static bool
poll_open(void *ctx)
{
	struct poller *p = ctx;

	p->published_at_open = p->m.events_published;
	if ((p->rc = session_open(p)) != 0)
		return false;
	obx_log_info("polling %s.%s: claims of up to %lld rows, %lld of them sent at a time, every %d ms "
	    "when idle%s%s", p->cfg->table_schema, p->cfg->table_name, p->cfg->poll_batch,
	    obx_poll_claim_rows(p->cfg),
	    p->cfg->poll_interval_ms,
	    p->listening ? ", woken by NOTIFY on " : "", p->listening ? p->cfg->poll_notify_channel : "");
	set_state(p, OBX_STATE_STREAMING, OBX_NOT_READY_NONE, NULL);
	stats(p);
	return true;
}

/* One connection's life: p->rc becomes 0 on a clean stop, a negative code otherwise. */
static void
poll_run(void *ctx)
{
	struct poller *p = ctx;
	int r, n;

	for (;;) {
		if (p->signals > 0) {
			snprintf(p->reason, sizeof(p->reason), "stopped");
			r = 0;
			break;
		}
		if (!p->kf_open) {
			char err[512];

			if (obx_kafka_open(&p->kf, p->cfg, NULL, on_delivery, p, err, sizeof(err)) != 0) {
				snprintf(p->reason, sizeof(p->reason), "%s", err);
				r = OBX_ECONFIG;
				break;
			}
			p->kf_open = true;
			p->kf.metrics = &p->m;
		}
		n = cycle(p);
		if (n < 0) {
			r = n;
			break;
		}
		if (obx_mono_ms() >= p->next_stats_ms)
			stats(p);
		obx_runner_publish(&p->run);
		if (n == 0 && (r = idle_wait(p, p->cfg->poll_interval_ms)) != 0)
			break;
	}
	p->rc = r;
}

static void
poll_close(void *ctx, bool opened, struct obx_session_result *out)
{
	struct poller *p = ctx;

	(void)opened;
	session_close(p);
	out->broker = p->kf_open && p->kf.fatal; /* read before the close clears it */
	if (p->kf_open && (p->rc != 0 || p->signals > 0)) {
		/* rows not yet marked stay pending: whatever is still queued is dropped */
		obx_kafka_close(&p->kf, 1000);
		p->kf_open = false;
	}
	out->end = p->rc == 0 ? OBX_RUN_STOP : p->rc == OBX_ECONFIG || p->rc == OBX_ENOMEM ?
	    OBX_RUN_FATAL : OBX_RUN_RETRY;
	out->reason = p->reason;
	out->published = p->m.events_published;
	out->progressed = p->m.events_published > p->published_at_open;
}

static const struct obx_runner_ops poll_runner_ops = {
	.open = poll_open,
	.run = poll_run,
	.close = poll_close,
	.stop = poll_stop,
	.reload = poll_reload,
	.live = poll_live,
	.nlive = sizeof(poll_live) / sizeof(poll_live[0]),
	.title = poll_title,
	.interrupted_names_reason = true,
};

/* ---- the process ---- */

int
obx_poll_run(const struct obx_config *cfg, const struct obx_run_opts *opts)
{
	struct poller p;
	int rc = 1;

	memset(&p, 0, sizeof(p));
	p.cfg = cfg;
	p.opts = opts;
	p.log_level = cfg->log_level;
	p.m.poll_mode = 1;
	p.m.poll_pending_rows = -1;
	p.m.state = OBX_STATE_CONNECTING;
	p.m.not_ready = OBX_NOT_READY_POSTGRES;
	obx_log_context(NULL, "poll"); /* no slot: polling reads the table */
#ifdef OBX_TEST_HOOKS
	if (getenv("OBX_TEST_KILL_AFTER_ACKS") != NULL)
		p.test_kill_after = atol(getenv("OBX_TEST_KILL_AFTER_ACKS"));
#endif
	snprintf(p.m.info_table, sizeof(p.m.info_table), "%s.%s", cfg->table_schema, cfg->table_name);
	obx_pg_conninfo_dbname(cfg->conninfo, p.m.info_database, sizeof(p.m.info_database));
	if (obx_poll_sql_build(&p.sql, cfg) != 0 || obx_event_builder_init(&p.eb, cfg) != 0) {
		obx_log_error("out of memory");
		goto out;
	}
	if (obx_runner_init(&p.run, cfg, opts, &p.m, &poll_runner_ops, &p) != 0)
		goto out;
	rc = obx_runner_run(&p.run);
out:
	if (p.kf_open)
		obx_kafka_close(&p.kf, 1000);
	obx_runner_reset(&p.run);
	obx_pollcore_reset(&p.pc);
	free(p.hdrs);
	free(p.datums);
	obx_rel_free(&p.rel);
	obx_event_builder_reset(&p.eb);
	obx_poll_sql_reset(&p.sql);
	return rc;
}
