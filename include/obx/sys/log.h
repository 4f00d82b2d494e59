/*
 * log.h - gated, errno-preserving log lines on stderr (Kubernetes collects
 * stderr).  One line per event, JSON (jansson) or text.  Messages follow
 * PostgreSQL's style: lowercase, no trailing period, "could not X: %s".
 * Callers must never pass secrets (use obx_conninfo_redact()).
 *
 * Structured fields: in JSON format a line carries, after ts, level and
 * msg, the members of the process's context (slot, mode; set once per run
 * with obx_log_context()) and of the line's own struct obx_logfields (lsn,
 * xid, event_id, topic; a line's slot overrides the context's).  An empty
 * field is left out.  The text format prints the sentence alone, as before.
 */
#ifndef OBX_LOG_H
#define OBX_LOG_H

#include <stdint.h>
#include <stdio.h>

#include "obx/core/config.h"
#include "obx/core/logfields.h"
#include "obx/core/lsn.h"

void obx_log_setup(enum obx_log_level level, enum obx_log_format format);
/*
 * Every later line of this process carries slot and mode (NULL or "":
 * none), copied; call before starting threads that log.
 */
void obx_log_context(const char *slot, const char *mode);
bool obx_log_enabled(enum obx_log_level level);
/* "error", "warn", "info" or "debug" (static). */
const char *obx_log_level_name(enum obx_log_level level);
void obx_log(enum obx_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* obx_log() with the fields of f (NULL: the context's only). */
void obx_log_f(enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * The line obx_log_f() writes, without its newline: ts, level and msg, then
 * the context's slot and mode (either may be NULL) and f's fields (f may be
 * NULL).  Returns a string the caller frees with free(), or NULL when out
 * of memory.  A JSON line whose msg is not valid UTF-8 falls back to text.
 */
char *obx_log_render(enum obx_log_format format, const char *ts, enum obx_log_level level, const char *ctx_slot,
    const char *ctx_mode, const struct obx_logfields *f, const char *msg);

#define obx_log_error(...) obx_log(OBX_LOG_ERROR, __VA_ARGS__)
#define obx_log_warn(...) obx_log(OBX_LOG_WARN, __VA_ARGS__)
#define obx_log_info(...) obx_log(OBX_LOG_INFO, __VA_ARGS__)
#define obx_log_debug(...) obx_log(OBX_LOG_DEBUG, __VA_ARGS__)

/* Milliseconds of the monotonic clock: what every loop's deadlines and waits are counted in. */
int64_t obx_mono_ms(void);

/* Unix time in seconds (wall clock), for timestamps the metrics report. */
double obx_unix_seconds(void);

#endif
