/*
 * poll.h - polling mode ([source] mode = poll; docs/design.md, "Polling
 * mode"): claim pending outbox rows with FOR UPDATE SKIP LOCKED, produce
 * them with the same event builder and Kafka sink as the log-based source,
 * mark what the broker acknowledged published in the transaction that
 * holds the row locks, and record failures with capped exponential backoff.
 *
 * Three parts: the SQL text and the backoff arithmetic are pure (pollsql.c,
 * in the core library, unit-tested), so are the decisions for a claimed
 * batch (pollcore.h); the loop is I/O (poll.c).
 */
#ifndef OBX_POLL_H
#define OBX_POLL_H

#include <stdint.h>

#include "obx/config.h"
#include "obx/pollcore.h"
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
