/*
 * poll_session.c - polling mode's process: its connections (connect,
 * check the table, LISTEN), the idle wait between cycles (NOTIFY, signals,
 * the poll interval), the pending-rows statistics, and the callbacks of the
 * runner (runner.h) that drives the sessions.  poll.c runs each cycle,
 * poll_io.c its statements.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "obx/core/err.h"
#include "obx/core/tables.h"
#include "obx/sys/log.h"
#include "obx/pg/util.h"
#include "obx/run/poll_int.h"
#include "obx/core/relaycore.h"
#include "obx/core/walmsg.h"

/* ---- signals and title: the runner's (runner.h) ---- */

/* SIGHUP: the log level takes effect at once; the runner names the other changes. */
static void
poll_reload(void *ctx, const struct obx_config *fresh)
{
	struct poller *p = ctx;

	if (fresh->log_level != p->log_level) {
		p->log_level = fresh->log_level;
		obx_log_setup(p->log_level, p->cfg->log_format);
		obx_log_info("SIGHUP: log level %s", obx_log_level_name(p->log_level));
	}
}

/* A stop signal: the first finishes the claimed batch (obx_pollcore_drain() says until when). */
static void
poll_stop(void *ctx, enum obx_stop_verdict v, int64_t now_ms)
{
	struct poller *p = ctx;

	p->signals = obx_runner_stops(&p->run);
	if (v != OBX_STOP_DRAIN)
		return;
	p->stop_ms = now_ms;
	obx_log_info("stopping: finishing the claimed batch for up to %d s (a second signal "
	             "abandons it)",
	    OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
}

static void
poll_title(void *ctx, char *buf, size_t len)
{
	struct poller *p = ctx;

	if (obx_tables_several(p->base))
		snprintf(buf, len, "%s (polling %zu tables)", obx_state_name(p->m.state), p->ntables);
	else
		snprintf(buf, len, "%s (polling %s.%s)", obx_state_name(p->m.state), p->cfg->table_schema,
		    p->cfg->table_name);
}

static void
stats(struct poller *p)
{
	int64_t pending = 0, retrying = 0, max_attempts = 0;
	double oldest = 0;
	bool read = false;

	/* the sums over every table: pending and retrying rows; the oldest age and most attempts */
	for (size_t i = 0; i < p->ntables; i++) {
		PGresult *res;

		/* a table passed over or left out would hold the loop up for lock_timeout again */
		if (p->tables[i].out || p->tables[i].skip)
			continue;
		res = obx_poll_exec(p, p->tables[i].sql.stats); /* NULL: stopped meanwhile */

		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
			int64_t v;
			double age;

			/* a value that is not a number leaves its gauge as it was */
			read = true;
			if (obx_pg_int64(res, 0, 0, &v) == 0)
				pending += v;
			if (obx_pg_double(res, 0, 1, &age) == 0 && age > oldest)
				oldest = age;
			if (obx_pg_int64(res, 0, 2, &v) == 0)
				retrying += v;
			if (obx_pg_int64(res, 0, 3, &v) == 0 && v > max_attempts)
				max_attempts = v;
		}
		PQclear(res);
		if (res == NULL)
			break;
	}
	if (read) {
		p->m.poll_pending_rows = pending;
		p->m.poll_oldest_pending_age_seconds = oldest;
		p->m.poll_retrying_rows = retrying;
		p->m.poll_max_attempts_pending = max_attempts;
	}
	p->next_stats_ms = obx_mono_ms() + OBX_POLL_STATS_INTERVAL_MS;
}

/*
 * Sleeps up to ms, or until a notification on the channel, a signal or the
 * connection's failure.  Returns 0, or OBX_EIO with reason filled.
 */
static int
idle_wait(struct poller *p, int ms)
{
	int64_t until = obx_mono_ms() + ms;
	PGnotify *nt;
	bool woken = false;

	while (!woken && p->signals == 0) {
		int64_t left = until - obx_mono_ms();
		struct pollfd fds[3] = {
			{ PQsocket(p->pg), POLLIN, 0 },
			{ p->opts->signal_fd, POLLIN, 0 },
			{ obx_kafka_fd(&p->kf), POLLIN, 0 },
		};

		if (left <= 0)
			break;
		if (poll(fds, 3, (int)(left < 1000 ? left : 1000)) < 0 && errno != EINTR) {
			snprintf(p->reason, sizeof(p->reason), "could not poll: %s", strerror(errno));
			return OBX_EIO;
		}
		if (fds[1].revents & POLLIN)
			obx_runner_read_signals(&p->run);
		if (fds[2].revents & POLLIN)
			obx_kafka_poll(&p->kf, 0);
		if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
			char err[512];

			if (PQconsumeInput(p->pg) == 0) {
				snprintf(p->reason, sizeof(p->reason), "lost the connection: %s",
				    obx_pg_error_line(p->pg, err, sizeof(err)));
				return OBX_EIO;
			}
		}
		while ((nt = PQnotifies(p->pg)) != NULL) {
			woken = true;
			PQfreemem(nt);
		}
		obx_runner_publish(&p->run);
	}
	return 0;
}

/* Connects, checks the table and LISTENs.  Returns 0 or a negative code with reason filled. */
static int
session_open(struct poller *p)
{
	char err[512];
	PGresult *res;
	int r;

	if (obx_pg_connect(p->cfg->conninfo, p->cfg->password, NULL, NULL, "outboxd", &p->pg, err, sizeof(err)) !=
	    0) {
		snprintf(p->reason, sizeof(p->reason), "could not connect to the server: %s", err);
		return OBX_EIO;
	}
	/* several tables: one tenant's ALTER TABLE or LOCK TABLE must not hold up the others' turns;
	 * a lock not granted in time passes its table over (obx_tables_read_fault()).  A lock_timeout
	 * of the role's or the server's own is kept */
	if (obx_tables_several(p->base)) {
		res = PQexec(p->pg,
		    "SELECT set_config('lock_timeout', '" OBX_POLL_LOCK_TIMEOUT "', false) "
		    "WHERE current_setting('lock_timeout') IN ('0', '0ms')");
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			obx_log_warn("could not set lock_timeout: a table locked by another session holds up the "
			             "others' turns: %s",
			    obx_pg_result_error_line(res, err, sizeof(err)));
		PQclear(res);
	}
	/* the tables, afresh on each connection (their columns are read again too) */
	obx_poll_tables_reset(p);
	p->warned_missing = false;
	if ((r = obx_poll_tables_read(p)) != 0)
		return r;
	for (size_t i = 0; i < p->ntables; i++)
		if ((r = obx_poll_tables_use(p, i)) != 0 && r != OBX_ENOENT)
			return r;
	/* a claim that failed ended the last session: start after its table, so one table's
	 * failure cannot keep the tables after it from their turn */
	for (size_t i = 0; p->failed_table[0] != '\0' && i < p->ntables; i++) {
		char name[sizeof(p->failed_table)];

		snprintf(name, sizeof(name), "%s.%s", p->tables[i].schema, p->tables[i].name);
		if (strcmp(name, p->failed_table) == 0)
			p->round.cur = (i + 1) % p->ntables;
	}
	p->failed_table[0] = '\0';
	p->listening = false;
	if (p->cfg->poll_notify_channel[0] != '\0') {
		char chan[256] = "", q[300];

		if (obx_poll_quote_ident(p->cfg->poll_notify_channel, chan, sizeof(chan)) == 0) {
			snprintf(q, sizeof(q), "LISTEN %s", chan);
			res = PQexec(p->pg, q);
			p->listening = PQresultStatus(res) == PGRES_COMMAND_OK;
			if (!p->listening)
				obx_log_warn("could not listen on channel %s, polling every %d ms only: %s",
				    p->cfg->poll_notify_channel, p->cfg->poll_interval_ms,
				    obx_pg_result_error_line(res, err, sizeof(err)));
			PQclear(res);
		}
	}
	p->rel_built = false;
	return 0;
}

static void
session_close(struct poller *p)
{
	PQfinish(p->pg);
	p->pg = NULL;
	p->pg_busy = false;
}

/* ---- one session, as the runner drives it ---- */

static bool
poll_open(void *ctx)
{
	struct poller *p = ctx;

	p->published_at_open = p->m.events_published;
	if ((p->rc = session_open(p)) != 0)
		return false;
	if (obx_tables_several(p->base))
		obx_log_info("polling %zu table(s) of [source] table in turn: claims of up to %lld rows each, "
		             "%lld of them sent at a time, every %d ms when a whole round found none%s%s",
		    p->ntables, p->cfg->poll_batch, obx_poll_claim_rows(p->cfg), p->cfg->poll_interval_ms,
		    p->listening ? ", woken by NOTIFY on " : "", p->listening ? p->cfg->poll_notify_channel : "");
	else
		obx_log_info("polling %s.%s: claims of up to %lld rows, %lld of them sent at a time, every %d ms "
		             "when idle%s%s",
		    p->cfg->table_schema, p->cfg->table_name, p->cfg->poll_batch, obx_poll_claim_rows(p->cfg),
		    p->cfg->poll_interval_ms, p->listening ? ", woken by NOTIFY on " : "",
		    p->listening ? p->cfg->poll_notify_channel : "");
	obx_poll_set_state(p, OBX_STATE_STREAMING, OBX_NOT_READY_NONE, NULL);
	stats(p);
	return true;
}

/* One connection's life: p->rc becomes 0 on a clean stop, a negative code otherwise. */
static void
poll_run(void *ctx)
{
	struct poller *p = ctx;
	bool idle, round_end;
	int r, n;

	for (;;) {
		if (p->signals > 0) {
			snprintf(p->reason, sizeof(p->reason), "stopped");
			r = 0;
			break;
		}
		if (!p->kf_open) {
			char err[512];

			if (obx_kafka_open(&p->kf, p->cfg, NULL, false, obx_poll_on_delivery, p, err,
			        sizeof(err)) != 0) {
				snprintf(p->reason, sizeof(p->reason), "%s", err);
				r = OBX_ECONFIG;
				break;
			}
			p->kf_open = true;
			p->kf.metrics = &p->m;
		}
		if (p->ntables == 0) {
			n = 0; /* a pattern that matches no table yet: its tables are read every round */
		} else if ((r = obx_poll_tables_use(p, p->round.cur)) == OBX_ENOENT) {
			n = 0; /* left out this round (logged) */
		} else if (r != 0 || (n = obx_poll_cycle(p)) < 0) {
			if (r == 0)
				r = n;
			snprintf(p->failed_table, sizeof(p->failed_table), "%s.%s", p->tables[p->round.cur].schema,
			    p->tables[p->round.cur].name);
			break;
		}
		p->m.poll_tables_out = 0;
		for (size_t i = 0; i < p->ntables; i++)
			p->m.poll_tables_out += p->tables[i].out;
		if (obx_mono_ms() >= p->next_stats_ms)
			stats(p);
		obx_runner_publish(&p->run);
		idle = obx_poll_round_next(&p->round, n, &round_end);
		/* after each round, the tables a pattern matches now (one created meanwhile joins) */
		if (round_end && obx_tables_several(p->base) && (r = obx_poll_tables_read(p)) != 0)
			break;
		if (idle && (r = idle_wait(p, p->cfg->poll_interval_ms)) != 0)
			break;
	}
	p->rc = r;
}

static void
poll_close(void *ctx, bool opened, struct obx_session_result *out)
{
	struct poller *p = ctx;

	(void)opened;
	session_close(p);
	out->broker = p->kf_open && p->kf.fatal; /* read before the close clears it */
	if (p->kf_open && (p->rc != 0 || p->signals > 0)) {
		/* rows not yet marked stay pending: whatever is still queued is dropped */
		obx_kafka_close(&p->kf, 1000);
		p->kf_open = false;
	}
	out->end = p->rc == 0                           ? OBX_RUN_STOP :
	    p->rc == OBX_ECONFIG || p->rc == OBX_ENOMEM ? OBX_RUN_FATAL :
	                                                  OBX_RUN_RETRY;
	out->reason = p->reason;
	out->published = p->m.events_published;
	out->progressed = p->m.events_published > p->published_at_open;
}

static const struct obx_runner_ops poll_runner_ops = {
	.open = poll_open,
	.run = poll_run,
	.close = poll_close,
	.stop = poll_stop,
	.reload = poll_reload,
	.title = poll_title,
	.interrupted_names_reason = true,
};

/* ---- the process ---- */

int
obx_poll_run(const struct obx_config *cfg, const struct obx_run_opts *opts)
{
	struct poller p;
	int rc = 1;

	memset(&p, 0, sizeof(p));
	p.cfg = cfg;
	p.base = cfg;
	p.opts = opts;
	p.log_level = cfg->log_level;
	p.m.poll_mode = 1;
	p.m.poll_pending_rows = -1;
	p.m.state = OBX_STATE_CONNECTING;
	p.m.not_ready = OBX_NOT_READY_POSTGRES;
	obx_log_context(NULL, "poll"); /* no slot: polling reads the table */
#ifdef OBX_TEST_HOOKS
	if (getenv("OBX_TEST_KILL_AFTER_ACKS") != NULL)
		p.test_kill_after = (long)strtonum(getenv("OBX_TEST_KILL_AFTER_ACKS"), 0, LONG_MAX, NULL);
	if (getenv("OBX_TEST_FATAL_BEFORE") != NULL)
		p.test_fatal_before = (long)strtonum(getenv("OBX_TEST_FATAL_BEFORE"), 0, LONG_MAX, NULL);
#endif
	if (obx_tables_format(cfg, p.m.info_table, sizeof(p.m.info_table)) != 0)
		strlcpy(p.m.info_table, "(several)", sizeof(p.m.info_table));
	obx_pg_conninfo_dbname(cfg->conninfo, p.m.info_database, sizeof(p.m.info_database));
	/* one table of missing topics for the process: a wait counts from the first refusal */
	obx_dlv_init(&p.dlv, cfg, OBX_DLV_POLL, OBX_DLV_ATTEMPTS, &obx_poll_dlv_ops, &p, &p.m, &p.waits);
	if (obx_event_builder_init(&p.eb, cfg) != 0) {
		obx_log_error("out of memory");
		goto out;
	}
	if (obx_runner_init(&p.run, cfg, opts, &p.m, &poll_runner_ops, &p) != 0)
		goto out;
	rc = obx_runner_run(&p.run);
out:
	if (p.kf_open)
		obx_kafka_close(&p.kf, 1000);
	obx_runner_reset(&p.run);
	obx_pollcore_reset(&p.pc);
	obx_dlv_reset(&p.dlv);
	free(p.hdrs);
	free(p.datums);
	obx_rel_free(&p.rel);
	obx_event_builder_reset(&p.eb);
	obx_poll_tables_reset(&p);
	return rc;
}
