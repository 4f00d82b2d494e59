/*
 * poll_tables.c - the tables polling mode reads: one, or with several in
 * [source] table each table the server has that an entry matches, read
 * again after every round so a table created later joins the rotation;
 * each with its mapping's statements.  The order and the idle wait are
 * pollcore.h's (obx_poll_round_next()).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/pollsql.h"
#include "obx/core/tables.h"
#include "obx/pg/tables.h"
#include "obx/pg/util.h"
#include "obx/sys/log.h"
#include "obx/run/poll_int.h"

void
obx_poll_tables_reset(struct poller *p)
{
	for (size_t i = 0; i < p->ntables; i++) {
		free(p->tables[i].schema);
		free(p->tables[i].name);
		obx_poll_sql_reset(&p->tables[i].sql);
	}
	free(p->tables);
	p->tables = NULL;
	p->ntables = 0;
	memset(&p->sql, 0, sizeof(p->sql));
	p->cfg = p->base;
}

/* Adds schema.name with mapping to ts (n entries).  Returns 0 or OBX_ENOMEM. */
static int
add_table(const struct obx_config *base, struct obx_poll_table **ts, size_t *n, const char *schema,
    const char *name, int mapping)
{
	struct obx_poll_table *grown = reallocarray(*ts, *n + 1, sizeof(**ts)), *t;

	if (grown == NULL)
		return OBX_ENOMEM;
	*ts = grown;
	t = &grown[*n];
	memset(t, 0, sizeof(*t));
	t->schema = strdup(schema);
	t->name = strdup(name);
	(*n)++;
	if (t->schema == NULL || t->name == NULL)
		return OBX_ENOMEM;
	obx_tables_view(base, mapping, t->schema, t->name, &t->view);
	return obx_poll_sql_build(&t->sql, &t->view) == 0 ? 0 : OBX_ENOMEM;
}

int
obx_poll_tables_read(struct poller *p)
{
	const struct obx_config *base = p->base;
	struct obx_poll_table *ts = NULL;
	struct obx_pg_tables tl = { 0 };
	size_t n = 0;
	char err[512];
	int r = 0;

	if (!obx_tables_several(base)) {
		r = add_table(base, &ts, &n, base->table_schema, base->table_name, 0);
	} else if ((r = obx_pg_tables_read(p->pg, base, &tl, err, sizeof(err))) != 0) {
		snprintf(p->reason, sizeof(p->reason), "could not read the outbox tables: %s", err);
	} else {
		for (size_t i = 0; i < tl.n && r == 0; i++)
			r = add_table(base, &ts, &n, tl.t[i].schema, tl.t[i].name, tl.t[i].mapping);
		/* a listed table the server lacks: refused at start (a typo would lose its rows),
		 * a warning once running (dropped, as in logical mode) */
		const struct obx_table_pat *e;
		size_t next = 0;

		while (r == 0 && (e = obx_tables_next_missing(base, &next, obx_pg_tables_has, &tl)) != NULL) {
			if (!p->tables_read_once) {
				snprintf(p->reason, sizeof(p->reason),
				    "outbox table %s.%s of [source] table does not exist (create it, see "
				    "sql/001_outbox.sql and sql/008_polling.sql, or take it out of [source] table)",
				    e->schema, e->name);
				r = OBX_ECONFIG;
			} else if (!p->warned_missing) {
				obx_log_warn("outbox table %s.%s of [source] table does not exist (dropped?); the "
				             "other tables are polled",
				    e->schema, e->name);
				p->warned_missing = true;
			}
		}
	}
	obx_pg_tables_reset(&tl);
	if (r == OBX_ENOMEM)
		snprintf(p->reason, sizeof(p->reason), "out of memory");
	if (r != 0) {
		for (size_t i = 0; i < n; i++) {
			free(ts[i].schema);
			free(ts[i].name);
			obx_poll_sql_reset(&ts[i].sql);
		}
		free(ts);
		return r;
	}
	/* a table already read keeps its columns' check, and one left out stays out for a while */
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < p->ntables; j++)
			if (strcmp(ts[i].schema, p->tables[j].schema) == 0 &&
			    strcmp(ts[i].name, p->tables[j].name) == 0) {
				ts[i].checked = p->tables[j].checked;
				ts[i].skip = p->tables[j].skip && obx_mono_ms() < p->skips_until_ms;
				ts[i].out = p->tables[j].out;
			}
	obx_poll_tables_reset(p);
	p->tables = ts;
	p->ntables = n;
	obx_poll_round_init(&p->round, n);
	p->tables_read_once = true;
	p->rel_built = false;
	if (n > 0) {
		p->cfg = &ts[0].view;
		p->sql = ts[0].sql;
	}
	return 0;
}

int
obx_poll_tables_use(struct poller *p, size_t i)
{
	struct obx_poll_table *t = &p->tables[i];
	PGresult *res;
	int r;

	if (p->cfg != &t->view)
		p->rel_built = false; /* another table's columns */
	p->cfg = &t->view;
	p->sql = t->sql;
	if (t->skip)
		return OBX_ENOENT;
	if (t->checked)
		return 0;
	/* through obx_poll_exec(): a check that waits on a lock (ALTER TABLE) stays cancellable */
	if ((res = obx_poll_exec(p, t->sql.check)) == NULL)
		return OBX_EIO; /* stopped, or the statement could not be sent: p->reason says */
	if (PQresultStatus(res) == PGRES_TUPLES_OK) {
		PQclear(res);
		t->checked = true;
		return 0;
	}
	r = obx_poll_table_failed(p, i, res, "could not read the outbox table");
	PQclear(res);
	return r;
}

int
obx_poll_claim_failed(struct poller *p, PGresult *res)
{
	char err[512];
	int r = obx_poll_table_failed(p, p->round.cur, res, "could not claim the rows of");

	PQclear(res);
	if (r != OBX_ENOENT)
		return OBX_EIO; /* a table missing since its check: the next session's read says so */
	/* passed over or left out: the failed transaction ends, and the others go on */
	res = PQexec(p->pg, "ROLLBACK");
	r = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : OBX_EIO;
	if (r != 0)
		snprintf(p->reason, sizeof(p->reason), "could not end the failed claim: %s",
		    obx_pg_result_error_line(res, err, sizeof(err)));
	PQclear(res);
	return r;
}

int
obx_poll_table_failed(struct poller *p, size_t i, const PGresult *res, const char *what)
{
	struct obx_poll_table *t = &p->tables[i];
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	enum obx_table_fault f = obx_tables_read_fault(p->base, t->schema, t->name, state);
	bool missing = state != NULL && (strcmp(state, "42703") == 0 || strcmp(state, "42P01") == 0);
	char err[512];

	snprintf(p->reason, sizeof(p->reason), "%s %s.%s for polling: %s%s", what, t->schema, t->name,
	    primary != NULL ? primary : obx_pg_result_error_line(res, err, sizeof(err)),
	    missing ? " (apply sql/008_polling.sql, or map the columns in [outbox])" :
	        state != NULL && strcmp(state, "42501") == 0 ?
	              " (GRANT SELECT, UPDATE on it, and USAGE on its schema)" :
	              "");
	t->out = f == OBX_TABLE_FAULT_NEXT_TURN || f == OBX_TABLE_FAULT_LEAVE_OUT;
	switch (f) {
	case OBX_TABLE_FAULT_NEXT_TURN:
		/* another session's lock outlasted lock_timeout: the others' turns are not held up */
		obx_log_warn("%s; passed over this round", p->reason);
		return OBX_ENOENT;
	case OBX_TABLE_FAULT_LEAVE_OUT:
		/* a tenant half set up (its polling columns or grants come in a later migration) or
		 * just dropped: the others go on; the table is read again after the round */
		obx_log_warn("%s; left out, and tried again in 30 s", p->reason);
		t->skip = true;
		p->skips_until_ms = obx_mono_ms() + 30000;
		return OBX_ENOENT;
	case OBX_TABLE_FAULT_STOP:
		return OBX_ECONFIG;
	case OBX_TABLE_FAULT_RETRY:
		break;
	}
	return OBX_EIO;
}
