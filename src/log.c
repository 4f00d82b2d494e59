#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <jansson.h>

#include "obx/log.h"

static enum obx_log_level log_level = OBX_LOG_INFO;
static enum obx_log_format log_format = OBX_LOG_FORMAT_TEXT;

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

bool
obx_log_enabled(enum obx_log_level level)
{
	return level <= log_level;
}

void
obx_log(enum obx_log_level level, const char *fmt, ...)
{
	int saved_errno = errno;
	char msg[2048], ts[64];
	struct timespec now;
	struct tm tm;
	va_list ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
	    tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	    (int)(now.tv_nsec / 1000000));
	if (log_format == OBX_LOG_FORMAT_JSON) {
		json_t *o = json_pack("{s:s, s:s, s:s}", "ts", ts, "level", level_names[level],
		    "msg", msg);
		char *line = o != NULL ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;

		if (line != NULL)
			fprintf(stderr, "%s\n", line);
		else /* not valid UTF-8, or out of memory: never drop the line */
			fprintf(stderr, "%s %s %s\n", ts, level_names[level], msg);
		free(line);
		json_decref(o);
	} else {
		fprintf(stderr, "%s %s %s\n", ts, level_names[level], msg);
	}
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
