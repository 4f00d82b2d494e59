/*
 * poll_mark.c - polling mode's writes in a claimed batch's transaction:
 * recording the failed rows (attempts + 1, last_error, the backoff) and
 * the given-up ones, marking the acknowledged rows published (early, while
 * the last reports are awaited, and at the COMMIT).  pollcore.c decides
 * which rows; pollsql.c holds the statements.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/pg/util.h"
#include "obx/run/poll_int.h"
#include "obx/core/relaycore.h"
#include "obx/core/walmsg.h"

/* Appends "v" to a PostgreSQL array literal under construction ("{a,b"). */
static int
array_add(char **buf, size_t *len, size_t *cap, const char *v)
{
	size_t need = *len + strlen(v) + 2;

	if (need > *cap) {
		size_t nc = *cap ? *cap * 2 : 256;
		char *q;

		while (nc < need)
			nc *= 2;
		if ((q = realloc(*buf, nc)) == NULL)
			return OBX_ENOMEM;
		*buf = q;
		*cap = nc;
	}
	if (*len > 0)
		(*buf)[(*len)++] = ',';
	memcpy(*buf + *len, v, strlen(v) + 1);
	*len += strlen(v);
	return 0;
}

/* A text[] literal element: double-quoted, with backslash and quote escaped. */
static char *
array_text(const char *s)
{
	size_t n = strlen(s);
	char *o = malloc(n * 2 + 3), *q = o;

	if (o == NULL)
		return NULL;
	*q++ = '"';
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			*q++ = '\\';
		*q++ = *s;
	}
	*q++ = '"';
	*q = '\0';
	return o;
}

/* Three array literals under construction: seq, error and delay. */
struct row_arrays {
	char *a[3];
	size_t len[3], cap[3];
};

/*
 * Appends row i (seq, error; with_delay: its backoff, logged) to ra.
 * Returns 0 or OBX_ENOMEM.
 */
static int
add_row(struct poller *p, size_t i, bool with_delay, struct row_arrays *ra)
{
	const struct obx_prow *row = obx_pollcore_row(&p->pc, i);
	char num[32], *t;
	int64_t d;

	snprintf(num, sizeof(num), "%" PRId64, row->seq);
	if (array_add(&ra->a[0], &ra->len[0], &ra->cap[0], num) != 0)
		return OBX_ENOMEM;
	if ((t = array_text(row->error != NULL ? row->error : "")) == NULL ||
	    array_add(&ra->a[1], &ra->len[1], &ra->cap[1], t) != 0) {
		free(t);
		return OBX_ENOMEM;
	}
	free(t);
	if (!with_delay)
		return 0;
	d = obx_pollcore_backoff_ms(&p->pc, i, arc4random());
	snprintf(num, sizeof(num), "%" PRId64, d);
	if (array_add(&ra->a[2], &ra->len[2], &ra->cap[2], num) != 0)
		return OBX_ENOMEM;
	obx_log_warn("row seq %" PRId64 " failed (attempt %lld of %lld), next in %" PRId64 " ms: %s", row->seq,
	    row->attempts + 1, p->cfg->poll_max_attempts, d, row->error != NULL ? row->error : "unknown");
	return 0;
}

/* Closes each started literal ("{a,b" to "{a,b}").  Returns 0 or OBX_ENOMEM. */
static int
close_arrays(struct row_arrays *ra)
{
	for (int k = 0; k < 3; k++) {
		char *w;

		if (ra->a[k] == NULL)
			continue;
		if ((w = malloc(ra->len[k] + 3)) == NULL)
			return OBX_ENOMEM;
		snprintf(w, ra->len[k] + 3, "{%s}", ra->a[k]);
		free(ra->a[k]);
		ra->a[k] = w;
	}
	return 0;
}

/* Runs stmt with the rows in state as arrays (seq, error[, delay]).  Returns 0 or OBX_EIO. */
int
obx_poll_record_rows(struct poller *p, const char *stmt, enum obx_prow_state state, bool with_delay)
{
	struct row_arrays ra = { { NULL, NULL, NULL }, { 0, 0, 0 }, { 0, 0, 0 } };
	const char *params[3];
	size_t count = 0;
	char err[512];
	PGresult *res;
	int r = 0;

	for (size_t i = 0; i < p->pc.nrows && r == 0; i++)
		if (obx_pollcore_row(&p->pc, i)->state == state && (r = add_row(p, i, with_delay, &ra)) == 0)
			count++;
	if (r != 0 || count == 0 || (r = close_arrays(&ra)) != 0)
		goto out;
	for (int k = 0; k < 3; k++)
		params[k] = ra.a[k];
	res = PQexecParams(p->pg, stmt, with_delay ? 3 : 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		snprintf(p->reason, sizeof(p->reason), "could not record %zu row(s): %s", count,
		    obx_pg_result_error_line(res, err, sizeof(err)));
		r = OBX_EIO;
	} else if (with_delay) {
		p->m.poll_failed_attempts += count;
	}
	PQclear(res);
out:
	for (int k = 0; k < 3; k++)
		free(ra.a[k]);
	return r;
}

/*
 * Builds the marking UPDATE for the acknowledged rows not yet marked (and
 * flags them marked), followed by "; COMMIT" when commit.  Returns the
 * malloc'd statement, or NULL when out of memory; *count says how many
 * rows it marks.
 */
static char *
mark_statement(struct poller *p, bool commit, size_t *count)
{
	size_t head = strlen(p->sql.mark_head), tail = strlen(p->sql.mark_tail);
	size_t cap = head + tail + p->pc.nrows * 21 + 16, len = head;
	char *q = malloc(cap);

	*count = 0;
	if (q == NULL)
		return NULL;
	memcpy(q, p->sql.mark_head, head);
	for (size_t i = 0; i < p->pc.nrows; i++) {
		if (!obx_pollcore_take_mark(&p->pc, i))
			continue;
		len += (size_t)snprintf(q + len, cap - len, "%s%" PRId64, *count > 0 ? "," : "",
		    obx_pollcore_row(&p->pc, i)->seq);
		(*count)++;
	}
	snprintf(q + len, cap - len, "%s%s", p->sql.mark_tail, commit ? "; COMMIT" : "");
	return q;
}

/*
 * Serves the result of an early marking UPDATE without blocking (block:
 * waits for it).  Returns 0, or OBX_EIO with reason filled.
 */
int
obx_poll_mark_result(struct poller *p, bool block)
{
	PGresult *res;
	char err[512];
	int r = 0;

	if (!p->pg_busy)
		return 0;
	if (!block && PQconsumeInput(p->pg) == 0) {
		snprintf(p->reason, sizeof(p->reason), "lost the connection: %s",
		    obx_pg_error_line(p->pg, err, sizeof(err)));
		return OBX_EIO;
	}
	while (block || !PQisBusy(p->pg)) {
		if ((res = PQgetResult(p->pg)) == NULL) {
			p->pg_busy = false;
			break;
		}
		if (PQresultStatus(res) != PGRES_COMMAND_OK && r == 0) {
			snprintf(p->reason, sizeof(p->reason), "could not mark rows published: %s",
			    obx_pg_result_error_line(res, err, sizeof(err)));
			r = OBX_EIO;
		}
		PQclear(res);
	}
	return r;
}

/*
 * While the last reports of a batch are awaited, marks the rows already
 * acknowledged (inside the same transaction, so nothing is published
 * before the COMMIT): the UPDATE's work overlaps the wait.  At most one
 * statement runs at a time.  Returns 0, or OBX_EIO/OBX_ENOMEM.
 */
int
obx_poll_mark_early(struct poller *p)
{
	size_t count;
	char *q, err[512];

	if (p->pg_busy || !obx_pollcore_mark_early(&p->pc))
		return 0;
	if ((q = mark_statement(p, false, &count)) == NULL)
		return OBX_ENOMEM;
	if (PQsendQuery(p->pg, q) == 0) {
		snprintf(p->reason, sizeof(p->reason), "could not mark rows published: %s",
		    obx_pg_error_line(p->pg, err, sizeof(err)));
		free(q);
		return OBX_EIO;
	}
	free(q);
	p->pg_busy = true;
	return 0;
}

/* Marks the remaining acknowledged rows published and commits.  Returns 0 or OBX_EIO/OBX_ENOMEM. */
int
obx_poll_mark_and_commit(struct poller *p)
{
	size_t count;
	char *q, err[512];
	PGresult *res;
	int r;

	if ((r = obx_poll_mark_result(p, true)) != 0)
		return r;
	if ((q = mark_statement(p, true, &count)) == NULL)
		return OBX_ENOMEM;
	res = PQexec(p->pg, count > 0 ? q : "COMMIT");
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		snprintf(p->reason, sizeof(p->reason), "could not mark the batch published: %s",
		    obx_pg_result_error_line(res, err, sizeof(err)));
		r = OBX_EIO;
	}
	PQclear(res);
	free(q);
	return r;
}
