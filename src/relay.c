/*
 * relay.c - the loop of "outboxd run": turns the replication socket, the
 * producer's delivery reports, timers and signals into inputs of the relay
 * core (relaycore.h), and performs the core's actions with pgstream and
 * kafka.  Every decision (what to publish, on_error, what may be
 * confirmed, backpressure, drain) is the core's; docs/design.md ("Relay
 * core") describes the split.
 *
 * Each session (connect .. disconnect) gets a fresh producer and a new
 * stream generation.  On a transient failure the session ends: the producer
 * drops what it still holds, and the next session resumes from the slot's
 * confirmed position (duplicates possible, loss not).
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

#include "obx/acktrack.h"
#include "obx/err.h"
#include "obx/kafka.h"
#include "obx/log.h"
#include "obx/lookup.h"
#include "obx/metrics.h"
#include "obx/pgstream.h"
#include "obx/pgutil.h"
#include "obx/progress.h"
#include "obx/relay.h"
#include "obx/relay_eos.h"
#include "obx/relaycore.h"
#include "obx/runner.h"
#include "obx/slotwatch.h"
#include "obx/snapshot.h"
#include "obx/walmsg.h"

#define READ_BATCH 2000
#define MAX_REPORT_HEADERS 64
#define IDLE_MESSAGES 32

struct relay {
	struct obx_slotwatch watch;  /* the slot as the server sees it: lag, and a standby's wait */
	const struct obx_config *cfg;
	const struct obx_run_opts *opts;
	struct obx_pgstream st;
	struct obx_kafka kf;
	struct obx_lookup lk;   /* reads topics back for restart de-duplication */
	struct obx_core core;
	struct obx_metrics m;
	struct obx_runner run;   /* HTTP, heartbeat, title, signals, the session loop */
	struct obx_pgsetup_ctx setup; /* lines said once, the tick while the setup waits */

	enum obx_core_end end;  /* how the last session ended */
	char reason[1024];
	struct obx_logfields_kept reason_fields; /* what reason concerns, for its line */
	bool streamed;          /* the last session got as far as streaming */
	bool slot_seen;         /* some session of this process found or created the slot */
	bool standby;           /* the slot is in use by another instance */
	bool end_kafka;         /* the last session ended because of the broker side */
	bool first_message;     /* logged once per process */
	int announced_interval; /* the status interval the last session used */
	int64_t last_rx_ms;     /* the last message from the server (or the last time we were not reading) */
	int64_t reports_at_us;  /* PostgreSQL-epoch time of the delivery reports being served */
	int silence_factor;     /* times wal_sender_timeout that counts as dead (1, 2, 4, 8) */
	obx_lsn silence_at;     /* the received position when silence last ended a session */
	enum obx_log_level log_level; /* as running: SIGHUP may change it */
	int progress_interval_ms;

	int64_t last_progress_ms;
	uint64_t progress_events;
	uint64_t progress_txns;
	struct obx_relay_eos eos; /* exactly-once: the session's transactions (relay_eos.h) */
	struct obx_snapshot snap; /* [source] snapshot = pending: the run under way */
	bool snapshotting;      /* delivery reports go to snap */
#ifdef OBX_TEST_HOOKS
	long test_fatal_after;
	long test_produced;
	long test_kill_after;
#endif
};

/* ---- the core's actions ---- */

/* What a refused produce call means, in words. */
static void
produce_error(const struct relay *r, rd_kafka_resp_err_t err, char *why, size_t whylen)
{
	if (err == RD_KAFKA_RESP_ERR__STATE && r->kf.transactional)
		snprintf(why, whylen, "the Kafka transaction can take no more records (the broker refused "
		    "part of it, it must be aborted)");
	else
		snprintf(why, whylen, "%s", rd_kafka_err2str(err));
}

static enum obx_produce_result
do_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *why, size_t whylen)
{
	struct relay *r = ctx;
	rd_kafka_resp_err_t err;

	err = obx_kafka_produce(&r->kf, rec->topic, RD_KAFKA_PARTITION_UA, rec->key, rec->keylen,
	    rec->value, rec->len, rec->timestamp_ms, rec->headers, rec->nheaders, NULL, NULL, opaque);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
		produce_error(r, err, why, whylen);
		return obx_kafka_produce_result(err);
	}
#ifdef OBX_TEST_HOOKS
	/* test builds only: provoke a producer fatal error after N events (OBX_TEST_FATAL_AFTER) */
	if (r->test_fatal_after > 0 && ++r->test_produced == r->test_fatal_after) {
		obx_log_warn("test hook: raising a producer fatal error");
		rd_kafka_test_fatal_error(r->kf.rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
		    "test hook");
	}
#endif
	return OBX_PRODUCE_OK;
}

static void
do_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	(void)ctx;
	obx_log_f(level, f, "%s", line);
}

static bool
do_lookup(void *ctx, const char *topic, const struct obx_dd_mark *floor, uint32_t gen)
{
	struct relay *r = ctx;

	return obx_lookup_request(&r->lk, topic, floor, gen) == 0;
}

static const struct obx_core_ops relay_ops = { do_produce, do_note, do_lookup };

/* A delivery report, handed to its source with the record as the producer held it. */
static void
on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *m)
{
	struct relay *r = ctx;
	struct obx_header hs[MAX_REPORT_HEADERS];
	struct obx_report rep;
	struct obx_dlv_tag t;

	if (!obx_dlv_untag(opaque, &t)) {
		/* a progress record: its transaction's commit says how it went */
		if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
			obx_log_debug("progress record not delivered: %s", rd_kafka_err2str(m->err));
		return;
	}
	if (t.src == OBX_DLV_SNAPSHOT) {
		if (r->snapshotting)
			obx_snapshot_report(&r->snap, opaque, m);
		return;
	}
	obx_kafka_report(m, opaque, hs, MAX_REPORT_HEADERS, &rep);
	rep.now_us = r->reports_at_us;
	obx_core_report(&r->core, &rep);
}

/* Serves delivery reports; a producer fatal error ends the session (recreate and rewind). */
static void
serve_reports(struct relay *r)
{
	/* one clock read per batch of reports, for the latency histogram */
	r->reports_at_us = obx_pg_now();
	obx_kafka_poll(&r->kf, 0);
#ifdef OBX_TEST_HOOKS
	/* test builds only: die right after N acknowledgements, before any status update
	 * could confirm them (OBX_TEST_KILL_AFTER_ACKS) */
	if (r->test_kill_after > 0 && r->core.published >= (uint64_t)r->test_kill_after)
		raise(SIGKILL);
#endif
	if (r->kf.fenced && obx_core_ended(&r->core, NULL) == OBX_CORE_RUNNING) {
		r->end_kafka = true;
		obx_relay_eos_fenced(&r->eos);
	}
	if (r->kf.fatal && obx_core_ended(&r->core, NULL) == OBX_CORE_RUNNING) {
		r->end_kafka = true;
		obx_metrics_kafka_error(&r->m, "_FATAL");
		obx_core_fail(&r->core, OBX_CORE_END_RETRY, "producer fatal error: %s; recreating it and "
		    "rewinding to the slot", r->kf.fatal_reason);
	}
}

/* Hands finished read-backs of topics (restart de-duplication) to the core. */
static void
serve_lookups(struct relay *r)
{
	struct obx_lookup_job *job;

	while ((job = obx_lookup_take(&r->lk)) != NULL) {
		obx_core_lookup_done(&r->core, job->tag, job->topic, job->scan);
		job->scan = NULL;
		obx_lookup_job_free(job);
	}
}

static void
send_status(struct relay *r, obx_lsn write, obx_lsn flush, bool reply)
{
	char err[512], a[OBX_LSN_STRLEN];

	if (obx_pgstream_send_status(&r->st, write, flush, reply, err, sizeof(err)) != 0) {
		obx_core_fail(&r->core, OBX_CORE_END_RETRY, "could not send status update: %s", err);
		return;
	}
	if (flush > r->core.sent_flush)
		obx_log_f(OBX_LOG_DEBUG, &(struct obx_logfields){ .lsn = flush }, "confirmed %s",
		    obx_lsn_format(flush, a, sizeof(a)));
	obx_core_status_sent(&r->core, flush, obx_mono_ms());
}

/*
 * Sends a status update when the core says one is due; asks the server for
 * a reply too when it has been silent for a status interval, so a healthy
 * connection is never silent for long.
 */
static void
maybe_status(struct relay *r)
{
	int64_t now = obx_mono_ms();
	obx_lsn write, flush;
	bool reply;

	if (obx_core_status_due(&r->core, now, &write, &flush, &reply))
		send_status(r, write, flush, reply || now - r->last_rx_ms >= r->core.status_interval_ms);
}

/*
 * A replication connection silent for wal_sender_timeout while we read is
 * dead (a server that hangs, a network path that drops packets without a
 * reset): the kernel would take its keepalive time to say so.  While the
 * stream is paused nothing is judged.  A server that is merely slow at one
 * point of the WAL (a long step of decoding without a reply) would be cut
 * there again and again: each time the silence ends the session at the same
 * position, the next session allows twice as long (up to 8 times).
 */
static void
check_silence(struct relay *r)
{
	int64_t now = obx_mono_ms(), limit = (int64_t)r->st.wal_sender_timeout_ms * r->silence_factor;

	if (!obx_core_can_read(&r->core) || r->st.wal_sender_timeout_ms <= 0) {
		r->last_rx_ms = now;
		return;
	}
	if (r->core.received > r->silence_at)
		r->silence_factor = 1; /* moved on since the last silence */
	if (now - r->last_rx_ms <= limit)
		return;
	if (r->core.received == r->silence_at && r->silence_factor < 8)
		r->silence_factor *= 2;
	r->silence_at = r->core.received;
	obx_core_fail(&r->core, OBX_CORE_END_RETRY, "nothing received from the server for %" PRId64
	    " ms (wal_sender_timeout is %d ms): treating the replication connection as dead",
	    now - r->last_rx_ms, r->st.wal_sender_timeout_ms);
}

/*
 * Reads what the stream has; returns true when it read everything the
 * connection had buffered and that was little (IDLE_MESSAGES at most): the
 * stream keeps up with the server, so waiting gains no batching.  A backlog
 * arrives in larger reads.
 */
static bool
read_stream(struct relay *r)
{
	char err[1024];
	int got = 0;
	bool drained = false;

	for (int i = 0; i < READ_BATCH && obx_core_can_read(&r->core); i++) {
		const uint8_t *buf;
		size_t len;
		int n = obx_pgstream_read(&r->st, &buf, &len, err, sizeof(err));

		if (n == 0) {
			drained = true;
			break;
		}
		if (n < 0) {
			bool no_pub = n == -2; /* the publication dropped behind the slot (pgstream.h) */

			obx_core_fail(&r->core, no_pub ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY,
			    "replication stream lost: %s%s", err, no_pub ? "; the publication was dropped behind "
			    "slot: reconcile the events committed since its confirmed position "
			    "(sql/006_reconciliation.sql), drop the slot and start outboxd once with "
			    "--recreate-slot" : "");
			break;
		}
		got++;
		if (!r->first_message) {
			/* start-up is measured to here (bench/): process start to the first CopyData */
			obx_log_info("first replication message received");
			r->first_message = true;
		}
		obx_core_copydata(&r->core, buf, len);
		/* serve delivery reports between messages so acks are never late */
		if ((i & 255) == 255)
			serve_reports(r);
	}
	if (got > 0)
		r->last_rx_ms = obx_mono_ms(); /* one clock read per batch */
	return drained && got <= IDLE_MESSAGES && obx_core_can_read(&r->core);
}

/* Exactly-once: the open Kafka transaction's commit, when the core says (relay_eos.h). */
static void
drive_commit(struct relay *r, bool idle)
{
	obx_relay_eos_commit(&r->eos, idle);
}

/* ---- signals, metrics, title: the runner's (runner.h) ---- */

/*
 * SIGHUP: the log level and the progress interval take effect at once;
 * the runner names every other change as needing a restart.
 */
static const char *const relay_live[] = { "[log] level", "[log] progress_interval" };

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
	obx_core_signal(&r->core, now_ms);
}

static void
relay_title(void *ctx, char *buf, size_t len)
{
	struct relay *r = ctx;
	char a[OBX_LSN_STRLEN];

	snprintf(buf, len, "%s slot %s confirmed %s", obx_state_name(r->m.state), r->cfg->slot,
	    obx_lsn_format(r->core.sent_flush, a, sizeof(a)));
}

/* The server's own numbers (slotwatch.h) into the metrics. */
static void
watch_metrics(struct relay *r)
{
	struct obx_slotview v;

	obx_slotwatch_read(&r->watch, &v);
	/* a read older than two intervals hangs (a server that drops packets): not a number to show */
	r->m.server_ok = v.ok && obx_mono_ms() - v.read_ms <= 2 * (int64_t)r->cfg->status_interval_ms + 1000;
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
	    "%.1f events/s, %.1f transactions/s, %" PRIu64 " in flight", obx_state_name(r->m.state),
	    obx_lsn_format(r->m.received_lsn, a, sizeof(a)),
	    obx_lsn_format(r->m.confirmed_flush_lsn, b, sizeof(b)), lag,
	    (double)(r->m.events_published - r->progress_events) / secs,
	    (double)(r->m.transactions - r->progress_txns) / secs, r->m.inflight_events);
	r->last_progress_ms = now;
	r->progress_events = r->m.events_published;
	r->progress_txns = r->m.transactions;
	obx_runner_title(&r->run);
}

/* Copies the core's numbers into the metrics, logs progress, publishes. */
static void
update_metrics(struct relay *r)
{
	const struct obx_core *c = &r->core;
	int64_t now = obx_mono_ms(), oldest;

	r->m.state = c->draining ? OBX_STATE_DRAINING : obx_core_backpressured(c) ?
	    OBX_STATE_BACKPRESSURED : OBX_STATE_STREAMING;
	r->m.not_ready = OBX_NOT_READY_NONE;
	r->m.state_reason[0] = '\0';
	r->m.received_lsn = c->received;
	r->m.confirmed_flush_lsn = c->sent_flush;
	r->m.stream_wal_end_lsn = c->server_wal_end > c->received ? c->server_wal_end : c->received;
	r->m.inflight_events = c->dlv.inflight;
	r->m.inflight_bytes = c->dlv.inflight_bytes;
	obx_metrics_published(&r->m, c->published, obx_unix_seconds());
	r->m.kafka_txn_committed = c->eos_commits;
	r->m.kafka_txn_aborted = c->eos_aborts;
	r->m.oldest_unacked_age_seconds = obx_ack_oldest_time(&c->ack, &oldest) ?
	    (double)(obx_pg_now() - oldest) / 1e6 : 0;
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
static bool
setup_tick(void *arg)
{
	struct relay *r = arg;

	return obx_runner_tick(&r->run);
}

/* The words of produce_error() for the exactly-once part's progress record. */
static void
eos_produce_error(void *ctx, rd_kafka_resp_err_t err, char *why, size_t whylen)
{
	produce_error(ctx, err, why, whylen);
}

/* Exactly-once, once the slot is ours (relay_eos.h).  Returns false with r->end and r->reason set. */
static bool
eos_open(struct relay *r)
{
	struct obx_relay_eos_io io = { r->cfg, &r->st, &r->kf, &r->core, &r->m, &r->reports_at_us,
		setup_tick, r, eos_produce_error, r, 0 };

#ifdef OBX_TEST_HOOKS
	io.kill_after = r->test_kill_after;
#endif
	return obx_relay_eos_open(&r->eos, &io, &r->end, r->reason, sizeof(r->reason));
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
	enum obx_fail f;
	int rc;

	if (obx_snapshot_init(&r->snap, r->cfg, &r->core, &r->kf, &r->m) != 0) {
		r->end = OBX_CORE_END_FATAL;
		snprintf(r->reason, sizeof(r->reason), "out of memory");
		return false;
	}
#ifdef OBX_TEST_HOOKS
	r->snap.kill_after = r->test_kill_after;
#endif
	r->snapshotting = true;
	r->m.not_ready = OBX_NOT_READY_SNAPSHOT;
	snprintf(r->m.state_reason, sizeof(r->m.state_reason), "publishing the rows pending at the "
	    "creation of slot %s before streaming", r->cfg->slot);
	obx_runner_publish(&r->run);
	r->reports_at_us = obx_pg_now();
	rc = obx_snapshot_run(&r->snap, r->st.snap.conn, r->st.snap.imported, r->st.start_confirmed,
	    setup_tick, r, err, sizeof(err));
	r->core.published += r->snap.acked - r->snap.dead_lettered;
	if (rc != 0) {
		/* the producer still holds records: closing it serves their reports to snap */
		r->end = rc == OBX_ESTATE ? OBX_CORE_END_STOP : rc == OBX_EIO ? OBX_CORE_END_RETRY :
		    OBX_CORE_END_FATAL;
		r->end_kafka = rc == OBX_EIO && r->snap.end == OBX_EIO;
		snprintf(r->reason, sizeof(r->reason), "%s", err);
		return false;
	}
	r->snapshotting = false;
	obx_snapshot_reset(&r->snap);
	f = obx_pgstream_start(&r->st, r->cfg, err, sizeof(err));
	if (f != OBX_FAIL_NONE) {
		r->standby = f == OBX_FAIL_SLOT_IN_USE;
		r->end = f == OBX_FAIL_FATAL ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY;
		snprintf(r->reason, sizeof(r->reason), "%s", err);
		return false;
	}
	return true;
}

/* Connects and starts the producer.  Returns true when streaming may begin. */
static bool
session_open(struct relay *r)
{
	char err[1024], a[OBX_LSN_STRLEN];
	const char *partitioner;
	enum obx_fail f;
	int interval;
	char txn_id[256];

	r->m.state = OBX_STATE_CONNECTING;
	if (r->m.not_ready == OBX_NOT_READY_NONE) /* else the last failure's side, until streaming */
		r->m.not_ready = OBX_NOT_READY_POSTGRES;
	obx_runner_publish(&r->run);
	/* --recreate-slot is for the slot missing at start-up: once a session has found or
	 * created the slot (also as a standby), one lost later is refused as usual */
	f = obx_pgstream_open(&r->st, r->cfg, r->opts->recreate_slot && !r->slot_seen,
	    obx_core_streaming_allowed(&r->core), &r->setup, err, sizeof(err));
	if (f == OBX_FAIL_NONE || f == OBX_FAIL_SLOT_IN_USE || r->st.slot_made)
		r->slot_seen = true;
	if (f != OBX_FAIL_NONE) {
		obx_pgstream_close(&r->st);
		r->standby = f == OBX_FAIL_SLOT_IN_USE;
		r->end = f == OBX_FAIL_FATAL ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY;
		snprintf(r->reason, sizeof(r->reason), "%s", err);
		/* fenced, and now another instance holds the slot: it took over (README, "Exactly-once") */
		if (obx_progress_taken_over(r->eos.fenced_before, r->standby, r->eos.fenced_id, r->cfg->slot,
		    r->reason, sizeof(r->reason))) {
			r->standby = false;
			r->end = OBX_CORE_END_FATAL;
		}
		return false;
	}
	r->eos.fenced_before = false;
	/* the read-backs of restart de-duplication get their consumer connected meanwhile; should
	 * that fail, the first read-back tries again, and a topic it cannot read is published */
	obx_lookup_init(&r->lk, r->cfg);
	if (r->cfg->dedupe && !r->cfg->exactly_once && obx_dd_partitioner_supported(r->cfg, &partitioner))
		(void)obx_lookup_start(&r->lk);
	/* a fresh producer per session: nothing of an earlier stream can land after this one's events */
	if (r->cfg->exactly_once)
		obx_kafka_txn_id(r->cfg, r->st.sysid, PQdb(r->st.conn), txn_id, sizeof(txn_id));
	if (obx_kafka_open(&r->kf, r->cfg, r->cfg->exactly_once ? txn_id : NULL, on_delivery, r, err,
	    sizeof(err)) != 0) {
		obx_lookup_close(&r->lk);
		obx_pgstream_close(&r->st);
		r->end = OBX_CORE_END_FATAL;
		snprintf(r->reason, sizeof(r->reason), "%s", err);
		return false;
	}
	r->kf.metrics = &r->m;
	if (r->st.snap.wanted && !snapshot_then_start(r)) {
		obx_lookup_close(&r->lk);
		r->reports_at_us = obx_pg_now();
		obx_kafka_close(&r->kf, 0);
		r->snapshotting = false;
		obx_snapshot_reset(&r->snap);
		obx_pgstream_close(&r->st);
		return false;
	}
	if (r->cfg->exactly_once && !eos_open(r)) {
		obx_lookup_close(&r->lk);
		r->reports_at_us = obx_pg_now();
		obx_kafka_close(&r->kf, 0);
		obx_pgstream_close(&r->st);
		r->end_kafka = r->end != OBX_CORE_END_FATAL;
		return false;
	}
	interval = obx_core_status_interval(r->cfg->status_interval_ms, r->st.wal_sender_timeout_ms);
	if (interval != r->cfg->status_interval_ms && interval != r->announced_interval)
		obx_log_info("status updates every %d ms: a third of the server's wal_sender_timeout "
		    "(%d ms), sooner than [source] status_interval (%d ms)", interval,
		    r->st.wal_sender_timeout_ms, r->cfg->status_interval_ms);
	r->announced_interval = interval;
	if (obx_core_session_start(&r->core, r->st.start_confirmed, r->st.proto_version, interval,
	    obx_mono_ms()) != 0) {
		obx_lookup_close(&r->lk);
		r->reports_at_us = obx_pg_now();
		obx_kafka_close(&r->kf, 0);
		obx_pgstream_close(&r->st);
		r->end = OBX_CORE_END_FATAL;
		snprintf(r->reason, sizeof(r->reason), "out of memory");
		return false;
	}
	if (r->cfg->exactly_once)
		obx_relay_eos_start(&r->eos);
	snprintf(r->m.info_database, sizeof(r->m.info_database), "%s", PQdb(r->st.conn));
	r->streamed = true;
	r->last_rx_ms = obx_mono_ms();
	if (r->run.was_standby)
		obx_log_info("taking over slot %s from the previous instance", r->cfg->slot);
	r->run.was_standby = false;
	r->last_progress_ms = obx_mono_ms();
	r->progress_events = r->core.published;
	r->progress_txns = r->m.transactions;
	obx_log_f(OBX_LOG_INFO, &(struct obx_logfields){ .lsn = r->st.start_confirmed },
	    "streaming from slot %s at %s (pgoutput protocol %d%s%s%s, status every %d ms)",
	    r->cfg->slot, obx_lsn_format(r->st.start_confirmed, a, sizeof(a)), r->st.proto_version,
	    r->st.streaming ? ", streaming in-progress transactions" : "",
	    r->cfg->messages ? ", messages" : "", r->st.in_recovery ? ", from a hot standby" : "",
	    interval);
	return true;
}

/* Waits for the socket, the producer, a signal or the core's next deadline. */
static void
wait_for_input(struct relay *r, int flushing)
{
	char err[1024];
	struct pollfd p[4];

	p[0] = (struct pollfd){ obx_pgstream_fd(&r->st), 0, 0 };
	if (obx_core_can_read(&r->core))
		p[0].events |= POLLIN;
	if (flushing == 1)
		p[0].events |= POLLOUT;
	p[1] = (struct pollfd){ obx_kafka_fd(&r->kf), POLLIN, 0 };
	p[2] = (struct pollfd){ r->opts->signal_fd, POLLIN, 0 };
	p[3] = (struct pollfd){ obx_lookup_fd(&r->lk), POLLIN, 0 }; /* -1 until a read-back starts */
	if (poll(p, 4, (int)obx_core_wait_ms(&r->core, obx_mono_ms())) < 0 && errno != EINTR) {
		obx_core_fail(&r->core, OBX_CORE_END_FATAL, "poll: %s", strerror(errno));
		return;
	}
	if ((p[0].revents & (POLLIN | POLLERR | POLLHUP)) &&
	    obx_pgstream_consume(&r->st, err, sizeof(err)) != 0)
		obx_core_fail(&r->core, OBX_CORE_END_RETRY, "replication connection lost: %s", err);
}

/* Confirms what is safe, then closes the producer and the connection. */
static void
session_close(struct relay *r)
{
	const char *reason;
	char err[512];
	obx_lsn write, flush;
	bool reply;

	r->end = obx_core_ended(&r->core, &reason);
	snprintf(r->reason, sizeof(r->reason), "%s", reason);
	r->reason_fields = r->core.reason_fields;
	r->end_kafka = r->end_kafka || r->core.end_kafka;
	/* confirm what is safe before leaving (no-op when the connection is gone) */
	if (r->end != OBX_CORE_END_FATAL && PQstatus(r->st.conn) == CONNECTION_OK) {
		obx_core_status_due(&r->core, obx_mono_ms(), &write, &flush, &reply);
		if (obx_pgstream_send_status(&r->st, write, flush, false, err, sizeof(err)) == 0)
			obx_core_status_sent(&r->core, flush, obx_mono_ms());
		obx_pgstream_flush(&r->st);
	}
	obx_metrics_published(&r->m, r->core.published, obx_unix_seconds());
	/* the generation moves on first: reports served while the producer closes count for nothing */
	obx_core_session_end(&r->core);
	/* exactly-once: the open transaction is aborted; a fence may stop the run (relay_eos.h) */
	if (r->cfg->exactly_once && r->kf.rk != NULL &&
	    obx_relay_eos_close(&r->eos, r->end, r->reason, sizeof(r->reason))) {
		r->end = OBX_CORE_END_FATAL;
		obx_logfields_keep(&r->reason_fields, NULL);
	}
	r->m.kafka_txn_aborted = r->core.eos_aborts;
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
relay_run(void *ctx)
{
	struct relay *r = ctx;

	for (;;) {
		int flushing;
		bool idle;

		obx_runner_read_signals(&r->run);
		serve_reports(r);
		serve_lookups(r);
		obx_core_pump(&r->core, obx_mono_ms());
		update_metrics(r);
		if (obx_core_ended(&r->core, NULL) != OBX_CORE_RUNNING)
			break;
		idle = read_stream(r);
		check_silence(r);
		if (r->cfg->exactly_once && obx_core_ended(&r->core, NULL) == OBX_CORE_RUNNING)
			drive_commit(r, idle);
		if (obx_core_ended(&r->core, NULL) != OBX_CORE_RUNNING)
			break;
		maybe_status(r);
		flushing = obx_pgstream_flush(&r->st);
		if (flushing < 0) {
			obx_core_fail(&r->core, OBX_CORE_END_RETRY, "could not send to the server");
			break;
		}
		wait_for_input(r, flushing);
	}
}

static void
relay_close(void *ctx, bool opened, struct obx_session_result *out)
{
	struct relay *r = ctx;

	if (opened)
		session_close(r);
	out->end = r->end == OBX_CORE_END_STOP ? OBX_RUN_STOP : r->end == OBX_CORE_END_FATAL ?
	    OBX_RUN_FATAL : OBX_RUN_RETRY;
	out->reason = r->reason;
	out->fields = obx_logfields_of(&r->reason_fields);
	out->published = r->core.published;
	out->broker = r->end_kafka;
	out->standby = r->standby;
	out->progressed = r->streamed || r->standby;
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
		if (obx_mono_ms() - since < 1000)
			continue; /* a session at most every second, as before */
		/* unreadable, or no fresh read for 3 s (a hanging one): let the session find out */
		if (!v.ok || obx_mono_ms() - v.read_ms > 3000)
			break;
		if (v.read_ms > since && !(v.has_slot && v.active))
			break;
		if (v.ok && v.read_ms > since && !said) {
			obx_log_debug("slot %s is in use by pid %d: waiting, one query a second on an ordinary "
			    "connection", r->cfg->slot, v.active_pid);
			said = true;
		}
	}
	obx_slotwatch_fast(&r->watch, false);
	return stop;
}

static const struct obx_runner_ops relay_runner_ops = {
	.open = relay_open,
	.run = relay_run,
	.close = relay_close,
	.stop = relay_stop,
	.reload = relay_reload,
	.live = relay_live,
	.nlive = sizeof(relay_live) / sizeof(relay_live[0]),
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
	r.setup.tick = setup_tick;
	r.setup.tick_arg = &r;
	obx_log_context(cfg->slot, "logical");
#ifdef OBX_TEST_HOOKS
	if (getenv("OBX_TEST_FATAL_AFTER") != NULL)
		r.test_fatal_after = atol(getenv("OBX_TEST_FATAL_AFTER"));
	if (getenv("OBX_TEST_KILL_AFTER_ACKS") != NULL)
		r.test_kill_after = atol(getenv("OBX_TEST_KILL_AFTER_ACKS"));
#endif
	snprintf(r.m.info_slot, sizeof(r.m.info_slot), "%s", cfg->slot);
	snprintf(r.m.info_table, sizeof(r.m.info_table), "%s.%s", cfg->table_schema, cfg->table_name);
	obx_pg_conninfo_dbname(cfg->conninfo, r.m.info_database, sizeof(r.m.info_database));
	if (obx_core_init(&r.core, cfg, &relay_ops, &r, &r.m) != 0) {
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
	obx_core_reset(&r.core);
	return rc;
}
