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
		if (r == 0 && n == 0 && !obx_tables_wild(base)) {
			snprintf(p->reason, sizeof(p->reason),
			    "no table of [source] table exists (create them, see sql/001_outbox.sql and "
			    "sql/008_polling.sql)");
			r = OBX_ECONFIG;
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
	/* a table already read keeps its columns' check */
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < p->ntables; j++)
			if (p->tables[j].checked && strcmp(ts[i].schema, p->tables[j].schema) == 0 &&
			    strcmp(ts[i].name, p->tables[j].name) == 0)
				ts[i].checked = true;
	obx_poll_tables_reset(p);
	p->tables = ts;
	p->ntables = n;
	obx_poll_round_init(&p->round, n);
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
	char err[512];
	PGresult *res;

	if (p->cfg != &t->view)
		p->rel_built = false; /* another table's columns */
	p->cfg = &t->view;
	p->sql = t->sql;
	if (t->checked)
		return 0;
	res = PQexec(p->pg, t->sql.check);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
		bool missing = state != NULL && (strcmp(state, "42703") == 0 || strcmp(state, "42P01") == 0);

		snprintf(p->reason, sizeof(p->reason), "could not read the outbox table %s.%s for polling: %s%s",
		    t->schema, t->name,
		    primary != NULL ? primary : obx_pg_result_error_line(res, err, sizeof(err)),
		    missing ? " (apply sql/008_polling.sql, or map the columns in [outbox])" : "");
		PQclear(res);
		return missing ? OBX_ECONFIG : OBX_EIO;
	}
	PQclear(res);
	t->checked = true;
	return 0;
}
