/*
 * relay_eos.c - the loop's exactly-once I/O; see relay_eos.h and
 * docs/internals/design.md ("Exactly-once").  What each result means is decided in
 * the pure core (relaycore_eos.c, core/eos_progress.c); this file makes the calls and
 * says the lines.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/sys/log.h"
#include "obx/kafka/dedupe_lookup.h"
#include "obx/kafka/progress_read.h"
#include "obx/run/relay_eos.h"
#include "obx/core/walmsg.h"

/* how long a session start may take to initialise transactions, and to read progress */
#define TXN_INIT_MS 15000
#define PROGRESS_READ_MS 30000
/* the longest a commit holds the loop per turn */
#define COMMIT_SLICE_MS 500

/* Whether the replication connection is still this instance's (a fence's verdict needs it). */
static bool
connection_ours(struct obx_relay_eos *e)
{
	char err[512];

	return PQstatus(e->io.st->conn) == CONNECTION_OK && obx_pgstream_consume(e->io.st, err, sizeof(err)) == 0;
}

/*
 * While a session's exactly-once set-up waits on the broker, the stream has
 * started: status updates at the start position keep the server from ending
 * it at wal_sender_timeout.  Then the loop's tick (health, signals).
 */
static bool
status_tick(void *arg)
{
	struct obx_relay_eos *e = arg;
	struct obx_pgstream *st = e->io.st;
	char err[512];

	if (obx_mono_ms() - e->status_ms >= 1000) {
		if (obx_pgstream_send_status(st, st->start_confirmed, st->start_confirmed, false, err,
		        sizeof(err)) == 0)
			(void)obx_pgstream_flush(st);
		e->status_ms = obx_mono_ms();
	}
	return e->io.tick(e->io.tick_arg);
}

enum obx_core_end
obx_relay_eos_open(struct obx_relay_eos *e, const struct obx_relay_eos_io *io, char *errbuf, size_t errlen)
{
	const struct obx_config *cfg = io->cfg;
	struct obx_pgstream *st = io->st;
	const char *txn_id = io->kf->txn_id;
	char detail[768], line[2048];
	enum obx_core_end verdict;
	enum obx_progress_floor f;
	int32_t nparts = 0;
	int rc = 0;

	e->io = *io;
	e->committing = e->have_floor = false;
	memset(&e->floor, 0, sizeof(e->floor));
	e->partition = RD_KAFKA_PARTITION_UA;
	verdict = obx_core_txn_init_end(obx_kafka_txn_init(e->io.kf, TXN_INIT_MS, status_tick, e, detail,
	                                    sizeof(detail)),
	    txn_id, TXN_INIT_MS, detail, sizeof(detail));
	if (verdict != OBX_CORE_RUNNING) {
		snprintf(errbuf, errlen, "%s", detail);
		return verdict;
	}
	obx_progress_source_init(&e->source, st->sysid, PQdb(st->conn), (uint32_t)st->timeline, st->slot_created,
	    cfg);
	if (!st->slot_made)
		rc = obx_kafka_progress_read(cfg, txn_id, PROGRESS_READ_MS, status_tick, e, &e->floor, &nparts,
		    detail, sizeof(detail));
	f = obx_progress_floor(cfg, txn_id, &e->source, st->server_lsn, st->slot_made, rc, detail, &e->floor, line,
	    sizeof(line));
	if (f == OBX_PROGRESS_FLOOR_UNREADABLE) {
		snprintf(errbuf, errlen, "%s", line);
		return OBX_CORE_END_RETRY;
	}
	if (!st->slot_made) /* the record goes to the key's own partition, where the next session reads first */
		e->partition = obx_progress_partition(txn_id, nparts);
	e->have_floor = f == OBX_PROGRESS_FLOOR_TRUSTED;
	if (f == OBX_PROGRESS_FLOOR_UNTRUSTED)
		obx_log_warn("%s", line);
	else
		obx_log_info("%s", line);
	return OBX_CORE_RUNNING;
}

void
obx_relay_eos_start(struct obx_relay_eos *e)
{
	obx_core_exactly_once(e->io.core, e->have_floor ? &e->floor.mark : NULL, e->floor.mark_commit_time);
	e->committing = false;
}

/*
 * The commit the core asks for begins: the transaction's progress record
 * joins it.  Returns true when the commit may go on, false when none is due
 * or it already ended (told to the core).
 */
static bool
begin_commit(struct obx_relay_eos *e, bool idle)
{
	const struct obx_config *cfg = e->io.cfg;
	struct obx_kafka *kf = e->io.kf;
	struct obx_core_progress p;
	struct obx_progress pr;
	enum obx_produce_result res;
	char errbuf[768], text[256];
	char *value;

	if (!obx_core_commit_due(e->io.core, obx_mono_ms(), idle, &p))
		return false;
	obx_core_progress_record(&p, &e->source, &pr);
	value = obx_progress_encode(&pr, cfg->slot, kf->txn_id);
	if (value == NULL) {
		obx_core_commit_done(e->io.core, OBX_CORE_COMMIT_FATAL, "out of memory", obx_pg_now());
		return false;
	}
	res = obx_kafka_produce(kf, cfg->progress_topic, e->partition, kf->txn_id, strlen(kf->txn_id), value,
	    strlen(value), (obx_pg_now() + OBX_PG_EPOCH_OFFSET_US) / 1000, NULL, 0, NULL, NULL,
	    OBX_KAFKA_OPAQUE_PROGRESS, NULL, text, sizeof(text));
	free(value);
	if (res != OBX_PRODUCE_OK) {
		snprintf(errbuf, sizeof(errbuf), "could not produce the progress record to %s: %s",
		    cfg->progress_topic, text);
		obx_core_commit_done(e->io.core, OBX_CORE_COMMIT_ABORT, errbuf, obx_pg_now());
		return false;
	}
	e->committing = true;
	return true;
}

void
obx_relay_eos_commit(struct obx_relay_eos *e, bool idle)
{
	struct obx_kafka *kf = e->io.kf;
	struct obx_core *core = e->io.core;
	int res;
	char errbuf[768];

	if (!e->committing && !begin_commit(e, idle))
		return;
	*e->io.reports_at_us = obx_pg_now(); /* delivery reports are served from inside the commit */
	res = obx_kafka_txn_commit(kf, COMMIT_SLICE_MS, errbuf, sizeof(errbuf));
	if (res == OBX_ETIMEDOUT)
		return;
	e->committing = false;
	if (res == OBX_EFENCED) {
		obx_metrics_kafka_error(e->io.m, "_FENCED");
		obx_core_commit_done(core,
		    obx_core_commit_verdict(res, connection_ours(e), kf->txn_id, e->io.cfg->slot, errbuf,
		        sizeof(errbuf)),
		    errbuf, obx_pg_now());
		return;
	}
	if (res == OBX_OK)
		obx_log_debug("committed Kafka transaction %s (%" PRIu64 " record(s))", kf->txn_name,
		    obx_core_stats(core).txn_records);
	obx_core_commit_done(core,
	    obx_core_commit_verdict(res, false, kf->txn_id, e->io.cfg->slot, errbuf, sizeof(errbuf)), errbuf,
	    obx_pg_now());
#ifdef OBX_TEST_HOOKS
	/* test builds only: die right after the commit, before its status update */
	if (e->io.kill_after > 0 && obx_core_stats(core).published >= (uint64_t)e->io.kill_after)
		raise(SIGKILL);
#endif
}

void
obx_relay_eos_fenced(struct obx_relay_eos *e)
{
	char errbuf[768];
	enum obx_core_end end;

	obx_metrics_kafka_error(e->io.m, "_FENCED");
	end = obx_core_fenced_end(connection_ours(e), e->io.kf->txn_id, e->io.cfg->slot, errbuf, sizeof(errbuf));
	obx_core_fail(e->io.core, end, "%s", errbuf);
}

bool
obx_relay_eos_close(struct obx_relay_eos *e, enum obx_core_end end, char *errbuf, size_t errlen)
{
	struct obx_kafka *kf = e->io.kf;
	char err[512], detail[768];
	bool fenced;

	/* what the transaction holds is purged; a new session starts from the slot */
	*e->io.reports_at_us = obx_pg_now();
	fenced = obx_kafka_txn_abort(kf, 5000, err, sizeof(err)) == OBX_EFENCED || kf->fenced;
	e->committing = false;
	if (!fenced || end == OBX_CORE_END_FATAL)
		return false;
	if (obx_core_fenced_end(connection_ours(e), kf->txn_id, e->io.cfg->slot, detail, sizeof(detail)) ==
	    OBX_CORE_END_FATAL) {
		snprintf(errbuf, errlen, "%s", detail);
		return true;
	}
	/* the connection looked alive: if the next session finds the slot taken, the fence was a
	 * takeover after all */
	e->fenced_before = true;
	snprintf(e->fenced_id, sizeof(e->fenced_id), "%s", kf->txn_id);
	return false;
}
