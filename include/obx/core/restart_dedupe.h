/*
 * core/restart_dedupe.h - restart de-duplication (pure): which records of a new session
 * are in Kafka already, judged from what the session read back from the
 * end of each partition.  docs/internals/design.md ("Restart de-duplication") gives
 * the argument and what a skip relies on.
 *
 * Every outboxd record carries a mark: its lsn header (the transaction's
 * commit LSN), its seq header (the event's ordinal in the transaction) and
 * its id header.  A record is skipped only when its mark is at or below the
 * last outboxd record of the partition it maps to (so what follows it
 * continues from where the partition stands: per-key order) and a record
 * with the same mark and id was read back from that partition (found,
 * never inferred: no loss where an earlier session left a gap).  Per
 * partition, the first record of the session that fails either ends the
 * checking there: it and everything after it is published.
 *
 * Two halves.  A scan (struct obx_dd_scan) is what the read-back of one
 * topic builds: the I/O layer (kafka/dedupe_lookup.h) asks it which offsets to read,
 * hands it every record read and then hands the finished scan to the
 * session.  The session state (struct obx_dedupe) takes finished scans and
 * answers, for each record about to be produced: send it, skip it (it is
 * there), ask for its topic's scan, or wait for it.
 *
 * Nothing here does I/O; a scan may be built on another thread and then
 * passed on (ownership moves with it).
 */
#ifndef OBX_DEDUPE_H
#define OBX_DEDUPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/event.h"
#include "obx/core/lsn.h"

/* Marks kept per topic scan at most (24 bytes each); past it the partition falls back. */
#define OBX_DD_MAX_MARKS 131072
/* The first read-back window per partition, in records (from the end); each further one is larger. */
#define OBX_DD_FIRST_WINDOW 16
/* Bytes a further window aims to read per partition, judged from the record sizes seen. */
#define OBX_DD_WINDOW_BYTES (4 << 20)

/* What identifies an outboxd record. */
struct obx_dd_mark {
	obx_lsn lsn;      /* the lsn header: the transaction's commit LSN */
	uint32_t seq;     /* the seq header: the event's ordinal in its transaction */
	uint64_t id_hash; /* FNV-1a of the id header's bytes; 0 without one */
};

/*
 * Reads the mark from a record's headers, taking the first occurrence of
 * lsn, seq and id (outboxd writes its own before any user header).
 * Returns 0, or OBX_ENOENT when lsn or seq is missing or not outboxd's
 * form ("X/X", a decimal number).
 */
int obx_dd_mark_parse(const struct obx_header *hs, size_t n, struct obx_dd_mark *out);

/* Orders marks by (lsn, seq): <0, 0, >0. */
int obx_dd_mark_cmp(const struct obx_dd_mark *a, const struct obx_dd_mark *b);

/* Kafka's murmur2 of data (the Java client's Utils.murmur2). */
uint32_t obx_murmur2(const void *data, size_t len);

/*
 * The partition librdkafka's murmur2 and murmur2_random partitioners give
 * key among nparts: (murmur2(key) & 0x7fffffff) % nparts, for an empty key
 * too.  -1 for a NULL key, which murmur2_random places at random.
 */
int32_t obx_dd_partition(const void *key, size_t keylen, int32_t nparts);

/*
 * True when the producer's partitioner (the [kafka] partitioner property,
 * murmur2_random unless set) is one obx_dd_partition() reproduces;
 * *name says which it is.
 */
bool obx_dd_partitioner_supported(const struct obx_config *cfg, const char **name);

/* ---- the read-back of one topic ---- */

/* A range of offsets to read: [from, to). */
struct obx_dd_window {
	int64_t from;
	int64_t to;
};

enum obx_dd_part_state {
	OBX_DD_CHECKING, /* records are checked against the marks read */
	OBX_DD_NEW,      /* caught up: every further record is published */
	OBX_DD_FALLBACK, /* an assumption failed or the read did not finish: publish all */
};

struct obx_dd_part {
	enum obx_dd_part_state state;
	bool bounded;             /* lo and hi are known */
	bool reached;             /* met a record below the floor, or the first offset: nothing older matters */
	int64_t lo, hi;           /* the first offset and the end when the read began */
	int64_t read_from;        /* the lowest offset read so far (hi before the first window) */
	struct obx_dd_window win; /* the window given out */
	bool in_window;           /* win is being read */
	int64_t last_below;       /* the last offset of a record below the floor; -1 none */
	int64_t last_foreign;     /* the last offset of a record without a mark; -1 none */
	int64_t last_moved;       /* the last offset of a record whose key maps elsewhere; -1 none */
	bool has_last;
	struct obx_dd_mark last;   /* the mark of the partition's last outboxd record */
	int64_t last_off;          /* its offset */
	uint64_t records, bytes;   /* read so far, for the size of the next window */
	struct obx_dd_mark *marks; /* marks at or above the floor, sorted once installed */
	size_t n, cap;
	uint64_t skipped; /* records of the session found here */
	char reason[256]; /* FALLBACK: the reason, for the log */
};

struct obx_dd_scan {
	char *topic;
	struct obx_dd_mark floor; /* the first record of the session to check: nothing below matters */
	int32_t nparts;           /* -1 until known; 0: the topic does not exist */
	struct obx_dd_part *parts;
	size_t nmarks; /* over all partitions */
	bool failed;   /* the whole topic falls back */
	char reason[512];
};

/*
 * A scan of topic for records at or above floor.  Returns NULL when out of
 * memory.  The caller owns it: obx_dd_scan_free(), or hand it to
 * obx_dedupe_install().
 */
struct obx_dd_scan *obx_dd_scan_new(const char *topic, const struct obx_dd_mark *floor);
void obx_dd_scan_free(struct obx_dd_scan *s);

/*
 * The topic has nparts partitions (0: it does not exist, so nothing of it
 * can be found).  Returns 0 or OBX_ENOMEM (the scan is then failed).
 */
int obx_dd_scan_partitions(struct obx_dd_scan *s, int32_t nparts);

/* Partition p's first offset (low watermark) and end (high watermark) as the read begins. */
void obx_dd_scan_bounds(struct obx_dd_scan *s, int32_t p, int64_t lo, int64_t hi);

/*
 * Which offsets of partition p to read next: true with *w, the window just
 * below what was read already, while p still needs older records; false
 * when its read is over (or its bounds are not known).  The read of the
 * window ends with obx_dd_scan_window_done() (or obx_dd_scan_fail()).
 */
bool obx_dd_scan_want(struct obx_dd_scan *s, int32_t p, struct obx_dd_window *w);

/*
 * One record read from partition p at offset: its key (NULL when it has
 * none), its value's length and its headers (borrowed for the call).
 * Records outside the window given out are ignored.
 */
void obx_dd_scan_record(struct obx_dd_scan *s, int32_t p, int64_t offset, const void *key, size_t keylen,
    size_t len, const struct obx_header *hs, size_t nh);

/*
 * The window of p is read: its last offset arrived, or a record past it,
 * or the end of the partition.
 */
void obx_dd_scan_window_done(struct obx_dd_scan *s, int32_t p);

/*
 * Partition p (or, with p < 0, the whole topic) falls back to publishing
 * everything; fmt (printf-style) says why, for the log.  The first reason
 * stays.
 */
void obx_dd_scan_fail(struct obx_dd_scan *s, int32_t p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * The read is over: every partition still checking that has not reached
 * back to the floor falls back with unfinished as the reason.
 */
void obx_dd_scan_finish(struct obx_dd_scan *s, const char *unfinished);

/* ---- the session's state ---- */

enum obx_dd_verdict {
	OBX_DD_SEND,   /* publish the record */
	OBX_DD_SKIP,   /* the record is in Kafka already: count it as acknowledged */
	OBX_DD_LOOKUP, /* the first record of its topic: read the topic back (floor in *mark), then wait */
	OBX_DD_WAIT,   /* the topic's read-back is under way: hold the record and ask again */
};

/* A line for the log, from inside obx_dedupe calls. */
typedef void (*obx_dd_note_fn)(void *ctx, enum obx_log_level level, const char *line);

struct obx_dd_topic {
	char *name;
	struct obx_dd_scan *scan; /* NULL while the read-back is under way */
	size_t checking;          /* partitions still checking; 0: caught up */
	uint64_t skipped;
};

struct obx_dedupe {
	bool on;
	obx_dd_note_fn note;
	void *ctx;
	struct obx_dd_topic *topics;
	size_t n, cap;
	size_t last;        /* the topic looked up last: most records go to one in a row */
	uint64_t skipped;   /* records found in Kafka (counted by obx_dedupe_check) */
	uint64_t fallbacks; /* topics and partitions that fell back to publishing everything */
};

/* Starts a session's state; off, every record is sent.  note may be NULL. */
void obx_dedupe_init(struct obx_dedupe *d, bool on, obx_dd_note_fn note, void *ctx);
/* Frees everything the state owns (every scan installed); d may be initialised again. */
void obx_dedupe_reset(struct obx_dedupe *d);

/*
 * What to do with a record for topic with key (NULL: none) and headers,
 * about to be produced.  OBX_DD_LOOKUP once per topic (the first record
 * with a key and a mark): *mark is then the floor to read back to, and the
 * topic waits for obx_dedupe_install() (or obx_dedupe_unavailable()).
 * Records with no key, or no mark, are always sent.
 */
enum obx_dd_verdict obx_dedupe_check(struct obx_dedupe *d, const char *topic, const void *key, size_t keylen,
    const struct obx_header *hs, size_t nh, struct obx_dd_mark *mark);

/*
 * The read-back of s->topic is over.  Takes ownership of s.  Logs a line
 * for every partition (or the whole topic) that falls back.  A scan for a
 * topic not waiting is freed unused.
 */
void obx_dedupe_install(struct obx_dedupe *d, struct obx_dd_scan *s);

/* The read-back of topic could not be started: its records are all sent; reason goes to the log. */
void obx_dedupe_unavailable(struct obx_dedupe *d, const char *topic, const char *reason);

/* True while some topic's read-back is under way. */
bool obx_dedupe_waiting(const struct obx_dedupe *d);

#endif
