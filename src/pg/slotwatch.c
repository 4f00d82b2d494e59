/*
 * slotwatch.c - the slot as the server sees it; see slotwatch.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/core/metrics.h"
#include "obx/pg/util.h"
#include "obx/pg/slotwatch.h"

#define FAST_MS 1000

struct obx_slotwatch_state {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs;      /* guarded by mu: the watch and the thread */
	bool stopping; /* guarded by mu */
	bool fast;     /* guarded by mu: read every second (a standby waits) */
	int interval_ms;
	char *conninfo, *password, *slot;
	struct obx_slotview view; /* guarded by mu */
};

/* Drops one reference (mu held); the last one frees st. */
static void
state_unref(struct obx_slotwatch_state *st)
{
	bool last = --st->refs == 0;

	pthread_mutex_unlock(&st->mu);
	if (!last)
		return;
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->cv);
	free(st->conninfo);
	if (st->password != NULL)
		explicit_bzero(st->password, strlen(st->password));
	free(st->password);
	free(st->slot);
	free(st);
}

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
read_once(struct obx_slotwatch_state *w, PGconn **conn, struct obx_slotview *v)
{
	const char *params[1] = { w->slot };
	char err[512];
	PGresult *r;
	bool ok = false;

	if (*conn == NULL || PQstatus(*conn) != CONNECTION_OK) {
		PQfinish(*conn);
		*conn = NULL;
		if (obx_pg_connect(w->conninfo, w->password, NULL, NULL, "outboxd slot watch", conn, err,
		        sizeof(err)) != 0) {
			/* the sessions say why a connection fails; said here once after a success only */
			if (v->ok)
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
	} else if (v->ok) {
		obx_log_debug("slot watch: could not read slot %s: %s", w->slot,
		    obx_pg_result_error_line(r, err, sizeof(err)));
	}
	PQclear(r);
	return ok;
}

static void *
watch_main(void *arg)
{
	struct obx_slotwatch_state *w = arg;
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
	pthread_mutex_lock(&w->mu);
	state_unref(w);
	return NULL;
}

int
obx_slotwatch_start(struct obx_slotwatch *w, const struct obx_config *cfg, int interval_ms)
{
	struct obx_slotwatch_state *st = calloc(1, sizeof(*st));

	memset(w, 0, sizeof(*w));
	if (st == NULL)
		return OBX_ENOMEM;
	st->interval_ms = interval_ms > FAST_MS ? interval_ms : FAST_MS;
	st->conninfo = strdup(cfg->conninfo);
	st->password = cfg->password != NULL ? strdup(cfg->password) : NULL;
	st->slot = strdup(cfg->slot);
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->cv, NULL);
	st->refs = 2;
	if (st->conninfo == NULL || st->slot == NULL || (cfg->password != NULL && st->password == NULL) ||
	    pthread_create(&w->thread, NULL, watch_main, st) != 0) {
		pthread_mutex_lock(&st->mu);
		st->refs = 1;
		state_unref(st);
		return OBX_EIO;
	}
	w->st = st;
	w->running = true;
	return 0;
}

void
obx_slotwatch_stop(struct obx_slotwatch *w)
{
	struct obx_slotwatch_state *st = w->st;
	struct timespec until;

	if (!w->running)
		return;
	w->running = false;
	w->st = NULL;
	pthread_mutex_lock(&st->mu);
	st->stopping = true;
	pthread_cond_signal(&st->cv);
	pthread_mutex_unlock(&st->mu);
	/* a read may hang in a connection attempt (connect_timeout): not waited for; the
	 * thread frees the shared state when it ends */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 2;
	if (pthread_timedjoin_np(w->thread, NULL, &until) != 0)
		pthread_detach(w->thread);
	pthread_mutex_lock(&st->mu);
	state_unref(st);
}

void
obx_slotwatch_read(struct obx_slotwatch *w, struct obx_slotview *out)
{
	if (!w->running) {
		memset(out, 0, sizeof(*out));
		return;
	}
	pthread_mutex_lock(&w->st->mu);
	*out = w->st->view;
	pthread_mutex_unlock(&w->st->mu);
}

void
obx_slotwatch_fast(struct obx_slotwatch *w, bool fast)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->st->mu);
	if (fast != w->st->fast) {
		w->st->fast = fast;
		pthread_cond_signal(&w->st->cv);
	}
	pthread_mutex_unlock(&w->st->mu);
}
