/*
 * core/eos_progress.h - the progress record of exactly-once mode (pure): what a
 * Kafka transaction of outboxd writes to the progress topic beside its
 * events, how a new session reads it back, and whether the session may
 * trust it (docs/internals/design.md, "Exactly-once").
 *
 * Key: the transactional.id.  Value: a JSON object
 *   {"slot": S, "transactional_id": T, "system_id": "N", "database": D,
 *    "timeline": N, "slot_created": "X/X", "events": E,
 *    "lsn": "X/X", "seq": N, "lsn_commit_time": N,
 *    "end_lsn": "X/X", "commit_time": "ISO 8601", "records": N}
 * where (lsn, seq) is the mark of the last event the transaction holds
 * (core/restart_dedupe.h) and lsn_commit_time the commit time (PostgreSQL-epoch
 * microseconds) of the PostgreSQL transaction that committed at lsn; end_lsn
 * the end of the last PostgreSQL transaction that ended in it (0/0 when
 * none) and records how many records it holds.  The source fields name the
 * history the mark belongs to: the server's system identifier, the
 * database, the timeline (LSNs of another timeline are not comparable), the
 * slot's creation point from the slot guard (a slot dropped and created
 * again starts another history) and what the seq ordinals count (events).
 */
#ifndef OBX_PROGRESS_H
#define OBX_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/restart_dedupe.h"
#include "obx/core/lsn.h"

/* The history a progress record belongs to. */
struct obx_progress_source {
	char system_id[32]; /* IDENTIFY_SYSTEM's systemid */
	char database[128];
	uint32_t timeline;
	obx_lsn slot_created; /* the slot's creation point as the slot guard recorded it; 0: unknown */
	char events[400];     /* what seq counts: "schema.table", "+messages:prefix" with [source] messages */
};

struct obx_progress {
	struct obx_dd_mark mark;  /* id_hash unused (0) */
	int64_t mark_commit_time; /* commit time of the transaction at mark.lsn; 0: unknown */
	bool has_source;          /* src was in the record (records of earlier versions lack it) */
	struct obx_progress_source src;
	obx_lsn end_lsn;
	int64_t commit_time; /* PostgreSQL epoch microseconds; 0 when unknown */
	uint64_t records;
};

/*
 * Fills *src->events for the table and the [source] messages settings:
 * what the seq ordinals of a transaction count, so that a record is never
 * read against another numbering.
 */
void obx_progress_events(struct obx_progress_source *src, const char *schema, const char *table, bool messages,
    const char *prefix);

/*
 * Fills *src with the history a session decodes: the server's system_id
 * and timeline (IDENTIFY_SYSTEM), the database, the slot's creation point
 * (0: unknown) and what cfg's table and [source] messages make the seq
 * ordinals count (obx_progress_events()).  Strings are copied, cut to fit.
 */
void obx_progress_source_init(struct obx_progress_source *src, const char *system_id, const char *database,
    uint32_t timeline, obx_lsn slot_created, const struct obx_config *cfg);

/*
 * The record's value for slot and transactional_id (p->src is written when
 * p->has_source); a string the caller frees, or NULL when out of memory.
 */
char *obx_progress_encode(const struct obx_progress *p, const char *slot, const char *txn_id);

/*
 * Reads a value; slot must match.  Returns 0, OBX_ENOENT (another slot's
 * record) or OBX_EINVAL (not a progress record: errbuf says what is wrong).
 */
int obx_progress_parse(const void *value, size_t len, const char *slot, struct obx_progress *out, char *errbuf,
    size_t errlen);

/*
 * Whether a session on source now, whose server's WAL position is
 * server_lsn (IDENTIFY_SYSTEM's xlogpos), may skip replayed events up to
 * the record's mark.  Returns true, or false with errbuf saying what tells
 * the record apart from this session's history: no source named (an
 * earlier version's record), another system, database, timeline, slot
 * creation or event numbering, a mark beyond the server's WAL position
 * (the server went back: a restore from a copy), or no commit time to
 * verify the mark with.  A trusted record is still only a candidate: the
 * core checks that the replay meets the mark's transaction (relaycore.h,
 * obx_core_exactly_once()).
 */
bool obx_progress_trusted(const struct obx_progress *rec, const struct obx_progress_source *now,
    obx_lsn server_lsn, char *errbuf, size_t errlen);

/*
 * The broker refused this producer's epoch (exactly-once).  Another
 * instance that took the transactional.id must have taken the slot first,
 * which ends this instance's replication connection: then the process
 * stops at once (OBX_PROGRESS_STOP, exit 1).  While the connection is still
 * ours (connection_ours) nobody can have taken over: a transaction outlived
 * transaction.timeout.ms and the broker aborted it, and a new session goes
 * on (OBX_PROGRESS_NEW_SESSION).  errbuf gets the line.
 */
enum obx_progress_fence { OBX_PROGRESS_NEW_SESSION, OBX_PROGRESS_STOP };
enum obx_progress_fence obx_progress_fenced(bool connection_ours, const char *txn_id, const char *slot,
    char *errbuf, size_t errlen);

/*
 * The session after a fence that looked like an aborted transaction
 * (obx_progress_fenced() said NEW_SESSION) finds the slot in use by another
 * instance: it was a takeover after all, and the process stops (true, errbuf
 * filled) instead of waiting as a hot standby.
 */
bool obx_progress_taken_over(bool fenced_before, bool slot_in_use, const char *txn_id, const char *slot,
    char *errbuf, size_t errlen);

/*
 * The partition of the progress topic a transactional.id's records go to:
 * the key's own (murmur2, as the next session reads first), or -1 (the
 * partitioner's choice) while the topic's partition count is unknown.
 */
int32_t obx_progress_partition(const char *txn_id, int32_t nparts);

/* Where a session's replay starts skipping (obx_progress_floor()). */
enum obx_progress_floor {
	OBX_PROGRESS_FLOOR_NEW_SLOT,   /* the slot was made this session: nothing read, nothing to skip */
	OBX_PROGRESS_FLOOR_UNREADABLE, /* the record could not be read: the session ends and retries */
	OBX_PROGRESS_FLOOR_NONE,       /* no record of the transactional.id yet: nothing to skip */
	OBX_PROGRESS_FLOOR_UNTRUSTED,  /* a record of another history: nothing to skip this session */
	OBX_PROGRESS_FLOOR_TRUSTED,    /* the record's mark is the floor (obx_core_exactly_once()) */
};

/*
 * The floor of a session on source now whose server's WAL position is
 * server_lsn, for transactional.id txn_id and cfg's slot and progress
 * topic.  slot_made: the slot was created this session, so nothing was
 * read (read_rc, read_why and rec are then not looked at); else read_rc
 * is obx_kafka_progress_read()'s return (kafka/progress_read.h: 1 with *rec, 0 none,
 * negative with read_why) and rec the record read.  Never guesses: a read
 * that failed is UNREADABLE, since without the record a replay would
 * publish committed events again.  line gets what to say: the session's
 * end reason for UNREADABLE, a warning for UNTRUSTED, else an info line.
 */
enum obx_progress_floor obx_progress_floor(const struct obx_config *cfg, const char *txn_id,
    const struct obx_progress_source *now, obx_lsn server_lsn, bool slot_made, int read_rc, const char *read_why,
    const struct obx_progress *rec, char *line, size_t linelen);

#endif
