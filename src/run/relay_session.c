/*
 * relay_session.c - the sessions of "outboxd run" in streaming mode: open
 * one (the replication connection, the producer, the snapshot hand-over,
 * exactly-once's set-up, the core's start), close it (confirm what is safe,
 * end the generation, close the producer), and the process around them
 * through the runner (runner.h): metrics, title, reload, stop signals, a
 * hot standby's wait.  relay.c runs each session's loop; the decisions are
 * the core's (relaycore.h) and the runner's (runpolicy.h).
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/tables.h"
#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/pg/util.h"
#include "obx/core/eos_progress.h"
#include "obx/run/relay_int.h"
#include "obx/core/runpolicy.h"

/* ---- signals, metrics, title: the runner's (runner.h) ---- */

/*
 * SIGHUP: the log level and the progress interval take effect at once (the
 * table marks them so); the runner names every other change as needing a
 * restart.
 */
static void
relay_reload(void *ctx, const struct obx_config *fresh)
{
	struct relay *r = ctx;

	if (fresh->log_level != r->log_level || fresh->progress_interval_ms != r->progress_interval_ms) {
		r->log_level = fresh->log_level;
		r->progress_interval_ms = fresh->progress_interval_ms;
		obx_log_setup(r->log_level, r->cfg->log_format);
		obx_log_info("SIGHUP: log level %s, progress every %d ms", obx_log_level_name(r->log_level),
		    r->progress_interval_ms);
	}
}

/* A stop signal: the core counts it (the first drains, the second stops at once). */
static void
relay_stop(void *ctx, enum obx_stop_verdict v, int64_t now_ms)
{
	struct relay *r = ctx;

	(void)v;
	obx_core_signal(r->core, now_ms);
}

static void
relay_title(void *ctx, char *buf, size_t len)
{
	struct relay *r = ctx;
	char a[OBX_LSN_STRLEN];

	snprintf(buf, len, "%s slot %s confirmed %s", obx_state_name(r->m.state), r->cfg->slot,
	    obx_lsn_format(obx_core_stats(r->core).sent_flush, a, sizeof(a)));
}

/* The server's own numbers (slotwatch.h) into the metrics. */
static void
watch_metrics(struct relay *r)
{
	struct obx_slotview v;

	obx_slotwatch_read(&r->watch, &v);
	r->m.server_ok = obx_server_view_fresh(v.ok, v.read_ms, obx_mono_ms(), r->cfg->status_interval_ms);
	r->m.server_read_failures = v.failures;
	if (v.read_ms == 0)
		return;
	r->m.server_wal_lsn = v.server_lsn;
	r->m.lag_bytes = v.lag_bytes;
	r->m.has_slot = v.has_slot;
	r->m.slot_retained_wal_bytes = v.retained_wal_bytes;
	r->m.slot_safe_wal_size_bytes = v.safe_wal_size_bytes;
	r->m.slot_wal_status = v.wal_status;
	r->m.slot_max_wal_keep_size_bytes = v.max_wal_keep_size_bytes;
}

static void
relay_refresh(void *ctx)
{
	watch_metrics(ctx);
}

static void
log_progress(struct relay *r, int64_t now)
{
	double secs = (double)(now - r->last_progress_ms) / 1000.0;
	char a[OBX_LSN_STRLEN], b[OBX_LSN_STRLEN];
	char lag[32] = "unknown";

	if (r->m.server_ok)
		snprintf(lag, sizeof(lag), "%" PRId64, r->m.lag_bytes);
	obx_log_info("progress: %s, received %s, confirmed %s, lag %s bytes, "
	             "%.1f events/s, %.1f transactions/s, %" PRIu64 " in flight",
	    obx_state_name(r->m.state), obx_lsn_format(r->m.received_lsn, a, sizeof(a)),
	    obx_lsn_format(r->m.confirmed_flush_lsn, b, sizeof(b)), lag,
	    (double)(r->m.events_published - r->progress_events) / secs,
	    (double)(r->m.transactions - r->progress_txns) / secs, r->m.inflight_events);
	r->last_progress_ms = now;
	r->progress_events = r->m.events_published;
	r->progress_txns = r->m.transactions;
	obx_runner_title(&r->run);
}

/* Copies the core's numbers into the metrics, logs progress, publishes. */
void
obx_relay_update_metrics(struct relay *r)
{
	struct obx_core_stats c = obx_core_stats(r->core);
	int64_t now = obx_mono_ms();

	r->m.state = c.draining ? OBX_STATE_DRAINING :
	    c.backpressured     ? OBX_STATE_BACKPRESSURED :
	                          OBX_STATE_STREAMING;
	r->m.not_ready = OBX_NOT_READY_NONE;
	r->m.state_reason[0] = '\0';
	r->m.received_lsn = c.received;
	r->m.confirmed_flush_lsn = c.sent_flush;
	r->m.stream_wal_end_lsn = c.server_wal_end > c.received ? c.server_wal_end : c.received;
	r->m.inflight_events = c.inflight_events;
	r->m.inflight_bytes = c.inflight_bytes;
	obx_metrics_published(&r->m, c.published, obx_unix_seconds());
	r->m.kafka_txn_committed = c.txn_committed;
	r->m.kafka_txn_aborted = c.txn_aborted;
	r->m.oldest_unacked_age_seconds = c.has_oldest ? (double)(obx_pg_now() - c.oldest_time) / 1e6 : 0;
	if (r->progress_interval_ms > 0 && now - r->last_progress_ms >= r->progress_interval_ms)
		log_progress(r, now);
	obx_runner_publish(&r->run);
}

/* ---- one session ---- */

/*
 * Runs about every second while the setup waits on the server (a slot
 * created on a hot standby waits for the primary): /healthz stays green
 * and a stop signal ends the wait.
 */
bool
obx_relay_setup_tick(void *arg)
{
	struct relay *r = arg;

	return obx_runner_tick(&r->run);
}

/* Exactly-once, once the slot is ours (relay_eos.h).  Returns false with r->end and r->reason set. */
static bool
eos_open(struct relay *r)
{
	struct obx_relay_eos_io io = { r->cfg, &r->st, &r->kf, r->core, &r->m, &r->reports_at_us,
		obx_relay_setup_tick, r, 0 };
	enum obx_core_end end;

#ifdef OBX_TEST_HOOKS
	io.kill_after = r->test_kill_after;
#endif
	end = obx_relay_eos_open(&r->eos, &io, r->reason, sizeof(r->reason));
	if (end == OBX_CORE_RUNNING)
		return true;
	r->end = end;
	return false;
}

/*
 * [source] snapshot = pending: publishes the rows pending at the slot's
 * creation (snapshot.c), then drops the marker and starts streaming.
 * Returns false with r->end and r->reason set when the session cannot go on.
 */
static bool
snapshot_then_start(struct relay *r)
{
	char err[1024];
	int rc;

	if (obx_snapshot_init(&r->snap, r->cfg, r->core, &r->kf, &r->m) != 0) {
		r->end = OBX_CORE_END_FATAL;
		snprintf(r->reason, sizeof(r->reason), "out of memory");
		return false;
	}
#ifdef OBX_TEST_HOOKS
	r->snap.kill_after = r->test_kill_after;
#endif
	r->snapshotting = true;
	r->m.not_ready = OBX_NOT_READY_SNAPSHOT;
	snprintf(r->m.state_reason, sizeof(r->m.state_reason),
	    "publishing the rows pending at the "
	    "creation of slot %s before streaming",
	    r->cfg->slot);
	obx_runner_publish(&r->run);
	r->reports_at_us = obx_pg_now();
	rc = obx_snapshot_run(&r->snap, r->st.snap.conn, r->st.snap.imported, r->st.start_confirmed,
	    obx_relay_setup_tick, r, err, sizeof(err));
	obx_core_published_elsewhere(r->core, r->snap.acked - r->snap.dead_lettered);
	if (rc != 0) {
		/* the producer still holds records: the caller closes it, and they are dropped */
		r->end = rc == OBX_ESTATE ? OBX_CORE_END_STOP :
		    rc == OBX_EIO         ? OBX_CORE_END_RETRY :
		                            OBX_CORE_END_FATAL;
		r->end_kafka = rc == OBX_EIO && r->snap.end == OBX_EIO;
		snprintf(r->reason, sizeof(r->reason), "%s", err);
		return false;
	}
	r->snapshotting = false;
	obx_snapshot_reset(&r->snap);
	rc = obx_pgstream_start(&r->st, r->cfg, err, sizeof(err));
	if (rc != 0) {
		r->standby = rc == OBX_EBUSY;
		r->end = rc == OBX_EFATAL ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY;
		snprintf(r->reason, sizeof(r->reason), "%s", err);
		return false;
	}
	return true;
}

/* The session's end, for a reason found while it opened. */
static bool
open_failed(struct relay *r, enum obx_core_end end, const char *reason)
{
	r->end = end;
	snprintf(r->reason, sizeof(r->reason), "%s", reason);
	return false;
}

/* The replication connection, the server checks, the slot.  Returns false with r->end set. */
static bool
open_stream(struct relay *r)
{
	char err[1024];
	int rc;

	/* --recreate-slot is for the slot missing at start-up: once a session has found or
	 * created the slot (also as a standby), one lost later is refused as usual */
	rc = obx_pgstream_open(&r->st, r->cfg, r->opts->recreate_slot && !r->slot_seen,
	    obx_core_streaming_allowed(r->core), &r->setup, err, sizeof(err));
	if (rc == 0 || rc == OBX_EBUSY || r->st.slot_made)
		r->slot_seen = true;
	if (rc == 0) {
		r->eos.fenced_before = false;
		return true;
	}
	obx_pgstream_close(&r->st);
	r->standby = rc == OBX_EBUSY;
	open_failed(r, rc == OBX_EFATAL ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY, err);
	/* fenced, and now another instance holds the slot: it took over (README, "Exactly-once") */
	if (obx_progress_taken_over(r->eos.fenced_before, r->standby, r->eos.fenced_id, r->cfg->slot, r->reason,
	        sizeof(r->reason))) {
		r->standby = false;
		r->end = OBX_CORE_END_FATAL;
	}
	return false;
}

/* The read-back consumer and a fresh producer.  Returns false with r->end set (the stream closed). */
static bool
open_producer(struct relay *r)
{
	char err[1024], txn_id[256];
	const char *partitioner;

	/* the read-backs of restart de-duplication get their consumer connected meanwhile; should
	 * that fail, the first read-back tries again, and a topic it cannot read is published */
	obx_lookup_init(&r->lk, r->cfg);
	if (r->cfg->dedupe && !r->cfg->exactly_once && obx_dd_partitioner_supported(r->cfg, &partitioner))
		(void)obx_lookup_start(&r->lk);
	/* a fresh producer per session: nothing of an earlier stream can land after this one's events */
	if (r->cfg->exactly_once)
		obx_kafka_txn_id(r->cfg, r->st.sysid, PQdb(r->st.conn), txn_id, sizeof(txn_id));
	/* gap-less, so that a refused record stops its partition and what is sent again lands in
	 * order; not while the snapshot of pending rows, whose refusals are on_error at once, uses it */
	if (obx_kafka_open(&r->kf, r->cfg, r->cfg->exactly_once ? txn_id : NULL, !r->st.snap.wanted,
	        obx_relay_on_delivery, r, err, sizeof(err)) != 0) {
		obx_lookup_close(&r->lk);
		obx_pgstream_close(&r->st);
		return open_failed(r, OBX_CORE_END_FATAL, err);
	}
	r->kf.metrics = &r->m;
	return true;
}

/* Closes what open_producer() and open_stream() opened. */
static void
open_undo(struct relay *r)
{
	obx_lookup_close(&r->lk);
	r->reports_at_us = obx_pg_now();
	obx_kafka_close(&r->kf, 0);
	obx_pgstream_close(&r->st);
}

/* The core's session, and the line that says streaming began.  Returns false with r->end set. */
static bool
start_core(struct relay *r)
{
	char a[OBX_LSN_STRLEN];
	int interval = obx_core_status_interval(r->cfg->status_interval_ms, r->st.wal_sender_timeout_ms);

	if (interval != r->cfg->status_interval_ms && interval != r->announced_interval)
		obx_log_info("status updates every %d ms: a third of the server's wal_sender_timeout "
		             "(%d ms), sooner than [source] status_interval (%d ms)",
		    interval, r->st.wal_sender_timeout_ms, r->cfg->status_interval_ms);
	r->announced_interval = interval;
	if (obx_core_session_start(r->core, r->st.start_confirmed, r->st.proto_version, interval, obx_mono_ms()) !=
	    0)
		return open_failed(r, OBX_CORE_END_FATAL, "out of memory");
	obx_core_set_gapless(r->core, r->kf.gapless);
	if (r->cfg->exactly_once)
		obx_relay_eos_start(&r->eos);
	/* the slot watch reads this server from now on; the core confirms only what its readings
	 * verified (core/coverage.h) */
	r->cov_pin = obx_slotwatch_pin(&r->watch, r->st.conn);
	r->cov_seq = 0;
	if (r->cov_pin != 0 && obx_core_coverage_start(r->core, &r->st.cov_base) != 0)
		return open_failed(r, OBX_CORE_END_FATAL, "out of memory");
	if (r->cov_pin == 0 && !r->cov_unchecked_said) {
		obx_log_warn("the slot watch does not run: a table that leaves publication %s while outboxd "
		             "streams is not noticed",
		    r->cfg->publication);
		r->cov_unchecked_said = true;
	}
	obx_log_f(OBX_LOG_INFO, &(struct obx_logfields){ .lsn = r->st.start_confirmed },
	    "streaming from slot %s at %s (pgoutput protocol %d%s%s%s, status every %d ms)", r->cfg->slot,
	    obx_lsn_format(r->st.start_confirmed, a, sizeof(a)), r->st.proto_version,
	    r->st.streaming ? ", streaming in-progress transactions" : "", r->cfg->messages ? ", messages" : "",
	    r->st.in_recovery ? ", from a hot standby" : "", interval);
	return true;
}

/* Connects and starts the producer.  Returns true when streaming may begin. */
static bool
session_open(struct relay *r)
{
	r->m.state = OBX_STATE_CONNECTING;
	if (r->m.not_ready == OBX_NOT_READY_NONE) /* else the last failure's side, until streaming */
		r->m.not_ready = OBX_NOT_READY_POSTGRES;
	obx_runner_publish(&r->run);
	if (!open_stream(r) || !open_producer(r))
		return false;
	if (r->st.snap.wanted && !snapshot_then_start(r)) {
		open_undo(r); /* the producer drops what it still holds: the next session starts it again */
		r->snapshotting = false;
		obx_snapshot_reset(&r->snap);
		return false;
	}
	if (r->cfg->exactly_once && !eos_open(r)) {
		open_undo(r);
		r->end_kafka = r->end != OBX_CORE_END_FATAL;
		return false;
	}
	if (!start_core(r)) {
		open_undo(r);
		return false;
	}
	snprintf(r->m.info_database, sizeof(r->m.info_database), "%s", PQdb(r->st.conn));
	r->streamed = true;
	r->streamed_since_ms = obx_mono_ms();
	r->flush_at_stream = obx_core_stats(r->core).sent_flush;
	r->last_rx_ms = obx_mono_ms();
	if (r->run.was_standby)
		obx_log_info("taking over slot %s from the previous instance", r->cfg->slot);
	r->run.was_standby = false;
	r->last_progress_ms = obx_mono_ms();
	r->progress_events = obx_core_stats(r->core).published;
	r->progress_txns = r->m.transactions;
	return true;
}

/* Confirms what is safe, then closes the producer and the connection. */
static void
session_close(struct relay *r)
{
	const char *reason;
	char err[512];
	obx_lsn write, flush;
	bool reply;

	/* a fresh reading of the catalog first: the last confirmation goes as far as it verifies */
	if (r->cov_pin != 0 && PQstatus(r->st.conn) == CONNECTION_OK &&
	    obx_core_ended(r->core, NULL) != OBX_CORE_END_FATAL && obx_slotwatch_refresh(&r->watch, 3000))
		obx_relay_serve_coverage(r);
	r->end = obx_core_ended(r->core, &reason);
	snprintf(r->reason, sizeof(r->reason), "%s", reason);
	r->reason_fields = *obx_core_reason_fields(r->core);
	r->end_kafka = r->end_kafka || obx_core_stats(r->core).end_kafka;
	/* confirm what is safe before leaving (no-op when the connection is gone) */
	if (r->end != OBX_CORE_END_FATAL && PQstatus(r->st.conn) == CONNECTION_OK) {
		obx_core_status_due(r->core, obx_mono_ms(), &write, &flush, &reply);
		if (obx_pgstream_send_status(&r->st, write, flush, false, err, sizeof(err)) == 0)
			obx_core_status_sent(r->core, flush, obx_mono_ms());
		obx_pgstream_flush(&r->st);
	}
	obx_metrics_published(&r->m, obx_core_stats(r->core).published, obx_unix_seconds());
	/* the generation moves on first: reports served while the producer closes count for nothing */
	obx_core_session_end(r->core);
	/* exactly-once: the open transaction is aborted; a fence may stop the run (relay_eos.h) */
	if (r->cfg->exactly_once && r->kf.rk != NULL &&
	    obx_relay_eos_close(&r->eos, r->end, r->reason, sizeof(r->reason))) {
		r->end = OBX_CORE_END_FATAL;
		obx_logfields_keep(&r->reason_fields, NULL);
	}
	r->m.kafka_txn_aborted = obx_core_stats(r->core).txn_aborted;
	obx_lookup_close(&r->lk);
	obx_pgstream_close(&r->st);
	r->reports_at_us = obx_pg_now();
	obx_kafka_close(&r->kf, 5000);
}

/* ---- one session, as the runner drives it ---- */

static bool
relay_open(void *ctx)
{
	struct relay *r = ctx;

	r->standby = r->end_kafka = false;
	obx_logfields_keep(&r->reason_fields, NULL);
	return session_open(r);
}

static void
relay_close(void *ctx, bool opened, struct obx_session_result *out)
{
	struct relay *r = ctx;
	int64_t streamed_ms = r->streamed ? obx_mono_ms() - r->streamed_since_ms : 0;
	bool confirmed_moved;

	if (opened)
		session_close(r);
	/* with the closing status update: did the session confirm anything (the next session's start
	 * resets the figure) */
	confirmed_moved = r->streamed && obx_core_stats(r->core).sent_flush > r->flush_at_stream;
	out->end = r->end == OBX_CORE_END_STOP ? OBX_RUN_STOP :
	    r->end == OBX_CORE_END_FATAL       ? OBX_RUN_FATAL :
	                                         OBX_RUN_RETRY;
	out->reason = r->reason;
	out->fields = obx_logfields_of(&r->reason_fields);
	out->published = obx_core_stats(r->core).published;
	out->broker = r->end_kafka;
	out->standby = r->standby;
	out->progressed = obx_session_progressed(r->standby, confirmed_moved, streamed_ms);
	r->streamed = false;
}

/*
 * A hot standby waits while another instance streams from the slot: the
 * slot watch reads pg_replication_slots every second on its ordinary
 * connection, so the server sees no replication session and logs no
 * refused START_REPLICATION.  Returns (true on a stop signal), at the
 * earliest a second after it began, once a fresh read finds the slot free
 * or gone (another instance publishing its snapshot holds the slot
 * inactive: then a session a second, as before), or when the server cannot
 * be read or no read came for 3 s, so that the session finds out.  Without
 * the slot watch, the standby's backoff.
 */
static bool
relay_standby_wait(void *ctx)
{
	struct relay *r = ctx;
	int64_t since = obx_mono_ms();
	bool said = false, stop = false;

	if (!r->watch.running)
		return obx_runner_sleep(&r->run, obx_reconnect_delay_ms(0, true, arc4random()));
	obx_slotwatch_fast(&r->watch, true);
	while (!(stop = obx_runner_sleep(&r->run, 250))) {
		struct obx_slotview v;

		obx_slotwatch_read(&r->watch, &v);
		if (obx_standby_step(v.ok, v.read_ms, v.has_slot && v.active, since, obx_mono_ms()) ==
		    OBX_STANDBY_TRY)
			break;
		if (v.ok && v.read_ms > since && !said) {
			obx_log_debug("slot %s is in use by pid %d: waiting, one query a second on an ordinary "
			              "connection",
			    r->cfg->slot, v.active_pid);
			said = true;
		}
	}
	obx_slotwatch_fast(&r->watch, false);
	return stop;
}

static const struct obx_runner_ops relay_runner_ops = {
	.open = relay_open,
	.run = obx_relay_loop,
	.close = relay_close,
	.stop = relay_stop,
	.reload = relay_reload,
	.title = relay_title,
	.refresh = relay_refresh,
	.standby_wait = relay_standby_wait,
};

/* ---- the process ---- */

int
obx_relay_run(const struct obx_config *cfg, const struct obx_run_opts *opts)
{
	struct relay r;
	int rc = 1;

	memset(&r, 0, sizeof(r));
	r.cfg = cfg;
	r.opts = opts;
	r.silence_factor = 1;
	r.log_level = cfg->log_level;
	r.progress_interval_ms = cfg->progress_interval_ms;
	r.setup.tick = obx_relay_setup_tick;
	r.setup.tick_arg = &r;
	obx_log_context(cfg->slot, "logical");
#ifdef OBX_TEST_HOOKS
	/* a value that is not a positive number leaves the hook off (0) */
	if (getenv("OBX_TEST_FATAL_AFTER") != NULL)
		r.test_fatal_after = (long)strtonum(getenv("OBX_TEST_FATAL_AFTER"), 0, LONG_MAX, NULL);
	if (getenv("OBX_TEST_KILL_AFTER_ACKS") != NULL)
		r.test_kill_after = (long)strtonum(getenv("OBX_TEST_KILL_AFTER_ACKS"), 0, LONG_MAX, NULL);
#endif
	snprintf(r.m.info_slot, sizeof(r.m.info_slot), "%s", cfg->slot);
	if (obx_tables_format(cfg, r.m.info_table, sizeof(r.m.info_table)) != 0)
		strlcpy(r.m.info_table, "(several)", sizeof(r.m.info_table));
	obx_pg_conninfo_dbname(cfg->conninfo, r.m.info_database, sizeof(r.m.info_database));
	if (obx_core_new(&r.core, cfg, &obx_relay_core_ops, &r, &r.m) != 0) {
		obx_log_error("out of memory");
		goto out;
	}
	if (obx_runner_init(&r.run, cfg, opts, &r.m, &relay_runner_ops, &r) != 0)
		goto out;
	if (obx_slotwatch_start(&r.watch, cfg, cfg->status_interval_ms) != 0)
		obx_log_warn("could not start reading the slot's lag from the server: outboxd_lag_bytes "
		             "stays NaN");
	rc = obx_runner_run(&r.run);
out:
	obx_slotwatch_stop(&r.watch);
	obx_runner_reset(&r.run);
	obx_core_free(r.core);
	return rc;
}
