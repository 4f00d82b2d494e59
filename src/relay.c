/*
 * relay.c - the loop that moves outbox INSERTs from the replication stream
 * to Kafka and confirms the slot only up to what the broker acknowledged.
 *
 * Each session (connect .. disconnect) gets a fresh producer and a new
 * stream generation; reports from an older generation are never counted.
 * On a transient failure the session ends: the producer drops what it still
 * holds, the ack tracker is reset, and the next session resumes from the
 * slot's confirmed position (duplicates possible, loss not).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "obx/acktrack.h"
#include "obx/err.h"
#include "obx/event.h"
#include "obx/http.h"
#include "obx/kafka.h"
#include "obx/log.h"
#include "obx/metrics.h"
#include "obx/pgoutput.h"
#include "obx/pgstream.h"
#include "obx/relay.h"
#include "obx/relcache.h"
#include "obx/streambuf.h"
#include "obx/walmsg.h"

#define DRAIN_TIMEOUT_MS 30000
#define STATUS_MIN_GAP_MS 100
#define READ_BATCH 2000
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 30000

/* opaque layout: bit 63 = dead-letter copy, bits 48..62 = generation, 0..47 = ticket */
#define OP_DEAD_LETTER (1ULL << 63)
#define OP_GEN_SHIFT 48
#define OP_GEN_MASK 0x7fffULL
#define OP_TICKET_MASK ((1ULL << 48) - 1)

enum session_end { END_STOP, END_RETRY, END_FATAL };

struct relay {
	const struct obx_config *cfg;
	const struct obx_run_opts *opts;
	struct obx_pgstream st;
	struct obx_kafka kf;
	struct obx_pgoutput dec;
	struct obx_relcache rels;
	struct obx_event_builder eb;
	struct obx_acktrack ack;
	uint32_t gen;

	bool in_txn;
	struct obx_txninfo txn;
	uint32_t txn_events;

	/* streaming = on: rows of in-progress transactions until their Stream Commit */
	struct obx_streambuf sbuf;
	uint32_t stream_xid;  /* the transaction of the current Stream Start block */
	bool streaming_off;   /* the buffer overflowed once: the server buffers from now on */

	/* a logical decoding message seen as a row of a table with the message's keys */
	struct obx_rel mrel;
	struct obx_relcol mcols[64];
	struct obx_pg_datum mdat[64];
	char *mdumps[64];
	size_t nmdumps;
	json_t *mjson;
	unsigned mversion;

	obx_lsn received;
	obx_lsn sent_flush;
	obx_lsn server_wal_end;
	int64_t last_status_ms;
	bool status_now;
	int status_interval_ms;

	uint64_t inflight;
	uint64_t inflight_bytes;
	uint64_t published;

	int signals;
	bool draining;
	int64_t drain_deadline;

	enum session_end end; /* set when the session must end */
	bool ending;
	bool streamed; /* the last session got as far as streaming */
	bool paused;   /* backpressure: not reading the stream */
	bool standby;  /* the slot is in use by another instance */
	bool end_kafka; /* the session ended because of the broker side */
	struct obx_metrics m;
	struct obx_http http;
	bool http_on;
	int64_t last_progress_ms;
	uint64_t progress_events;
	uint64_t progress_txns;
	enum obx_state title_state;
	bool was_standby;
	bool first_message; /* logged once per process */
#ifdef OBX_TEST_HOOKS
	long test_fatal_after;
	long test_produced;
#endif
	char end_reason[1024];
};

static int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void end_session(struct relay *r, enum session_end how, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
end_session(struct relay *r, enum session_end how, const char *fmt, ...)
{
	va_list ap;

	if (r->ending && r->end == END_FATAL)
		return; /* the first fatal reason wins */
	va_start(ap, fmt);
	vsnprintf(r->end_reason, sizeof(r->end_reason), fmt, ap);
	va_end(ap);
	r->end = how;
	r->ending = true;
}

static uint64_t
make_opaque(const struct relay *r, uint64_t ticket, bool dead_letter)
{
	return (dead_letter ? OP_DEAD_LETTER : 0) | ((uint64_t)(r->gen & OP_GEN_MASK) << OP_GEN_SHIFT) |
	    (ticket & OP_TICKET_MASK);
}

static const char *
header_value(const rd_kafka_message_t *m, const char *name, char *buf, size_t len)
{
	rd_kafka_headers_t *h = NULL;
	const void *v;
	size_t sz;

	buf[0] = '\0';
	if (rd_kafka_message_headers(m, &h) == 0 && rd_kafka_header_get_last(h, name, &v, &sz) == 0 &&
	    v != NULL)
		snprintf(buf, len, "%.*s", (int)sz, (const char *)v);
	return buf;
}

/* Re-sends a rejected record to the dead-letter topic; counts as acked when that succeeds. */
static void
dead_letter_message(struct relay *r, const rd_kafka_message_t *m, uint64_t ticket,
    const char *reason)
{
	rd_kafka_headers_t *h = NULL;
	struct obx_header hs[64];
	size_t n = 0;
	const char *name;
	const void *v;
	size_t sz;
	rd_kafka_resp_err_t err;

	if (rd_kafka_message_headers(m, &h) == 0)
		for (size_t i = 0; n < 63 && rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0; i++)
			hs[n++] = (struct obx_header){ name, v, sz };
	hs[n++] = (struct obx_header){ "original_topic", rd_kafka_topic_name(m->rkt),
		strlen(rd_kafka_topic_name(m->rkt)) };
	err = obx_kafka_produce(&r->kf, r->cfg->dead_letter_topic, m->key, m->key_len, m->payload,
	    m->len, rd_kafka_message_timestamp(m, NULL), hs, n, "error", reason,
	    make_opaque(r, ticket, true));
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
		end_session(r, END_FATAL, "could not dead-letter event to %s: %s",
		    r->cfg->dead_letter_topic, rd_kafka_err2str(err));
		return;
	}
	r->inflight++;
	r->inflight_bytes += m->len + m->key_len;
}

static void
on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *m)
{
	struct relay *r = ctx;
	uint64_t ticket = opaque & OP_TICKET_MASK;
	bool dl = (opaque & OP_DEAD_LETTER) != 0;
	char id[128], lsn[32];

	if (((opaque >> OP_GEN_SHIFT) & OP_GEN_MASK) != (r->gen & OP_GEN_MASK))
		return; /* an earlier stream's report: never an ack now (invariant 8) */
	r->inflight--;
	r->inflight_bytes -= m->len + m->key_len;
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
		int64_t committed = obx_ack_ticket_time(&r->ack, ticket);

		if (committed != 0)
			obx_metrics_observe(&r->m, (double)(obx_pg_now() - committed) / 1e6);
		if (dl)
			r->m.events_dead_lettered++;
		if (obx_ack_ack(&r->ack, ticket) != 0) {
			end_session(r, END_FATAL, "delivery report for unknown ticket %" PRIu64, ticket);
			return;
		}
		if (!dl)
			r->published++;
		return;
	}
	if (m->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || m->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
		return; /* this session is being torn down */
	obx_metrics_kafka_error(&r->m, rd_kafka_err2name(m->err));
	header_value(m, "id", id, sizeof(id));
	header_value(m, "lsn", lsn, sizeof(lsn));
	if (dl) {
		end_session(r, END_FATAL, "could not dead-letter event id=%s lsn=%s to %s: %s", id, lsn,
		    r->cfg->dead_letter_topic, rd_kafka_err2str(m->err));
		return;
	}
	if (!obx_kafka_err_is_permanent(m->err)) {
		/* timeouts (a user-set message.timeout.ms) and the like: rewind, never skip */
		r->end_kafka = true;
		end_session(r, END_RETRY, "delivery of event id=%s lsn=%s failed: %s; rewinding to the slot",
		    id, lsn, rd_kafka_err2str(m->err));
		return;
	}
	if (r->cfg->on_error == OBX_ON_ERROR_DEAD_LETTER) {
		obx_log_warn("event id=%s lsn=%s rejected by the broker for %s (%s): dead-lettering it to %s",
		    id, lsn, rd_kafka_topic_name(m->rkt), rd_kafka_err2str(m->err), r->cfg->dead_letter_topic);
		dead_letter_message(r, m, ticket, rd_kafka_err2str(m->err));
		return;
	}
	end_session(r, END_FATAL, "event id=%s lsn=%s rejected by the broker for topic %s: %s "
	    "(on_error = stop: nothing after it is confirmed)", id, lsn, rd_kafka_topic_name(m->rkt),
	    rd_kafka_err2str(m->err));
}

static void
send_status(struct relay *r, bool reply_requested)
{
	char err[512];
	obx_lsn flush = obx_ack_flushable(&r->ack);

	if (obx_pgstream_send_status(&r->st, r->received, flush, reply_requested, err, sizeof(err)) != 0) {
		end_session(r, END_RETRY, "could not send status update: %s", err);
		return;
	}
	if (flush > r->sent_flush && obx_log_enabled(OBX_LOG_DEBUG)) {
		char a[OBX_LSN_STRLEN];

		obx_log_debug("confirmed %s", obx_lsn_format(flush, a, sizeof(a)));
	}
	if (flush > r->sent_flush)
		r->sent_flush = flush;
	r->last_status_ms = now_ms();
	r->status_now = false;
}

/* Sends a status update when one is due; the server must hear from us regularly. */
static void
maybe_status(struct relay *r)
{
	int64_t now = now_ms();
	int64_t since = now - r->last_status_ms;

	if (r->status_now || since >= r->status_interval_ms) {
		/* idle: ask for a keepalive so the confirmed position can follow the WAL end */
		send_status(r, since >= r->status_interval_ms && obx_ack_idle(&r->ack));
	} else if (obx_ack_flushable(&r->ack) > r->sent_flush && since >= STATUS_MIN_GAP_MS) {
		send_status(r, false);
	}
}

/* Writes every column of the row as a JSON object (for a dead-lettered row). */
static char *
row_as_json(const struct obx_rel *rel, const struct obx_pg_tuple *t)
{
	json_t *o = json_object();
	char *s;

	for (uint16_t i = 0; i < t->ncols && i < rel->natts; i++) {
		const struct obx_pg_datum *d = &t->cols[i];

		json_object_set_new(o, rel->cols[i].name, d->kind == 'n' || d->kind == 'u' ? json_null() :
		    json_stringn((const char *)d->data, d->len));
	}
	s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

static bool
produce_with_retry(struct relay *r, rd_kafka_resp_err_t *errp, const char *topic, const void *key,
    size_t keylen, const void *value, size_t len, int64_t ts, const struct obx_header *h, size_t nh,
    const char *xname, const char *xval, uint64_t opaque)
{
	rd_kafka_resp_err_t err;

	for (;;) {
		err = obx_kafka_produce(&r->kf, topic, key, keylen, value, len, ts, h, nh, xname, xval,
		    opaque);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		/* the producer's queue is sized above our caps; if it fills anyway, wait in place */
		obx_kafka_poll(&r->kf, 50);
		maybe_status(r);
		if (r->ending)
			break;
	}
	*errp = err;
	return err == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/*
 * A row that cannot become an event, or an event the producer refused at
 * once.  on_error = stop ends the run without confirming past it;
 * dead_letter sends the whole row as JSON (or, when even that is refused,
 * the identifying headers alone) to the dead-letter topic.
 */
static void
poison(struct relay *r, const struct obx_rel *rel, const struct obx_pg_tuple *t, uint64_t ticket,
    const char *id, const char *topic, const char *reason)
{
	char lsn[OBX_LSN_STRLEN], seq[16], xid[16];
	struct obx_header h[5];
	size_t nh = 4;
	rd_kafka_resp_err_t err;
	char *row;
	int64_t ts = (r->txn.commit_time + OBX_PG_EPOCH_OFFSET_US) / 1000;

	obx_lsn_format(r->txn.commit_lsn, lsn, sizeof(lsn));
	if (r->cfg->on_error == OBX_ON_ERROR_STOP) {
		end_session(r, END_FATAL, "event id=%s at lsn %s (xid %" PRIu32 ") cannot be published: %s "
		    "(on_error = stop: nothing after it is confirmed)", id ? id : "?", lsn, r->txn.xid,
		    reason);
		return;
	}
	snprintf(seq, sizeof(seq), "%" PRIu32, r->txn_events - 1);
	snprintf(xid, sizeof(xid), "%" PRIu32, r->txn.xid);
	h[0] = (struct obx_header){ "lsn", lsn, strlen(lsn) };
	h[1] = (struct obx_header){ "seq", seq, strlen(seq) };
	h[2] = (struct obx_header){ "xid", xid, strlen(xid) };
	h[3] = (struct obx_header){ "id", id, id ? strlen(id) : 0 };
	if (topic != NULL)
		h[nh++] = (struct obx_header){ "original_topic", topic, strlen(topic) };
	row = row_as_json(rel, t);
	if (row == NULL) {
		end_session(r, END_FATAL, "out of memory");
		return;
	}
	obx_log_warn("event id=%s at lsn %s cannot be published (%s): dead-lettering the row to %s",
	    id ? id : "?", lsn, reason, r->cfg->dead_letter_topic);
	if (!produce_with_retry(r, &err, r->cfg->dead_letter_topic, NULL, 0, row, strlen(row), ts, h, nh,
	    "error", reason, make_opaque(r, ticket, true)) && !r->ending &&
	    obx_kafka_err_is_permanent(err)) {
		/* the row itself is too large for a record: send what identifies it */
		if (produce_with_retry(r, &err, r->cfg->dead_letter_topic, NULL, 0, NULL, 0, ts, h, nh,
		    "error", reason, make_opaque(r, ticket, true))) {
			r->inflight++;
			free(row);
			return;
		}
	} else if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
		r->inflight++;
		r->inflight_bytes += strlen(row);
		free(row);
		return;
	}
	if (!r->ending)
		end_session(r, END_FATAL, "could not dead-letter event id=%s at lsn %s: %s", id ? id : "?",
		    lsn, rd_kafka_err2str(err));
	free(row);
}

/*
 * Publishes one outbox row of the current transaction (r->txn): registers
 * it with the ack tracker, builds the record and hands it to the producer,
 * or follows on_error when it cannot become one.
 */
static void
publish_row(struct relay *r, const struct obx_rel *rel, const struct obx_pg_tuple *tuple)
{
	struct obx_event ev;
	char why[512];
	uint64_t ticket;
	rd_kafka_resp_err_t err;
	int rc;

	if (obx_ack_add_event(&r->ack, &ticket) != 0) {
		end_session(r, END_FATAL, "out of memory");
		return;
	}
	r->txn_events++;
	rc = obx_event_build(&r->eb, rel, tuple, &r->txn, r->txn_events - 1, &ev, why, sizeof(why));
	if (rc == OBX_ENOMEM) {
		end_session(r, END_FATAL, "out of memory");
		return;
	}
	if (rc != 0) {
		poison(r, rel, tuple, ticket, NULL, NULL, why);
		return;
	}
	if (!produce_with_retry(r, &err, ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms,
	    ev.headers, ev.nheaders, NULL, NULL, make_opaque(r, ticket, false))) {
		if (r->ending)
			return;
		if (obx_kafka_err_is_permanent(err) || err == RD_KAFKA_RESP_ERR__INVALID_ARG)
			poison(r, rel, tuple, ticket, ev.id, ev.topic, rd_kafka_err2str(err));
		else
			end_session(r, END_RETRY, "could not produce event id=%s: %s", ev.id,
			    rd_kafka_err2str(err));
		return;
	}
	r->inflight++;
	r->inflight_bytes += ev.len + ev.keylen;
#ifdef OBX_TEST_HOOKS
	/* test builds only: provoke a producer fatal error after N events (OBX_TEST_FATAL_AFTER) */
	if (r->test_fatal_after > 0 && ++r->test_produced == r->test_fatal_after) {
		obx_log_warn("test hook: raising a producer fatal error");
		rd_kafka_test_fatal_error(r->kf.rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
		    "test hook");
	}
#endif
}

/* A row of the current transaction that cannot become an event: on_error decides. */
static void
poison_row(struct relay *r, const struct obx_rel *rel, const struct obx_pg_tuple *t, const char *why)
{
	uint64_t ticket;

	if (obx_ack_add_event(&r->ack, &ticket) != 0) {
		end_session(r, END_FATAL, "out of memory");
		return;
	}
	r->txn_events++;
	poison(r, rel, t, ticket, NULL, NULL, why);
}

/* A row of a streamed transaction: kept until its Stream Commit or Abort. */
static void
buffer_row(struct relay *r, uint32_t subxid, const struct obx_rel *rel, const struct obx_pg_tuple *t)
{
	char a[OBX_LSN_STRLEN];
	int rc = obx_streambuf_add(&r->sbuf, r->stream_xid, subxid, rel, t);

	if (rc == OBX_EFULL) {
		/* the server then decodes the transaction whole, spilling to its own disk */
		r->streaming_off = true;
		end_session(r, END_RETRY, "streamed transaction %" PRIu32 " holds more outbox rows than "
		    "[source] stream_buffer (%lld bytes) after lsn %s; reconnecting with streaming off",
		    r->stream_xid, r->cfg->stream_buffer_bytes, obx_lsn_format(r->received, a, sizeof(a)));
		return;
	}
	if (rc != 0)
		end_session(r, END_FATAL, rc == OBX_ENOMEM ? "out of memory" :
		    "streamed change for transaction %" PRIu32 " outside of Stream Start", r->stream_xid);
	r->m.stream_buffer_bytes = r->sbuf.bytes;
}

static void
handle_insert(struct relay *r, const struct obx_pgmsg *m)
{
	const struct obx_rel *rel = obx_relcache_get(&r->rels, m->u.insert.relid);

	if (rel == NULL) {
		end_session(r, END_FATAL, "Insert for relation %" PRIu32 " that no Relation message announced",
		    m->u.insert.relid);
		return;
	}
	if (!obx_event_is_outbox(&r->eb, rel))
		return;
	if (r->dec.in_stream) {
		buffer_row(r, m->xid, rel, &m->u.insert.tuple);
		return;
	}
	if (!r->in_txn) {
		end_session(r, END_FATAL, "Insert outside of a transaction");
		return;
	}
	publish_row(r, rel, &m->u.insert.tuple);
}

static void
message_row_free(struct relay *r)
{
	for (size_t i = 0; i < r->nmdumps; i++)
		free(r->mdumps[i]);
	r->nmdumps = 0;
	json_decref(r->mjson);
	r->mjson = NULL;
}

/*
 * Turns the JSON object of a logical decoding message into a row of a
 * relation whose columns are the object's keys, so the outbox mapping
 * applies unchanged: strings are column text as they are, other values
 * their compact JSON, null a NULL.  An unparsable content becomes a row
 * with one column "content" (for the dead-letter record) and *why says so.
 */
static int
message_row(struct relay *r, const struct obx_pgmsg *m, struct obx_pg_tuple *t, char *why,
    size_t whylen)
{
	json_error_t jerr;
	const char *k;
	json_t *v;
	uint16_t n = 0;

	message_row_free(r);
	r->mrel = (struct obx_rel){ .relid = 0, .nspname = r->cfg->table_schema,
		.relname = r->cfg->table_name, .cols = r->mcols, .version = ++r->mversion };
	obx_event_builder_forget(&r->eb);
	r->mjson = json_loadb((const char *)m->u.message.content, m->u.message.len, 0, &jerr);
	why[0] = '\0';
	if (r->mjson == NULL || !json_is_object(r->mjson) || json_object_size(r->mjson) > 64) {
		snprintf(why, whylen, r->mjson == NULL ? "message content is not JSON: %s" :
		    !json_is_object(r->mjson) ? "message content is not a JSON object%s" :
		    "message content has more than 64 keys%s", r->mjson == NULL ? jerr.text : "");
		r->mcols[0] = (struct obx_relcol){ "content", 25 };
		r->mdat[0] = (struct obx_pg_datum){ 't', m->u.message.content, m->u.message.len };
		r->mrel.natts = 1;
		*t = (struct obx_pg_tuple){ 1, r->mdat };
		return OBX_EINVAL;
	}
	json_object_foreach(r->mjson, k, v) {
		r->mcols[n] = (struct obx_relcol){ (char *)k, json_is_object(v) || json_is_array(v) ? 3802 : 25 };
		if (json_is_null(v)) {
			r->mdat[n] = (struct obx_pg_datum){ 'n', NULL, 0 };
		} else if (json_is_string(v)) {
			r->mdat[n] = (struct obx_pg_datum){ 't', (const uint8_t *)json_string_value(v),
				(uint32_t)json_string_length(v) };
		} else {
			char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

			if (d == NULL)
				return OBX_ENOMEM;
			r->mdumps[r->nmdumps++] = d;
			r->mdat[n] = (struct obx_pg_datum){ 't', (const uint8_t *)d, (uint32_t)strlen(d) };
		}
		n++;
	}
	r->mrel.natts = n;
	*t = (struct obx_pg_tuple){ n, r->mdat };
	return 0;
}

/* A logical decoding message: with [source] messages = on, ours become events. */
static void
handle_message(struct relay *r, const struct obx_pgmsg *m)
{
	struct obx_pg_tuple t;
	char why[512], a[OBX_LSN_STRLEN];
	int rc;

	if (!r->cfg->messages || strcmp(m->u.message.prefix, r->cfg->message_prefix) != 0)
		return;
	if (!(m->u.message.flags & 1)) {
		r->m.messages_refused++;
		obx_log_warn("non-transactional message with prefix '%s' at lsn %s not published: "
		    "only pg_logical_emit_message(true, ...) is tied to a commit", m->u.message.prefix,
		    obx_lsn_format(m->u.message.lsn, a, sizeof(a)));
		return;
	}
	if (!r->dec.in_stream && !r->in_txn) {
		end_session(r, END_FATAL, "transactional message outside of a transaction at lsn %s",
		    obx_lsn_format(m->u.message.lsn, a, sizeof(a)));
		return;
	}
	rc = message_row(r, m, &t, why, sizeof(why));
	if (rc == OBX_ENOMEM) {
		end_session(r, END_FATAL, "out of memory");
	} else if (r->dec.in_stream) {
		buffer_row(r, m->xid, &r->mrel, &t); /* a bad one is judged at Stream Commit again */
	} else if (rc != 0) {
		poison_row(r, &r->mrel, &t, why);
	} else {
		publish_row(r, &r->mrel, &t);
	}
	message_row_free(r);
}

static bool backpressured(const struct relay *r);

/* After a poll: a producer fatal error ends the session (recreate and rewind).  True when it did. */
static bool
producer_failed(struct relay *r)
{
	if (!r->kf.fatal)
		return false;
	r->end_kafka = true;
	obx_metrics_kafka_error(&r->m, "_FATAL");
	end_session(r, END_RETRY, "producer fatal error: %s; recreating it and rewinding to the slot",
	    r->kf.fatal_reason);
	return true;
}

/* Waits (serving delivery reports and status updates) until the in-flight caps allow more. */
static void
wait_inflight(struct relay *r)
{
	while (backpressured(r) && !r->ending) {
		obx_kafka_poll(&r->kf, 50);
		if (producer_failed(r))
			break;
		maybe_status(r);
		obx_pgstream_flush(&r->st);
	}
}

/* Stream Commit: the buffered rows become events of one transaction, in insertion order. */
static void
stream_commit(struct relay *r, const struct obx_pgmsg *m)
{
	const struct obx_sbuf_txn *t = obx_streambuf_get(&r->sbuf, m->u.stream_commit.xid);
	char a[OBX_LSN_STRLEN];

	if (r->in_txn || obx_ack_begin_at(&r->ack, m->u.stream_commit.commit_time) != 0) {
		end_session(r, END_FATAL, "Stream Commit inside an open transaction at lsn %s",
		    obx_lsn_format(m->u.stream_commit.commit_lsn, a, sizeof(a)));
		return;
	}
	r->in_txn = true;
	r->txn.commit_lsn = m->u.stream_commit.commit_lsn;
	r->txn.xid = m->u.stream_commit.xid;
	r->txn.commit_time = m->u.stream_commit.commit_time;
	r->txn_events = 0;
	obx_event_builder_forget(&r->eb);
	for (size_t i = 0; t != NULL && i < t->nrows && !r->ending; i++) {
		const struct obx_sbuf_row *row = &t->rows[i];
		const struct obx_rel *rel = &t->rels[row->rel];

		wait_inflight(r);
		if (r->ending)
			break;
		if (rel->relid == 0 && rel->natts == 1 && strcmp(rel->cols[0].name, "content") == 0) {
			/* a message whose content was not an object: say why under on_error */
			struct obx_pgmsg mm = { .type = 'M' };
			struct obx_pg_tuple mt;
			char why[512];
			int rc;

			mm.u.message.content = row->tuple.cols[0].data;
			mm.u.message.len = row->tuple.cols[0].len;
			rc = message_row(r, &mm, &mt, why, sizeof(why));
			if (rc != 0) {
				if (rc == OBX_ENOMEM)
					end_session(r, END_FATAL, "out of memory");
				else
					poison_row(r, &r->mrel, &mt, why);
				message_row_free(r);
				continue;
			}
			message_row_free(r);
		}
		publish_row(r, rel, &row->tuple);
	}
	obx_event_builder_forget(&r->eb);
	if (r->ending)
		return;
	if (obx_ack_commit(&r->ack, m->u.stream_commit.end_lsn) != 0) {
		end_session(r, END_FATAL, "Stream Commit without its transaction at lsn %s",
		    obx_lsn_format(m->u.stream_commit.commit_lsn, a, sizeof(a)));
		return;
	}
	r->in_txn = false;
	r->m.transactions++;
	obx_streambuf_drop(&r->sbuf, m->u.stream_commit.xid);
	obx_ack_streams_open(&r->ack, obx_streambuf_open(&r->sbuf));
	r->m.stream_buffer_bytes = r->sbuf.bytes;
	if (m->u.stream_commit.end_lsn > r->received)
		r->received = m->u.stream_commit.end_lsn;
}

static void
handle_xlogdata(struct relay *r, const struct obx_walmsg *w)
{
	struct obx_pgmsg m;
	char lsn[OBX_LSN_STRLEN];
	int rc;

	if (w->data_start > r->received)
		r->received = w->data_start;
	if (w->wal_end > r->server_wal_end)
		r->server_wal_end = w->wal_end;
	rc = obx_pgoutput_decode(&r->dec, w->payload, w->payload_len, &m);
	if (rc != 0) {
		end_session(r, END_FATAL, "could not decode pgoutput %s message (type 0x%02x) at offset %zu, "
		    "lsn %s: %s", w->payload_len ? obx_pgoutput_type_name((char)w->payload[0]) : "empty",
		    w->payload_len ? w->payload[0] : 0, r->dec.error_offset,
		    obx_lsn_format(w->data_start ? w->data_start : r->received, lsn, sizeof(lsn)),
		    obx_strerror(rc));
		return;
	}
	switch (m.type) {
	case 'B':
		if (obx_ack_begin_at(&r->ack, m.u.begin.commit_time) != 0) {
			end_session(r, END_FATAL, "Begin inside an open transaction at lsn %s",
			    obx_lsn_format(m.u.begin.final_lsn, lsn, sizeof(lsn)));
			return;
		}
		r->in_txn = true;
		r->txn.commit_lsn = m.u.begin.final_lsn;
		r->txn.xid = m.u.begin.xid;
		r->txn.commit_time = m.u.begin.commit_time;
		r->txn_events = 0;
		break;
	case 'C':
		if (!r->in_txn || obx_ack_commit(&r->ack, m.u.commit.end_lsn) != 0) {
			end_session(r, END_FATAL, "Commit without Begin at lsn %s",
			    obx_lsn_format(m.u.commit.commit_lsn, lsn, sizeof(lsn)));
			return;
		}
		r->in_txn = false;
		r->m.transactions++;
		if (m.u.commit.end_lsn > r->received)
			r->received = m.u.commit.end_lsn;
		break;
	case 'R':
		if (obx_relcache_update(&r->rels, &m) != 0)
			end_session(r, END_FATAL, "out of memory");
		break;
	case 'I':
		handle_insert(r, &m);
		break;
	case 'M':
		handle_message(r, &m);
		break;
	case 'S':
		if (obx_streambuf_start(&r->sbuf, m.u.stream_start.xid) != 0) {
			end_session(r, END_FATAL, "out of memory");
			return;
		}
		r->stream_xid = m.u.stream_start.xid;
		obx_ack_streams_open(&r->ack, obx_streambuf_open(&r->sbuf));
		break;
	case 'c':
		stream_commit(r, &m);
		break;
	case 'A': {
		size_t n = obx_streambuf_abort(&r->sbuf, m.u.stream_abort.xid, m.u.stream_abort.subxid);

		r->m.stream_aborted_events += n;
		if (n > 0)
			obx_log_debug("streamed transaction %" PRIu32 " rolled back %s %" PRIu32 ": %zu "
			    "buffered event(s) discarded", m.u.stream_abort.xid,
			    m.u.stream_abort.subxid == m.u.stream_abort.xid ? "whole, xid" : "savepoint, subxid",
			    m.u.stream_abort.subxid, n);
		obx_ack_streams_open(&r->ack, obx_streambuf_open(&r->sbuf));
		r->m.stream_buffer_bytes = r->sbuf.bytes;
		break;
	}
	case 'b': case 'P': case 'K': case 'r': case 'p':
		end_session(r, END_FATAL, "unexpected two-phase %s message at lsn %s: outboxd does not "
		    "request two_phase", obx_pgoutput_type_name(m.type),
		    obx_lsn_format(w->data_start ? w->data_start : r->received, lsn, sizeof(lsn)));
		return;
	default:
		/* Stream Stop, Origin, Type, Update, Delete, Truncate: nothing to publish */
		break;
	}
}

static bool
backpressured(const struct relay *r)
{
	if (r->inflight == 0)
		return false; /* always allow one event, however large */
	return r->inflight >= (uint64_t)r->cfg->max_inflight ||
	    r->inflight_bytes >= (uint64_t)r->cfg->max_inflight_bytes;
}

static void
read_stream(struct relay *r)
{
	char err[1024];

	/* when stopping, read on to the end of an open transaction: stopping inside one
	 * would leave its acknowledged events unconfirmed, to be sent again */
	for (int i = 0; i < READ_BATCH && !r->ending && !(r->draining && !r->in_txn) && !backpressured(r); i++) {
		const uint8_t *buf;
		size_t len;
		struct obx_walmsg w;
		int n = obx_pgstream_read(&r->st, &buf, &len, err, sizeof(err));

		if (n == 0)
			return;
		if (n < 0) {
			end_session(r, END_RETRY, "replication stream lost: %s", err);
			return;
		}
		if (!r->first_message) {
			/* start-up is measured to here (bench/): process start to the first CopyData */
			obx_log_info("first replication message received");
			r->first_message = true;
		}
		if (obx_walmsg_parse(buf, len, &w) != 0) {
			end_session(r, END_FATAL, "malformed CopyData message (type 0x%02x, %zu bytes) after lsn %s",
			    len ? buf[0] : 0, len, obx_lsn_format(r->received, err, sizeof(err)));
			return;
		}
		if (w.kind == 'k') {
			if (w.wal_end > r->server_wal_end)
				r->server_wal_end = w.wal_end;
			obx_ack_keepalive(&r->ack, w.wal_end);
			if (w.reply_requested)
				r->status_now = true;
		} else {
			handle_xlogdata(r, &w);
		}
		/* serve delivery reports between messages so acks are never late */
		if ((i & 255) == 255)
			obx_kafka_poll(&r->kf, 0);
	}
}

static void
handle_signals(struct relay *r)
{
	char buf[16];
	ssize_t n;

	while ((n = read(r->opts->signal_fd, buf, sizeof(buf))) > 0)
		r->signals += (int)n;
	if (r->signals >= 2) {
		end_session(r, END_STOP, "second signal: stopping at once with %" PRIu64
		    " event(s) unacknowledged (they will be re-sent from the slot)", r->ack.outstanding);
		return;
	}
	if (r->signals == 1 && !r->draining) {
		r->draining = true;
		r->drain_deadline = now_ms() + DRAIN_TIMEOUT_MS;
		obx_log_info("stopping: waiting up to %d s for %" PRIu64 " outstanding event(s)",
		    DRAIN_TIMEOUT_MS / 1000, r->ack.outstanding);
	}
}

static void
set_title(struct relay *r)
{
	char a[OBX_LSN_STRLEN];

	setproctitle("%s slot %s confirmed %s", obx_state_name(r->m.state), r->cfg->slot,
	    obx_lsn_format(r->sent_flush, a, sizeof(a)));
	r->title_state = r->m.state;
}

static void
publish(struct relay *r)
{
	r->m.heartbeat_ms = now_ms();
	if (r->http_on)
		obx_http_publish(&r->http, &r->m);
	if (r->m.state != r->title_state)
		set_title(r);
}

/* Copies the loop's numbers into the metrics, logs progress, publishes. */
static void
update_metrics(struct relay *r)
{
	int64_t now = now_ms(), oldest;

	r->m.state = r->draining ? OBX_STATE_DRAINING : r->paused ? OBX_STATE_BACKPRESSURED :
	    OBX_STATE_STREAMING;
	r->m.state_reason[0] = '\0';
	r->m.received_lsn = r->received;
	r->m.confirmed_flush_lsn = r->sent_flush;
	r->m.server_wal_end_lsn = r->server_wal_end > r->received ? r->server_wal_end : r->received;
	r->m.inflight_events = r->inflight;
	r->m.inflight_bytes = r->inflight_bytes;
	r->m.events_published = r->published;
	r->m.oldest_unacked_age_seconds = obx_ack_oldest_time(&r->ack, &oldest) ?
	    (double)(obx_pg_now() - oldest) / 1e6 : 0;
	if (r->cfg->progress_interval_ms > 0 && now - r->last_progress_ms >= r->cfg->progress_interval_ms) {
		double secs = (double)(now - r->last_progress_ms) / 1000.0;
		char a[OBX_LSN_STRLEN], b[OBX_LSN_STRLEN];

		obx_log_info("progress: %s, received %s, confirmed %s, lag %" PRIu64 " bytes, "
		    "%.1f events/s, %.1f transactions/s, %" PRIu64 " in flight",
		    obx_state_name(r->m.state), obx_lsn_format(r->received, a, sizeof(a)),
		    obx_lsn_format(r->sent_flush, b, sizeof(b)),
		    r->m.server_wal_end_lsn - (r->sent_flush < r->m.server_wal_end_lsn ? r->sent_flush : r->m.server_wal_end_lsn),
		    (double)(r->published - r->progress_events) / secs,
		    (double)(r->m.transactions - r->progress_txns) / secs, r->inflight);
		r->last_progress_ms = now;
		r->progress_events = r->published;
		r->progress_txns = r->m.transactions;
		set_title(r);
	}
	publish(r);
}

static enum session_end
session(struct relay *r)
{
	char err[1024], a[OBX_LSN_STRLEN];
	enum obx_fail f;

	r->gen++;
	r->ending = false;
	r->in_txn = false;
	r->inflight = r->inflight_bytes = 0;
	r->paused = false;
	obx_relcache_init(&r->rels);
	r->standby = false;
	r->end_kafka = false;
	r->m.state = OBX_STATE_CONNECTING;
	publish(r);
	f = obx_pgstream_open(&r->st, r->cfg, r->opts->recreate_slot,
	    r->cfg->streaming && !r->streaming_off, err, sizeof(err));
	if (f != OBX_FAIL_NONE) {
		obx_pgstream_close(&r->st);
		r->standby = f == OBX_FAIL_SLOT_IN_USE;
		end_session(r, f == OBX_FAIL_FATAL ? END_FATAL : END_RETRY, "%s", err);
		return r->end;
	}
	/* a fresh producer per session: nothing of an earlier stream can land after this one's events */
	if (obx_kafka_open(&r->kf, r->cfg, on_delivery, r, err, sizeof(err)) != 0) {
		obx_pgstream_close(&r->st);
		end_session(r, END_FATAL, "%s", err);
		return END_FATAL;
	}
	obx_pgoutput_reset(&r->dec);
	obx_pgoutput_init(&r->dec, r->st.proto_version);
	obx_streambuf_init(&r->sbuf, (size_t)r->cfg->stream_buffer_bytes);
	obx_event_builder_forget(&r->eb);
	r->status_interval_ms = r->cfg->status_interval_ms;
	if (r->st.wal_sender_timeout_ms > 0 && r->st.wal_sender_timeout_ms / 3 < r->status_interval_ms)
		r->status_interval_ms = r->st.wal_sender_timeout_ms / 3;
	r->streamed = true;
	if (r->was_standby)
		obx_log_info("taking over slot %s from the previous instance", r->cfg->slot);
	r->was_standby = false;
	obx_ack_init(&r->ack, r->st.start_confirmed);
	r->received = r->sent_flush = r->st.start_confirmed;
	r->last_status_ms = now_ms();
	r->last_progress_ms = now_ms();
	r->progress_events = r->published;
	r->progress_txns = r->m.transactions;
	obx_log_info("streaming from slot %s at %s (pgoutput protocol %d%s%s, status every %d ms)",
	    r->cfg->slot, obx_lsn_format(r->st.start_confirmed, a, sizeof(a)), r->st.proto_version,
	    r->st.streaming ? ", streaming in-progress transactions" : "",
	    r->cfg->messages ? ", messages" : "", r->status_interval_ms);

	while (!r->ending) {
		struct pollfd p[3];
		int64_t wait;
		int flushing;

		handle_signals(r);
		obx_kafka_poll(&r->kf, 0);
		producer_failed(r);
		update_metrics(r);
		if (r->ending)
			break;
		read_stream(r);
		if (r->ending)
			break;
		maybe_status(r);
		if (backpressured(r) != r->paused) {
			r->paused = !r->paused;
			if (r->paused)
				obx_log_info("backpressure: %" PRIu64 " event(s), %" PRIu64 " byte(s) in flight; "
				    "pausing the replication stream", r->inflight, r->inflight_bytes);
			else
				obx_log_info("backpressure released: resuming the replication stream");
		}
		if (r->draining && ((r->ack.outstanding == 0 && !r->in_txn) || now_ms() >= r->drain_deadline)) {
			if (r->ack.outstanding > 0)
				obx_log_warn("stopping with %" PRIu64 " event(s) unacknowledged after %d s "
				    "(they will be re-sent from the slot)", r->ack.outstanding,
				    DRAIN_TIMEOUT_MS / 1000);
			send_status(r, false);
			end_session(r, END_STOP, "stopped");
			break;
		}
		flushing = obx_pgstream_flush(&r->st);
		if (flushing < 0) {
			end_session(r, END_RETRY, "could not send to the server");
			break;
		}
		p[0] = (struct pollfd){ obx_pgstream_fd(&r->st), 0, 0 };
		if ((!r->draining || r->in_txn) && !backpressured(r))
			p[0].events |= POLLIN;
		if (flushing == 1)
			p[0].events |= POLLOUT;
		p[1] = (struct pollfd){ obx_kafka_fd(&r->kf), POLLIN, 0 };
		p[2] = (struct pollfd){ r->opts->signal_fd, POLLIN, 0 };
		wait = r->last_status_ms + r->status_interval_ms - now_ms();
		if (obx_ack_flushable(&r->ack) > r->sent_flush)
			wait = STATUS_MIN_GAP_MS;
		if (r->draining)
			wait = 100;
		if (wait < 0)
			wait = 0;
		if (poll(p, 3, (int)wait) < 0 && errno != EINTR) {
			end_session(r, END_FATAL, "poll: %s", strerror(errno));
			break;
		}
		if ((p[0].revents & (POLLIN | POLLERR | POLLHUP)) &&
		    obx_pgstream_consume(&r->st, err, sizeof(err)) != 0)
			end_session(r, END_RETRY, "replication connection lost: %s", err);
	}

	/* confirm what is safe before leaving (no-op when the connection is gone) */
	if (r->end != END_FATAL && PQstatus(r->st.conn) == CONNECTION_OK) {
		send_status(r, false);
		obx_pgstream_flush(&r->st);
	}
	obx_pgstream_close(&r->st);
	obx_kafka_close(&r->kf, 5000);
	obx_ack_reset(&r->ack);
	obx_relcache_reset(&r->rels);
	obx_streambuf_reset(&r->sbuf);
	r->m.stream_buffer_bytes = 0;
	return r->end;
}

int
obx_relay_run(const struct obx_config *cfg, const struct obx_run_opts *opts)
{
	struct relay r;
	char last[1024] = "";
	int attempt = 0;
	int rc = 1;

	memset(&r, 0, sizeof(r));
	r.cfg = cfg;
	r.opts = opts;
	obx_pgoutput_init(&r.dec, 1);
#ifdef OBX_TEST_HOOKS
	if (getenv("OBX_TEST_FATAL_AFTER") != NULL)
		r.test_fatal_after = atol(getenv("OBX_TEST_FATAL_AFTER"));
#endif
	if (obx_event_builder_init(&r.eb, cfg) != 0) {
		obx_log_error("out of memory");
		goto out;
	}
	{
		char err[512];

		if (obx_http_start(&r.http, cfg, err, sizeof(err)) != 0) {
			obx_log_error("%s", err);
			goto out;
		}
		r.http_on = true;
		obx_log_info("metrics and health on %s:%d (/metrics, /healthz, /readyz)", cfg->metrics_host,
		    r.http.port);
	}
	r.title_state = OBX_STATE_COUNT;
	for (;;) {
		enum session_end e = session(&r);

		if (e == END_STOP) {
			obx_log_info("%s; %" PRIu64 " event(s) published", r.end_reason, r.published);
			rc = 0;
			break;
		}
		if (e == END_FATAL) {
			obx_log_error("%s", r.end_reason);
			rc = 1;
			break;
		}
		if (r.signals > 0) {
			obx_log_info("stopped while reconnecting");
			rc = 0;
			break;
		}
		if (r.streamed)
			attempt = 0;
		r.streamed = false;
		if (r.end_kafka)
			r.m.reconnects_kafka++;
		else if (!r.standby)
			r.m.reconnects_postgres++;
		r.m.state = r.standby ? OBX_STATE_STANDBY : OBX_STATE_CONNECTING;
		snprintf(r.m.state_reason, sizeof(r.m.state_reason), "%.*s", (int)sizeof(r.m.state_reason) - 1,
		    r.end_reason);
		r.m.inflight_events = r.m.inflight_bytes = 0;
		r.m.oldest_unacked_age_seconds = 0;
		publish(&r);
		if (r.standby) {
			/* a hot standby: poll the slot often so a takeover takes seconds */
			if (!r.was_standby)
				obx_log_info("standby: %s; holding no events, retrying every second", r.end_reason);
			r.was_standby = true;
			attempt = 0;
			snprintf(last, sizeof(last), "%s", r.end_reason);
		} else if (strcmp(last, r.end_reason) != 0) {
			/* log once per distinct failure, not per retry */
			obx_log_warn("%s; retrying", r.end_reason);
			snprintf(last, sizeof(last), "%s", r.end_reason);
		} else {
			obx_log_debug("still failing (attempt %d): %s", attempt + 1, r.end_reason);
		}
		{
			int64_t cap = r.standby ? 1000 : BACKOFF_MIN_MS << (attempt < 8 ? attempt : 8);
			int64_t delay = cap > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : cap;
			int64_t until;

			delay = delay / 2 + arc4random_uniform((uint32_t)(delay / 2 + 1));
			until = now_ms() + delay;
			attempt++;
			while (now_ms() < until) {
				struct pollfd p = { opts->signal_fd, POLLIN, 0 };

				if (poll(&p, 1, (int)(until - now_ms() < 1000 ? until - now_ms() : 1000)) > 0)
					break;
				publish(&r); /* the loop is turning: /healthz stays green */
			}
			{
				char buf[16];
				ssize_t n;

				while ((n = read(opts->signal_fd, buf, sizeof(buf))) > 0)
					r.signals += (int)n;
			}
			if (r.signals > 0) {
				obx_log_info("stopped while reconnecting");
				rc = 0;
				break;
			}
		}
	}
out:
	if (r.http_on)
		obx_http_stop(&r.http);
	obx_event_builder_reset(&r.eb);
	obx_pgoutput_reset(&r.dec);
	message_row_free(&r);
	return rc;
}
