/*
 * cmd/check_tables.c - `outboxd check` when [source] table names several
 * tables or holds a pattern: each table the server has that an entry
 * matches, the columns of its mapping, and whether the publication covers
 * it and the tables created later (docs/guide/several-tables.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/cmd/check_int.h"
#include "obx/core/tables.h"
#include "obx/pg/tables.h"

static void
check_coverage(struct obx_check *cx, const struct obx_config *cfg, const struct obx_pg_tables *tl,
    bool in_recovery)
{
	bool wild = obx_tables_wild(cfg);
	size_t unpublished = 0;

	if (!tl->pub_exists) {
		obx_check_report(cx, cfg->create_publication && !in_recovery ? (wild ? "WARN" : "ok") : "FAIL",
		    "publication: %s does not exist%s", cfg->publication,
		    in_recovery ? " and this hot standby cannot create it (create it on the primary)" :
		        !cfg->create_publication ? " and create_publication = false" :
		        wild ? " (outboxd creates it FOR ALL TABLES, which needs a superuser)" :
		               " (will be created for the tables of [source] table)");
		return;
	}
	if (!tl->pub_insert)
		obx_check_report(cx, "FAIL",
		    "publication: %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
		    cfg->publication, cfg->publication);
	if (wild && !tl->pub_all) {
		obx_check_report(cx, "FAIL",
		    "publication: %s names its tables, but [source] table has a pattern: the first rows of a "
		    "table created later would be missed (it must be FOR ALL TABLES)",
		    cfg->publication);
		return;
	}
	if (wild && !tl->pub_viaroot) {
		obx_check_report(cx, "FAIL",
		    "publication: %s lacks publish_via_partition_root = true: a partitioned outbox created "
		    "later would arrive under its partitions' names",
		    cfg->publication);
		unpublished++;
	}
	for (size_t i = 0; i < tl->n; i++)
		if (!tl->t[i].published && tl->pub_all &&
		    obx_tables_may_leave_out(cfg, tl->t[i].schema, tl->t[i].name)) {
			/* outboxd leaves such a tenant out (pg/publication_tables.c): its rows are lost */
			obx_check_report(cx, "WARN",
			    "publication: %s does not publish %s.%s, an unlogged table: it is left out, and "
			    "its rows are never relayed (ALTER TABLE %s.%s SET LOGGED)",
			    cfg->publication, tl->t[i].schema, tl->t[i].name, tl->t[i].schema, tl->t[i].name);
		} else if (!tl->t[i].published) {
			obx_check_report(cx, "FAIL",
			    "publication: %s does not publish %s.%s (an unlogged table never is)",
			    cfg->publication, tl->t[i].schema, tl->t[i].name);
			unpublished++;
		} else if (tl->t[i].relkind == 'p' && !tl->pub_viaroot) {
			obx_check_report(cx, "FAIL",
			    "publication: %s publishes partitioned %s.%s without publish_via_partition_root",
			    cfg->publication, tl->t[i].schema, tl->t[i].name);
			unpublished++;
		}
	if (unpublished == 0)
		obx_check_report(cx, "ok", "publication: %s publishes inserts of %s%s", cfg->publication,
		    tl->pub_all ? "every table" : "the outbox tables",
		    tl->pub_all ? " (outboxd ignores the tables [source] table does not match)" : "");
}

bool
obx_check_tables(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool in_recovery)
{
	struct obx_pg_tables tl;
	char err[1024];
	bool any;

	if (obx_pg_tables_read(conn, cfg, &tl, err, sizeof(err)) != 0) {
		obx_check_report(cx, "FAIL", "tables: could not read the tables: %s", err);
		obx_pg_tables_reset(&tl);
		return false;
	}
	for (size_t i = 0; i < cfg->n_tables; i++) {
		const struct obx_table_pat *p = &cfg->tables[i];
		size_t n = 0;

		for (size_t j = 0; j < tl.n; j++)
			n += obx_table_pat_match(p, tl.t[j].schema, tl.t[j].name);
		if (!p->schema_wild && !p->name_wild && n == 0)
			obx_check_report(cx, "FAIL", "table: %s.%s does not exist", p->schema, p->name);
		else if (p->schema_wild || p->name_wild)
			obx_check_report(cx, "ok",
			    "table: pattern %s.%s matches %zu table(s) now, and the tables created later",
			    p->schema, p->name, n);
	}
	for (size_t i = 0; i < tl.n; i++) {
		struct obx_config view;

		obx_tables_view(cfg, tl.t[i].mapping, tl.t[i].schema, tl.t[i].name, &view);
		obx_check_report(cx, "ok", "table: %s.%s exists (mapping: [%s])", tl.t[i].schema, tl.t[i].name,
		    tl.t[i].mapping > 0 ? cfg->overrides[tl.t[i].mapping - 1].section : "outbox");
		obx_check_columns(cx, conn, &view, true);
	}
	any = tl.n > 0;
	check_coverage(cx, cfg, &tl, in_recovery);
	obx_pg_tables_reset(&tl);
	return any;
}
