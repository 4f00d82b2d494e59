/*
 * relaycore.c - the relay's decisions (pure); see relaycore.h and
 * docs/internals/design.md ("Relay core").
 *
 * Every event goes through one path: the ack tracker registers it (a
 * ticket), the event builder makes the record, send_record() hands it to
 * the producer or, when the producer's queue is full, to the pending queue
 * that obx_core_pump() drains in order.  A record that can never be
 * produced, or that the broker rejects for good, is handed to on_error:
 * stop ends the run without confirming past it, dead_letter sends it (or,
 * when even that is refused, the headers that identify it) to the
 * dead-letter topic, and the copy's acknowledgement counts for the event.
 * Before a record reaches the producer, restart de-duplication (core/restart_dedupe.h)
 * may find it in Kafka already: it is then acknowledged at the next pump,
 * as a delivery report would acknowledge it.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/relaycore.h"
#include "obx/core/walmsg.h"

#define PENDING_WAIT_MS 50
#define DRAIN_CHECK_MS 100
#define BACKPRESSURE_NOTE_MS 10000

static void publish_row(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *t);

uint64_t
obx_core_opaque(uint32_t gen, uint64_t ticket, bool dead_letter)
{
	return obx_dlv_opaque(&(struct obx_dlv_tag){ OBX_DLV_STREAM, gen, ticket, dead_letter, false });
}

/* A line for the log about f (NULL: nothing in particular). */
static void note(struct obx_core *c, enum obx_log_level level, const struct obx_logfields *f,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void
note(struct obx_core *c, enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (c->ops->note == NULL)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	c->ops->note(c->ctx, level, f, line);
}

static void end_session(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f,
    const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

static void
end_session(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f,
    const char *fmt, va_list ap)
{
	if (c->end == OBX_CORE_END_FATAL)
		return; /* the first fatal reason wins */
	vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
	obx_logfields_keep(&c->reason_fields, f);
	c->end = how;
}

void
obx_core_fail(struct obx_core *c, enum obx_core_end how, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	end_session(c, how, NULL, fmt, ap);
	va_end(ap);
}

#define fail obx_core_fail

/* obx_core_fail() with what the reason concerns, for its line in the log. */
static void fail_at(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void
fail_at(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	end_session(c, how, f, fmt, ap);
	va_end(ap);
}

static bool
ending(const struct obx_core *c)
{
	return c->end != OBX_CORE_RUNNING;
}

/* ---- producing: the delivery policy (delivery.h) decides, the stream acts on its outcomes ---- */

/* What an outcome of the delivery policy means for the session (report: of a delivery report). */
static void
delivered(struct obx_core *c, enum obx_dlv_outcome o, const struct obx_dlv_result *res, bool report)
{
	switch (o) {
	case OBX_DLV_SENT:
	case OBX_DLV_SETTLED:
	case OBX_DLV_ACKED:
	case OBX_DLV_IGNORED:
	case OBX_DLV_REJECTED: /* obx_core_report() remembers the record */
		return;
	case OBX_DLV_WAIT_TOPIC:
		/* nothing is confirmed past the event: the next session tries it again */
		c->end_kafka = true;
		fail_at(c, OBX_CORE_END_RETRY, &(struct obx_logfields){ .topic = res->f_topic },
		    "%s, rewinding to the slot", res->why);
		return;
	case OBX_DLV_RETRY:
		c->end_kafka = c->end_kafka || report;
		fail_at(c, OBX_CORE_END_RETRY, &res->f, report ? "%s; rewinding to the slot" : "%s", res->why);
		return;
	case OBX_DLV_STOP:
		fail_at(c, OBX_CORE_END_FATAL, &res->f, "%s", res->why);
		return;
	}
}

/* Hands rec to the delivery policy (dl: rec is a dead-letter record already). */
static void
send_record(struct obx_core *c, const struct obx_record *rec, uint64_t ticket, bool dl)
{
	struct obx_dlv_result res;

	if (ending(c))
		return;
	delivered(c, obx_dlv_send(&c->dlv, rec, ticket, dl, c->now_ms, &res), &res, false);
}

/* An event found in Kafka: acknowledged by the next obx_core_pump(), never from here. */
static void
skip(struct obx_core *c, uint64_t ticket)
{
	if (c->nskips == c->skips_cap) {
		size_t cap = c->skips_cap ? c->skips_cap * 2 : 64;
		uint64_t *grown = reallocarray(c->skips, cap, sizeof(*grown));

		if (grown == NULL) {
			fail(c, OBX_CORE_END_FATAL, "out of memory");
			return;
		}
		c->skips = grown;
		c->skips_cap = cap;
	}
	c->skips[c->nskips++] = ticket;
}

/*
 * Restart de-duplication: send rec, skip it (found in Kafka), or hold it
 * until its topic has been read back (docs/internals/design.md, "Restart
 * de-duplication").
 */
static enum obx_dd_verdict
dedupe(struct obx_core *c, const struct obx_record *rec)
{
	struct obx_dd_mark floor;
	enum obx_dd_verdict v;

	if (!c->dd.on)
		return OBX_DD_SEND;
	v = obx_dedupe_check(&c->dd, rec->topic, rec->key, rec->keylen, rec->headers, rec->nheaders,
	    &floor);
	if (v != OBX_DD_LOOKUP)
		return v;
	if (c->ops->lookup(c->ctx, rec->topic, &floor, c->gen))
		return OBX_DD_WAIT;
	obx_dedupe_unavailable(&c->dd, rec->topic, "could not start reading it back");
	c->m->dedupe_fallbacks++;
	return OBX_DD_SEND;
}

/* ---- exactly-once: Kafka transactions (docs/internals/design.md, "Exactly-once") ---- */

static bool
is_bare(const struct obx_record *rec)
{
	return rec->key == NULL && rec->value == NULL;
}

/* Why the broker rejected rec in an earlier session's transaction, or NULL. */
static const char *
rejected_before(const struct obx_core *c, const struct obx_record *rec, bool dl)
{
	struct obx_dd_mark m;

	if (c->nrejected == 0 || obx_dd_mark_parse(rec->headers, rec->nheaders, &m) != 0)
		return NULL;
	for (size_t i = 0; i < c->nrejected; i++)
		if (obx_dd_mark_cmp(&c->rejected[i].mark, &m) == 0 && c->rejected[i].dead_letter == dl &&
		    (c->rejected[i].why[0] == 'b') == is_bare(rec))
			return c->rejected[i].why + 1;
	return NULL;
}

/* Remembers that the broker rejected rec for good; the first byte of why says bare or not. */
static void
remember_rejected(struct obx_core *c, const struct obx_record *rec, bool dl, const char *why)
{
	size_t i;

	if (c->nrejected == c->rejected_cap) {
		size_t cap = c->rejected_cap ? c->rejected_cap * 2 : 16;
		void *grown = reallocarray(c->rejected, cap, sizeof(*c->rejected));

		if (grown == NULL) {
			fail(c, OBX_CORE_END_FATAL, "out of memory");
			return;
		}
		c->rejected = grown;
		c->rejected_cap = cap;
	}
	i = c->nrejected++;

	if (obx_dd_mark_parse(rec->headers, rec->nheaders, &c->rejected[i].mark) != 0)
		memset(&c->rejected[i].mark, 0, sizeof(c->rejected[i].mark));
	c->rejected[i].dead_letter = dl;
	snprintf(c->rejected[i].why, sizeof(c->rejected[i].why), "%c%s", is_bare(rec) ? 'b' : 'r', why);
}

/* A record went into the open Kafka transaction: its ticket waits for the commit. */
static void
batch_add(struct obx_core *c, const struct obx_record *rec, uint64_t ticket, bool dl)
{
	struct obx_dd_mark m;

	if (c->nbatch == c->batch_cap) {
		size_t cap = c->batch_cap ? c->batch_cap * 2 : 256;
		uint64_t *grown = reallocarray(c->batch_tickets, cap, sizeof(*grown));

		if (grown == NULL) {
			fail(c, OBX_CORE_END_FATAL, "out of memory");
			return;
		}
		c->batch_tickets = grown;
		c->batch_cap = cap;
	}
	c->batch_tickets[c->nbatch++] = obx_core_opaque(c->gen, ticket, dl);
	if (c->batch_records++ == 0)
		c->batch_since_ms = c->now_ms;
	c->batch_bytes += rec->len + rec->keylen;
	if (obx_dd_mark_parse(rec->headers, rec->nheaders, &m) == 0 &&
	    obx_dd_mark_cmp(&m, &c->batch.mark) > 0) {
		c->batch.mark = m;
		c->batch.mark_commit_time = m.lsn == c->txn.commit_lsn ? c->txn.commit_time : 0;
	}
}

static void
batch_clear(struct obx_core *c)
{
	c->nbatch = 0;
	c->batch_records = c->batch_bytes = 0;
	c->committing = c->commit_wanted = false;
	memset(&c->batch, 0, sizeof(c->batch));
}

/* Before each produce: a record rejected inside an aborted Kafka transaction, or de-duplication. */
static enum obx_dlv_gate
dlv_gate(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl, char *why, size_t whylen)
{
	struct obx_core *c = ctx;
	const char *was;

	if (c->eos && (was = rejected_before(c, rec, dl)) != NULL) {
		/* the broker rejected it inside a transaction that was aborted: on_error now */
		snprintf(why, whylen, "%s", was);
		return OBX_DLV_GATE_REFUSED;
	}
	switch (dedupe(c, rec)) {
	case OBX_DD_SKIP:
		skip(c, ticket);
		return OBX_DLV_GATE_SETTLED;
	case OBX_DD_WAIT:
		return OBX_DLV_GATE_HOLD; /* tried again by obx_core_pump(), in order */
	default:
		return OBX_DLV_GATE_SEND;
	}
}

static enum obx_produce_result
dlv_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *why, size_t whylen)
{
	struct obx_core *c = ctx;

	return c->ops->produce(c->ctx, rec, opaque, why, whylen);
}

static void
dlv_accepted(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl)
{
	struct obx_core *c = ctx;

	if (c->eos)
		batch_add(c, rec, ticket, dl);
}

static void
dlv_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	note(ctx, level, f, "%s", line);
}

static const struct obx_delivery_ops core_dlv_ops = { dlv_gate, dlv_produce, dlv_accepted, dlv_note };

/* Sends pending records in order until the queue refuses one again. */
static void
pending_flush(struct obx_core *c)
{
	struct obx_dlv_result res;

	delivered(c, obx_dlv_pump(&c->dlv, c->now_ms, &res), &res, false);
}

/* ---- rows and messages of a committed transaction ---- */

/* A row of the current transaction that cannot become an event (ticket registered): on_error. */
static void
poison_row(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *t,
    uint64_t ticket, const char *reason)
{
	char lsn[OBX_LSN_STRLEN], seq[16], xid[16];
	struct obx_header h[4];
	struct obx_record rec;
	char *row;
	struct obx_logfields f = { .lsn = c->txn.commit_lsn, .xid = c->txn.xid };

	obx_lsn_format(c->txn.commit_lsn, lsn, sizeof(lsn));
	if (c->cfg->on_error == OBX_ON_ERROR_STOP) {
		fail_at(c, OBX_CORE_END_FATAL, &f, "event id=? at lsn %s (xid %" PRIu32 ") cannot be published: %s "
		    "(on_error = stop: nothing after it is confirmed)", lsn, c->txn.xid, reason);
		return;
	}
	snprintf(seq, sizeof(seq), "%" PRIu32, c->txn_events - 1);
	snprintf(xid, sizeof(xid), "%" PRIu32, c->txn.xid);
	h[0] = (struct obx_header){ "lsn", lsn, strlen(lsn) };
	h[1] = (struct obx_header){ "seq", seq, strlen(seq) };
	h[2] = (struct obx_header){ "xid", xid, strlen(xid) };
	h[3] = (struct obx_header){ "error", reason, strlen(reason) };
	row = obx_event_row_json(rel, t);
	if (row == NULL) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	note(c, OBX_LOG_WARN, &f, "event id=? at lsn %s cannot be published (%s): dead-lettering the row to %s",
	    lsn, reason, c->cfg->dead_letter_topic);
	rec = (struct obx_record){ c->cfg->dead_letter_topic, NULL, 0, row, strlen(row),
		(c->txn.commit_time + OBX_PG_EPOCH_OFFSET_US) / 1000, h, 4 };
	send_record(c, &rec, ticket, true);
	free(row);
}

/*
 * Publishes one outbox row of the current transaction (c->txn): registers
 * it with the ack tracker, builds the record and sends it, or follows
 * on_error when it cannot become one.  why_not, when set, says that the row
 * is already known to be unbuildable (a message that is not a JSON object).
 */
static void
publish_event(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *tuple,
    const char *why_not)
{
	struct obx_event ev;
	struct obx_record rec;
	char why[512];
	uint64_t ticket;
	int rc;

	if (obx_ack_add_event(&c->ack, &ticket) != 0) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	c->txn_events++;
	if (c->eos_floor_set) {
		struct obx_dd_mark m = { c->txn.commit_lsn, c->txn_events - 1, 0 };

		if (obx_dd_mark_cmp(&m, &c->eos_floor) <= 0) {
			skip(c, ticket); /* a committed Kafka transaction holds it (exactly-once) */
			c->eos_skipped++;
			return;
		}
		c->eos_floor_set = c->eos_checking = false; /* marks only grow: nothing after it is skipped */
		note(c, OBX_LOG_INFO, NULL, "exactly-once: %" PRIu64 " replayed event(s) were in committed Kafka "
		    "transactions already and were not sent again", c->eos_skipped);
	}
	if (why_not != NULL) {
		poison_row(c, rel, tuple, ticket, why_not);
		return;
	}
	rc = obx_event_build(&c->eb, rel, tuple, &c->txn, c->txn_events - 1, &ev, why, sizeof(why));
	if (rc == OBX_ENOMEM) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	if (rc != 0) {
		poison_row(c, rel, tuple, ticket, why);
		return;
	}
	rec = (struct obx_record){ ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms,
		ev.headers, ev.nheaders };
	send_record(c, &rec, ticket, false);
}

static void
publish_row(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *t)
{
	publish_event(c, rel, t, NULL);
}

static void
message_row_free(struct obx_core *c)
{
	struct obx_core_msgrow *mr = &c->mrow;

	for (size_t i = 0; i < mr->ndumps; i++)
		free(mr->dumps[i]);
	mr->ndumps = 0;
	json_decref(mr->json);
	mr->json = NULL;
}

/*
 * Turns the JSON object of a logical decoding message into a row of a
 * relation whose columns are the object's keys, so the outbox mapping
 * applies unchanged: strings are column text as they are, other values
 * their compact JSON, null a NULL.  A content that is not such an object
 * becomes a row with one column "content" (for the dead-letter record) and
 * *why says why.  Returns 0, OBX_EINVAL (why filled) or OBX_ENOMEM.
 */
static int
message_row(struct obx_core *c, const uint8_t *content, uint32_t len, struct obx_pg_tuple *t,
    char *why, size_t whylen)
{
	struct obx_core_msgrow *mr = &c->mrow;
	json_error_t jerr;
	const char *k;
	json_t *v;
	uint16_t n = 0;

	message_row_free(c);
	mr->rel = (struct obx_rel){ .relid = 0, .nspname = c->cfg->table_schema,
		.relname = c->cfg->table_name, .cols = mr->cols, .version = ++mr->version };
	obx_event_builder_forget(&c->eb);
	mr->json = json_loadb((const char *)content, len, 0, &jerr);
	if (mr->json == NULL || !json_is_object(mr->json) ||
	    json_object_size(mr->json) > OBX_CORE_MESSAGE_KEYS) {
		snprintf(why, whylen, mr->json == NULL ? "message content is not JSON: %s" :
		    !json_is_object(mr->json) ? "message content is not a JSON object%s" :
		    "message content has more than 64 keys%s", mr->json == NULL ? jerr.text : "");
		mr->cols[0] = (struct obx_relcol){ "content", 25 };
		mr->dat[0] = (struct obx_pg_datum){ 't', content, len };
		mr->rel.natts = 1;
		*t = (struct obx_pg_tuple){ 1, mr->dat };
		return OBX_EINVAL;
	}
	json_object_foreach(mr->json, k, v) {
		mr->cols[n] = (struct obx_relcol){ (char *)k, json_is_object(v) || json_is_array(v) ? 3802 : 25 };
		if (json_is_null(v)) {
			mr->dat[n] = (struct obx_pg_datum){ 'n', NULL, 0 };
		} else if (json_is_string(v)) {
			mr->dat[n] = (struct obx_pg_datum){ 't', (const uint8_t *)json_string_value(v),
				(uint32_t)json_string_length(v) };
		} else {
			char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

			if (d == NULL)
				return OBX_ENOMEM;
			mr->dumps[mr->ndumps++] = d;
			mr->dat[n] = (struct obx_pg_datum){ 't', (const uint8_t *)d, (uint32_t)strlen(d) };
		}
		n++;
	}
	mr->rel.natts = n;
	*t = (struct obx_pg_tuple){ n, mr->dat };
	return 0;
}

/* Publishes one of our transactional messages as an event of the current transaction. */
static void
publish_message(struct obx_core *c, const uint8_t *content, uint32_t len)
{
	struct obx_pg_tuple t;
	char why[512];
	int rc = message_row(c, content, len, &t, why, sizeof(why));

	if (rc == OBX_ENOMEM)
		fail(c, OBX_CORE_END_FATAL, "out of memory");
	else
		publish_event(c, &c->mrow.rel, &t, rc != 0 ? why : NULL);
	message_row_free(c);
}

/* ---- streamed transactions ---- */

static void
streams_changed(struct obx_core *c)
{
	obx_ack_streams_open(&c->ack, obx_streambuf_open(&c->sbuf));
	c->m->stream_buffer_bytes = c->sbuf.bytes;
}

static void
buffer_result(struct obx_core *c, int rc)
{
	char a[OBX_LSN_STRLEN];

	if (rc == OBX_EFULL) {
		/* the server then decodes the transaction whole, spilling to its own disk */
		c->streaming_off = true;
		fail(c, OBX_CORE_END_RETRY, "streamed transaction %" PRIu32 " holds more outbox rows than "
		    "[source] stream_buffer (%lld bytes) after lsn %s; reconnecting with streaming off",
		    c->stream_xid, c->cfg->stream_buffer_bytes, obx_lsn_format(c->received, a, sizeof(a)));
		return;
	}
	if (rc != 0)
		fail(c, OBX_CORE_END_FATAL, rc == OBX_ENOMEM ? "out of memory" :
		    "streamed change for transaction %" PRIu32 " outside of Stream Start", c->stream_xid);
	c->m->stream_buffer_bytes = c->sbuf.bytes;
}

static bool backpressured(const struct obx_core *c);
static void check_floor(struct obx_core *c, obx_lsn commit_lsn, int64_t commit_time);

/*
 * A PostgreSQL transaction ended at end_lsn: when every event of it is in
 * the open Kafka transaction (none waits in the pending queue), its
 * progress record names it as the last one complete.
 */
static void
batch_txn_done(struct obx_core *c, obx_lsn end_lsn)
{
	if (!c->eos || obx_dlv_pending(&c->dlv) || c->batch_records == 0)
		return;
	c->batch.end_lsn = end_lsn;
	c->batch.commit_time = c->txn.commit_time;
}

/* Publishes the rows of the Stream Commit in progress as far as the caps allow. */
static void
replay(struct obx_core *c)
{
	const struct obx_sbuf_txn *t = obx_streambuf_get(&c->sbuf, c->replay_xid);
	char a[OBX_LSN_STRLEN];

	while (t != NULL && c->replay_next < t->nrows && !ending(c) && !obx_dlv_pending(&c->dlv) && !backpressured(c)) {
		const struct obx_sbuf_row *row = &t->rows[c->replay_next++];

		if (row->rel == OBX_SBUF_MESSAGE)
			publish_message(c, row->tuple.cols[0].data, row->tuple.cols[0].len);
		else
			publish_row(c, &t->rels[row->rel], &row->tuple);
	}
	if (ending(c) || (t != NULL && c->replay_next < t->nrows))
		return;
	obx_event_builder_forget(&c->eb); /* the relation copies go now */
	if (obx_ack_commit(&c->ack, c->replay_end_lsn) != 0) {
		fail(c, OBX_CORE_END_FATAL, "Stream Commit without its transaction at lsn %s",
		    obx_lsn_format(c->txn.commit_lsn, a, sizeof(a)));
		return;
	}
	c->replaying = false;
	c->in_txn = false;
	c->m->transactions++;
	batch_txn_done(c, c->replay_end_lsn);
	obx_streambuf_drop(&c->sbuf, c->replay_xid);
	streams_changed(c);
	if (c->replay_end_lsn > c->received)
		c->received = c->replay_end_lsn;
}

/*
 * Exactly-once: the replay contradicts the floor (no transaction of its
 * commit time at its lsn).  Events skipped before are published again by a
 * new session; none was confirmed (eos_holding).
 */
static void
floor_refused(struct obx_core *c, const char *how)
{
	char a[OBX_LSN_STRLEN];

	c->eos_refused = c->eos_floor;
	c->eos_refused_time = c->eos_floor_time;
	c->eos_refused_set = true;
	c->eos_floor_set = c->eos_checking = false;
	obx_lsn_format(c->eos_floor.lsn, a, sizeof(a));
	if (!c->eos_holding) {
		note(c, OBX_LOG_WARN, NULL, "exactly-once: %s: the last progress record (lsn %s) is of another "
		    "history (a data directory restored from a copy?); nothing was skipped, nothing is", how, a);
		return;
	}
	/* eos_holding stays: the session's last status update confirms nothing of what it skipped */
	fail(c, OBX_CORE_END_RETRY, "exactly-once: %s: the last progress record (lsn %s) is of another "
	    "history (a data directory restored from a copy?); %" PRIu64 " replayed event(s) were taken for "
	    "ones in Kafka, none confirmed: starting again to publish them", how, a, c->eos_skipped);
}

/*
 * Exactly-once: a transaction at commit_lsn, commit_time begins while the
 * floor is not met yet (obx_core_exactly_once()).
 */
static void
check_floor(struct obx_core *c, obx_lsn commit_lsn, int64_t commit_time)
{
	if (commit_lsn < c->eos_floor.lsn) {
		c->eos_holding = true; /* skipped, not confirmed, until the floor is met */
		return;
	}
	if (commit_lsn == c->eos_floor.lsn && commit_time == c->eos_floor_time) {
		c->eos_checking = c->eos_holding = false;
		return;
	}
	if (commit_lsn == c->eos_floor.lsn) {
		floor_refused(c, "the transaction at the record's lsn committed at another time");
		return;
	}
	if (c->eos_holding) {
		floor_refused(c, "the replay passed the record's lsn without its transaction");
		return;
	}
	/* the first replayed transaction is past the floor: nothing to skip */
	c->eos_floor_set = c->eos_checking = false;
}

/*
 * A transaction's events begin (Begin, or a Stream Commit about to publish
 * its rows).  Returns false, with the session ended, when one is open already.
 */
static bool
open_txn(struct obx_core *c, const char *what, obx_lsn commit_lsn, uint32_t xid, int64_t commit_time)
{
	char a[OBX_LSN_STRLEN];

	if (c->in_txn || obx_ack_begin_at(&c->ack, commit_time) != 0) {
		fail(c, OBX_CORE_END_FATAL, "%s inside an open transaction at lsn %s", what,
		    obx_lsn_format(commit_lsn, a, sizeof(a)));
		return false;
	}
	c->in_txn = true;
	c->txn = (struct obx_txninfo){ commit_lsn, xid, commit_time };
	c->txn_events = 0;
	if (c->eos_checking)
		check_floor(c, commit_lsn, commit_time);
	return !ending(c);
}

/* Stream Commit: the buffered rows become events of one transaction, in insertion order. */
static void
stream_commit(struct obx_core *c, const struct obx_pgmsg *m)
{
	if (!open_txn(c, "Stream Commit", m->u.stream_commit.commit_lsn, m->u.stream_commit.xid,
	    m->u.stream_commit.commit_time))
		return;
	c->replaying = true;
	c->replay_xid = m->u.stream_commit.xid;
	c->replay_next = 0;
	c->replay_end_lsn = m->u.stream_commit.end_lsn;
	obx_event_builder_forget(&c->eb);
	replay(c);
}

/*
 * Stream Abort.  A whole transaction's abort discards its rows.  A
 * subtransaction's abort discards the rows tagged with its xid; but
 * pgoutput tags a logical decoding message inside a streamed transaction
 * with the top-level xid, so when the transaction holds messages of ours
 * there is no telling which of them the savepoint wrote.  Then the session
 * ends and the process asks for no more streaming: the server decodes the
 * transaction again, whole, at its commit, without what rolled back
 * (docs/internals/design.md, invariant 2).
 */
static void
stream_abort(struct obx_core *c, const struct obx_pgmsg *m)
{
	uint32_t xid = m->u.stream_abort.xid, subxid = m->u.stream_abort.subxid;
	const struct obx_sbuf_txn *t = obx_streambuf_get(&c->sbuf, xid);
	size_t n;

	if (subxid != xid && t != NULL && t->nmessages > 0) {
		c->streaming_off = true;
		fail(c, OBX_CORE_END_RETRY, "streamed transaction %" PRIu32 " rolled back subtransaction %"
		    PRIu32 " and holds %zu logical decoding message(s), which pgoutput does not tag with their "
		    "subtransaction; reconnecting with streaming off", xid, subxid, t->nmessages);
		return;
	}
	n = obx_streambuf_abort(&c->sbuf, xid, subxid);
	c->m->stream_aborted_events += n;
	if (n > 0)
		note(c, OBX_LOG_DEBUG, NULL, "streamed transaction %" PRIu32 " rolled back %s %" PRIu32 ": %zu "
		    "buffered event(s) discarded", xid, subxid == xid ? "whole, xid" : "savepoint, subxid",
		    subxid, n);
	streams_changed(c);
}

/* ---- messages of the stream ---- */

static void
handle_insert(struct obx_core *c, const struct obx_pgmsg *m)
{
	const struct obx_rel *rel = obx_relcache_get(&c->rels, m->u.insert.relid);

	if (rel == NULL) {
		fail(c, OBX_CORE_END_FATAL, "Insert for relation %" PRIu32 " that no Relation message "
		    "announced", m->u.insert.relid);
		return;
	}
	if (!obx_event_is_outbox(&c->eb, rel))
		return;
	if (c->in_stream) {
		buffer_result(c, obx_streambuf_add(&c->sbuf, c->stream_xid, m->xid, rel, &m->u.insert.tuple));
		return;
	}
	if (!c->in_txn) {
		fail(c, OBX_CORE_END_FATAL, "Insert outside of a transaction");
		return;
	}
	publish_row(c, rel, &m->u.insert.tuple);
}

/* A logical decoding message: with [source] messages = on, ours become events. */
static void
handle_message(struct obx_core *c, const struct obx_pgmsg *m)
{
	char a[OBX_LSN_STRLEN];

	if (!c->cfg->messages || strcmp(m->u.message.prefix, c->cfg->message_prefix) != 0)
		return;
	if (!(m->u.message.flags & 1)) {
		c->m->messages_refused++;
		note(c, OBX_LOG_WARN, &(struct obx_logfields){ .lsn = m->u.message.lsn },
		    "non-transactional message with prefix '%s' at lsn %s not published: "
		    "only pg_logical_emit_message(true, ...) is tied to a commit", m->u.message.prefix,
		    obx_lsn_format(m->u.message.lsn, a, sizeof(a)));
		return;
	}
	if (c->in_stream) {
		buffer_result(c, obx_streambuf_add_message(&c->sbuf, c->stream_xid, m->xid,
		    m->u.message.content, m->u.message.len));
		return;
	}
	if (!c->in_txn) {
		fail(c, OBX_CORE_END_FATAL, "transactional message outside of a transaction at lsn %s",
		    obx_lsn_format(m->u.message.lsn, a, sizeof(a)));
		return;
	}
	publish_message(c, m->u.message.content, m->u.message.len);
}

static void
handle_begin(struct obx_core *c, const struct obx_pgmsg *m)
{
	(void)open_txn(c, "Begin", m->u.begin.final_lsn, m->u.begin.xid, m->u.begin.commit_time);
}

static void
handle_commit(struct obx_core *c, const struct obx_pgmsg *m)
{
	char a[OBX_LSN_STRLEN];

	if (!c->in_txn || c->replaying || obx_ack_commit(&c->ack, m->u.commit.end_lsn) != 0) {
		fail(c, OBX_CORE_END_FATAL, "Commit without Begin at lsn %s",
		    obx_lsn_format(m->u.commit.commit_lsn, a, sizeof(a)));
		return;
	}
	c->in_txn = false;
	c->m->transactions++;
	if (m->u.commit.end_lsn > c->received)
		c->received = m->u.commit.end_lsn;
	batch_txn_done(c, m->u.commit.end_lsn);
}

static void
handle_stream_start(struct obx_core *c, const struct obx_pgmsg *m)
{
	if (obx_streambuf_start(&c->sbuf, m->u.stream_start.xid) != 0) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	c->in_stream = true;
	c->stream_xid = m->u.stream_start.xid;
	streams_changed(c);
}

void
obx_core_pgmsg(struct obx_core *c, const struct obx_pgmsg *m, obx_lsn data_start)
{
	char a[OBX_LSN_STRLEN];

	if (ending(c))
		return;
	if (c->replaying) {
		/* the loop reads only when obx_core_can_read(): a caller's defect, never the server's */
		fail(c, OBX_CORE_END_FATAL, "%s message while a Stream Commit is being published",
		    obx_pgoutput_type_name(m->type));
		return;
	}
	if (data_start > c->received)
		c->received = data_start;
	switch (m->type) {
	case 'B': handle_begin(c, m); break;
	case 'C': handle_commit(c, m); break;
	case 'R':
		if (obx_relcache_update(&c->rels, m) != 0)
			fail(c, OBX_CORE_END_FATAL, "out of memory");
		break;
	case 'I': handle_insert(c, m); break;
	case 'M': handle_message(c, m); break;
	case 'S': handle_stream_start(c, m); break;
	case 'E': c->in_stream = false; break;
	case 'c': stream_commit(c, m); break;
	case 'A': stream_abort(c, m); break;
	case 'b': case 'P': case 'K': case 'r': case 'p':
		fail(c, OBX_CORE_END_FATAL, "unexpected two-phase %s message at lsn %s: outboxd does not "
		    "request two_phase", obx_pgoutput_type_name(m->type),
		    obx_lsn_format(data_start ? data_start : c->received, a, sizeof(a)));
		break;
	default:
		/* Origin, Type, Update, Delete, Truncate: nothing to publish */
		break;
	}
}

void
obx_core_keepalive(struct obx_core *c, obx_lsn wal_end, bool reply_requested)
{
	/* between transactions, a walsender that sent past the floor's lsn sent its transaction
	 * before, if this history has it (the commit record is decoded where it lies) */
	if (c->eos_checking && c->eos_holding && !c->in_txn && !c->in_stream && wal_end > c->eos_floor.lsn)
		floor_refused(c, "the server sent past the record's lsn without its transaction");
	if (wal_end > c->server_wal_end)
		c->server_wal_end = wal_end;
	obx_ack_keepalive(&c->ack, wal_end);
	if (reply_requested)
		c->status_now = true;
}

void
obx_core_copydata(struct obx_core *c, const uint8_t *buf, size_t len)
{
	struct obx_walmsg w;
	struct obx_pgmsg m;
	char a[OBX_LSN_STRLEN];
	int rc;

	if (ending(c))
		return;
	if (obx_walmsg_parse(buf, len, &w) != 0) {
		fail(c, OBX_CORE_END_FATAL, "malformed CopyData message (type 0x%02x, %zu bytes) after lsn %s",
		    len ? buf[0] : 0, len, obx_lsn_format(c->received, a, sizeof(a)));
		return;
	}
	if (w.kind == 'k') {
		obx_core_keepalive(c, w.wal_end, w.reply_requested);
		return;
	}
	if (w.wal_end > c->server_wal_end)
		c->server_wal_end = w.wal_end;
	rc = obx_pgoutput_decode(&c->dec, w.payload, w.payload_len, &m);
	if (rc != 0) {
		fail(c, OBX_CORE_END_FATAL, "could not decode pgoutput %s message (type 0x%02x) at offset %zu, "
		    "lsn %s: %s", w.payload_len ? obx_pgoutput_type_name((char)w.payload[0]) : "empty",
		    w.payload_len ? w.payload[0] : 0, c->dec.error_offset,
		    obx_lsn_format(w.data_start ? w.data_start : c->received, a, sizeof(a)), obx_strerror(rc));
		return;
	}
	obx_core_pgmsg(c, &m, w.data_start);
}

/* ---- delivery reports ---- */

void
obx_core_report(struct obx_core *c, const struct obx_report *r)
{
	struct obx_dlv_result res;
	enum obx_dlv_outcome o;
	int64_t committed;

	if (!c->active)
		return; /* an earlier stream's report: never an ack now (docs/internals/design.md, invariant 8) */
	o = obx_dlv_report(&c->dlv, r, c->now_ms, &res);
	if (o == OBX_DLV_REJECTED) {
		/* on_error applies to it in the next transaction, at the replay */
		remember_rejected(c, &r->record, res.dead_letter, r->error);
		c->end_kafka = true;
		fail_at(c, OBX_CORE_END_RETRY, &res.f, "%s: aborting it and rewinding to the slot; on_error "
		    "applies at the replay", res.why);
		return;
	}
	if (o != OBX_DLV_ACKED) {
		delivered(c, o, &res, true);
		return;
	}
	if (c->eos)
		return; /* acknowledged when its Kafka transaction commits (obx_core_commit_done) */
	committed = obx_ack_ticket_time(&c->ack, res.ticket);
	if (committed != 0)
		obx_metrics_observe(c->m, (double)(r->now_us - committed) / 1e6);
	if (obx_ack_ack(&c->ack, res.ticket) != 0) {
		fail(c, OBX_CORE_END_FATAL, "delivery report for unknown ticket %" PRIu64, res.ticket);
		return;
	}
	if (res.dead_letter)
		c->m->events_dead_lettered++;
	else
		c->published++;
}

/* ---- restart de-duplication ---- */

void
obx_core_lookup_done(struct obx_core *c, uint32_t gen, const char *topic, struct obx_dd_scan *s)
{
	uint64_t before = c->dd.fallbacks;

	if (!c->active || gen != c->gen) {
		obx_dd_scan_free(s); /* an earlier session's */
		return;
	}
	if (s != NULL)
		obx_dedupe_install(&c->dd, s);
	else
		obx_dedupe_unavailable(&c->dd, topic, "out of memory");
	c->m->dedupe_fallbacks += c->dd.fallbacks - before;
}

/* Acknowledges the events found in Kafka since the last pump (docs/internals/design.md, invariant 4). */
static void
apply_skips(struct obx_core *c)
{
	for (size_t i = 0; i < c->nskips; i++)
		if (obx_ack_ack(&c->ack, c->skips[i]) != 0) {
			fail(c, OBX_CORE_END_FATAL, "skipped event with unknown ticket %" PRIu64, c->skips[i]);
			return;
		}
	c->m->dedupe_skipped += c->nskips;
	c->nskips = 0;
}

static void
dd_note(void *ctx, enum obx_log_level level, const char *line)
{
	note(ctx, level, NULL, "%s", line);
}

/* ---- flow control, status, drain ---- */

static bool
backpressured(const struct obx_core *c)
{
	if (c->dlv.inflight == 0)
		return false; /* always allow one event, however large */
	/* the ack queue too: a stalled partition must not let acked transactions pile up behind it */
	return obx_dlv_capped(&c->dlv) || c->ack.count >= (size_t)c->cfg->max_inflight;
}

bool
obx_core_backpressured(const struct obx_core *c)
{
	return backpressured(c);
}

bool
obx_core_can_read(const struct obx_core *c)
{
	/* when stopping, read on to the end of an open transaction: stopping inside one
	 * would leave its acknowledged events unconfirmed, to be sent again */
	return c->active && !ending(c) && !obx_dlv_pending(&c->dlv) && !c->replaying && !backpressured(c) &&
	    !c->committing && !c->commit_wanted && !(c->draining && !c->in_txn);
}

void
obx_core_pump(struct obx_core *c, int64_t now_ms)
{
	c->now_ms = now_ms;
	obx_topic_gauge(&c->waits, now_ms, c->m);
	if (!c->active || ending(c))
		return;
	apply_skips(c);
	if (c->committing || c->commit_wanted) {
		/* nothing is produced while a Kafka transaction commits; a drain still ends in time */
		if (c->draining && obx_stops_abandoned(&c->stops, now_ms, OBX_CORE_DRAIN_TIMEOUT_MS)) {
			note(c, OBX_LOG_WARN, NULL, "stopping with a Kafka transaction of %" PRIu64 " record(s) not "
			    "committed after %d s (it is aborted; its events are re-sent from the slot)",
			    c->batch_records, OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
			fail(c, OBX_CORE_END_STOP, "stopped");
		}
		return;
	}
	pending_flush(c);
	if (c->replaying && !obx_dlv_pending(&c->dlv))
		replay(c);
	if (ending(c))
		return;
	if (backpressured(c) != c->paused) {
		/* at the caps under steady load this flips every turn: a pause at info at most
		 * every 10 s, and its release at the level the pause had */
		enum obx_log_level level;

		c->paused = !c->paused;
		if (c->paused) {
			c->pause_noted = now_ms - c->last_pause_note_ms >= BACKPRESSURE_NOTE_MS;
			if (c->pause_noted)
				c->last_pause_note_ms = now_ms;
		}
		level = c->pause_noted ? OBX_LOG_INFO : OBX_LOG_DEBUG;
		if (c->paused)
			note(c, level, NULL, "backpressure: %" PRIu64 " event(s), %" PRIu64 " byte(s) in flight, "
			    "%zu transaction(s) unconfirmed; pausing the replication stream", c->dlv.inflight,
			    c->dlv.inflight_bytes, c->ack.count);
		else
			note(c, level, NULL, "backpressure released: resuming the replication stream");
	}
	if (!c->draining)
		return;
	if (c->ack.outstanding == 0 && !c->in_txn && !obx_dlv_pending(&c->dlv)) {
		fail(c, OBX_CORE_END_STOP, "stopped");
	} else if (obx_stops_abandoned(&c->stops, now_ms, OBX_CORE_DRAIN_TIMEOUT_MS)) {
		note(c, OBX_LOG_WARN, NULL, "stopping with %" PRIu64 " event(s) unacknowledged after %d s "
		    "(they will be re-sent from the slot)", c->ack.outstanding,
		    OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
		fail(c, OBX_CORE_END_STOP, "stopped");
	}
}

void
obx_core_published_elsewhere(struct obx_core *c, uint64_t n)
{
	c->published += n; /* the counter behind outboxd_events_published_total is the process's */
}

void
obx_core_signal(struct obx_core *c, int64_t now_ms)
{
	if (obx_stops_add(&c->stops, now_ms) == OBX_STOP_NOW) {
		fail(c, OBX_CORE_END_STOP, "second signal: stopping at once with %" PRIu64
		    " event(s) unacknowledged (they will be re-sent from the slot)", c->ack.outstanding);
		return;
	}
	c->draining = true;
	if (c->active)
		note(c, OBX_LOG_INFO, NULL, "stopping: waiting up to %d s for %" PRIu64 " outstanding event(s)",
		    OBX_CORE_DRAIN_TIMEOUT_MS / 1000, c->ack.outstanding);
}

/* What may be confirmed: the ack tracker's flush position, held while a floor is checked. */
static obx_lsn
flushable(const struct obx_core *c)
{
	obx_lsn f = obx_ack_flushable(&c->ack);

	/* events were skipped on a floor the replay has not met yet (obx_core_exactly_once()) */
	return c->eos_holding && f > c->eos_hold_flush ? c->eos_hold_flush : f;
}

bool
obx_core_status_due(const struct obx_core *c, int64_t now_ms, obx_lsn *write, obx_lsn *flush,
    bool *reply)
{
	int64_t since = now_ms - c->last_status_ms;

	*flush = flushable(c);
	*write = c->received > *flush ? c->received : *flush;
	/* idle: ask for a keepalive so the confirmed position can follow the WAL end */
	*reply = since >= c->status_interval_ms && obx_ack_idle(&c->ack);
	if (c->status_now || since >= c->status_interval_ms)
		return true;
	return *flush > c->sent_flush && since >= OBX_CORE_STATUS_MIN_GAP_MS;
}

void
obx_core_status_sent(struct obx_core *c, obx_lsn flush, int64_t now_ms)
{
	if (flush > c->sent_flush)
		c->sent_flush = flush;
	c->last_status_ms = now_ms;
	c->status_now = false;
}

int64_t
obx_core_wait_ms(const struct obx_core *c, int64_t now_ms)
{
	int64_t w = c->last_status_ms + c->status_interval_ms - now_ms;

	if (c->status_now)
		w = 0;
	if (flushable(c) > c->sent_flush && c->last_status_ms + OBX_CORE_STATUS_MIN_GAP_MS - now_ms < w)
		w = c->last_status_ms + OBX_CORE_STATUS_MIN_GAP_MS - now_ms;
	if (c->draining && w > DRAIN_CHECK_MS)
		w = DRAIN_CHECK_MS;
	if (obx_dlv_pending(&c->dlv) && w > PENDING_WAIT_MS)
		w = PENDING_WAIT_MS; /* nothing wakes the loop when the producer's queue has room */
	if (c->replaying && !obx_dlv_pending(&c->dlv) && !backpressured(c))
		w = 0; /* reports served meanwhile let the Stream Commit go on: pump at once */
	if (c->nskips > 0)
		w = 0; /* events found in Kafka wait for their acknowledgement */
	if (c->eos && c->batch_records > 0 && !c->committing && !c->commit_wanted &&
	    c->batch_since_ms + c->cfg->txn_max_ms - now_ms < w)
		w = c->batch_since_ms + c->cfg->txn_max_ms - now_ms; /* wanted: the reports wake the loop */
	if (c->committing)
		w = 0; /* the loop drives the commit, a slice per turn */
	return w < 0 ? 0 : w;
}

enum obx_core_end
obx_core_ended(const struct obx_core *c, const char **reason)
{
	if (reason != NULL)
		*reason = c->reason;
	return c->end;
}

bool
obx_core_streaming_allowed(const struct obx_core *c)
{
	return c->cfg->streaming && !c->streaming_off;
}

/* ---- lifetime ---- */

int
obx_core_init(struct obx_core *c, const struct obx_config *cfg, const struct obx_core_ops *ops,
    void *ctx, struct obx_metrics *m)
{
	memset(c, 0, sizeof(*c));
	c->cfg = cfg;
	c->ops = ops;
	c->ctx = ctx;
	c->m = m;
	c->last_pause_note_ms = -BACKPRESSURE_NOTE_MS;
	obx_pgoutput_init(&c->dec, 1);
	obx_relcache_init(&c->rels);
	obx_ack_init(&c->ack, 0);
	obx_streambuf_init(&c->sbuf, (size_t)cfg->stream_buffer_bytes);
	obx_dlv_init(&c->dlv, cfg, OBX_DLV_STREAM, OBX_DLV_ON_ERROR, &core_dlv_ops, c, m, &c->waits);
	return obx_event_builder_init(&c->eb, cfg);
}

void
obx_core_reset(struct obx_core *c)
{
	obx_core_session_end(c);
	obx_event_builder_reset(&c->eb);
	obx_pgoutput_reset(&c->dec);
	message_row_free(c);
	obx_dlv_reset(&c->dlv);
	free(c->skips);
	free(c->batch_tickets);
	free(c->rejected);
	memset(c, 0, sizeof(*c)); /* a second reset is a no-op */
}

/* Restart de-duplication needs the setting, a read-back and a partitioner it can reproduce. */
static bool
dedupe_on(struct obx_core *c)
{
	const char *name;

	if (!c->cfg->dedupe || c->ops->lookup == NULL)
		return false;
	if (obx_dd_partitioner_supported(c->cfg, &name))
		return true;
	if (!c->dd_noted)
		note(c, OBX_LOG_WARN, NULL, "[delivery] dedupe is on but partitioner %s is not one outboxd can "
		    "reproduce (murmur2_random, murmur2): events after a restart are published again "
		    "(at-least-once)", name);
	c->dd_noted = true;
	return false;
}

int
obx_core_session_start(struct obx_core *c, obx_lsn start, int proto, int status_interval_ms,
    int64_t now_ms)
{
	obx_core_session_end(c);
	c->gen++;
	c->active = true;
	c->end = OBX_CORE_RUNNING;
	c->reason[0] = '\0';
	obx_logfields_keep(&c->reason_fields, NULL);
	c->end_kafka = false;
	c->paused = false;
	obx_pgoutput_reset(&c->dec);
	obx_pgoutput_init(&c->dec, proto);
	obx_ack_init(&c->ack, start);
	obx_dedupe_init(&c->dd, dedupe_on(c), dd_note, c);
	obx_dlv_begin(&c->dlv, c->gen, false);
	c->received = c->sent_flush = c->server_wal_end = start;
	c->last_status_ms = now_ms;
	c->status_now = false;
	c->status_interval_ms = status_interval_ms;
	c->now_ms = now_ms;
	return 0;
}

void
obx_core_session_end(struct obx_core *c)
{
	if (c->cfg == NULL)
		return; /* reset already */
	if (c->active)
		c->gen++; /* reports served while the producer closes belong to no session */
	c->active = false;
	c->in_txn = c->in_stream = c->replaying = false;
	obx_dlv_begin(&c->dlv, c->gen, false); /* nothing pending, nothing in flight */
	c->nskips = 0;
	if (c->eos && (c->batch_records > 0 || c->committing))
		c->eos_aborts++; /* ended without its commit: the next init_transactions aborts it */
	batch_clear(c);
	c->eos = c->eos_floor_set = c->eos_checking = c->eos_holding = false;
	obx_dedupe_reset(&c->dd);
	obx_ack_reset(&c->ack);
	obx_relcache_reset(&c->rels);
	obx_relcache_init(&c->rels);
	obx_streambuf_reset(&c->sbuf);
	obx_streambuf_init(&c->sbuf, (size_t)c->cfg->stream_buffer_bytes);
	obx_event_builder_forget(&c->eb);
	c->m->stream_buffer_bytes = 0;
}

/* ---- exactly-once ---- */

void
obx_core_exactly_once(struct obx_core *c, const struct obx_dd_mark *floor, int64_t floor_time)
{
	char a[OBX_LSN_STRLEN];

	c->eos = true;
	c->dlv.transactional = true;
	batch_clear(c);
	/* the progress record does what the read-back would: de-duplication is off */
	obx_dedupe_reset(&c->dd);
	obx_dedupe_init(&c->dd, false, dd_note, c);
	c->eos_skipped = 0;
	c->eos_holding = false;
	c->eos_hold_flush = c->sent_flush;
	if (floor != NULL && c->eos_refused_set && obx_dd_mark_cmp(floor, &c->eos_refused) == 0 &&
	    floor_time == c->eos_refused_time) {
		note(c, OBX_LOG_INFO, NULL, "exactly-once: the last progress record (lsn %s) is the one the replay "
		    "contradicted: not skipping anything", obx_lsn_format(floor->lsn, a, sizeof(a)));
		floor = NULL;
	}
	c->eos_floor_set = c->eos_checking = floor != NULL;
	if (floor != NULL) {
		c->eos_floor = *floor;
		c->eos_floor_time = floor_time;
	}
}

bool
obx_core_commit_due(struct obx_core *c, int64_t now_ms, bool idle, struct obx_core_progress *p)
{
	if (!c->eos || !c->active || ending(c) || c->committing || c->batch_records == 0)
		return false;
	if (!c->commit_wanted && !(idle || c->draining || backpressured(c) ||
	    c->batch_records >= (uint64_t)c->cfg->txn_max_events ||
	    c->batch_bytes >= (uint64_t)c->cfg->txn_max_bytes ||
	    now_ms - c->batch_since_ms >= c->cfg->txn_max_ms))
		return false;
	/* nothing more joins the transaction; its progress record is produced only once every
	 * record of it is acknowledged, so that no broker, consumer or crash ever sees the record
	 * of a transaction without all of its events in the log ("Exactly-once") */
	c->commit_wanted = true;
	if (c->dlv.inflight > 0)
		return false;
	c->commit_wanted = false;
	c->committing = true;
	*p = c->batch;
	p->records = c->batch_records;
	return true;
}

void
obx_core_commit_done(struct obx_core *c, enum obx_core_commit how, const char *why, int64_t now_us)
{
	if (!c->active || !c->committing)
		return;
	if (how != OBX_CORE_COMMIT_OK) {
		c->end_kafka = true;
		if (how == OBX_CORE_COMMIT_FENCED)
			fail(c, OBX_CORE_END_FATAL, "%s", why);
		else
			fail(c, OBX_CORE_END_RETRY, "%s; rewinding to the slot", why);
		return;
	}
	for (size_t i = 0; i < c->nbatch; i++) {
		struct obx_dlv_tag t;
		uint64_t ticket = obx_dlv_untag(c->batch_tickets[i], &t) ? t.ticket : 0;
		int64_t committed = obx_ack_ticket_time(&c->ack, ticket);

		if (committed != 0)
			obx_metrics_observe(c->m, (double)(now_us - committed) / 1e6);
		if (obx_ack_ack(&c->ack, ticket) != 0) {
			fail(c, OBX_CORE_END_FATAL, "committed event with unknown ticket %" PRIu64, ticket);
			return;
		}
		if (t.dead_letter)
			c->m->events_dead_lettered++;
		else
			c->published++;
	}
	c->eos_commits++;
	batch_clear(c);
}

void
obx_core_progress_record(const struct obx_core_progress *p, const struct obx_progress_source *src,
    struct obx_progress *out)
{
	*out = (struct obx_progress){ .mark = p->mark, .mark_commit_time = p->mark_commit_time,
		.has_source = true, .src = *src, .end_lsn = p->end_lsn, .commit_time = p->commit_time,
		.records = p->records };
}

enum obx_core_end
obx_core_txn_init_end(enum obx_txn_result res, const char *txn_id, int budget_ms, char *why,
    size_t whylen)
{
	if (res == OBX_TXN_OK)
		return OBX_CORE_RUNNING;
	if (res == OBX_TXN_PENDING)
		snprintf(why, whylen, "Kafka transactions for transactional.id %s not initialised within %d s",
		    txn_id, budget_ms / 1000);
	return res == OBX_TXN_FENCED ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY;
}

enum obx_core_end
obx_core_fenced_end(bool connection_ours, const char *txn_id, const char *slot, char *why, size_t whylen)
{
	return obx_progress_fenced(connection_ours, txn_id, slot, why, whylen) == OBX_PROGRESS_STOP ?
	    OBX_CORE_END_FATAL : OBX_CORE_END_RETRY;
}

enum obx_core_commit
obx_core_commit_verdict(enum obx_txn_result res, bool connection_ours, const char *txn_id,
    const char *slot, char *why, size_t whylen)
{
	switch (res) {
	case OBX_TXN_OK:
		return OBX_CORE_COMMIT_OK;
	case OBX_TXN_ABORT:
		return OBX_CORE_COMMIT_ABORT;
	case OBX_TXN_FENCED:
		/* a new session goes on through the rewind of a FATAL commit */
		return obx_core_fenced_end(connection_ours, txn_id, slot, why, whylen) == OBX_CORE_END_FATAL ?
		    OBX_CORE_COMMIT_FENCED : OBX_CORE_COMMIT_FATAL;
	default:
		return OBX_CORE_COMMIT_FATAL;
	}
}

int
obx_core_status_interval(int status_interval_ms, int wal_sender_timeout_ms)
{
	if (wal_sender_timeout_ms > 0 && wal_sender_timeout_ms / 3 < status_interval_ms)
		return wal_sender_timeout_ms / 3;
	return status_interval_ms;
}
