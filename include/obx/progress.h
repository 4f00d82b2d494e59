/*
 * progress.h - the progress record of exactly-once mode (pure): what a
 * Kafka transaction of outboxd writes to the progress topic beside its
 * events, and how a new session reads it back (docs/design.md,
 * "Exactly-once").
 *
 * Key: the slot name.  Value: a JSON object
 *   {"slot": S, "transactional_id": T, "timeline": N, "lsn": "X/X", "seq": N,
 *    "end_lsn": "X/X", "commit_time": "ISO 8601", "records": N}
 * where (lsn, seq) is the mark of the last event the transaction holds
 * (dedupe.h), timeline the server's timeline (LSNs of another timeline are
 * not comparable: a point-in-time recovery or a failover may go back),
 * end_lsn the end of the last PostgreSQL transaction that ended in it (0/0
 * when none) and records how many records it holds.
 */
#ifndef OBX_PROGRESS_H
#define OBX_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "obx/dedupe.h"
#include "obx/lsn.h"

struct obx_progress {
	struct obx_dd_mark mark; /* id_hash unused (0) */
	uint32_t timeline;       /* the server's timeline when it was written (0: unknown) */
	obx_lsn end_lsn;
	int64_t commit_time;     /* PostgreSQL epoch microseconds; 0 when unknown */
	uint64_t records;
};

/*
 * The record's value for slot and transactional_id; a string the caller
 * frees, or NULL when out of memory.
 */
char *obx_progress_encode(const struct obx_progress *p, const char *slot, const char *txn_id);

/*
 * Reads a value; slot must match.  Returns 0, OBX_ENOENT (another slot's
 * record) or OBX_EINVAL (not a progress record: why says what is wrong).
 */
int obx_progress_parse(const void *value, size_t len, const char *slot, struct obx_progress *out,
    char *why, size_t whylen);

#endif
