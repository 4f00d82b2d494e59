/*
 * snapshot.c - [source] snapshot = pending: the rows already pending when
 * outboxd created its slot (docs/internals/design.md, "Rows pending at the slot's
 * creation").
 *
 * One repeatable-read transaction on an ordinary connection, in the
 * snapshot the slot exported (or a fresh one after a crash): a cursor over
 * the matching rows in table order, each row built into a record by the
 * event builder of the log-based source and produced; then every delivery
 * report is waited for.  Only then may the caller drop the marker and
 * stream, so the stream's first event follows the last snapshot record.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/delivery.h"
#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/pg/stream.h"
#include "obx/pg/util.h"
#include "obx/run/poll.h"
#include "obx/core/relaycore.h"
#include "obx/core/snapcore.h"
#include "obx/run/snapshot.h"
#include "obx/run/snapshot_int.h"
#include "obx/pg/tables.h"
#include "obx/core/tables.h"


#define PROGRESS_MS 10000


static const struct obx_delivery_ops snapshot_ops;

int
obx_snapshot_init(struct obx_snapshot *s, const struct obx_config *cfg, struct obx_core *core,
    struct obx_kafka *kf, struct obx_metrics *m)
{
	memset(s, 0, sizeof(*s));
	s->cfg = cfg;
	s->core = core;
	s->kf = kf;
	s->m = m;
	if (obx_event_builder_init(&s->eb, cfg) != 0)
		return OBX_ENOMEM;
	s->eb_ready = true;
	/* the stream's missing-topic waits: one rule and one gauge for the process */
	obx_dlv_init(&s->dlv, cfg, OBX_DLV_SNAPSHOT, OBX_DLV_ON_ERROR, &snapshot_ops, s, m,
	    obx_core_topic_waits(core));
	obx_dlv_begin(&s->dlv, obx_core_generation(core), false);
	return 0;
}

void
obx_snapshot_reset(struct obx_snapshot *s)
{
	if (s->eb_ready)
		obx_event_builder_reset(&s->eb);
	obx_rel_free(&s->rel);
	free(s->datums);
	free(s->hdrs);
	obx_dlv_reset(&s->dlv);
	memset(s, 0, sizeof(*s));
}

/* Records the first failure of the run; later ones add nothing. */
void
obx_snap_fail(struct obx_snapshot *s, int end, const char *fmt, ...)
{
	va_list ap;

	if (s->end != 0)
		return;
	s->end = end;
	va_start(ap, fmt);
	vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
	va_end(ap);
}

/* ---- the delivery policy's actions (delivery.h) ---- */

static enum obx_produce_result
snap_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct obx_snapshot *s = ctx;
	enum obx_produce_result res;
	const char *name;

	res = obx_kafka_produce(s->kf, rec->topic, RD_KAFKA_PARTITION_UA, rec->key, rec->keylen, rec->value,
	    rec->len, rec->timestamp_ms, rec->headers, rec->nheaders, NULL, NULL, opaque, &name, errbuf, errlen);
	if (res != OBX_PRODUCE_OK && res != OBX_PRODUCE_QUEUE_FULL)
		obx_metrics_kafka_error(s->m, name);
	return res;
}

static void
snap_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	struct obx_snapshot *s = ctx;

	obx_log_f(level, f, "snapshot of slot %s: %s", s->cfg->slot, line);
}

static const struct obx_delivery_ops snapshot_ops = { NULL, snap_produce, NULL, snap_note };

/*
 * What an outcome of the delivery policy means for the run (snapcore.h:
 * the next session starts the snapshot again, or exit 1).  Returns 0 or
 * the run's end code.
 */
int
obx_snap_delivered(struct obx_snapshot *s, enum obx_dlv_outcome o, const struct obx_dlv_result *res)
{
	char errbuf[sizeof(s->reason)];
	int end = obx_snap_outcome(&s->hold, o, res->ticket, s->cfg->slot, res->reason, errbuf, sizeof(errbuf));

	if (o == OBX_DLV_WAIT_TOPIC && !s->hold.probe && res->ticket == s->hold.from)
		obx_log_f(OBX_LOG_WARN, &res->f,
		    "snapshot of slot %s: %s; the snapshot holds, and reads its rows again from this one "
		    "once it can go",
		    s->cfg->slot, res->reason);
	if (end == 0)
		return 0;
	obx_snap_fail(s, end, "%s", errbuf);
	return s->end;
}

void
obx_snapshot_report(struct obx_snapshot *s, uint64_t opaque, const rd_kafka_message_t *m)
{
	struct obx_header hs[OBX_DLV_MAX_HEADERS];
	struct obx_report rep;
	struct obx_dlv_result res;
	enum obx_dlv_outcome o;

	obx_kafka_report(m, opaque, hs, OBX_DLV_MAX_HEADERS, &rep);
	o = obx_dlv_report(&s->dlv, &rep, obx_mono_ms(), &res);
	if (o != OBX_DLV_ACKED) {
		(void)obx_snap_delivered(s, o, &res);
		return;
	}
	s->acked++;
	if (res.dead_letter) {
		s->dead_lettered++;
		s->m->events_dead_lettered++;
	} else {
		obx_metrics_published(s->m, s->m->events_published + 1, obx_unix_seconds());
	}
#ifdef OBX_TEST_HOOKS
	if (s->kill_after > 0 && s->acked >= (uint64_t)s->kill_after) {
		obx_log_info("test hook: killing myself after %" PRIu64 " snapshot acknowledgement(s)", s->acked);
		raise(SIGKILL);
	}
#endif
}

/* ---- reading the rows ---- */

/*
 * Runs one statement: through the extended protocol, which refuses a string
 * of several ("cannot insert multiple commands into a prepared statement"),
 * so that nothing in [source] snapshot_filter can end the read-only
 * transaction or run a statement of its own.
 */
int
obx_snap_exec(PGconn *c, const char *sql, char *err, size_t errlen, char state[6])
{
	PGresult *res = PQexecParams(c, sql, 0, NULL, NULL, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);
	const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	if (state != NULL)
		snprintf(state, 6, "%s", code != NULL ? code : "");
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

		/* the message alone: a filter's error would otherwise span lines with its caret */
		if (primary != NULL)
			snprintf(err, errlen, "%s", primary);
		else
			obx_pg_result_error_line(res, err, errlen);
		if (err[0] == '\0')
			obx_pg_error_line(c, err, errlen);
		PQclear(res);
		return OBX_EIO;
	}
	PQclear(res);
	return 0;
}

/* A server error's class: a bad filter, table or column needs a person. */
int
obx_snap_sql_class(PGconn *c, const char *state)
{
	if (PQstatus(c) != CONNECTION_OK)
		return OBX_EIO;
	/* 72000: snapshot too old (old_snapshot_threshold, 13-16): a retry meets it again */
	return strncmp(state, "42", 2) == 0 || strncmp(state, "22", 2) == 0 || strcmp(state, "72000") == 0 ?
	    OBX_ECONFIG :
	    OBX_EIO;
}

/*
 * Serves delivery reports, and moves on what the producer's queue refused,
 * until room(s) holds; the tick runs about every 100 ms, also when nothing
 * has to wait.  Returns 0, the run's end code, or OBX_ESTATE when the tick
 * asks to stop.
 */
int
obx_snap_wait_reports(struct obx_snapshot *s, bool (*room)(const struct obx_snapshot *, size_t), size_t bytes)
{
	struct obx_dlv_result res;

	while (s->end == 0) {
		obx_kafka_poll(s->kf, room(s, bytes) ? 0 : 100);
		if (obx_snap_delivered(s, obx_dlv_pump(&s->dlv, obx_mono_ms(), &res), &res) != 0)
			break;
		if (s->tick != NULL && obx_mono_ms() - s->ticked_ms >= 100) {
			s->ticked_ms = obx_mono_ms();
			if (s->tick(s->tick_arg)) {
				s->stopped = true;
				return OBX_ESTATE;
			}
		}
		if (room(s, bytes) || s->end != 0)
			break;
		if (obx_mono_ms() >= s->next_note_ms) {
			obx_log_info("snapshot of slot %s: %" PRIu64 " row(s) read, %" PRIu64 " acknowledged, "
			             "%.0f s so far",
			    s->cfg->slot, s->rows, s->acked, (double)(obx_mono_ms() - s->started_ms) / 1000);
			s->next_note_ms = obx_mono_ms() + PROGRESS_MS;
		}
	}
	return s->end;
}

/* Room for a record of bytes: the in-flight bounds hold with it (one record always goes). */
bool
obx_snap_room_for(const struct obx_snapshot *s, size_t bytes)
{
	return obx_dlv_room_for(&s->dlv, bytes);
}

/* Nothing waits: every record produced has its report. */
bool
obx_snap_all_reported(const struct obx_snapshot *s, size_t bytes)
{
	(void)bytes;
	return !obx_dlv_pending(&s->dlv) && s->dlv.inflight == 0;
}

/* A hold's pause is over (obx_snap_pause()). */
static bool
paused(const struct obx_snapshot *s, size_t bytes)
{
	(void)bytes;
	return obx_mono_ms() >= s->resume_ms;
}

/*
 * A hold (snapcore.h): lets everything in flight report (a report may move
 * the hold to an earlier row), then waits a second, twice as long after each
 * hold in a row up to 30 s, serving the tick.
 * Returns 0, the run's end code, or OBX_ESTATE when the tick asks to stop.
 */
int
obx_snap_pause(struct obx_snapshot *s)
{
	int r = obx_snap_wait_reports(s, obx_snap_all_reported, 0);

	if (r != 0)
		return r;
	s->pause_ms = obx_snap_pause_ms(s->pause_ms);
	s->resume_ms = obx_mono_ms() + s->pause_ms;
	return obx_snap_wait_reports(s, paused, 0);
}

/* Anything: a turn of the loop while the server works. */
static bool
any(const struct obx_snapshot *s, size_t bytes)
{
	(void)s, (void)bytes;
	return true;
}

/*
 * Waits for the connection's next result without blocking the rest:
 * delivery reports are served and the tick runs while the server works
 * (the first FETCH may sort every matching row).  Returns 0, OBX_ESTATE
 * when the tick asked to stop, or the run's end code once a report ended it.
 */
int
obx_snap_wait_result(struct obx_snapshot *s, PGconn *c)
{
	while (PQisBusy(c)) {
		struct pollfd p = { PQsocket(c), POLLIN, 0 };
		int r = obx_snap_wait_reports(s, any, 0);

		if (r != 0)
			return r; /* stopped, or the run ended (a report): the FETCH is not waited for */
		if (poll(&p, 1, 100) < 0 && errno != EINTR)
			break;
		if (PQconsumeInput(c) == 0)
			break; /* the connection failed: PQgetResult() says how */
	}
	return 0;
}

/*
 * Several tables: the pending rows of each table an entry of [source] table matches in the
 * snapshot (the tables that existed at the slot's creation point; a table created later is
 * in the stream from its first row), each read in its own mapping.  Returns what
 * obx_snap_table() returns.
 */
static int
every_table(struct obx_snapshot *s, PGconn *conn, bool imported, char *errbuf, size_t errlen)
{
	const struct obx_config *cfg = s->cfg;
	struct obx_pg_tables tl;
	int r;

	if ((r = obx_pg_tables_read(conn, cfg, &tl, errbuf, errlen)) != 0) {
		char why[512];

		strlcpy(why, errbuf, sizeof(why));
		snprintf(errbuf, errlen, "snapshot of slot %s: could not read the outbox tables: %s", cfg->slot,
		    why);
		obx_pg_tables_reset(&tl);
		return r;
	}
	errbuf[0] = '\0';
	for (size_t i = 0; i < tl.n && r == 0; i++) {
		struct obx_config view;

		/* the list is the snapshot's: obx_snap_table() reads each table by its OID then, under
		 * its name now, and passes over one dropped since */
		obx_tables_view(cfg, tl.t[i].mapping, tl.t[i].schema, tl.t[i].name, &view);
		s->cfg = &view;
		r = obx_snap_table(s, conn, imported, errbuf, errlen);
		s->cfg = cfg;
	}
	obx_pg_tables_reset(&tl);
	return r;
}

int
obx_snapshot_run(struct obx_snapshot *s, PGconn *conn, bool imported, obx_lsn start, bool (*tick)(void *),
    void *arg, char *errbuf, size_t errlen)
{
	const struct obx_config *cfg = s->cfg;
	char err[512];
	int r;

	/* [delivery] max_inflight and max_inflight_bytes bound what waits for the broker, as in
	 * the stream (docs/internals/design.md, invariant 7): obx_dlv_room_for() */
	s->tick = tick;
	s->tick_arg = arg;
	s->started_ms = obx_mono_ms();
	s->next_note_ms = s->started_ms + PROGRESS_MS;
	obx_lsn_format(start, s->point, sizeof(s->point));
	if (!imported &&
	    obx_snap_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", err, sizeof(err), NULL) != 0) {
		snprintf(errbuf, errlen, "snapshot of slot %s: could not begin: %s", cfg->slot, err);
		return OBX_EIO;
	}
	r = obx_tables_several(cfg) ? every_table(s, conn, imported, errbuf, errlen) :
	                              obx_snap_table(s, conn, imported, errbuf, errlen);
	if (r != 0 && errbuf[0] != '\0')
		return r; /* the read failed: errbuf says how */
	if (r == 0)
		r = obx_snap_wait_reports(s, obx_snap_all_reported, 0);
	if (r == OBX_ESTATE) {
		snprintf(errbuf, errlen,
		    "stopped during the snapshot of slot %s: %" PRIu64 " of its rows "
		    "acknowledged; the next start publishes its pending rows again",
		    cfg->slot, s->acked);
		return r;
	}
	if (r != 0) {
		snprintf(errbuf, errlen, "%s", s->reason);
		return r;
	}
	/* the connection (and the lock pg/snapshot_mark.c took on it) stays until the caller has
	 * dropped the marker: an instance that then finds the marker still finds the lock taken */
	obx_log_info("snapshot of slot %s at %s: %" PRIu64 " row(s) published in %.1f s; streaming "
	             "follows",
	    cfg->slot, s->point, s->acked - s->dead_lettered, (double)(obx_mono_ms() - s->started_ms) / 1000);
	if (s->dead_lettered > 0)
		obx_log_warn("snapshot of slot %s: %" PRIu64 " row(s) dead-lettered to %s", cfg->slot,
		    s->dead_lettered, cfg->dead_letter_topic);
	return 0;
}
