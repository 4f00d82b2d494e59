/*
 * poll.h - polling mode ([source] mode = poll; docs/design.md, "Polling
 * mode"): claim pending outbox rows with FOR UPDATE SKIP LOCKED, produce
 * them with the same event builder and Kafka sink as the log-based source,
 * mark what the broker acknowledged published in the transaction that
 * holds the row locks, and record failures with capped exponential backoff.
 *
 * Two halves: the SQL text and the backoff arithmetic are pure (pollsql.c,
 * in the core library, unit-tested); the loop is I/O (poll.c).
 */
#ifndef OBX_POLL_H
#define OBX_POLL_H

#include <stdint.h>

#include "obx/config.h"
#include "obx/relay.h"

/*
 * The statements of one polling cycle for cfg's table and columns, every
 * identifier double-quoted.  The claim returns these columns first, then
 * the event builder's mapped columns (obx_config_mapped_columns) under
 * their own names:
 *   obx_seq (bigint), obx_attempts (integer), obx_last_error (text),
 *   obx_created_us (bigint, microseconds since the Unix epoch, NULL when
 *   [outbox] created_at is ""), obx_size (bigint, the payload's stored size);
 * and last obx_bytes (bigint, the running sum of obx_size).
 * Ownership: every string belongs to the struct; obx_poll_sql_reset() frees.
 */
struct obx_poll_sql {
	char *check;     /* reads every column the mode needs, LIMIT 0: names a missing one */
	char *claim;     /* "BEGIN; WITH c AS MATERIALIZED (... FOR UPDATE SKIP LOCKED) SELECT ..." */
	char *mark_head; /* followed by the seqs, comma-separated, then mark_tail: marks published */
	char *mark_tail; /* ends the array literal (and the statement) */
	char *fail;      /* $1 bigint[] seqs, $2 text[] errors, $3 bigint[] delays in ms */
	char *give_up;   /* $1 bigint[] seqs, $2 text[] last_error: published without a send */
	char *stats;     /* pending rows, oldest pending age (s), retrying rows, max attempts */
	char *row_json;  /* $1 seq: the whole row as JSON text (dead-letter copy of an unbuildable row) */
};

/*
 * Builds the statements for cfg (cfg->mode need not be poll).  Returns 0,
 * OBX_ENOMEM, or OBX_EINVAL (the topic template is not one; checked
 * configurations never have that).
 */
int obx_poll_sql_build(struct obx_poll_sql *s, const struct obx_config *cfg);

/* Frees what s owns and zeroes it; a zeroed one is a no-op. */
void obx_poll_sql_reset(struct obx_poll_sql *s);

/*
 * Appends name to buf (NUL-terminated, at most len bytes) as a quoted SQL
 * identifier ("a""b").  Returns 0, or OBX_ERANGE when it does not fit
 * (buf then holds a truncated, unusable prefix).
 */
int obx_poll_quote_ident(const char *name, char *buf, size_t len);

/*
 * How many rows one claim sends at most: [poll] batch, cut to [delivery]
 * max_inflight, the in-flight bound of every source (the producer's queue
 * holds twice that many records).  The claim locks up to [poll] batch rows,
 * so that rows held back behind a failing row of their key do not crowd the
 * other keys out; those past the cut stay pending for the next claim.
 */
long long obx_poll_claim_rows(const struct obx_config *cfg);

/* What polling does with one claimed row (obx_poll_row_action()). */
enum obx_poll_action {
	OBX_POLL_SEND,        /* produce its record */
	OBX_POLL_HOLD,        /* leave it pending, untouched: an earlier row of its key failed in this batch */
	OBX_POLL_FAIL,        /* it cannot become a record: an attempt, retried after the backoff */
	OBX_POLL_DEAD_LETTER, /* attempts exhausted, [poll] exhausted = dead_letter: its copy goes aside */
	OBX_POLL_GIVE_UP,     /* attempts exhausted, [poll] exhausted = mark: marked without sending */
};

/*
 * The decision for a claimed row that has failed attempts times before:
 * held back when an earlier row of its key failed in this batch (per-key
 * order), else exhausted past [poll] max_attempts (dead-letter or mark,
 * as [poll] exhausted says), else a failure when it cannot become a record
 * (buildable false), else sent.
 */
enum obx_poll_action obx_poll_row_action(const struct obx_config *cfg, long long attempts, bool held,
    bool buildable);

/*
 * The keys of the rows that failed in one batch, which hold back the later
 * rows of the same key.  Keys are borrowed (the batch's result) and
 * compared as bytes; a NULL key holds nothing back.
 */
struct obx_poll_holds {
	const char **keys;
	size_t *lens;
	size_t n, cap;
};

/* Adds key (len bytes).  Returns 0 or OBX_ENOMEM. */
int obx_poll_hold_add(struct obx_poll_holds *h, const char *key, size_t len);
/* True when a row of key (len bytes) is held back. */
bool obx_poll_held(const struct obx_poll_holds *h, const char *key, size_t len);
/* Forgets the keys and frees what h owns (a zeroed one is a no-op). */
void obx_poll_holds_reset(struct obx_poll_holds *h);

/*
 * The delay before the next attempt of a row that has now failed attempts
 * times (1 for the first failure): min_ms doubled per earlier failure,
 * capped at max_ms, then "equal jitter": the result lies in [d/2, d] for
 * that capped d, decided by rnd (any 32-bit random value), so replicas that
 * failed together do not retry together.  Never below 1.
 */
int64_t obx_poll_backoff_ms(long long attempts, int min_ms, int max_ms, uint32_t rnd);

/*
 * "outboxd run" in polling mode (I/O, poll.c): the same options, exit
 * status and signals as obx_relay_run().
 */
int obx_poll_run(const struct obx_config *cfg, const struct obx_run_opts *opts);

#endif
