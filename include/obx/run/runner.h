/*
 * runner.h - the loop around the sessions of either source ("outboxd run":
 * relay.c streams from the slot, poll.c polls the table): the HTTP server
 * and the metrics snapshot it serves, the heartbeat behind /healthz, the
 * process title, the signal pipe (stop signals counted, SIGHUP re-reads the
 * configuration), and sessions opened, run and closed again after a
 * backoff until one stops or fails for good.  Its decisions are
 * runpolicy.h's; the source's own work goes through struct
 * obx_runner_ops.
 *
 * Every wait of the runner (the backoff, obx_runner_sleep()) reads the
 * signal pipe and publishes the snapshot at least once a second, so
 * /healthz stays green while the process is turning; a source's own waits
 * call obx_runner_tick() or obx_runner_publish() as often.
 */
#ifndef OBX_RUNNER_H
#define OBX_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/sys/http.h"
#include "obx/sys/log.h"
#include "obx/core/metrics.h"
#include "obx/run/relay.h"
#include "obx/core/runpolicy.h"

/* How a session ended: filled by the source's close. */
struct obx_session_result {
	enum obx_run_end end;
	const char *reason;          /* borrowed from the source until its next session */
	struct obx_logfields fields; /* what reason concerns, for its line (borrowed alike) */
	uint64_t published;          /* events published by the process so far */
	bool broker;                 /* the broker side ended it (/readyz, reconnect counter) */
	bool standby;                /* another instance holds the slot: a standby, not a failure */
	bool progressed;             /* it got far enough that the backoff starts over */
};

/* What a source does for the runner; ctx is obx_runner_init()'s. */
struct obx_runner_ops {
	/* Connects and starts a session.  Returns true when run may follow. */
	bool (*open)(void *ctx);
	/* Runs the session until it ends (a failure, or a stop). */
	void (*run)(void *ctx);
	/* Closes what open left (opened: it returned true) and says how the session ended. */
	void (*close)(void *ctx, bool opened, struct obx_session_result *out);
	/* A stop signal; obx_runner_stops() already counts it. */
	void (*stop)(void *ctx, enum obx_stop_verdict v, int64_t now_ms);
	/* SIGHUP: applies what of fresh takes effect at once (the keys the configuration table marks
	 * SIGHUP for this mode) and logs it; the runner names the rest (obx_config_diff_restart()). */
	void (*reload)(void *ctx, const struct obx_config *fresh);
	/* The process title (NUL-terminated into buf, len bytes). */
	void (*title)(void *ctx, char *buf, size_t len);
	/* Optional: refreshes the metrics before each publication. */
	void (*refresh)(void *ctx);
	/* Optional: waits as a standby instead of the backoff.  Returns true on a stop signal. */
	bool (*standby_wait)(void *ctx);
	/* A failure after a stop signal logs "<reason>; stopped" (else "stopped while reconnecting"). */
	bool interrupted_names_reason;
};

/*
 * Embedded in the source's state.  cfg, opts, the metrics and ops are
 * borrowed and must outlive it.  Zeroed, obx_runner_reset() is a no-op.
 */
struct obx_runner {
	const struct obx_config *cfg;
	const struct obx_run_opts *opts;
	struct obx_metrics *m;
	const struct obx_runner_ops *ops;
	void *ctx;
	struct obx_http http;
	bool http_on;
	enum obx_state title_state;
	struct obx_stops stops;
	int attempt;      /* sessions failed in a row since one progressed */
	bool was_standby; /* the last failure was a standby's (the source clears it) */
	char last[1024];  /* the last failure's reason */
};

/*
 * Starts the HTTP server on [metrics] listen and logs where.  Returns 0,
 * or obx_http_start()'s OBX_ECONFIG or OBX_EIO with the error logged
 * (obx_runner_reset() still applies).
 */
int obx_runner_init(struct obx_runner *run, const struct obx_config *cfg, const struct obx_run_opts *opts,
    struct obx_metrics *m, const struct obx_runner_ops *ops, void *ctx);

/* Stops the HTTP server. */
void obx_runner_reset(struct obx_runner *run);

/*
 * Runs sessions until one stops or fails for good, logging how it ended.
 * Returns the exit status: 0 clean stop, 1 failure.
 */
int obx_runner_run(struct obx_runner *run);

/* Stamps the heartbeat, refreshes and publishes the snapshot; a new state retitles. */
void obx_runner_publish(struct obx_runner *run);

/* Sets the process title now (the state unchanged, what it shows did). */
void obx_runner_title(struct obx_runner *run);

/* Serves what the signal pipe holds, without blocking. */
void obx_runner_read_signals(struct obx_runner *run);

/* Publishes and serves the signal pipe.  Returns true once a stop signal came. */
bool obx_runner_tick(struct obx_runner *run);

/*
 * Sleeps ms, serving the signal pipe and publishing at least every
 * second.  Returns true (at once) on a stop signal.
 */
bool obx_runner_sleep(struct obx_runner *run, int64_t ms);

/* The stop signals received so far. */
int obx_runner_stops(const struct obx_runner *run);

/* True when a second stop signal came, or drain_ms passed since the first. */
bool obx_runner_abandoned(const struct obx_runner *run, int drain_ms);

#endif
