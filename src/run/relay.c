/*
 * relay.c - the loop of "outboxd run": turns the replication socket, the
 * producer's delivery reports, timers and signals into inputs of the relay
 * core (relaycore.h), and performs the core's actions with pgstream and
 * kafka.  Every decision (what to publish, on_error, what may be
 * confirmed, backpressure, drain) is the core's; docs/internals/design.md ("Relay
 * core") describes the split.
 *
 * relay_session.c opens and closes the sessions and runs the process.
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

#include "obx/core/acktrack.h"
#include "obx/core/err.h"
#include "obx/kafka/producer.h"
#include "obx/sys/log.h"
#include "obx/kafka/dedupe_lookup.h"
#include "obx/core/metrics.h"
#include "obx/pg/stream.h"
#include "obx/pg/util.h"
#include "obx/core/eos_progress.h"
#include "obx/run/relay.h"
#include "obx/run/relay_int.h"
#include "obx/run/relay_eos.h"
#include "obx/core/relaycore.h"
#include "obx/run/runner.h"
#include "obx/pg/slotwatch.h"
#include "obx/run/snapshot.h"
#include "obx/core/walmsg.h"

#define READ_BATCH 2000
#define MAX_REPORT_HEADERS 64
#define IDLE_MESSAGES 32

/* ---- the core's actions ---- */

static enum obx_produce_result
do_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct relay *r = ctx;
	enum obx_produce_result res;

	res = obx_kafka_produce(&r->kf, rec->topic, RD_KAFKA_PARTITION_UA, rec->key, rec->keylen, rec->value,
	    rec->len, rec->timestamp_ms, rec->headers, rec->nheaders, NULL, NULL, opaque, NULL, errbuf, errlen);
	if (res != OBX_PRODUCE_OK)
		return res;
#ifdef OBX_TEST_HOOKS
	/* test builds only: provoke a producer fatal error after N events (OBX_TEST_FATAL_AFTER) */
	if (r->test_fatal_after > 0 && ++r->test_produced == r->test_fatal_after) {
		obx_log_warn("test hook: raising a producer fatal error");
		rd_kafka_test_fatal_error(r->kf.rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, "test hook");
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

const struct obx_core_ops obx_relay_core_ops = { do_produce, do_note, do_lookup };

/* A delivery report, handed to its source with the record as the producer held it. */
void
obx_relay_on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *m)
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
	obx_core_report(r->core, &rep);
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
	if (r->test_kill_after > 0 && obx_core_stats(r->core).published >= (uint64_t)r->test_kill_after)
		raise(SIGKILL);
#endif
	if (r->kf.fenced && obx_core_ended(r->core, NULL) == OBX_CORE_RUNNING) {
		r->end_kafka = true;
		obx_relay_eos_fenced(&r->eos);
	}
	if (r->kf.fatal && r->kf.stopped_at_refusal && obx_core_ended(r->core, NULL) == OBX_CORE_RUNNING) {
		/* the refusal's delivery reports usually come first and say which records; in case not */
		obx_kafka_poll(&r->kf, 100);
		if (obx_core_ended(r->core, NULL) == OBX_CORE_RUNNING)
			obx_core_refused_unseen(r->core, "the producer stopped at a record the broker refused");
	}
	if (r->kf.fatal && obx_core_ended(r->core, NULL) == OBX_CORE_RUNNING) {
		r->end_kafka = true; /* kafka/producer.c counted it in outboxd_kafka_errors_total */
		obx_core_fail(r->core, OBX_CORE_END_RETRY,
		    "producer fatal error: %s; recreating it and "
		    "rewinding to the slot",
		    r->kf.fatal_reason);
	}
}

/* Hands the newest reading of the publication's hold on the outbox tables to the core. */
void
obx_relay_serve_coverage(struct relay *r)
{
	struct obx_cov cov = { 0 };
	obx_lsn lsn;

	if (r->cov_pin != 0 && obx_slotwatch_coverage(&r->watch, r->cov_pin, &r->cov_seq, &cov, &lsn))
		obx_core_coverage(r->core, &cov, lsn);
	obx_cov_reset(&cov);
}

/* Hands finished read-backs of topics (restart de-duplication) to the core. */
static void
serve_lookups(struct relay *r)
{
	struct obx_lookup_job *job;

	while ((job = obx_lookup_take(&r->lk)) != NULL) {
		obx_core_lookup_done(r->core, job->tag, job->topic, job->scan);
		job->scan = NULL;
		obx_lookup_job_free(job);
	}
}

static void
send_status(struct relay *r, obx_lsn write, obx_lsn flush, bool reply)
{
	char err[512], a[OBX_LSN_STRLEN];

	if (obx_pgstream_send_status(&r->st, write, flush, reply, err, sizeof(err)) != 0) {
		obx_core_fail(r->core, OBX_CORE_END_RETRY, "could not send status update: %s", err);
		return;
	}
	if (flush > obx_core_stats(r->core).sent_flush)
		obx_log_f(OBX_LOG_DEBUG, &(struct obx_logfields){ .lsn = flush }, "confirmed %s",
		    obx_lsn_format(flush, a, sizeof(a)));
	obx_core_status_sent(r->core, flush, obx_mono_ms());
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

	if (obx_core_status_due(r->core, now, &write, &flush, &reply))
		send_status(r, write, flush,
		    reply || now - r->last_rx_ms >= obx_core_stats(r->core).status_interval_ms);
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
	obx_lsn received = obx_core_stats(r->core).received;

	if (!obx_core_can_read(r->core) || r->st.wal_sender_timeout_ms <= 0) {
		r->last_rx_ms = now;
		return;
	}
	if (received > r->silence_at)
		r->silence_factor = 1; /* moved on since the last silence */
	if (now - r->last_rx_ms <= limit)
		return;
	if (received == r->silence_at && r->silence_factor < 8)
		r->silence_factor *= 2;
	r->silence_at = received;
	obx_core_fail(r->core, OBX_CORE_END_RETRY,
	    "nothing received from the server for %" PRId64
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

	for (int i = 0; i < READ_BATCH && obx_core_can_read(r->core); i++) {
		const uint8_t *buf;
		size_t len;
		int n = obx_pgstream_read(&r->st, &buf, &len, err, sizeof(err));

		if (n == 0) {
			drained = true;
			break;
		}
		if (n < 0) {
			bool no_pub = n == OBX_ENOENT; /* the publication dropped behind the slot (pg/stream.h) */

			obx_core_fail(r->core, no_pub ? OBX_CORE_END_FATAL : OBX_CORE_END_RETRY,
			    "replication stream lost: %s%s", err,
			    no_pub ? "; the publication was dropped behind "
			             "slot: reconcile the events committed since its confirmed position "
			             "(sql/006_reconciliation.sql), drop the slot and start outboxd once with "
			             "--recreate-slot" :
			             "");
			break;
		}
		got++;
		if (!r->first_message) {
			/* start-up is measured to here (bench/): process start to the first CopyData */
			obx_log_info("first replication message received");
			r->first_message = true;
		}
		obx_core_copydata(r->core, buf, len);
		/* serve delivery reports between messages so acks are never late */
		if ((i & 255) == 255)
			serve_reports(r);
	}
	if (got > 0)
		r->last_rx_ms = obx_mono_ms(); /* one clock read per batch */
	return drained && got <= IDLE_MESSAGES && obx_core_can_read(r->core);
}

/* Exactly-once: the open Kafka transaction's commit, when the core says (relay_eos.h). */
static void
drive_commit(struct relay *r, bool idle)
{
	obx_relay_eos_commit(&r->eos, idle);
}

/* Waits for the socket, the producer, a signal or the core's next deadline. */
static void
wait_for_input(struct relay *r, int flushing)
{
	char err[1024];
	struct pollfd p[4];

	p[0] = (struct pollfd){ obx_pgstream_fd(&r->st), 0, 0 };
	if (obx_core_can_read(r->core))
		p[0].events |= POLLIN;
	if (flushing == 1)
		p[0].events |= POLLOUT;
	p[1] = (struct pollfd){ obx_kafka_fd(&r->kf), POLLIN, 0 };
	p[2] = (struct pollfd){ r->opts->signal_fd, POLLIN, 0 };
	p[3] = (struct pollfd){ obx_lookup_fd(&r->lk), POLLIN, 0 }; /* -1 until a read-back starts */
	if (poll(p, 4, (int)obx_core_wait_ms(r->core, obx_mono_ms())) < 0 && errno != EINTR) {
		obx_core_fail(r->core, OBX_CORE_END_FATAL, "poll: %s", strerror(errno));
		return;
	}
	if ((p[0].revents & (POLLIN | POLLERR | POLLHUP)) && obx_pgstream_consume(&r->st, err, sizeof(err)) != 0)
		obx_core_fail(r->core, OBX_CORE_END_RETRY, "replication connection lost: %s", err);
}

/* ---- one session's loop ---- */

void
obx_relay_loop(void *ctx)
{
	struct relay *r = ctx;

	for (;;) {
		int flushing;
		bool idle;

		obx_runner_read_signals(&r->run);
		serve_reports(r);
		serve_lookups(r);
		obx_relay_serve_coverage(r);
		obx_core_pump(r->core, obx_mono_ms());
		obx_relay_update_metrics(r);
		if (obx_core_ended(r->core, NULL) != OBX_CORE_RUNNING)
			break;
		idle = read_stream(r);
		check_silence(r);
		if (r->cfg->exactly_once && obx_core_ended(r->core, NULL) == OBX_CORE_RUNNING)
			drive_commit(r, idle);
		if (obx_core_ended(r->core, NULL) != OBX_CORE_RUNNING)
			break;
		maybe_status(r);
		flushing = obx_pgstream_flush(&r->st);
		if (flushing < 0) {
			obx_core_fail(r->core, OBX_CORE_END_RETRY, "could not send to the server");
			break;
		}
		wait_for_input(r, flushing);
	}
}
