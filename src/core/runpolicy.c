/*
 * runpolicy.c - the decisions of the session loop (runpolicy.h).  Pure.
 */
#include <stdio.h>
#include <string.h>

#include "obx/core/runpolicy.h"

int64_t
obx_reconnect_delay_ms(int attempt, bool standby, uint32_t rnd)
{
	int64_t cap = OBX_RECONNECT_MIN_MS;
	int64_t half;

	if (standby)
		cap = OBX_STANDBY_RETRY_MS;
	else
		for (int i = 0; i < attempt && cap < OBX_RECONNECT_MAX_MS; i++)
			cap *= 2;
	if (cap > OBX_RECONNECT_MAX_MS)
		cap = OBX_RECONNECT_MAX_MS;
	half = cap / 2;
	return half + (int64_t)(rnd % (uint64_t)(cap - half + 1));
}

bool
obx_session_progressed(bool standby, bool confirmed_moved, int64_t streamed_ms)
{
	return standby || confirmed_moved || streamed_ms >= OBX_PROGRESS_STREAMED_MS;
}

enum obx_stop_verdict
obx_stops_add(struct obx_stops *s, int64_t now_ms)
{
	if (++s->count > 1)
		return OBX_STOP_NOW;
	s->first_ms = now_ms;
	return OBX_STOP_DRAIN;
}

bool
obx_stops_abandoned(const struct obx_stops *s, int64_t now_ms, int drain_ms)
{
	return s->count > 1 || (s->count == 1 && now_ms - s->first_ms >= drain_ms);
}

enum obx_run_next
obx_run_next(enum obx_run_end end, int stops)
{
	if (end == OBX_RUN_STOP)
		return OBX_NEXT_STOPPED;
	if (end == OBX_RUN_FATAL)
		return OBX_NEXT_FATAL;
	return stops > 0 ? OBX_NEXT_INTERRUPTED : OBX_NEXT_RETRY;
}

enum obx_failure_line
obx_failure_line(const char *last, const char *reason, bool standby, bool was_standby)
{
	if (standby)
		return was_standby ? OBX_FAILURE_QUIET : OBX_FAILURE_STANDBY;
	return strcmp(last, reason) != 0 ? OBX_FAILURE_NEW : OBX_FAILURE_AGAIN;
}

void
obx_failure_metrics(struct obx_metrics *m, bool broker, bool standby, const char *reason)
{
	if (broker)
		m->reconnects_kafka++;
	else if (!standby)
		m->reconnects_postgres++;
	m->state = standby ? OBX_STATE_STANDBY : OBX_STATE_CONNECTING;
	m->not_ready = standby ? OBX_NOT_READY_NONE : broker ? OBX_NOT_READY_BROKER : OBX_NOT_READY_POSTGRES;
	snprintf(m->state_reason, sizeof(m->state_reason), "%.*s", (int)sizeof(m->state_reason) - 1, reason);
	m->inflight_events = m->inflight_bytes = 0;
	m->oldest_unacked_age_seconds = 0;
}

bool
obx_server_view_fresh(bool ok, int64_t read_ms, int64_t now_ms, int status_interval_ms)
{
	return ok && now_ms - read_ms <= 2 * (int64_t)status_interval_ms + 1000;
}

enum obx_standby_step
obx_standby_step(bool ok, int64_t read_ms, bool busy, int64_t since_ms, int64_t now_ms)
{
	if (now_ms - since_ms < 1000)
		return OBX_STANDBY_WAIT;
	if (!ok || now_ms - read_ms > 3000)
		return OBX_STANDBY_TRY;
	return read_ms > since_ms && !busy ? OBX_STANDBY_TRY : OBX_STANDBY_WAIT;
}
