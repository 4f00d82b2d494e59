/*
 * relaycore_flow.c - the relay core's flow control: when the loop may read,
 * backpressure, the drain on a stop signal, status updates and how long
 * the loop may wait (relaycore.h, relaycore_int.h).
 */
#include <inttypes.h>
#include <stdio.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"

#define fail obx_core_fail

#define PENDING_WAIT_MS 50
#define DRAIN_CHECK_MS 100

static void coverage_quiet(struct obx_core *c, int64_t now_ms);

/* ---- flow control, status, drain ---- */

bool
obx_rc_backpressured(const struct obx_core *c)
{
	if (c->dlv.inflight == 0)
		return false; /* always allow one event, however large */
	/* the ack queue too: a stalled partition must not let acked transactions pile up behind it */
	return obx_dlv_capped(&c->dlv) || c->ack.count >= (size_t)c->cfg->max_inflight;
}

bool
obx_core_backpressured(const struct obx_core *c)
{
	return obx_rc_backpressured(c);
}

bool
obx_core_can_read(const struct obx_core *c)
{
	/* when stopping, read on to the end of an open transaction: stopping inside one
	 * would leave its acknowledged events unconfirmed, to be sent again */
	return c->active && !obx_rc_ending(c) && !obx_dlv_pending(&c->dlv) && !c->replaying &&
	    !obx_rc_backpressured(c) && !c->committing && !c->commit_wanted && !(c->draining && !c->in_txn);
}

void
obx_core_pump(struct obx_core *c, int64_t now_ms)
{
	c->now_ms = now_ms;
	obx_topic_gauge(&c->waits, now_ms, c->m);
	if (!c->active || obx_rc_ending(c))
		return;
	coverage_quiet(c, now_ms);
	obx_rc_apply_skips(c);
	if (c->committing || c->commit_wanted) {
		/* nothing is produced while a Kafka transaction commits; a drain still ends in time */
		if (c->draining && obx_stops_abandoned(&c->stops, now_ms, OBX_CORE_DRAIN_TIMEOUT_MS)) {
			obx_rc_note(c, OBX_LOG_WARN, NULL,
			    "stopping with a Kafka transaction of %" PRIu64
			    " record(s) not committed after %d s (it is aborted; its events are re-sent "
			    "from the slot)",
			    c->batch_records, OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
			fail(c, OBX_CORE_END_STOP, "stopped");
		}
		return;
	}
	obx_rc_pending_flush(c);
	if (c->replaying && !obx_dlv_pending(&c->dlv))
		obx_rc_replay(c);
	if (obx_rc_ending(c))
		return;
	if (obx_rc_backpressured(c) != c->paused) {
		/* at the caps under steady load this flips every turn: a pause at info at most
		 * every 10 s, and its release at the level the pause had */
		enum obx_log_level level;

		c->paused = !c->paused;
		if (c->paused) {
			c->pause_noted = now_ms - c->last_pause_note_ms >= OBX_CORE_PAUSE_NOTE_MS;
			if (c->pause_noted)
				c->last_pause_note_ms = now_ms;
		}
		level = c->pause_noted ? OBX_LOG_INFO : OBX_LOG_DEBUG;
		if (c->paused)
			obx_rc_note(c, level, NULL,
			    "backpressure: %" PRIu64 " event(s), %" PRIu64
			    " byte(s) in flight, %zu transaction(s) unconfirmed; pausing the replication "
			    "stream",
			    c->dlv.inflight, c->dlv.inflight_bytes, c->ack.count);
		else
			obx_rc_note(c, level, NULL, "backpressure released: resuming the replication stream");
	}
	if (!c->draining)
		return;
	if (c->ack.outstanding == 0 && !c->in_txn && !obx_dlv_pending(&c->dlv)) {
		fail(c, OBX_CORE_END_STOP, "stopped");
	} else if (obx_stops_abandoned(&c->stops, now_ms, OBX_CORE_DRAIN_TIMEOUT_MS)) {
		obx_rc_note(c, OBX_LOG_WARN, NULL,
		    "stopping with %" PRIu64 " event(s) unacknowledged "
		    "after %d s (they will be re-sent from the slot)",
		    c->ack.outstanding, OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
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
		fail(c, OBX_CORE_END_STOP,
		    "second signal: stopping at once with %" PRIu64
		    " event(s) unacknowledged (they will be re-sent from the slot)",
		    c->ack.outstanding);
		return;
	}
	c->draining = true;
	if (c->active)
		obx_rc_note(c, OBX_LOG_INFO, NULL,
		    "stopping: waiting up to %d s for %" PRIu64 " outstanding event(s)",
		    OBX_CORE_DRAIN_TIMEOUT_MS / 1000, c->ack.outstanding);
}

/*
 * What may be confirmed: the ack tracker's flush position, held while a
 * floor is checked, and never past what the catalog readings verified.
 */
static obx_lsn
flushable(const struct obx_core *c)
{
	obx_lsn f = obx_ack_flushable(&c->ack);

	/* events were skipped on a floor the replay has not met yet (obx_core_exactly_once()) */
	if (c->eos_holding && f > c->eos_hold_flush)
		f = c->eos_hold_flush;
	/* a table may have left the publication after the last reading (obx_core_coverage()) */
	if (c->cov_on && f > c->cov_verified)
		f = c->cov_verified;
	return f;
}

/* ---- coverage of the outbox tables (core/coverage.h) ---- */

/* The stop for a table not covered (why says which and how): nothing confirmed past the last verified position. */
static void
cov_gap(struct obx_core *c, const char *why)
{
	char a[OBX_LSN_STRLEN];

	obx_rc_fail_at(c, OBX_CORE_END_FATAL, &(struct obx_logfields){ .lsn = c->cov_verified },
	    "%s; rows committed to it after %s, the last position verified, may be missing from "
	    "Kafka: outboxd stops without confirming past it (publish again what consumers lack: rows "
	    "still in the table can be inserted again, sql/006_reconciliation.sql finds changes without "
	    "an event; then start outboxd again)",
	    why, obx_lsn_format(c->cov_verified, a, sizeof(a)));
}

/* The readings stopped coming for this long while they hold the flush position back: said once. */
#define COV_QUIET_MIN_MS 30000

int
obx_core_coverage_start(struct obx_core *c, const struct obx_cov *base)
{
	char why[1024];
	/* the last session's last verified reading, when this one goes on from where it verified:
	 * a table re-created between the sessions is a gap too (not when another instance confirmed
	 * further meanwhile: its readings were its own) */
	bool carry = c->cov_base.read && c->cov_verified != 0 && c->sent_flush <= c->cov_verified;

	c->cov_on = true;
	c->cov_at_ms = c->now_ms;
	c->cov_noted = false;
	if (carry && !obx_cov_judge(c->cfg, &c->cov_base, base, why, sizeof(why))) {
		c->cov_verified = c->sent_flush;
		cov_gap(c, why);
		return 0;
	}
	c->cov_verified = c->sent_flush;
	return obx_cov_copy(&c->cov_base, base);
}

void
obx_core_coverage(struct obx_core *c, const struct obx_cov *now, obx_lsn lsn)
{
	char why[1024];

	/* also while the session ends: its last confirmation goes as far as this reading verifies */
	if (!c->cov_on || !c->active || c->end == OBX_CORE_END_FATAL)
		return;
	if (!obx_cov_judge(c->cfg, &c->cov_base, now, why, sizeof(why))) {
		cov_gap(c, why);
		return;
	}
	/* the next reading is judged against this one: each step between two readings is covered */
	if (obx_cov_copy(&c->cov_base, now) != 0) {
		obx_rc_fail_at(c, OBX_CORE_END_FATAL, NULL, "out of memory");
		return;
	}
	if (lsn > c->cov_verified)
		c->cov_verified = lsn;
	c->cov_at_ms = c->now_ms;
	if (c->cov_noted)
		obx_rc_note(c, OBX_LOG_INFO, NULL,
		    "the publication's hold on the outbox tables is read again: "
		    "confirming resumes");
	c->cov_noted = false;
}

/* Says once when no reading came for long while the flush position waits for one. */
static void
coverage_quiet(struct obx_core *c, int64_t now_ms)
{
	int64_t limit = 3 * (int64_t)c->status_interval_ms;
	char a[OBX_LSN_STRLEN];

	if (!c->cov_on || c->cov_noted || obx_ack_flushable(&c->ack) <= c->cov_verified)
		return;
	if (limit < COV_QUIET_MIN_MS)
		limit = COV_QUIET_MIN_MS;
	if (now_ms - c->cov_at_ms < limit)
		return;
	c->cov_noted = true;
	obx_rc_note(c, OBX_LOG_WARN, NULL,
	    "confirmed position held at %s: the publication's hold on the outbox tables has not been read "
	    "for %" PRId64 " s (the slot watch's ordinary connection to the server fails; see "
	    "outboxd_server_read_failures_total)",
	    obx_lsn_format(c->cov_verified, a, sizeof(a)), (now_ms - c->cov_at_ms) / 1000);
}

bool
obx_core_status_due(const struct obx_core *c, int64_t now_ms, obx_lsn *write, obx_lsn *flush, bool *reply)
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
	if (c->replaying && !obx_dlv_pending(&c->dlv) && !obx_rc_backpressured(c))
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

int
obx_core_status_interval(int status_interval_ms, int wal_sender_timeout_ms)
{
	if (wal_sender_timeout_ms > 0 && wal_sender_timeout_ms / 3 < status_interval_ms)
		return wal_sender_timeout_ms / 3;
	return status_interval_ms;
}
