/*
 * delivery.c - the delivery policy of every source (pure); delivery.h has
 * the contract.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/delivery.h"
#include "obx/core/err.h"
#include "obx/core/lsn.h"

#define OP_DEAD_LETTER (1ULL << 63)
#define OP_BARE (1ULL << 62)
#define OP_SRC_SHIFT 60
#define OP_SRC_MASK 0x3ULL
#define OP_GEN_SHIFT 44
#define OP_GEN_MASK 0xffffULL
#define OP_TICKET_MASK ((1ULL << 44) - 1)
/* the progress record's opaque (kafka/producer.h, OBX_KAFKA_OPAQUE_PROGRESS): no source's */
#define OP_NONE UINT64_MAX

uint64_t
obx_dlv_opaque(const struct obx_dlv_tag *t)
{
	return (t->dead_letter ? OP_DEAD_LETTER : 0) | (t->bare ? OP_BARE : 0) |
	    (((uint64_t)t->src & OP_SRC_MASK) << OP_SRC_SHIFT) |
	    (((uint64_t)t->gen & OP_GEN_MASK) << OP_GEN_SHIFT) | (t->ticket & OP_TICKET_MASK);
}

bool
obx_dlv_untag(uint64_t opaque, struct obx_dlv_tag *t)
{
	if (opaque == OP_NONE)
		return false;
	t->dead_letter = (opaque & OP_DEAD_LETTER) != 0;
	t->bare = (opaque & OP_BARE) != 0;
	t->src = (enum obx_dlv_source)((opaque >> OP_SRC_SHIFT) & OP_SRC_MASK);
	t->gen = (uint32_t)((opaque >> OP_GEN_SHIFT) & OP_GEN_MASK);
	t->ticket = opaque & OP_TICKET_MASK;
	return t->src <= OBX_DLV_POLL;
}

/* ---- missing topics ---- */

void
obx_topic_gauge(const struct obx_topic_waits *w, int64_t now_ms, struct obx_metrics *m)
{
	int oldest = -1;

	for (int i = 0; i < OBX_DLV_MISSING_TOPICS; i++)
		if (w->t[i].name[0] != '\0' && (oldest < 0 || w->t[i].since_ms < w->t[oldest].since_ms))
			oldest = i;
	if (oldest < 0) {
		m->missing_topic[0] = '\0';
		m->missing_topic_seconds = 0;
		return;
	}
	snprintf(m->missing_topic, sizeof(m->missing_topic), "%s", w->t[oldest].name);
	m->missing_topic_seconds = (double)(now_ms - w->t[oldest].since_ms) / 1000.0;
}

void
obx_topic_present(struct obx_topic_waits *w, const char *topic)
{
	for (int i = 0; i < OBX_DLV_MISSING_TOPICS; i++)
		if (strcmp(w->t[i].name, topic) == 0)
			w->t[i].name[0] = '\0';
}

/*
 * The slot of topic's wait, a free one for a new wait, or -1 when every
 * slot holds a wait already (none is forgotten: a wait started again would
 * never end, the stream rewinding for ever).
 */
static int
topic_slot(struct obx_topic_waits *w, const char *topic, int64_t now_ms)
{
	for (int i = 0; i < OBX_DLV_MISSING_TOPICS; i++)
		if (strcmp(w->t[i].name, topic) == 0)
			return i;
	for (int i = 0; i < OBX_DLV_MISSING_TOPICS; i++)
		if (w->t[i].name[0] == '\0') {
			snprintf(w->t[i].name, sizeof(w->t[i].name), "%s", topic);
			w->t[i].since_ms = now_ms;
			w->t[i].expired = false;
			return i;
		}
	return -1;
}

bool
obx_topic_missing(struct obx_topic_waits *w, const char *topic, int64_t now_ms, int64_t timeout_ms)
{
	int i = topic_slot(w, topic, now_ms);

	if (i < 0)
		return false; /* more topics missing at once than are waited for: on_error */
	/* past the timeout it stays so: every record of the topic meets on_error at once (a fresh
	 * wait per record would end each session again and never get past them) */
	if (w->t[i].expired || now_ms - w->t[i].since_ms >= timeout_ms)
		w->t[i].expired = true;
	return !w->t[i].expired;
}

/* ---- what a record is, for the lines about it ---- */

/* The last value of header name in rec as text into buf; false ("" in buf) when absent. */
static bool
header_find(const struct obx_record *rec, const char *name, char *buf, size_t len)
{
	buf[0] = '\0';
	for (size_t i = rec->nheaders; i-- > 0;) {
		const struct obx_header *h = &rec->headers[i];

		if (strcmp(h->name, name) == 0 && h->value != NULL) {
			snprintf(buf, len, "%.*s", (int)h->len, (const char *)h->value);
			return true;
		}
	}
	return false;
}

/* Fills res's fields from rec's headers (id, lsn, xid; original_topic of a copy) and topic. */
static void
describe(struct obx_dlv_result *res, const struct obx_record *rec, uint64_t ticket, bool dl)
{
	char lsn[OBX_LSN_STRLEN + 8], xid[16];
	const char *err;

	res->ticket = ticket;
	res->dead_letter = dl;
	res->reason[0] = '\0';
	res->f = (struct obx_logfields){ .event_id = res->f_id, .topic = res->f_topic };
	if (!header_find(rec, "id", res->f_id, sizeof(res->f_id)))
		snprintf(res->f_id, sizeof(res->f_id), "?");
	if (!header_find(rec, "original_topic", res->f_topic, sizeof(res->f_topic)))
		snprintf(res->f_topic, sizeof(res->f_topic), "%s", rec->topic != NULL ? rec->topic : "");
	if (header_find(rec, "lsn", lsn, sizeof(lsn)) && obx_lsn_parse(lsn, &res->f.lsn) != 0)
		res->f.lsn = OBX_LSN_INVALID;
	if (header_find(rec, "xid", xid, sizeof(xid)))
		res->f.xid = (uint32_t)strtonum(xid, 0, UINT32_MAX, &err);
}

/* " at lsn L" when rec has an lsn header, else "" (polled rows have none). */
static const char *
at_lsn(const struct obx_record *rec, char *buf, size_t len)
{
	char lsn[OBX_LSN_STRLEN + 8];

	if (!header_find(rec, "lsn", lsn, sizeof(lsn))) {
		buf[0] = '\0';
		return buf;
	}
	snprintf(buf, len, " at lsn %s", lsn);
	return buf;
}

static enum obx_dlv_outcome outcome(struct obx_dlv_result *res, enum obx_dlv_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum obx_dlv_outcome
outcome(struct obx_dlv_result *res, enum obx_dlv_outcome o, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(res->reason, sizeof(res->reason), fmt, ap);
	va_end(ap);
	return o;
}

static void note(struct obx_delivery *d, enum obx_log_level level, const struct obx_logfields *f, const char *fmt,
    ...) __attribute__((format(printf, 4, 5)));

static void
note(struct obx_delivery *d, enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	d->ops->note(d->ctx, level, f, line);
}

/* ---- pending records ---- */

static void
pending_free(struct obx_dlv_pending *p)
{
	for (size_t i = 0; i < p->nheaders * 2; i++)
		free(p->hstore[i]);
	free(p->hstore);
	free(p->headers);
	free(p->topic);
	free(p->key);
	free(p->value);
	memset(p, 0, sizeof(*p));
}

static void *
dup_bytes(const void *p, size_t len)
{
	void *d = malloc(len ? len : 1);

	if (d != NULL && len > 0)
		memcpy(d, p, len);
	return d;
}

/* A copy of rec for the pending queue, owned by p.  Returns 0, or OBX_ENOMEM with p partly filled for pending_free(). */
static int
pending_copy(struct obx_dlv_pending *p, const struct obx_record *rec, const struct obx_dlv_tag *t)
{
	memset(p, 0, sizeof(*p));
	p->dead_letter = t->dead_letter;
	p->bare = t->bare;
	p->ticket = t->ticket;
	p->topic = strdup(rec->topic);
	p->key = rec->key != NULL ? dup_bytes(rec->key, rec->keylen) : NULL;
	p->keylen = rec->keylen;
	p->has_value = rec->value != NULL;
	p->value = p->has_value ? dup_bytes(rec->value, rec->len) : NULL;
	p->len = rec->len;
	p->timestamp_ms = rec->timestamp_ms;
	p->headers = calloc(rec->nheaders ? rec->nheaders : 1, sizeof(*p->headers));
	p->hstore = calloc(rec->nheaders * 2 + 1, sizeof(*p->hstore));
	if (p->topic == NULL || (rec->key != NULL && p->key == NULL) || (p->has_value && p->value == NULL) ||
	    p->headers == NULL || p->hstore == NULL)
		return OBX_ENOMEM;
	for (size_t i = 0; i < rec->nheaders; i++) {
		const struct obx_header *h = &rec->headers[i];

		p->nheaders = i + 1;
		p->hstore[2 * i] = strdup(h->name);
		p->hstore[2 * i + 1] = h->value != NULL ? dup_bytes(h->value, h->len) : NULL;
		if (p->hstore[2 * i] == NULL || (h->value != NULL && p->hstore[2 * i + 1] == NULL))
			return OBX_ENOMEM;
		p->headers[i] = (struct obx_header){ p->hstore[2 * i], p->hstore[2 * i + 1], h->len };
	}
	return 0;
}

static struct obx_record
pending_record(const struct obx_dlv_pending *p)
{
	return (struct obx_record){ p->topic, p->key, p->keylen, p->has_value ? p->value : NULL, p->len,
		p->timestamp_ms, p->headers, p->nheaders };
}

/* Keeps a copy of rec at the end of the queue; false when out of memory. */
static bool
pending_push(struct obx_delivery *d, const struct obx_record *rec, const struct obx_dlv_tag *t)
{
	if (d->npend == d->pend_cap) {
		size_t cap = d->pend_cap ? d->pend_cap * 2 : 4;
		struct obx_dlv_pending *grown = reallocarray(d->pend, cap, sizeof(*grown));

		if (grown == NULL)
			return false;
		d->pend = grown;
		d->pend_cap = cap;
	}
	if (pending_copy(&d->pend[d->npend], rec, t) != 0) {
		pending_free(&d->pend[d->npend]);
		return false;
	}
	d->npend++;
	return true;
}

static void
pending_clear(struct obx_delivery *d)
{
	for (size_t i = 0; i < d->npend; i++)
		pending_free(&d->pend[i]);
	d->npend = 0;
}

/* ---- producing, and on_error ---- */

static enum obx_dlv_outcome produce_now(struct obx_delivery *d, const struct obx_record *rec,
    const struct obx_dlv_tag *t, struct obx_dlv_result *res);

/* rec behind the pending ones, or at once. */
static enum obx_dlv_outcome
enqueue(struct obx_delivery *d, const struct obx_record *rec, const struct obx_dlv_tag *t,
    struct obx_dlv_result *res)
{
	if (d->npend > 0) {
		if (!pending_push(d, rec, t))
			return outcome(res, OBX_DLV_STOP, "out of memory");
		return OBX_DLV_SENT;
	}
	return produce_now(d, rec, t, res);
}

/*
 * The dead-letter copy of rec: its headers (but an earlier copy's
 * original_topic and error) plus original_topic and error.
 */
static enum obx_dlv_outcome
send_copy(struct obx_delivery *d, const struct obx_record *rec, uint64_t ticket, const char *reason,
    struct obx_dlv_result *res)
{
	struct obx_header hs[OBX_DLV_MAX_HEADERS + 2];
	struct obx_record dl = *rec;
	struct obx_dlv_tag t = { d->src, d->gen, ticket, true, false };
	size_t n = 0;

	for (size_t i = 0; i < rec->nheaders && n < OBX_DLV_MAX_HEADERS; i++)
		if (strcmp(rec->headers[i].name, "original_topic") != 0 &&
		    strcmp(rec->headers[i].name, "error") != 0)
			hs[n++] = rec->headers[i];
	hs[n++] = (struct obx_header){ "original_topic", rec->topic, strlen(rec->topic) };
	hs[n++] = (struct obx_header){ "error", reason, strlen(reason) };
	dl.topic = d->cfg->dead_letter_topic;
	dl.headers = hs;
	dl.nheaders = n;
	return enqueue(d, &dl, &t, res);
}

/* A dead-letter record refused too (the same size limit, say): its headers alone, as they are. */
static enum obx_dlv_outcome
send_bare(struct obx_delivery *d, const struct obx_record *rec, uint64_t ticket, struct obx_dlv_result *res)
{
	struct obx_record bare = *rec;
	struct obx_dlv_tag t = { d->src, d->gen, ticket, true, true };

	bare.key = bare.value = NULL;
	bare.keylen = bare.len = 0;
	return enqueue(d, &bare, &t, res);
}

/*
 * rec cannot be published (reason; report: the broker refused it, else the
 * produce call).  An event meets on_error (the source's attempts, for
 * OBX_DLV_ATTEMPTS); its dead-letter copy is sent again as its headers
 * alone; when even that is refused nothing more can be done.
 */
static enum obx_dlv_outcome
refused(struct obx_delivery *d, const struct obx_record *rec, const struct obx_dlv_tag *t, const char *reason,
    bool report, struct obx_dlv_result *res)
{
	char at[OBX_LSN_STRLEN + 16], lsn[OBX_LSN_STRLEN + 8], xid[16];

	describe(res, rec, t->ticket, t->dead_letter);
	at_lsn(rec, at, sizeof(at));
	if (!header_find(rec, "lsn", lsn, sizeof(lsn)))
		snprintf(lsn, sizeof(lsn), "?");
	if (!header_find(rec, "xid", xid, sizeof(xid)))
		snprintf(xid, sizeof(xid), "?");
	if (!t->dead_letter && d->policy == OBX_DLV_ATTEMPTS)
		return outcome(res, OBX_DLV_RETRY, "%s", reason);
	if (!t->dead_letter && d->cfg->on_error == OBX_ON_ERROR_STOP) {
		if (report)
			return outcome(res, OBX_DLV_STOP,
			    "event id=%s lsn=%s rejected by the broker for topic %s: "
			    "%s (on_error = stop: nothing after it is confirmed)",
			    res->f_id, lsn, rec->topic, reason);
		return outcome(res, OBX_DLV_STOP,
		    "event id=%s%s (xid %s) cannot be published: %s (on_error = "
		    "stop: nothing after it is confirmed)",
		    res->f_id, at, xid, reason);
	}
	if (!t->dead_letter) {
		if (report)
			note(d, OBX_LOG_WARN, &res->f,
			    "event id=%s lsn=%s rejected by the broker for %s (%s): "
			    "dead-lettering it to %s",
			    res->f_id, lsn, rec->topic, reason, d->cfg->dead_letter_topic);
		else
			note(d, OBX_LOG_WARN, &res->f,
			    "event id=%s%s cannot be published (%s): dead-lettering it "
			    "to %s",
			    res->f_id, at, reason, d->cfg->dead_letter_topic);
		return send_copy(d, rec, t->ticket, reason, res);
	}
	if (!t->bare && (rec->key != NULL || rec->value != NULL)) {
		note(d, OBX_LOG_WARN, &res->f,
		    "the dead-letter copy of event id=%s%s was refused too (%s): "
		    "sending its headers alone to %s",
		    res->f_id, at, reason, d->cfg->dead_letter_topic);
		return send_bare(d, rec, t->ticket, res);
	}
	return outcome(res, d->policy == OBX_DLV_ATTEMPTS ? OBX_DLV_RETRY : OBX_DLV_STOP,
	    "could not dead-letter event id=%s%s to %s: %s", res->f_id, at, d->cfg->dead_letter_topic, reason);
}

/* A refusal because the topic is missing: the wait, then on_error (never for a copy). */
static enum obx_dlv_outcome
missing(struct obx_delivery *d, const struct obx_record *rec, const struct obx_dlv_tag *t, const char *reason,
    bool report, struct obx_dlv_result *res)
{
	bool waiting;

	if (t->dead_letter) {
		describe(res, rec, t->ticket, true);
		/* on_error has decided: a missing dead-letter topic is not waited for */
		return outcome(res, d->policy == OBX_DLV_ATTEMPTS ? OBX_DLV_RETRY : OBX_DLV_STOP,
		    "the dead-letter topic %s does not exist: event id=%s for %s cannot be set aside "
		    "(create the topic, see [delivery] dead_letter_topic)",
		    rec->topic, res->f_id, res->f_topic);
	}
	waiting = obx_topic_missing(d->waits, rec->topic, d->now_ms, d->cfg->missing_topic_timeout_ms);
	obx_topic_gauge(d->waits, d->now_ms, d->m);
	if (!waiting)
		return refused(d, rec, t, reason, report, res);
	describe(res, rec, t->ticket, false);
	return outcome(res, OBX_DLV_WAIT_TOPIC,
	    "topic %s does not exist (yet): waiting up to %lld s for it "
	    "([delivery] missing_topic_timeout) before on_error applies",
	    rec->topic, (long long)(d->cfg->missing_topic_timeout_ms / 1000));
}

static enum obx_dlv_outcome
produce_now(struct obx_delivery *d, const struct obx_record *rec, const struct obx_dlv_tag *t,
    struct obx_dlv_result *res)
{
	char errbuf[512] = "";

	switch (d->ops->gate != NULL ?
	        d->ops->gate(d->ctx, rec, t->ticket, t->dead_letter, errbuf, sizeof(errbuf)) :
	        OBX_DLV_GATE_SEND) {
	case OBX_DLV_GATE_SETTLED:
		describe(res, rec, t->ticket, t->dead_letter);
		return OBX_DLV_SETTLED;
	case OBX_DLV_GATE_HOLD:
		if (!pending_push(d, rec, t))
			return outcome(res, OBX_DLV_STOP, "out of memory");
		return OBX_DLV_SENT;
	case OBX_DLV_GATE_REFUSED:
		return refused(d, rec, t, errbuf, false, res);
	case OBX_DLV_GATE_SEND:
		break;
	}
	switch (d->ops->produce(d->ctx, rec, obx_dlv_opaque(t), errbuf, sizeof(errbuf))) {
	case OBX_PRODUCE_OK:
		d->inflight++;
		d->inflight_bytes += rec->len + rec->keylen;
		if (d->ops->accepted != NULL)
			d->ops->accepted(d->ctx, rec, t->ticket, t->dead_letter);
		return OBX_DLV_SENT;
	case OBX_PRODUCE_QUEUE_FULL:
		if (!pending_push(d, rec, t)) /* tried again by obx_dlv_pump(), in order */
			return outcome(res, OBX_DLV_STOP, "out of memory");
		return OBX_DLV_SENT;
	case OBX_PRODUCE_MISSING_TOPIC:
		return missing(d, rec, t, errbuf, false, res);
	case OBX_PRODUCE_PERMANENT:
		return refused(d, rec, t, errbuf, false, res);
	case OBX_PRODUCE_TRANSIENT:
		break;
	}
	describe(res, rec, t->ticket, t->dead_letter);
	return outcome(res, OBX_DLV_RETRY, "could not produce event id=%s: %s", res->f_id, errbuf);
}

/* ---- the interface ---- */

void
obx_dlv_init(struct obx_delivery *d, const struct obx_config *cfg, enum obx_dlv_source src,
    enum obx_dlv_policy policy, const struct obx_delivery_ops *ops, void *ctx, struct obx_metrics *m,
    struct obx_topic_waits *waits)
{
	memset(d, 0, sizeof(*d));
	d->cfg = cfg;
	d->src = src;
	d->policy = policy;
	d->ops = ops;
	d->ctx = ctx;
	d->m = m;
	d->waits = waits;
}

void
obx_dlv_reset(struct obx_delivery *d)
{
	pending_clear(d);
	free(d->pend);
	d->pend = NULL;
	d->pend_cap = 0;
}

void
obx_dlv_begin(struct obx_delivery *d, uint32_t gen, bool transactional)
{
	pending_clear(d);
	d->gen = gen;
	d->transactional = transactional;
	d->inflight = d->inflight_bytes = 0;
}

enum obx_dlv_outcome
obx_dlv_send(struct obx_delivery *d, const struct obx_record *rec, uint64_t ticket, bool dl, int64_t now_ms,
    struct obx_dlv_result *res)
{
	struct obx_dlv_tag t = { d->src, d->gen, ticket, dl, false };

	d->now_ms = now_ms;
	describe(res, rec, ticket, dl);
	return enqueue(d, rec, &t, res);
}

enum obx_dlv_outcome
obx_dlv_dead_letter(struct obx_delivery *d, const struct obx_record *rec, uint64_t ticket, const char *reason,
    int64_t now_ms, struct obx_dlv_result *res)
{
	d->now_ms = now_ms;
	describe(res, rec, ticket, true);
	return send_copy(d, rec, ticket, reason, res);
}

enum obx_dlv_outcome
obx_dlv_pump(struct obx_delivery *d, int64_t now_ms, struct obx_dlv_result *res)
{
	d->now_ms = now_ms;
	memset(res, 0, sizeof(*res));
	while (d->npend > 0) {
		struct obx_dlv_pending p = d->pend[0];
		struct obx_record rec = pending_record(&p);
		struct obx_dlv_tag t = { d->src, d->gen, p.ticket, p.dead_letter, p.bare };
		enum obx_dlv_outcome o;
		size_t before;

		memmove(&d->pend[0], &d->pend[1], (d->npend - 1) * sizeof(d->pend[0]));
		d->npend--;
		/* one attempt queues at most one record (this one, or its dead-letter copy) */
		before = d->npend;
		describe(res, &rec, p.ticket, p.dead_letter);
		o = produce_now(d, &rec, &t, res);
		if (d->npend > before) {
			/* refused again: it goes back to the front, where it was */
			struct obx_dlv_pending back = d->pend[d->npend - 1];

			memmove(&d->pend[1], &d->pend[0], (d->npend - 1) * sizeof(d->pend[0]));
			d->pend[0] = back;
			pending_free(&p);
			return o;
		}
		pending_free(&p);
		if (o != OBX_DLV_SENT && o != OBX_DLV_SETTLED)
			return o;
	}
	return OBX_DLV_SENT;
}

/* The bytes of rec's header names and values. */
static size_t
header_bytes(const struct obx_record *rec)
{
	size_t n = 0;

	for (size_t i = 0; i < rec->nheaders; i++)
		n += strlen(rec->headers[i].name) + rec->headers[i].len;
	return n;
}

enum obx_dlv_outcome
obx_dlv_report(struct obx_delivery *d, const struct obx_report *r, int64_t now_ms, struct obx_dlv_result *res)
{
	struct obx_dlv_tag t;
	size_t bytes = r->record.len + r->record.keylen;
	char alone[600];
	const char *error = r->error;

	d->now_ms = now_ms;
	memset(res, 0, sizeof(*res));
	if (!obx_dlv_untag(r->opaque, &t) || t.src != d->src || t.gen != (d->gen & OP_GEN_MASK))
		return OBX_DLV_IGNORED; /* an earlier generation's: never an ack now (docs/internals/design.md, invariant 8) */
	if (d->inflight > 0)
		d->inflight--;
	d->inflight_bytes -= d->inflight_bytes < bytes ? d->inflight_bytes : bytes;
	describe(res, &r->record, t.ticket, t.dead_letter);
	switch (r->status) {
	case OBX_REPORT_OK:
		obx_topic_present(d->waits, r->record.topic);
		obx_topic_gauge(d->waits, now_ms, d->m);
		return OBX_DLV_ACKED;
	case OBX_REPORT_PURGED:
		return OBX_DLV_IGNORED; /* the session is being torn down */
	case OBX_REPORT_MISSING_TOPIC:
		obx_metrics_kafka_error(d->m, r->error_name);
		if (d->transactional && !t.dead_letter &&
		    obx_topic_missing(d->waits, r->record.topic, now_ms, d->cfg->missing_topic_timeout_ms))
			return outcome(res, OBX_DLV_WAIT_TOPIC,
			    "topic %s does not exist (yet): waiting up to %lld s "
			    "for it ([delivery] missing_topic_timeout) before on_error applies",
			    r->record.topic, (long long)(d->cfg->missing_topic_timeout_ms / 1000));
		if (!d->transactional)
			return missing(d, &r->record, &t, r->error, true, res);
		break;
	case OBX_REPORT_TRANSIENT:
		obx_metrics_kafka_error(d->m, r->error_name);
		/* timeouts (a user-set message.timeout.ms) and the like: try again, never skip */
		return outcome(res, OBX_DLV_RETRY, "delivery of event id=%s to %s failed: %s", res->f_id,
		    r->record.topic, r->error);
	case OBX_REPORT_PERMANENT:
		obx_metrics_kafka_error(d->m, r->error_name);
		if (d->find_alone && !d->solo && r->whole_request)
			/* the broker may have refused the request it was in, for another record's sake */
			return outcome(res, OBX_DLV_SOLO,
			    "%s id=%s refused by the broker for %s (%s) with the records sent beside it: sending "
			    "them again one at a time to find the one it refuses",
			    t.dead_letter ? "dead-letter copy of event" : "event", res->f_id, r->record.topic,
			    r->error);
		break;
	}
	if (d->solo && r->whole_request) {
		/* alone in flight: the refusal is this record's own; say how large it was */
		snprintf(alone, sizeof(alone), "%.200s (a record of %zu bytes, refused alone)", r->error,
		    bytes + header_bytes(&r->record));
		error = alone;
	}
	snprintf(res->why, sizeof(res->why), "%.250s", error);
	if (d->gapless && !d->transactional && (t.dead_letter || d->cfg->on_error == OBX_ON_ERROR_DEAD_LETTER))
		/* the producer stopped at the refusal: the copy goes out with the next one, at the replay */
		return outcome(res, OBX_DLV_REJECTED, "%s id=%s rejected by the broker for %s (%s)",
		    t.dead_letter ? "dead-letter copy of event" : "event", res->f_id, r->record.topic, error);
	if (d->transactional && (t.dead_letter || d->cfg->on_error == OBX_ON_ERROR_DEAD_LETTER))
		/* a rejected record makes its Kafka transaction abortable: on_error applies to it in
		 * the next transaction, at the replay (docs/internals/design.md, "Exactly-once") */
		return outcome(res, OBX_DLV_REJECTED,
		    "%s id=%s rejected by the broker for %s (%s) inside a "
		    "Kafka transaction",
		    t.dead_letter ? "dead-letter copy of event" : "event", res->f_id, r->record.topic, error);
	return refused(d, &r->record, &t, error, true, res);
}

bool
obx_dlv_pending(const struct obx_delivery *d)
{
	return d->npend > 0;
}

bool
obx_dlv_capped(const struct obx_delivery *d)
{
	if (d->inflight == 0)
		return false; /* always allow one record, however large */
	return d->solo || d->inflight >= (uint64_t)d->cfg->max_inflight ||
	    d->inflight_bytes >= (uint64_t)d->cfg->max_inflight_bytes;
}

bool
obx_dlv_room(const struct obx_delivery *d)
{
	return d->npend == 0 && !obx_dlv_capped(d);
}

bool
obx_dlv_room_for(const struct obx_delivery *d, size_t bytes)
{
	if (d->npend > 0)
		return false;
	if (d->inflight == 0)
		return true; /* one record always goes, however large */
	return !d->solo && d->inflight < (uint64_t)d->cfg->max_inflight &&
	    d->inflight_bytes + bytes <= (uint64_t)d->cfg->max_inflight_bytes;
}
