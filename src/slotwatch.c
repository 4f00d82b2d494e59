/*
 * slotwatch.c - the slot as the server sees it; see slotwatch.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "obx/err.h"
#include "obx/log.h"
#include "obx/metrics.h"
#include "obx/pgutil.h"
#include "obx/slotwatch.h"

#define FAST_MS 1000

/* The WAL position: a standby's replay position (its receive position before the first replay). */
static const char SQL[] =
    "SELECT w.lsn, s.confirmed_flush_lsn, coalesce(s.active, false), coalesce(s.active_pid, 0), "
    "pg_wal_lsn_diff(w.lsn, s.confirmed_flush_lsn)::bigint, "
    "coalesce(pg_wal_lsn_diff(w.lsn, s.restart_lsn)::bigint, 0), s.safe_wal_size, s.wal_status, "
    "(SELECT CASE WHEN setting::bigint < 0 THEN -1 ELSE setting::bigint * 1048576 END "
    "FROM pg_settings WHERE name = 'max_slot_wal_keep_size'), s.slot_name IS NOT NULL "
    "FROM (SELECT CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn(), "
    "pg_last_wal_receive_lsn()) ELSE pg_current_wal_lsn() END AS lsn) w "
    "LEFT JOIN pg_replication_slots s ON s.slot_name = $1";

static int64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t
num(const PGresult *r, int col, int64_t null_value)
{
	const char *bad = NULL;
	long long v;

	if (PQgetisnull(r, 0, col))
		return null_value;
	v = strtonum(PQgetvalue(r, 0, col), INT64_MIN, INT64_MAX, &bad);
	return bad == NULL ? v : null_value;
}

/* One read into *v; false when the server could not be read. */
static bool
read_once(struct obx_slotwatch *w, PGconn **conn, struct obx_slotview *v)
{
	const char *params[1] = { w->cfg->slot };
	char err[512];
	PGresult *r;
	bool ok = false;

	if (*conn == NULL || PQstatus(*conn) != CONNECTION_OK) {
		PQfinish(*conn);
		*conn = NULL;
		if (obx_pg_connect(w->cfg->conninfo, w->cfg->password, NULL, NULL, "outboxd slot watch", conn, err,
		    sizeof(err)) != 0) {
			obx_log_debug("slot watch: could not connect: %s", err);
			return false;
		}
	}
	r = PQexecParams(*conn, SQL, 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0) &&
	    obx_lsn_parse(PQgetvalue(r, 0, 0), &v->server_lsn) == 0) {
		ok = true;
		v->has_slot = strcmp(PQgetvalue(r, 0, 9), "t") == 0;
		if (PQgetisnull(r, 0, 1) || obx_lsn_parse(PQgetvalue(r, 0, 1), &v->confirmed) != 0)
			v->confirmed = 0;
		v->active = strcmp(PQgetvalue(r, 0, 2), "t") == 0;
		v->active_pid = (int)num(r, 3, 0);
		v->lag_bytes = num(r, 4, 0);
		v->retained_wal_bytes = num(r, 5, 0);
		v->safe_wal_size_bytes = num(r, 6, -1);
		v->wal_status = PQgetisnull(r, 0, 7) ? 0 : obx_metrics_wal_status(PQgetvalue(r, 0, 7));
		v->max_wal_keep_size_bytes = num(r, 8, -1);
	} else {
		obx_log_debug("slot watch: could not read slot %s: %s", w->cfg->slot,
		    obx_pg_result_error_line(r, err, sizeof(err)));
	}
	PQclear(r);
	return ok;
}

static void *
watch_main(void *arg)
{
	struct obx_slotwatch *w = arg;
	PGconn *conn = NULL;

	pthread_mutex_lock(&w->mu);
	while (!w->stopping) {
		struct obx_slotview v;
		struct timespec until;
		int wait_ms;
		bool ok;

		v = w->view;
		pthread_mutex_unlock(&w->mu);
		ok = read_once(w, &conn, &v);
		pthread_mutex_lock(&w->mu);
		if (ok) {
			v.ok = true;
			v.read_ms = mono_ms();
			v.failures = w->view.failures;
			w->view = v;
		} else {
			w->view.ok = false;
			w->view.failures++;
		}
		wait_ms = w->fast || !ok ? FAST_MS : w->interval_ms;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += wait_ms / 1000;
		until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		/* a change of pace (obx_slotwatch_fast()) or a stop wakes it */
		while (!w->stopping && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0 && !w->fast)
			;
	}
	pthread_mutex_unlock(&w->mu);
	PQfinish(conn);
	return NULL;
}

int
obx_slotwatch_start(struct obx_slotwatch *w, const struct obx_config *cfg, int interval_ms)
{
	int rc;

	memset(w, 0, sizeof(*w));
	w->cfg = cfg;
	w->interval_ms = interval_ms > FAST_MS ? interval_ms : FAST_MS;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	rc = pthread_create(&w->thread, NULL, watch_main, w);
	if (rc != 0) {
		pthread_mutex_destroy(&w->mu);
		pthread_cond_destroy(&w->cv);
		return OBX_EIO;
	}
	w->running = true;
	return 0;
}

void
obx_slotwatch_stop(struct obx_slotwatch *w)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->mu);
	w->stopping = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	w->running = false;
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->cv);
}

void
obx_slotwatch_read(struct obx_slotwatch *w, struct obx_slotview *out)
{
	if (!w->running) {
		memset(out, 0, sizeof(*out));
		return;
	}
	pthread_mutex_lock(&w->mu);
	*out = w->view;
	pthread_mutex_unlock(&w->mu);
}

void
obx_slotwatch_fast(struct obx_slotwatch *w, bool fast)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->mu);
	if (fast != w->fast) {
		w->fast = fast;
		pthread_cond_signal(&w->cv);
	}
	pthread_mutex_unlock(&w->mu);
}
