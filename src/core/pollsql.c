/*
 * pollsql.c - the SQL of polling mode and its backoff arithmetic (pure).
 * docs/internals/design.md, "Polling mode", says why the claim reads as it does.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/pollcore.h"
#include "obx/core/pollsql.h"
#include "obx/core/tables.h"
#include "obx/core/template.h"

int
obx_poll_quote_ident(const char *name, char *buf, size_t len)
{
	size_t o = strlen(buf);

	if (o + 1 >= len)
		return OBX_ERANGE;
	buf[o++] = '"';
	for (const char *p = name; *p != '\0'; p++) {
		/* this character (doubled when a quote), then room for the closing quote and NUL */
		if (o + (*p == '"' ? 2 : 1) + 2 > len)
			return OBX_ERANGE;
		if (*p == '"')
			buf[o++] = '"';
		buf[o++] = *p;
	}
	if (o + 2 > len)
		return OBX_ERANGE;
	buf[o++] = '"';
	buf[o] = '\0';
	return 0;
}

/* A growable string for statements; err sticks once set. */
struct sqlbuf {
	char *p;
	size_t len, cap;
	int err;
};

static void put(struct sqlbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
put(struct sqlbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err != 0)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p != NULL ? b->p + b->len : NULL, b->p != NULL ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = OBX_EINVAL;
			return;
		}
		if (b->p != NULL && b->len + (size_t)n < b->cap) {
			b->len += (size_t)n;
			return;
		}
		{
			size_t cap = b->cap ? b->cap : 256;
			char *q;

			while (cap <= b->len + (size_t)n)
				cap *= 2;
			q = realloc(b->p, cap);
			if (q == NULL) {
				b->err = OBX_ENOMEM;
				return;
			}
			b->p = q;
			b->cap = cap;
		}
	}
}

/* Appends name quoted. */
static void
ident(struct sqlbuf *b, const char *name)
{
	size_t need = strlen(name) * 2 + 3;
	char *q = calloc(1, need);

	if (q == NULL) {
		b->err = OBX_ENOMEM;
		return;
	}
	if (obx_poll_quote_ident(name, q, need) != 0)
		b->err = OBX_ERANGE;
	else
		put(b, "%s", q);
	free(q);
}

/* Appends alias."name" (alias may be NULL). */
static void
col(struct sqlbuf *b, const char *alias, const char *name)
{
	if (alias != NULL)
		put(b, "%s.", alias);
	ident(b, name);
}

static void
table(struct sqlbuf *b, const struct obx_config *cfg)
{
	ident(b, cfg->table_schema);
	put(b, ".");
	ident(b, cfg->table_name);
}

static int
finish(struct sqlbuf *b, char **out)
{
	if (b->err != 0 || b->p == NULL) {
		free(b->p);
		return b->err != 0 ? b->err : OBX_ENOMEM;
	}
	*out = b->p;
	return 0;
}

int
obx_poll_sql_build(struct obx_poll_sql *s, const struct obx_config *cfg)
{
	struct obx_names mapped = { NULL, 0 };
	struct sqlbuf b;
	int r;

	memset(s, 0, sizeof(*s));
	if ((r = obx_config_mapped_columns(cfg, &mapped)) != 0)
		return r;

	/* check: every column, so a missing one is named by the server */
	memset(&b, 0, sizeof(b));
	put(&b, "SELECT ");
	col(&b, "o", cfg->col_seq);
	put(&b, ", ");
	col(&b, "o", cfg->col_published_at);
	put(&b, ", ");
	col(&b, "o", cfg->col_attempts);
	put(&b, ", ");
	col(&b, "o", cfg->col_last_error);
	put(&b, ", ");
	col(&b, "o", cfg->col_next_attempt_at);
	if (cfg->col_created_at[0] != '\0') {
		put(&b, ", ");
		col(&b, "o", cfg->col_created_at);
	}
	for (size_t i = 0; i < mapped.n; i++) {
		put(&b, ", ");
		col(&b, "o", mapped.v[i]);
	}
	put(&b, " FROM ");
	table(&b, cfg);
	put(&b, " o LIMIT 0");
	if ((r = finish(&b, &s->check)) != 0)
		goto out;

	/*
	 * claim: lock up to batch due rows in order, skipping rows another
	 * replica holds; keep a row only when every older pending row of its
	 * key is among the rows locked here, and only as many as fit in
	 * [delivery] max_inflight_bytes of stored payload (the first always
	 * does) and no more than [delivery] max_inflight (obx_poll_claim_rows())
	 * (docs/internals/design.md, "Polling mode")
	 */
	memset(&b, 0, sizeof(b));
	put(&b, "BEGIN; ");
	if (obx_tables_several(cfg)) {
		/*
		 * several tables: the table's lock for the whole transaction first, under the
		 * connection's lock_timeout (run/poll_session.c), which passes a locked table over
		 * before anything is claimed or sent; then the role's own lock_timeout, so that the
		 * marking UPDATEs, which need no lock they do not hold now, are never cancelled by it
		 * after the batch was sent (a CREATE INDEX holds SHARE, which FOR UPDATE's ROW SHARE
		 * passes but an UPDATE's ROW EXCLUSIVE waits for)
		 */
		put(&b, "LOCK TABLE ");
		table(&b, cfg);
		put(&b, " IN ROW EXCLUSIVE MODE; SET LOCAL lock_timeout TO DEFAULT; ");
	}
	put(&b, "WITH c AS MATERIALIZED (SELECT ");
	col(&b, "o", cfg->col_seq);
	put(&b, " AS obx_seq, ");
	col(&b, "o", cfg->col_attempts);
	put(&b, " AS obx_attempts, ");
	col(&b, "o", cfg->col_last_error);
	put(&b, "::text AS obx_last_error, ");
	if (cfg->col_created_at[0] != '\0') {
		put(&b, "(extract(epoch FROM ");
		col(&b, "o", cfg->col_created_at);
		put(&b, ") * 1000000)::bigint AS obx_created_us");
	} else {
		put(&b, "NULL::bigint AS obx_created_us");
	}
	put(&b, ", pg_column_size(");
	col(&b, "o", cfg->col_payload);
	put(&b, ")::bigint AS obx_size");
	for (size_t i = 0; i < mapped.n; i++) {
		put(&b, ", ");
		col(&b, "o", mapped.v[i]);
	}
	put(&b, " FROM ");
	table(&b, cfg);
	put(&b, " o WHERE ");
	col(&b, "o", cfg->col_published_at);
	put(&b, " IS NULL AND ");
	col(&b, "o", cfg->col_next_attempt_at);
	put(&b, " <= now() ORDER BY ");
	col(&b, "o", cfg->col_seq);
	put(&b,
	    " LIMIT %lld FOR UPDATE SKIP LOCKED), k AS (SELECT *, sum(obx_size) OVER (ORDER BY obx_seq) "
	    "AS obx_bytes FROM c WHERE NOT EXISTS (SELECT 1 FROM ",
	    cfg->poll_batch);
	table(&b, cfg);
	put(&b, " p WHERE ");
	col(&b, "p", cfg->col_key);
	put(&b, " = ");
	col(&b, "c", cfg->col_key);
	put(&b, " AND ");
	col(&b, "p", cfg->col_seq);
	put(&b, " < c.obx_seq AND ");
	col(&b, "p", cfg->col_published_at);
	put(&b, " IS NULL AND NOT EXISTS (SELECT 1 FROM c c2 WHERE c2.obx_seq = ");
	col(&b, "p", cfg->col_seq);
	/* the bounds of what is sent, bytes and rows: rows past them stay locked but unsent, pending
	 * for the next claim; the rows held back per key are dropped before the row bound counts */
	put(&b,
	    "))) SELECT * FROM k WHERE coalesce(obx_bytes - obx_size, 0) < %lld ORDER BY obx_seq "
	    "LIMIT %lld",
	    cfg->max_inflight_bytes, obx_poll_claim_rows(cfg));
	if ((r = finish(&b, &s->claim)) != 0)
		goto out;

	/* mark: head + "1,2,3" + tail; the partial index on pending rows finds them */
	memset(&b, 0, sizeof(b));
	put(&b, "UPDATE ");
	table(&b, cfg);
	put(&b, " SET ");
	col(&b, NULL, cfg->col_published_at);
	put(&b, " = now() WHERE ");
	col(&b, NULL, cfg->col_published_at);
	put(&b, " IS NULL AND ");
	col(&b, NULL, cfg->col_seq);
	put(&b, " = ANY ('{");
	if ((r = finish(&b, &s->mark_head)) != 0)
		goto out;
	if ((s->mark_tail = strdup("}'::bigint[])")) == NULL) {
		r = OBX_ENOMEM;
		goto out;
	}

	/* fail: attempts + 1, last_error, next_attempt_at = now() + delay */
	memset(&b, 0, sizeof(b));
	put(&b, "UPDATE ");
	table(&b, cfg);
	put(&b, " AS o SET ");
	col(&b, NULL, cfg->col_attempts);
	put(&b, " = ");
	col(&b, "o", cfg->col_attempts);
	put(&b, " + 1, ");
	col(&b, NULL, cfg->col_last_error);
	put(&b, " = f.e, ");
	col(&b, NULL, cfg->col_next_attempt_at);
	put(&b,
	    " = now() + f.d * interval '1 millisecond' "
	    "FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(s, e, d) WHERE ");
	col(&b, "o", cfg->col_published_at);
	put(&b, " IS NULL AND ");
	col(&b, "o", cfg->col_seq);
	put(&b, " = f.s");
	if ((r = finish(&b, &s->fail)) != 0)
		goto out;

	/* give up: published (dead-lettered or marked only), with why in last_error */
	memset(&b, 0, sizeof(b));
	put(&b, "UPDATE ");
	table(&b, cfg);
	put(&b, " AS o SET ");
	col(&b, NULL, cfg->col_published_at);
	put(&b, " = now(), ");
	col(&b, NULL, cfg->col_last_error);
	put(&b, " = f.e FROM unnest($1::bigint[], $2::text[]) AS f(s, e) WHERE ");
	col(&b, "o", cfg->col_published_at);
	put(&b, " IS NULL AND ");
	col(&b, "o", cfg->col_seq);
	put(&b, " = f.s");
	if ((r = finish(&b, &s->give_up)) != 0)
		goto out;

	/* stats */
	memset(&b, 0, sizeof(b));
	put(&b, "SELECT count(*), ");
	if (cfg->col_created_at[0] != '\0') {
		put(&b, "coalesce(extract(epoch FROM now() - min(");
		col(&b, NULL, cfg->col_created_at);
		put(&b, "))::float8, 0), ");
	} else {
		put(&b, "0::float8, ");
	}
	put(&b, "count(*) FILTER (WHERE ");
	col(&b, NULL, cfg->col_attempts);
	put(&b, " > 0), coalesce(max(");
	col(&b, NULL, cfg->col_attempts);
	put(&b, "), 0) FROM ");
	table(&b, cfg);
	put(&b, " WHERE ");
	col(&b, NULL, cfg->col_published_at);
	put(&b, " IS NULL");
	if ((r = finish(&b, &s->stats)) != 0)
		goto out;

	memset(&b, 0, sizeof(b));
	put(&b, "SELECT to_jsonb(o)::text FROM ");
	table(&b, cfg);
	put(&b, " o WHERE ");
	col(&b, "o", cfg->col_seq);
	put(&b, " = $1");
	r = finish(&b, &s->row_json);
out:
	obx_names_reset(&mapped);
	if (r != 0)
		obx_poll_sql_reset(s);
	return r;
}

void
obx_poll_sql_reset(struct obx_poll_sql *s)
{
	free(s->check);
	free(s->claim);
	free(s->mark_head);
	free(s->mark_tail);
	free(s->fail);
	free(s->give_up);
	free(s->stats);
	free(s->row_json);
	memset(s, 0, sizeof(*s));
}
