/*
 * relaycore.c - the relay's decisions (pure); see relaycore.h and
 * docs/internals/design.md ("Relay core").  This file holds the core's
 * lifetime and session state, the dispatch of the stream's messages, and
 * how a session ends; relaycore_int.h lists the other files of the core.
 *
 * Every event goes through one path: the ack tracker registers it (a
 * ticket), the event builder makes the record (relaycore_msgs.c),
 * obx_rc_send_record() hands it to the producer or, when the producer's
 * queue is full, to the pending queue that obx_core_pump() drains in order
 * (relaycore_reports.c).  A record that can never be produced, or that the
 * broker rejects for good, is handed to on_error: stop ends the run without
 * confirming past it, dead_letter sends it (or, when even that is refused,
 * the headers that identify it) to the dead-letter topic, and the copy's
 * acknowledgement counts for the event.  Before a record reaches the
 * producer, restart de-duplication (core/restart_dedupe.h) may find it in
 * Kafka already: it is then acknowledged at the next pump, as a delivery
 * report would acknowledge it.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"
#include "obx/core/walmsg.h"

uint64_t
obx_core_opaque(uint32_t gen, uint64_t ticket, bool dead_letter)
{
	return obx_dlv_opaque(&(struct obx_dlv_tag){ OBX_DLV_STREAM, gen, ticket, dead_letter, false });
}

/* ---- log lines, and the end of a session ---- */

void
obx_rc_note(struct obx_core *c, enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
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

static void end_session(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f, const char *fmt,
    va_list ap) __attribute__((format(printf, 4, 0)));

static void
end_session(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f, const char *fmt, va_list ap)
{
	/* the first reason wins (a later report of the same refused request names another record),
	 * but a fatal one wins over any other */
	if (c->end == OBX_CORE_END_FATAL || (c->end != OBX_CORE_RUNNING && how != OBX_CORE_END_FATAL))
		return;
	vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
	obx_logfields_keep(&c->reason_fields, f);
	c->end = how;
}

void
obx_core_set_gapless(struct obx_core *c, bool gapless)
{
	c->dlv.gapless = gapless;
	c->dlv.find_alone = gapless || c->cfg->exactly_once;
}

void
obx_core_refused_unseen(struct obx_core *c, const char *why)
{
	if (!c->active || obx_rc_ending(c))
		return;
	if (c->received > c->solo_until)
		c->solo_until = c->received;
	c->solo_pending = true;
	c->end_kafka = true;
	obx_core_fail(c, OBX_CORE_END_RETRY,
	    "%s; rewinding to the slot, to send what was in flight again one record at a time", why);
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

void
obx_rc_fail_at(struct obx_core *c, enum obx_core_end how, const struct obx_logfields *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	end_session(c, how, f, fmt, ap);
	va_end(ap);
}

bool
obx_rc_ending(const struct obx_core *c)
{
	return c->end != OBX_CORE_RUNNING;
}

/* ---- the messages of the stream ---- */

/*
 * A transaction's events begin (Begin, or a Stream Commit about to publish
 * its rows).  Returns false, with the session ended, when one is open already.
 */
bool
obx_rc_open_txn(struct obx_core *c, const char *what, obx_lsn commit_lsn, uint32_t xid, int64_t commit_time)
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
		obx_rc_check_floor(c, commit_lsn, commit_time);
	return !obx_rc_ending(c);
}


static void
handle_begin(struct obx_core *c, const struct obx_pgmsg *m)
{
	(void)obx_rc_open_txn(c, "Begin", m->u.begin.final_lsn, m->u.begin.xid, m->u.begin.commit_time);
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
	obx_rc_batch_txn_done(c, m->u.commit.end_lsn);
}


void
obx_core_pgmsg(struct obx_core *c, const struct obx_pgmsg *m, obx_lsn data_start)
{
	char a[OBX_LSN_STRLEN];

	if (obx_rc_ending(c))
		return;
	if (c->replaying) {
		/* the loop reads only when obx_core_can_read(): a caller's defect, never the server's */
		fail(c, OBX_CORE_END_FATAL, "%s message while a Stream Commit is being published",
		    obx_pgoutput_type_name(m->type));
		return;
	}
	if (data_start > c->received)
		c->received = data_start;
	if (c->solo_pending && c->received > c->solo_until) {
		/* past everything that was read when the refusal came */
		c->solo_pending = c->dlv.solo = false;
		c->solo_until = 0;
		obx_rc_note(c, OBX_LOG_INFO, NULL, "past the refused records: sending at full rate again");
	}
	switch (m->type) {
	case 'B':
		handle_begin(c, m);
		break;
	case 'C':
		handle_commit(c, m);
		break;
	case 'R':
		if (obx_relcache_update(&c->rels, m) != 0)
			fail(c, OBX_CORE_END_FATAL, "out of memory");
		break;
	case 'I':
		obx_rc_insert(c, m);
		break;
	case 'M':
		obx_rc_message(c, m);
		break;
	case 'S':
		obx_rc_stream_start(c, m);
		break;
	case 'E':
		c->in_stream = false;
		break;
	case 'c':
		obx_rc_stream_commit(c, m);
		break;
	case 'A':
		obx_rc_stream_abort(c, m);
		break;
	case 'b':
	case 'P':
	case 'K':
	case 'r':
	case 'p':
		fail(c, OBX_CORE_END_FATAL,
		    "unexpected two-phase %s message at lsn %s: outboxd does not "
		    "request two_phase",
		    obx_pgoutput_type_name(m->type),
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
		obx_rc_floor_refused(c, "the server sent past the record's lsn without its transaction");
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

	if (obx_rc_ending(c))
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
		fail(c, OBX_CORE_END_FATAL,
		    "could not decode pgoutput %s message (type 0x%02x) at offset %zu, "
		    "lsn %s: %s",
		    w.payload_len ? obx_pgoutput_type_name((char)w.payload[0]) : "empty",
		    w.payload_len ? w.payload[0] : 0, c->dec.error_offset,
		    obx_lsn_format(w.data_start ? w.data_start : c->received, a, sizeof(a)), obx_strerror(rc));
		return;
	}
	obx_core_pgmsg(c, &m, w.data_start);
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
obx_core_init(struct obx_core *c, const struct obx_config *cfg, const struct obx_core_ops *ops, void *ctx,
    struct obx_metrics *m)
{
	memset(c, 0, sizeof(*c));
	c->cfg = cfg;
	c->ops = ops;
	c->ctx = ctx;
	c->m = m;
	c->last_pause_note_ms = -OBX_CORE_PAUSE_NOTE_MS;
	obx_pgoutput_init(&c->dec, 1);
	obx_relcache_init(&c->rels);
	obx_ack_init(&c->ack, 0);
	obx_streambuf_init(&c->sbuf, (size_t)cfg->stream_buffer_bytes);
	obx_dlv_init(&c->dlv, cfg, OBX_DLV_STREAM, OBX_DLV_ON_ERROR, &obx_rc_dlv_ops, c, m, &c->waits);
	return obx_event_builder_init(&c->eb, cfg);
}

void
obx_core_reset(struct obx_core *c)
{
	obx_core_session_end(c);
	obx_event_builder_reset(&c->eb);
	obx_pgoutput_reset(&c->dec);
	obx_rc_message_row_free(c);
	obx_cov_reset(&c->cov_base);
	obx_dlv_reset(&c->dlv);
	free(c->skips);
	free(c->batch_tickets);
	free(c->rejected);
	memset(c, 0, sizeof(*c)); /* a second reset is a no-op */
}

int
obx_core_new(struct obx_core **out, const struct obx_config *cfg, const struct obx_core_ops *ops, void *ctx,
    struct obx_metrics *m)
{
	struct obx_core *c = malloc(sizeof(*c));

	*out = NULL;
	if (c == NULL)
		return OBX_ENOMEM;
	if (obx_core_init(c, cfg, ops, ctx, m) != 0) {
		obx_core_reset(c);
		free(c);
		return OBX_ENOMEM;
	}
	*out = c;
	return 0;
}

void
obx_core_free(struct obx_core *c)
{
	if (c == NULL)
		return;
	obx_core_reset(c);
	free(c);
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
		obx_rc_note(c, OBX_LOG_WARN, NULL,
		    "[delivery] dedupe is on but partitioner %s is not "
		    "one outboxd can reproduce (murmur2_random, murmur2): events after a restart are "
		    "published again (at-least-once)",
		    name);
	c->dd_noted = true;
	return false;
}

int
obx_core_session_start(struct obx_core *c, obx_lsn start, int proto, int status_interval_ms, int64_t now_ms)
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
	obx_dedupe_init(&c->dd, dedupe_on(c), obx_rc_dd_note, c);
	obx_dlv_begin(&c->dlv, c->gen, false);
	/*
	 * a refusal of records sent together is tried again one record at a time, with a producer
	 * that writes nothing after a refused batch (obx_core_set_gapless()) or inside Kafka
	 * transactions, so that what is sent again lands in order; solo until the stream reads past
	 * what was read when the refusal came (not compared with start: a transaction that began
	 * before the slot's position reads from below it)
	 */
	c->dlv.find_alone = c->cfg->exactly_once;
	c->dlv.gapless = false;
	c->dlv.solo = c->solo_pending;
	if (c->dlv.solo) {
		char a[OBX_LSN_STRLEN];

		obx_rc_note(c, OBX_LOG_INFO, NULL,
		    "sending one record at a time up to lsn %s, to find the one the broker refuses",
		    obx_lsn_format(c->solo_until, a, sizeof(a)));
	}
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
	obx_rc_batch_clear(c);
	c->eos = c->eos_floor_set = c->eos_checking = c->eos_holding = false;
	c->cov_on = false; /* cov_base and cov_verified stay: the next session starts from them */
	obx_dedupe_reset(&c->dd);
	obx_ack_reset(&c->ack);
	obx_relcache_reset(&c->rels);
	obx_relcache_init(&c->rels);
	obx_streambuf_reset(&c->sbuf);
	obx_streambuf_init(&c->sbuf, (size_t)c->cfg->stream_buffer_bytes);
	obx_event_builder_forget(&c->eb);
	c->mt_rel = NULL; /* and the metrics slot cached for them */
	c->m->stream_buffer_bytes = 0;
}

/* ---- what the loop reads ---- */

struct obx_core_stats
obx_core_stats(const struct obx_core *c)
{
	struct obx_core_stats s = {
		.received = c->received,
		.sent_flush = c->sent_flush,
		.server_wal_end = c->server_wal_end,
		.status_interval_ms = c->status_interval_ms,
		.draining = c->draining,
		.backpressured = obx_rc_backpressured(c),
		.end_kafka = c->end_kafka,
		.published = c->published,
		.inflight_events = c->dlv.inflight,
		.inflight_bytes = c->dlv.inflight_bytes,
		.txn_records = c->batch_records,
		.txn_committed = c->eos_commits,
		.txn_aborted = c->eos_aborts,
	};

	s.has_oldest = obx_ack_oldest_time(&c->ack, &s.oldest_time);
	return s;
}

const struct obx_logfields_kept *
obx_core_reason_fields(const struct obx_core *c)
{
	return &c->reason_fields;
}

struct obx_topic_waits *
obx_core_topic_waits(struct obx_core *c)
{
	return &c->waits;
}

uint32_t
obx_core_generation(const struct obx_core *c)
{
	return c->gen;
}
