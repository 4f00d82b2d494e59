/*
 * runpolicy.h - the decisions of the loop that runs sessions (runner.h),
 * shared by both sources: how long to wait before the next session, what a
 * stop signal means, what to do once a session ended and how its failure is
 * told.  Pure: no clock, no I/O, no logging; the caller passes the time and
 * the random value, and performs what it gets back
 * (tests/unit/test_runner.c).
 */
#ifndef OBX_RUNPOLICY_H
#define OBX_RUNPOLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "obx/core/metrics.h"

#define OBX_RECONNECT_MIN_MS 200   /* the first wait before a new session */
#define OBX_RECONNECT_MAX_MS 30000 /* the longest */
#define OBX_STANDBY_RETRY_MS 1000  /* a hot standby's, whatever the attempt */

/*
 * The wait before session attempt + 1 (attempt 0: the first retry): the
 * cap OBX_RECONNECT_MIN_MS doubled per attempt up to OBX_RECONNECT_MAX_MS
 * (OBX_STANDBY_RETRY_MS for a standby), then "equal jitter": the result
 * lies in [cap/2, cap], decided by rnd (any 32-bit random value), so
 * instances that failed together do not retry together.  A negative
 * attempt counts as 0.
 */
int64_t obx_reconnect_delay_ms(int attempt, bool standby, uint32_t rnd);

/* A session that streamed this long without failing counts as progress (a quiet database's). */
#define OBX_PROGRESS_STREAMED_MS 60000

/*
 * Whether a session that ended counts as progress, so that the next wait
 * starts again at OBX_RECONNECT_MIN_MS: a standby's wait, a session that
 * moved the confirmed position (confirmed_moved), or one that streamed for
 * OBX_PROGRESS_STREAMED_MS or longer (streamed_ms).  A session that only
 * began streaming does not: one that a producer error, a refused login or
 * a missing ACL ends at once would otherwise start again without a pause.
 */
bool obx_session_progressed(bool standby, bool confirmed_moved, int64_t streamed_ms);

/* Stop signals (SIGTERM, SIGINT) received; zeroed means none. */
struct obx_stops {
	int count;
	int64_t first_ms; /* when the first one came */
};

enum obx_stop_verdict {
	OBX_STOP_DRAIN, /* the first: finish what is under way, up to the drain deadline */
	OBX_STOP_NOW,   /* a later one: abandon it at once */
};

/* Counts a stop signal received at now_ms.  Returns what it means. */
enum obx_stop_verdict obx_stops_add(struct obx_stops *s, int64_t now_ms);

/*
 * True when the work under way is abandoned: a second stop signal, or
 * drain_ms past since the first.
 */
bool obx_stops_abandoned(const struct obx_stops *s, int64_t now_ms, int drain_ms);

/* How a session ended, as its source tells it. */
enum obx_run_end {
	OBX_RUN_STOP,  /* stopped as asked: exit 0 */
	OBX_RUN_RETRY, /* a transient failure: a new session after the backoff */
	OBX_RUN_FATAL, /* cannot heal: exit 1 */
};

/* What the loop does once a session ended. */
enum obx_run_next {
	OBX_NEXT_STOPPED,     /* log the stop and exit 0 */
	OBX_NEXT_FATAL,       /* log the reason as an error and exit 1 */
	OBX_NEXT_INTERRUPTED, /* a failure, but a stop signal came: exit 0 without retrying */
	OBX_NEXT_RETRY,       /* report the failure, back off, open the next session */
};

/* The step after a session that ended so, with stops stop signals received so far. */
enum obx_run_next obx_run_next(enum obx_run_end end, int stops);

/* How the failure that ended a session is logged (obx_failure_line()). */
enum obx_failure_line {
	OBX_FAILURE_NEW,     /* warn: "<reason>; retrying" */
	OBX_FAILURE_AGAIN,   /* the same as the last one: debug, with the attempt */
	OBX_FAILURE_STANDBY, /* became a standby: info, once */
	OBX_FAILURE_QUIET,   /* still a standby: nothing */
};

/*
 * The line for a failure with reason, after last (the previous failure's
 * reason, "" for none); standby says the slot is in use by another
 * instance, was_standby that the previous failure said so too.
 */
enum obx_failure_line obx_failure_line(const char *last, const char *reason, bool standby, bool was_standby);

/*
 * The metrics while the next session is awaited: the side's reconnect
 * counter (broker: kafka, else postgres; a standby counts none), the state
 * (connecting or standby), /readyz's side and reason (cut to fit), and
 * nothing in flight.
 */
void obx_failure_metrics(struct obx_metrics *m, bool broker, bool standby, const char *reason);

/*
 * True when the server's numbers, read at read_ms (ok: that read worked),
 * may be shown at now_ms: a read older than two status intervals and a
 * second hangs (a server that drops packets), and the metric says unknown
 * instead of freezing (docs/internals/design.md, invariant 10).
 */
bool obx_server_view_fresh(bool ok, int64_t read_ms, int64_t now_ms, int status_interval_ms);

/* A hot standby's next step (obx_standby_step()). */
enum obx_standby_step {
	OBX_STANDBY_WAIT, /* another instance streams from the slot: wait on */
	OBX_STANDBY_TRY,  /* try a session now */
};

/*
 * A hot standby waiting since since_ms, at now_ms, with the slot watch's
 * last read (ok, read_ms; busy: the slot exists and another instance is
 * active on it): a session at most every second; at once when the server
 * cannot be read or no read came for 3 s (the session finds out why), or
 * when a read since the wait began finds the slot free or gone.
 */
enum obx_standby_step obx_standby_step(bool ok, int64_t read_ms, bool busy, int64_t since_ms, int64_t now_ms);

#endif
