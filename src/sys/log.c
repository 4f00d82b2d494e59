#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "obx/sys/log.h"

static enum obx_log_level log_level = OBX_LOG_INFO;
static enum obx_log_format log_format = OBX_LOG_FORMAT_TEXT;
static char ctx_slot[256], ctx_mode[16];

static const char *const level_names[] = { "error", "warn", "info", "debug" };

const char *
obx_log_level_name(enum obx_log_level level)
{
	return level_names[level];
}

void
obx_log_setup(enum obx_log_level level, enum obx_log_format format)
{
	log_level = level;
	log_format = format;
}

void
obx_log_context(const char *slot, const char *mode)
{
	strlcpy(ctx_slot, slot != NULL ? slot : "", sizeof(ctx_slot));
	strlcpy(ctx_mode, mode != NULL ? mode : "", sizeof(ctx_mode));
}

bool
obx_log_enabled(enum obx_log_level level)
{
	return level <= log_level;
}

static bool
present(const char *s)
{
	return s != NULL && s[0] != '\0';
}

static char *
render_text(const char *ts, enum obx_log_level level, const char *msg)
{
	size_t len = strlen(ts) + strlen(level_names[level]) + strlen(msg) + 3;
	char *line = malloc(len);

	if (line != NULL)
		snprintf(line, len, "%s %s %s", ts, level_names[level], msg);
	return line;
}

/*
 * Sets o[key] to the string s when present.  A field that is not valid
 * UTF-8 (a topic made from a column's bytes) is left out, the line kept.
 */
static bool
set_str(json_t *o, const char *key, const char *s)
{
	json_t *v;

	if (!present(s))
		return true;
	if ((v = json_string(s)) == NULL)
		return true;
	return json_object_set_new(o, key, v) == 0;
}

char *
obx_log_render(enum obx_log_format format, const char *ts, enum obx_log_level level, const char *slot,
    const char *mode, const struct obx_logfields *f, const char *msg)
{
	json_t *o;
	char *line = NULL, lsn[OBX_LSN_STRLEN];
	bool ok;

	if (format != OBX_LOG_FORMAT_JSON)
		return render_text(ts, level, msg);
	if (f != NULL && present(f->slot))
		slot = f->slot;
	o = json_pack("{s:s, s:s, s:s}", "ts", ts, "level", level_names[level], "msg", msg);
	ok = o != NULL && set_str(o, "slot", slot) && set_str(o, "mode", mode);
	if (ok && f != NULL) {
		if (f->lsn != OBX_LSN_INVALID)
			ok = set_str(o, "lsn", obx_lsn_format(f->lsn, lsn, sizeof(lsn)));
		if (ok && f->xid != 0)
			ok = json_object_set_new(o, "xid", json_integer(f->xid)) == 0;
		ok = ok && set_str(o, "event_id", f->event_id) && set_str(o, "topic", f->topic);
	}
	if (ok)
		line = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (line == NULL) /* not valid UTF-8, or out of memory: never drop the line */
		line = render_text(ts, level, msg);
	return line;
}

static void
log_va(enum obx_log_level level, const struct obx_logfields *f, const char *fmt, va_list ap)
{
	char msg[2048], ts[64], *line;
	struct timespec now;
	struct tm tm;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
	    tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(now.tv_nsec / 1000000));
	line = obx_log_render(log_format, ts, level, ctx_slot, ctx_mode, f, msg);
	if (line != NULL)
		fprintf(stderr, "%s\n", line);
	else
		fprintf(stderr, "%s %s %s\n", ts, level_names[level], msg);
	free(line);
}

void
obx_log(enum obx_log_level level, const char *fmt, ...)
{
	int saved_errno = errno;
	va_list ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	log_va(level, NULL, fmt, ap);
	va_end(ap);
	errno = saved_errno;
}

void
obx_log_f(enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
{
	int saved_errno = errno;
	va_list ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	log_va(level, f, fmt, ap);
	va_end(ap);
	errno = saved_errno;
}

int64_t
obx_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double
obx_unix_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
