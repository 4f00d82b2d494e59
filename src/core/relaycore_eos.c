/*
 * relaycore_eos.c - exactly-once in the relay core ([delivery] exactly_once;
 * docs/internals/design.md, "Exactly-once"): the records of the open Kafka
 * transaction, its commit, the floor a progress record sets and the replay
 * checks, and the verdicts on the producer's transaction calls
 * (relaycore.h, relaycore_int.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"

#define fail obx_core_fail

/* ---- the open Kafka transaction, and records rejected in an aborted one ---- */

static bool
is_bare(const struct obx_record *rec)
{
	return rec->key == NULL && rec->value == NULL;
}

/* Why the broker rejected rec in an earlier session's transaction, or NULL. */
const char *
obx_rc_rejected_before(const struct obx_core *c, const struct obx_record *rec, bool dl)
{
	struct obx_dd_mark m;

	if (c->nrejected == 0 || obx_dd_mark_parse(rec->headers, rec->nheaders, &m) != 0)
		return NULL;
	for (size_t i = 0; i < c->nrejected; i++)
		if (obx_dd_mark_cmp(&c->rejected[i].mark, &m) == 0 && c->rejected[i].dead_letter == dl &&
		    c->rejected[i].bare == is_bare(rec))
			return c->rejected[i].reason;
	return NULL;
}

/* Remembers that the broker rejected rec for good. */
void
obx_rc_remember_rejected(struct obx_core *c, const struct obx_record *rec, bool dl, const char *reason)
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
	c->rejected[i].bare = is_bare(rec);
	snprintf(c->rejected[i].reason, sizeof(c->rejected[i].reason), "%s", reason);
}

/* A record went into the open Kafka transaction: its ticket waits for the commit. */
void
obx_rc_batch_add(struct obx_core *c, const struct obx_record *rec, uint64_t ticket, bool dl)
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
	if (obx_dd_mark_parse(rec->headers, rec->nheaders, &m) == 0 && obx_dd_mark_cmp(&m, &c->batch.mark) > 0) {
		c->batch.mark = m;
		c->batch.mark_commit_time = m.lsn == c->txn.commit_lsn ? c->txn.commit_time : 0;
	}
}

void
obx_rc_batch_clear(struct obx_core *c)
{
	c->nbatch = 0;
	c->batch_records = c->batch_bytes = 0;
	c->committing = c->commit_wanted = false;
	memset(&c->batch, 0, sizeof(c->batch));
}

/*
 * A PostgreSQL transaction ended at end_lsn: when every event of it is in
 * the open Kafka transaction (none waits in the pending queue), its
 * progress record names it as the last one complete.
 */
void
obx_rc_batch_txn_done(struct obx_core *c, obx_lsn end_lsn)
{
	if (!c->eos || obx_dlv_pending(&c->dlv) || c->batch_records == 0)
		return;
	c->batch.end_lsn = end_lsn;
	c->batch.commit_time = c->txn.commit_time;
}

/* ---- the floor: what a committed Kafka transaction holds already ---- */

bool
obx_rc_floor_skip(struct obx_core *c, uint64_t ticket)
{
	struct obx_dd_mark m = { c->txn.commit_lsn, c->txn_events - 1, 0 };

	if (obx_dd_mark_cmp(&m, &c->eos_floor) <= 0) {
		obx_rc_skip(c, ticket); /* a committed Kafka transaction holds it */
		c->eos_skipped++;
		return true;
	}
	c->eos_floor_set = c->eos_checking = false; /* marks only grow: nothing after it is skipped */
	obx_rc_note(c, OBX_LOG_INFO, NULL,
	    "exactly-once: %" PRIu64 " replayed event(s) were in "
	    "committed Kafka transactions already and were not sent again",
	    c->eos_skipped);
	return false;
}

/*
 * Exactly-once: the replay contradicts the floor (no transaction of its
 * commit time at its lsn).  Events skipped before are published again by a
 * new session; none was confirmed (eos_holding).
 */
void
obx_rc_floor_refused(struct obx_core *c, const char *how)
{
	char a[OBX_LSN_STRLEN];

	c->eos_refused = c->eos_floor;
	c->eos_refused_time = c->eos_floor_time;
	c->eos_refused_set = true;
	c->eos_floor_set = c->eos_checking = false;
	obx_lsn_format(c->eos_floor.lsn, a, sizeof(a));
	if (!c->eos_holding) {
		obx_rc_note(c, OBX_LOG_WARN, NULL,
		    "exactly-once: %s: the last progress record (lsn %s) "
		    "is of another history (a data directory restored from a copy?); nothing was "
		    "skipped, nothing is",
		    how, a);
		return;
	}
	/* eos_holding stays: the session's last status update confirms nothing of what it skipped */
	fail(c, OBX_CORE_END_RETRY,
	    "exactly-once: %s: the last progress record (lsn %s) is of another "
	    "history (a data directory restored from a copy?); %" PRIu64 " replayed event(s) were taken for "
	    "ones in Kafka, none confirmed: starting again to publish them",
	    how, a, c->eos_skipped);
}

/*
 * Exactly-once: a transaction at commit_lsn, commit_time begins while the
 * floor is not met yet (obx_core_exactly_once()).
 */
void
obx_rc_check_floor(struct obx_core *c, obx_lsn commit_lsn, int64_t commit_time)
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
		obx_rc_floor_refused(c, "the transaction at the record's lsn committed at another time");
		return;
	}
	if (c->eos_holding) {
		obx_rc_floor_refused(c, "the replay passed the record's lsn without its transaction");
		return;
	}
	/* the first replayed transaction is past the floor: nothing to skip */
	c->eos_floor_set = c->eos_checking = false;
}

/* ---- the session's exactly-once calls ---- */

void
obx_core_exactly_once(struct obx_core *c, const struct obx_dd_mark *floor, int64_t floor_time)
{
	char a[OBX_LSN_STRLEN];

	c->eos = true;
	c->dlv.transactional = true;
	obx_rc_batch_clear(c);
	/* the progress record does what the read-back would: de-duplication is off */
	obx_dedupe_reset(&c->dd);
	obx_dedupe_init(&c->dd, false, obx_rc_dd_note, c);
	c->eos_skipped = 0;
	c->eos_holding = false;
	c->eos_hold_flush = c->sent_flush;
	if (floor != NULL && c->eos_refused_set && obx_dd_mark_cmp(floor, &c->eos_refused) == 0 &&
	    floor_time == c->eos_refused_time) {
		obx_rc_note(c, OBX_LOG_INFO, NULL,
		    "exactly-once: the last progress record (lsn %s) is "
		    "the one the replay contradicted: not skipping anything",
		    obx_lsn_format(floor->lsn, a, sizeof(a)));
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
	if (!c->eos || !c->active || obx_rc_ending(c) || c->committing || c->batch_records == 0)
		return false;
	if (!c->commit_wanted &&
	    !(idle || c->draining || obx_rc_backpressured(c) ||
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
obx_core_commit_done(struct obx_core *c, enum obx_core_commit how, const char *reason, int64_t now_us)
{
	if (!c->active || !c->committing)
		return;
	if (how != OBX_CORE_COMMIT_OK) {
		c->end_kafka = true;
		if (how == OBX_CORE_COMMIT_FENCED)
			fail(c, OBX_CORE_END_FATAL, "%s", reason);
		else
			fail(c, OBX_CORE_END_RETRY, "%s; rewinding to the slot", reason);
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
	obx_rc_batch_clear(c);
}

void
obx_core_progress_record(const struct obx_core_progress *p, const struct obx_progress_source *src,
    struct obx_progress *out)
{
	*out = (struct obx_progress){ .mark = p->mark,
		.mark_commit_time = p->mark_commit_time,
		.has_source = true,
		.src = *src,
		.end_lsn = p->end_lsn,
		.commit_time = p->commit_time,
		.records = p->records };
}

enum obx_core_end
obx_core_txn_init_end(int res, const char *txn_id, int budget_ms, char *errbuf, size_t errlen)
{
	if (res == OBX_OK)
		return OBX_CORE_RUNNING;
	if (res == OBX_ETIMEDOUT)
		snprintf(errbuf, errlen, "Kafka transactions for transactional.id %s not initialised within %d s",
		    txn_id, budget_ms / 1000);
	return res == OBX_EFENCED ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY;
}

enum obx_core_end
obx_core_fenced_end(bool connection_ours, const char *txn_id, const char *slot, char *errbuf, size_t errlen)
{
	return obx_progress_fenced(connection_ours, txn_id, slot, errbuf, errlen) == OBX_PROGRESS_STOP ?
	    OBX_CORE_END_FATAL :
	    OBX_CORE_END_RETRY;
}

enum obx_core_commit
obx_core_commit_verdict(int res, bool connection_ours, const char *txn_id, const char *slot, char *errbuf,
    size_t errlen)
{
	switch (res) {
	case OBX_OK:
		return OBX_CORE_COMMIT_OK;
	case OBX_EABORT:
		return OBX_CORE_COMMIT_ABORT;
	case OBX_EFENCED:
		/* a new session goes on through the rewind of a FATAL commit */
		return obx_core_fenced_end(connection_ours, txn_id, slot, errbuf, errlen) == OBX_CORE_END_FATAL ?
		    OBX_CORE_COMMIT_FENCED :
		    OBX_CORE_COMMIT_FATAL;
	default:
		return OBX_CORE_COMMIT_FATAL;
	}
}
