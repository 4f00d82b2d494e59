/*
 * log.h - gated, errno-preserving log lines on stderr (Kubernetes collects
 * stderr).  One line per event, JSON (jansson) or text.  Messages follow
 * PostgreSQL's style: lowercase, no trailing period, "could not X: %s".
 * Callers must never pass secrets (use obx_conninfo_redact()).
 */
#ifndef OBX_LOG_H
#define OBX_LOG_H

#include <stdint.h>

#include "obx/config.h"

void obx_log_setup(enum obx_log_level level, enum obx_log_format format);
bool obx_log_enabled(enum obx_log_level level);
/* "error", "warn", "info" or "debug" (static). */
const char *obx_log_level_name(enum obx_log_level level);
void obx_log(enum obx_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define obx_log_error(...) obx_log(OBX_LOG_ERROR, __VA_ARGS__)
#define obx_log_warn(...) obx_log(OBX_LOG_WARN, __VA_ARGS__)
#define obx_log_info(...) obx_log(OBX_LOG_INFO, __VA_ARGS__)
#define obx_log_debug(...) obx_log(OBX_LOG_DEBUG, __VA_ARGS__)

/* Milliseconds of the monotonic clock: what every loop's deadlines and waits are counted in. */
int64_t obx_mono_ms(void);

/* Unix time in seconds (wall clock), for timestamps the metrics report. */
double obx_unix_seconds(void);

#endif
