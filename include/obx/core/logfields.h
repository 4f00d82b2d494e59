/*
 * logfields.h - what a log line concerns (pure): the core fills these for
 * the lines it hands to the loop, which writes them (sys/log.h).
 */
#ifndef OBX_LOGFIELDS_H
#define OBX_LOGFIELDS_H

#include <stdint.h>
#include <stdio.h>

#include "obx/core/lsn.h"

/*
 * What a line concerns.  Zero-initialise and set what applies: lsn
 * OBX_LSN_INVALID, xid 0 (InvalidTransactionId) and NULL or "" strings are
 * absent.  Strings are borrowed for the call only.
 */
struct obx_logfields {
	const char *slot; /* overrides the context's slot */
	obx_lsn lsn;      /* rendered "X/X" */
	uint32_t xid;     /* rendered as a number */
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
	return (struct obx_logfields){ .lsn = k->lsn, .xid = k->xid, .event_id = k->event_id, .topic = k->topic };
}

#endif
