/*
 * relaycore_reports.c - the relay core's producing: the delivery policy
 * (core/delivery.h) decides, the stream acts on its outcomes; delivery
 * reports; restart de-duplication (core/restart_dedupe.h): records found in
 * Kafka, read-backs (relaycore.h, relaycore_int.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"

#define fail obx_core_fail

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
	case OBX_DLV_SOLO:     /* ... and sends again one at a time: only reports say either */
		return;
	case OBX_DLV_WAIT_TOPIC:
		/* nothing is confirmed past the event: the next session tries it again */
		c->end_kafka = true;
		obx_rc_fail_at(c, OBX_CORE_END_RETRY, &(struct obx_logfields){ .topic = res->f_topic },
		    "%s, rewinding to the slot", res->reason);
		return;
	case OBX_DLV_RETRY:
		c->end_kafka = c->end_kafka || report;
		obx_rc_fail_at(c, OBX_CORE_END_RETRY, &res->f, report ? "%s; rewinding to the slot" : "%s",
		    res->reason);
		return;
	case OBX_DLV_STOP:
		obx_rc_fail_at(c, OBX_CORE_END_FATAL, &res->f, "%s", res->reason);
		return;
	}
}

/* Hands rec to the delivery policy (dl: rec is a dead-letter record already). */
void
obx_rc_send_record(struct obx_core *c, const struct obx_record *rec, uint64_t ticket, bool dl)
{
	struct obx_dlv_result res;

	if (obx_rc_ending(c))
		return;
	delivered(c, obx_dlv_send(&c->dlv, rec, ticket, dl, c->now_ms, &res), &res, false);
}

/* An event found in Kafka: acknowledged by the next obx_core_pump(), never from here. */
void
obx_rc_skip(struct obx_core *c, uint64_t ticket)
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
	v = obx_dedupe_check(&c->dd, rec->topic, rec->key, rec->keylen, rec->headers, rec->nheaders, &floor);
	if (v != OBX_DD_LOOKUP)
		return v;
	if (c->ops->lookup(c->ctx, rec->topic, &floor, c->gen))
		return OBX_DD_WAIT;
	obx_dedupe_unavailable(&c->dd, rec->topic, "could not start reading it back");
	c->m->dedupe_fallbacks++;
	return OBX_DD_SEND;
}

/* Before each produce: a record rejected inside an aborted Kafka transaction, or de-duplication. */
static enum obx_dlv_gate
dlv_gate(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl, char *errbuf, size_t errlen)
{
	struct obx_core *c = ctx;
	const char *was;

	if (c->nrejected > 0 && (was = obx_rc_rejected_before(c, rec, dl)) != NULL) {
		/* the broker rejected it inside a transaction that was aborted, or alone to a producer
		 * that stopped there: on_error now */
		snprintf(errbuf, errlen, "%s", was);
		return OBX_DLV_GATE_REFUSED;
	}
	switch (dedupe(c, rec)) {
	case OBX_DD_SKIP:
		obx_rc_skip(c, ticket);
		return OBX_DLV_GATE_SETTLED;
	case OBX_DD_WAIT:
		return OBX_DLV_GATE_HOLD; /* tried again by obx_core_pump(), in order */
	default:
		return OBX_DLV_GATE_SEND;
	}
}

static enum obx_produce_result
dlv_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct obx_core *c = ctx;

	return c->ops->produce(c->ctx, rec, opaque, errbuf, errlen);
}

static void
dlv_accepted(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl)
{
	struct obx_core *c = ctx;

	if (c->eos)
		obx_rc_batch_add(c, rec, ticket, dl);
}

static void
dlv_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	obx_rc_note(ctx, level, f, "%s", line);
}

const struct obx_delivery_ops obx_rc_dlv_ops = { dlv_gate, dlv_produce, dlv_accepted, dlv_note };

/* Sends pending records in order until the queue refuses one again. */
void
obx_rc_pending_flush(struct obx_core *c)
{
	struct obx_dlv_result res;

	delivered(c, obx_dlv_pump(&c->dlv, c->now_ms, &res), &res, false);
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
		/* on_error applies to it in the next transaction or session, at the replay */
		obx_rc_remember_rejected(c, &r->record, res.dead_letter, res.why);
		c->end_kafka = true;
		obx_rc_fail_at(c, OBX_CORE_END_RETRY, &res.f, "%s: %s; on_error applies at the replay", res.reason,
		    c->eos ? "aborting it and rewinding to the slot" : "rewinding to the slot");
		return;
	}
	if (o == OBX_DLV_SOLO) {
		/* everything read so far goes again, one record at a time: the next refusal is the
		 * refused record's own */
		if (c->received > c->solo_until)
			c->solo_until = c->received;
		c->solo_pending = true;
		c->end_kafka = true;
		obx_rc_fail_at(c, OBX_CORE_END_RETRY, &res.f, "%s; rewinding to the slot", res.reason);
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
void
obx_rc_apply_skips(struct obx_core *c)
{
	for (size_t i = 0; i < c->nskips; i++)
		if (obx_ack_ack(&c->ack, c->skips[i]) != 0) {
			fail(c, OBX_CORE_END_FATAL, "skipped event with unknown ticket %" PRIu64, c->skips[i]);
			return;
		}
	c->m->dedupe_skipped += c->nskips;
	c->nskips = 0;
}

void
obx_rc_dd_note(void *ctx, enum obx_log_level level, const char *line)
{
	obx_rc_note(ctx, level, NULL, "%s", line);
}
