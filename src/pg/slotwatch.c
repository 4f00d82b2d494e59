/*
 * slotwatch.c - the slot as the server sees it; see slotwatch.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/core/metrics.h"
#include "obx/pg/coverage.h"
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
	/* what coverage reads: the publication and [source] table (copied: the owner's cfg may go first) */
	struct obx_config covcfg;
	/* guarded by mu: the server to read (obx_slotwatch_pin()); pin_gen moves on with each pin */
	char *pin_host, *pin_addr, *pin_port;
	uint32_t pin_gen;
	bool now;               /* guarded by mu: read at once (obx_slotwatch_refresh()) */
	uint64_t started, done; /* guarded by mu: reads begun and ended */
	struct obx_cov cov;     /* guarded by mu: the newest coverage reading */
	uint64_t cov_seq;       /* guarded by mu: its number (0: none) */
	uint32_t cov_pin;       /* guarded by mu: the pin it was read under */
	obx_lsn cov_lsn;        /* guarded by mu: the WAL position read before it */
	bool cov_failing;       /* the thread's own: the last coverage read failed */
};

static void
covcfg_reset(struct obx_config *c)
{
	for (size_t i = 0; i < c->n_tables; i++) {
		free(c->tables[i].schema);
		free(c->tables[i].name);
	}
	free(c->tables);
	free(c->publication);
	memset(c, 0, sizeof(*c));
}

/* Copies what pg/coverage.c reads of cfg.  Returns 0 or OBX_ENOMEM. */
static int
covcfg_copy(struct obx_config *dst, const struct obx_config *cfg)
{
	memset(dst, 0, sizeof(*dst));
	dst->publication = strdup(cfg->publication);
	dst->tables = calloc(cfg->n_tables > 0 ? cfg->n_tables : 1, sizeof(*dst->tables));
	if (dst->publication == NULL || dst->tables == NULL)
		return OBX_ENOMEM;
	for (size_t i = 0; i < cfg->n_tables; i++) {
		dst->tables[i] = cfg->tables[i];
		dst->tables[i].schema = strdup(cfg->tables[i].schema);
		dst->tables[i].name = strdup(cfg->tables[i].name);
		dst->n_tables++;
		if (dst->tables[i].schema == NULL || dst->tables[i].name == NULL)
			return OBX_ENOMEM;
	}
	return 0;
}

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
	free(st->pin_host);
	free(st->pin_addr);
	free(st->pin_port);
	covcfg_reset(&st->covcfg);
	obx_cov_reset(&st->cov);
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

/*
 * One read into *v, and of the coverage into *cov, under pin (whose host,
 * address and port are given, NULL: the conninfo's); false when the server
 * could not be read.  *cov_ok says whether the coverage was read.
 */
static bool
read_once(struct obx_slotwatch_state *w, PGconn **conn, const char *const *pin_kw, const char *const *pin_val,
    struct obx_slotview *v, struct obx_cov *cov, bool *cov_ok)
{
	const char *params[1] = { w->slot };
	char err[512];
	PGresult *r;
	bool ok = false;

	*cov_ok = false;
	if (*conn == NULL || PQstatus(*conn) != CONNECTION_OK) {
		PQfinish(*conn);
		*conn = NULL;
		char app[64];

		/* drop-slot finds a live instance of the slot by this name (obx_slotwatch_app_name()) */
		obx_slotwatch_app_name(w->slot, app, sizeof(app));
		if (obx_pg_connect(w->conninfo, w->password, pin_kw, pin_val, app, conn, err, sizeof(err)) != 0) {
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
	/* after the WAL position, in statements of their own: what they find held at that position */
	if (ok) {
		if (obx_pg_coverage_read(*conn, &w->covcfg, cov, err, sizeof(err)) == 0) {
			if (w->cov_failing)
				obx_log_info("slot watch: the outbox tables' publication is read again");
			w->cov_failing = false;
			*cov_ok = true;
		} else {
			/* the confirmed position waits for it (core/coverage.h): said at the first failure */
			if (!w->cov_failing)
				obx_log_warn("slot watch: %s; the confirmed position waits until it is read", err);
			w->cov_failing = true;
		}
	}
	return ok;
}

static void *
watch_main(void *arg)
{
	struct obx_slotwatch_state *w = arg;
	PGconn *conn = NULL;

	struct obx_cov cov = { 0 };
	uint32_t conn_pin = 0;

	pthread_mutex_lock(&w->mu);
	while (!w->stopping) {
		const char *kw[4], *val[4];
		char host[256], addr[64], port[16];
		struct obx_slotview v;
		struct timespec until;
		uint32_t pin = w->pin_gen;
		int wait_ms, n = 0;
		bool ok, cov_ok;

		v = w->view;
		w->started++;
		w->now = false;
		/* the pin's server, copied: obx_slotwatch_pin() may replace it while mu is let go */
		if (w->pin_host != NULL && strlcpy(host, w->pin_host, sizeof(host)) < sizeof(host)) {
			kw[n] = "host";
			val[n++] = host;
		}
		if (w->pin_addr != NULL && strlcpy(addr, w->pin_addr, sizeof(addr)) < sizeof(addr)) {
			kw[n] = "hostaddr";
			val[n++] = addr;
		}
		if (w->pin_port != NULL && strlcpy(port, w->pin_port, sizeof(port)) < sizeof(port)) {
			kw[n] = "port";
			val[n++] = port;
		}
		kw[n] = val[n] = NULL;
		if (pin != conn_pin) {
			/* another server, maybe: a connection of the earlier pin is not used */
			PQfinish(conn);
			conn = NULL;
			conn_pin = pin;
		}
		pthread_mutex_unlock(&w->mu);
		ok = read_once(w, &conn, kw, val, &v, &cov, &cov_ok);
		pthread_mutex_lock(&w->mu);
		pthread_cond_broadcast(&w->cv);
		if (ok) {
			v.ok = true;
			v.read_ms = mono_ms();
			v.failures = w->view.failures;
			v.pin = pin;
			w->view = v;
			if (cov_ok) {
				obx_cov_reset(&w->cov);
				w->cov = cov;
				memset(&cov, 0, sizeof(cov));
				w->cov_seq++;
				w->cov_pin = pin;
				w->cov_lsn = v.server_lsn;
			}
		} else {
			w->view.ok = false;
			w->view.failures++;
		}
		if (ok && !cov_ok)
			w->view.failures++; /* the server was read, the publication's hold on the tables was not */
		w->done++;
		wait_ms = w->fast || !ok ? FAST_MS : w->interval_ms;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += wait_ms / 1000;
		until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		/* a change of pace (obx_slotwatch_fast()) or a stop wakes it */
		while (!w->stopping && !w->now && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0 &&
		    !w->fast && !w->now)
			;
	}
	pthread_mutex_unlock(&w->mu);
	obx_cov_reset(&cov);
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
	if (covcfg_copy(&st->covcfg, cfg) != 0) {
		covcfg_reset(&st->covcfg);
		free(st->conninfo);
		free(st->password);
		free(st->slot);
		free(st);
		return OBX_ENOMEM;
	}
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
	pthread_cond_broadcast(&st->cv);
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
		pthread_cond_broadcast(&w->st->cv);
	}
	pthread_mutex_unlock(&w->st->mu);
}

void
obx_slotwatch_app_name(const char *slot, char *out, size_t len)
{
	/* application_name keeps NAMEDATALEN - 1 = 63 bytes: the slot's name is cut to fit */
	snprintf(out, len, "%s%.*s", OBX_SLOTWATCH_APP, (int)(63 - strlen(OBX_SLOTWATCH_APP)), slot);
}

/* A copy of s, NULL for NULL or "". */
static char *
dup_set(const char *s)
{
	return s != NULL && s[0] != '\0' ? strdup(s) : NULL;
}

uint32_t
obx_slotwatch_pin(struct obx_slotwatch *w, PGconn *c)
{
	struct obx_slotwatch_state *st = w->st;
	uint32_t pin;

	if (!w->running)
		return 0;
	pthread_mutex_lock(&st->mu);
	free(st->pin_host);
	free(st->pin_addr);
	free(st->pin_port);
	st->pin_host = dup_set(PQhost(c));
	st->pin_addr = dup_set(PQhostaddr(c));
	st->pin_port = dup_set(PQport(c));
	pin = ++st->pin_gen;
	st->now = true;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	return pin;
}

bool
obx_slotwatch_coverage(struct obx_slotwatch *w, uint32_t pin, uint64_t *seq, struct obx_cov *out, obx_lsn *lsn)
{
	struct obx_slotwatch_state *st = w->st;
	bool got = false;

	if (!w->running)
		return false;
	pthread_mutex_lock(&st->mu);
	if (st->cov_seq > *seq && st->cov_pin == pin && obx_cov_copy(out, &st->cov) == 0) {
		*seq = st->cov_seq;
		*lsn = st->cov_lsn;
		got = true;
	}
	pthread_mutex_unlock(&st->mu);
	return got;
}

bool
obx_slotwatch_refresh(struct obx_slotwatch *w, int timeout_ms)
{
	struct obx_slotwatch_state *st = w->st;
	struct timespec until;
	uint64_t want;
	bool ended;

	if (!w->running)
		return false;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&st->mu);
	want = st->started + 1; /* a read under way began before the call */
	st->now = true;
	pthread_cond_broadcast(&st->cv);
	while (st->done < want && !st->stopping && pthread_cond_timedwait(&st->cv, &st->mu, &until) == 0)
		;
	ended = st->done >= want;
	pthread_mutex_unlock(&st->mu);
	return ended;
}
