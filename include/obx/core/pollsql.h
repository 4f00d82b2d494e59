/*
 * pollsql.h - the SQL of polling mode ([source] mode = poll; docs/internals/design.md,
 * "Polling mode"), pure (pollsql.c): the claim with FOR UPDATE SKIP LOCKED,
 * the marking, the failure records and the statistics, every identifier
 * double-quoted.  The backoff between attempts is pollcore.h's.
 */
#ifndef OBX_POLLSQL_H
#define OBX_POLLSQL_H

#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"

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
	char *claim;     /* "BEGIN; WITH c AS MATERIALIZED (... FOR UPDATE SKIP LOCKED) SELECT ..."; with several
	                    tables "BEGIN; LOCK TABLE ... IN ROW EXCLUSIVE MODE; SET LOCAL lock_timeout TO DEFAULT;
	                    WITH ..." */
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

#endif
