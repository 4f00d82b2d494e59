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

#include "obx/config.h"
#include "obx/lsn.h"

/*
 * What a line concerns.  Zero-initialise and set what applies: lsn
 * OBX_LSN_INVALID, xid 0 (InvalidTransactionId) and NULL or "" strings are
 * absent.  Strings are borrowed for the call only.  Declared here for the
 * pure core too, which fills one for each line it hands to the loop.
 */
struct obx_logfields {
	const char *slot;     /* overrides the context's slot */
	obx_lsn lsn;          /* rendered "X/X" */
	uint32_t xid;         /* rendered as a number */
	const char *event_id;
	const char *topic;
};

/*
 * The fields of a line written later (a session's end reason): holds its
 * strings, cut to the buffers.  Pure: the core keeps one too.
 */
struct obx_logfields_kept {
	obx_lsn lsn;
	uint32_t xid;
	char event_id[128];
	char topic[256];
};

/* Copies f (NULL: clears) into k. */
static inline void
obx_logfields_keep(struct obx_logfields_kept *k, const struct obx_logfields *f)
{
	k->lsn = f != NULL ? f->lsn : OBX_LSN_INVALID;
	k->xid = f != NULL ? f->xid : 0;
	snprintf(k->event_id, sizeof(k->event_id), "%s", f != NULL && f->event_id != NULL ? f->event_id : "");
	snprintf(k->topic, sizeof(k->topic), "%s", f != NULL && f->topic != NULL ? f->topic : "");
}

/* The fields k holds, borrowing its strings. */
static inline struct obx_logfields
obx_logfields_of(const struct obx_logfields_kept *k)
{
	return (struct obx_logfields){ .lsn = k->lsn, .xid = k->xid, .event_id = k->event_id,
		.topic = k->topic };
}

void obx_log_setup(enum obx_log_level level, enum obx_log_format format);
/*
 * Every later line of this process carries slot and mode (NULL or "":
 * none), copied; call before starting threads that log.
 */
void obx_log_context(const char *slot, const char *mode);
bool obx_log_enabled(enum obx_log_level level);
/* "error", "warn", "info" or "debug" (static). */
const char *obx_log_level_name(enum obx_log_level level);
void obx_log(enum obx_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* obx_log() with the fields of f (NULL: the context's only). */
void obx_log_f(enum obx_log_level level, const struct obx_logfields *f, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * The line obx_log_f() writes, without its newline: ts, level and msg, then
 * the context's slot and mode (either may be NULL) and f's fields (f may be
 * NULL).  Returns a string the caller frees with free(), or NULL when out
 * of memory.  A JSON line whose msg is not valid UTF-8 falls back to text.
 */
char *obx_log_render(enum obx_log_format format, const char *ts, enum obx_log_level level,
    const char *ctx_slot, const char *ctx_mode, const struct obx_logfields *f, const char *msg);

#define obx_log_error(...) obx_log(OBX_LOG_ERROR, __VA_ARGS__)
#define obx_log_warn(...) obx_log(OBX_LOG_WARN, __VA_ARGS__)
#define obx_log_info(...) obx_log(OBX_LOG_INFO, __VA_ARGS__)
#define obx_log_debug(...) obx_log(OBX_LOG_DEBUG, __VA_ARGS__)

/* Milliseconds of the monotonic clock: what every loop's deadlines and waits are counted in. */
int64_t obx_mono_ms(void);

/* Unix time in seconds (wall clock), for timestamps the metrics report. */
double obx_unix_seconds(void);

#endif
