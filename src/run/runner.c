/*
 * runner.c - the loop around the sessions of either source (runner.h):
 * HTTP, heartbeat, process title, signals, backoff and the session loop.
 * Its decisions are runpolicy.c's.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obx/sys/log.h"
#include "obx/run/runner.h"

int
obx_runner_init(struct obx_runner *run, const struct obx_config *cfg, const struct obx_run_opts *opts,
    struct obx_metrics *m, const struct obx_runner_ops *ops, void *ctx)
{
	char err[512];
	int rc;

	run->cfg = cfg;
	run->opts = opts;
	run->m = m;
	run->ops = ops;
	run->ctx = ctx;
	run->title_state = OBX_STATE_COUNT;
	if ((rc = obx_http_start(&run->http, cfg, err, sizeof(err))) != 0) {
		obx_log_error("%s", err);
		return rc;
	}
	run->http_on = true;
	obx_log_info("metrics and health on %s:%d (/metrics, /healthz, /readyz)", cfg->metrics_host,
	    run->http.port);
	return 0;
}

void
obx_runner_reset(struct obx_runner *run)
{
	if (run->http_on)
		obx_http_stop(&run->http);
	run->http_on = false;
}

/* ---- metrics, health, title ---- */

void
obx_runner_title(struct obx_runner *run)
{
	char buf[512];

	run->ops->title(run->ctx, buf, sizeof(buf));
	setproctitle("%s", buf);
	run->title_state = run->m->state;
}

void
obx_runner_publish(struct obx_runner *run)
{
	run->m->heartbeat_ms = obx_mono_ms();
	if (run->ops->refresh != NULL)
		run->ops->refresh(run->ctx);
	if (run->http_on)
		obx_http_publish(&run->http, run->m);
	if (run->m->state != run->title_state)
		obx_runner_title(run);
}

/* ---- signals ---- */

/*
 * SIGHUP: re-reads the configuration; the source applies what takes
 * effect at once, every other change is named as needing a restart (the
 * running settings stay as they are).
 */
static void
report_reload(const struct obx_config *running, const struct obx_config *fresh)
{
	const char *names[48];
	char later[1024] = "";
	size_t n = obx_config_diff_restart(running, fresh, names, sizeof(names) / sizeof(names[0]));

	for (size_t i = 0; i < n; i++)
		snprintf(later + strlen(later), sizeof(later) - strlen(later), "%s%s", later[0] ? ", " : "",
		    names[i]);
	if (later[0] != '\0')
		obx_log_warn("SIGHUP: changed settings that take effect only after a restart: %s", later);
	else
		obx_log_info("SIGHUP: configuration re-read");
}

static void
reload(struct obx_runner *run)
{
	struct obx_config fresh;
	char err[1024];

	if (run->opts->reload == NULL)
		return;
	if (run->opts->reload(run->opts->reload_ctx, &fresh, err, sizeof(err)) != 0) {
		obx_log_warn("SIGHUP: could not re-read the configuration, the running one stays: %s", err);
		obx_config_reset(&fresh);
		return;
	}
	run->ops->reload(run->ctx, &fresh);
	report_reload(run->cfg, &fresh);
	obx_config_reset(&fresh);
}

void
obx_runner_read_signals(struct obx_runner *run)
{
	char buf[16];
	ssize_t n;

	while ((n = read(run->opts->signal_fd, buf, sizeof(buf))) > 0)
		for (ssize_t i = 0; i < n; i++) {
			int64_t now = obx_mono_ms();

			if (buf[i] == SIGHUP) {
				reload(run);
				continue;
			}
			run->ops->stop(run->ctx, obx_stops_add(&run->stops, now), now);
		}
}

int
obx_runner_stops(const struct obx_runner *run)
{
	return run->stops.count;
}

bool
obx_runner_abandoned(const struct obx_runner *run, int drain_ms)
{
	return obx_stops_abandoned(&run->stops, obx_mono_ms(), drain_ms);
}

bool
obx_runner_tick(struct obx_runner *run)
{
	obx_runner_publish(run);
	obx_runner_read_signals(run);
	return run->stops.count > 0;
}

bool
obx_runner_sleep(struct obx_runner *run, int64_t ms)
{
	int64_t until = obx_mono_ms() + ms;

	while (run->stops.count == 0 && obx_mono_ms() < until) {
		struct pollfd p = { run->opts->signal_fd, POLLIN, 0 };
		int64_t left = until - obx_mono_ms();

		if (poll(&p, 1, (int)(left < 1000 ? left : 1000)) > 0)
			obx_runner_read_signals(run);
		obx_runner_publish(run); /* the loop is turning: /healthz stays green */
	}
	obx_runner_read_signals(run);
	return run->stops.count > 0;
}

/* ---- the session loop ---- */

/* Says why the session ended and sets the state for /readyz; logs once per distinct failure. */
static void
report_failure(struct obx_runner *run, const struct obx_session_result *res)
{
	obx_failure_metrics(run->m, res->broker, res->standby, res->reason);
	obx_runner_publish(run);
	switch (obx_failure_line(run->last, res->reason, res->standby, run->was_standby)) {
	case OBX_FAILURE_STANDBY:
		/* a hot standby: poll the slot often so a takeover takes seconds */
		obx_log_info("standby: %s; holding no events, retrying every second", res->reason);
		break;
	case OBX_FAILURE_QUIET:
		break;
	case OBX_FAILURE_NEW:
		obx_log_f(OBX_LOG_WARN, &res->fields, "%s; retrying", res->reason);
		break;
	case OBX_FAILURE_AGAIN:
		obx_log_f(OBX_LOG_DEBUG, &res->fields, "still failing (attempt %d): %s", run->attempt + 1,
		    res->reason);
		break;
	}
	if (res->standby)
		run->was_standby = true;
	snprintf(run->last, sizeof(run->last), "%s", res->reason);
}

/* Waits before the next session.  Returns true on a stop signal. */
static bool
backoff(struct obx_runner *run, const struct obx_session_result *res)
{
	int attempt = run->attempt++;

	if (res->standby && run->ops->standby_wait != NULL)
		return run->ops->standby_wait(run->ctx);
	return obx_runner_sleep(run, obx_reconnect_delay_ms(attempt, res->standby, arc4random()));
}

/* One session: open, run, close.  Fills res. */
static void
session(struct obx_runner *run, struct obx_session_result *res)
{
	bool opened;

	memset(res, 0, sizeof(*res));
	if ((opened = run->ops->open(run->ctx)))
		run->ops->run(run->ctx);
	run->ops->close(run->ctx, opened, res);
	if (res->reason == NULL)
		res->reason = "";
}

int
obx_runner_run(struct obx_runner *run)
{
	struct obx_session_result res;

	for (;;) {
		session(run, &res);
		switch (obx_run_next(res.end, run->stops.count)) {
		case OBX_NEXT_STOPPED:
			obx_log_info("%s; %" PRIu64 " event(s) published", res.reason, res.published);
			return 0;
		case OBX_NEXT_FATAL:
			obx_log_f(OBX_LOG_ERROR, &res.fields, "%s", res.reason);
			return 1;
		case OBX_NEXT_INTERRUPTED:
			if (run->ops->interrupted_names_reason)
				obx_log_info("%s; stopped", res.reason);
			else
				obx_log_info("stopped while reconnecting");
			return 0;
		case OBX_NEXT_RETRY:
			break;
		}
		if (res.progressed)
			run->attempt = 0;
		report_failure(run, &res);
		if (backoff(run, &res)) {
			obx_log_info("stopped while reconnecting");
			return 0;
		}
	}
}
