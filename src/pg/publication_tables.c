/*
 * pg/publication_tables.c - the publication when [source] table names
 * several tables or holds a pattern (docs/guide/several-tables.md).  A
 * pattern needs a publication FOR ALL TABLES: a row is decoded only when
 * its table was in the publication at the row's place in the WAL, and a
 * publication of named tables learns of a table created later only after
 * its CREATE TABLE committed, too late for the rows of that transaction.
 * FOR ALL TABLES covers a table from its creation on; outboxd ignores the
 * rows of the tables no entry matches (core/tables.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/tables.h"
#include "obx/pg/setup_int.h"
#include "obx/pg/tables.h"
#include "obx/pg/util.h"
#include "obx/sys/log.h"

void
obx_pg_tables_reset(struct obx_pg_tables *t)
{
	for (size_t i = 0; i < t->n; i++) {
		free(t->t[i].schema);
		free(t->t[i].name);
	}
	free(t->t);
	memset(t, 0, sizeof(*t));
}

bool
obx_pg_tables_has(void *ctx, const char *schema, const char *name)
{
	const struct obx_pg_tables *tl = ctx;

	for (size_t i = 0; i < tl->n; i++)
		if (strcmp(tl->t[i].schema, schema) == 0 && strcmp(tl->t[i].name, name) == 0)
			return true;
	return false;
}

int
obx_pg_tables_read(PGconn *c, const struct obx_config *cfg, struct obx_pg_tables *out, char *errbuf, size_t errlen)
{
	char *pub = PQescapeLiteral(c, cfg->publication, strlen(cfg->publication));
	char *sql = NULL;
	PGresult *res = NULL;
	int r = 0;

	memset(out, 0, sizeof(*out));
	if (pub == NULL)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	if (asprintf(&sql, "SELECT pubinsert, pubviaroot, puballtables FROM pg_publication WHERE pubname = %s",
	        pub) < 0) {
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
		goto out;
	}
	if ((r = obx_pgsetup_query(c, sql, &res, NULL, errbuf, errlen)) != 0)
		goto out;
	out->pub_exists = PQntuples(res) > 0;
	out->pub_insert = out->pub_exists && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	out->pub_viaroot = out->pub_exists && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	out->pub_all = out->pub_exists && strcmp(PQgetvalue(res, 0, 2), "t") == 0;
	PQclear(res);
	res = NULL;
	free(sql);
	/* every table a pattern could match: matched here, by the rule the stream uses */
	if (asprintf(&sql,
	        "SELECT n.nspname, c.relname, c.relkind, pt.tablename IS NOT NULL "
	        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	        "LEFT JOIN (SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s) pt "
	        "ON pt.schemaname = n.nspname AND pt.tablename = c.relname "
	        "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
	        "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_(toast|temp)' "
	        "ORDER BY 1, 2",
	        pub) < 0) {
		sql = NULL;
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
		goto out;
	}
	if ((r = obx_pgsetup_query(c, sql, &res, NULL, errbuf, errlen)) != 0)
		goto out;
	for (int i = 0; i < PQntuples(res); i++) {
		const char *schema = PQgetvalue(res, i, 0), *name = PQgetvalue(res, i, 1);
		int map = obx_tables_mapping(cfg, schema, name);
		struct obx_pg_table *grown, *t;

		if (map < 0)
			continue;
		if ((grown = reallocarray(out->t, out->n + 1, sizeof(*grown))) == NULL) {
			r = obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
			goto out;
		}
		out->t = grown;
		t = &grown[out->n];
		/* pg_publication_tables lists what is published, FOR ALL TABLES too (an unlogged table,
		 * which has no WAL to decode, never is) */
		*t = (struct obx_pg_table){ strdup(schema), strdup(name), PQgetvalue(res, i, 2)[0],
			strcmp(PQgetvalue(res, i, 3), "t") == 0, map };
		out->n++;
		if (t->schema == NULL || t->name == NULL) {
			r = obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
			goto out;
		}
	}
out:
	PQclear(res);
	free(sql);
	PQfreemem(pub);
	return r;
}

/* The SQL that creates the publication cfg needs, into sql (the caller frees it).  Returns 0 or OBX_ENOMEM. */
static int
create_sql(PGconn *c, const struct obx_config *cfg, const struct obx_pg_tables *tl, char **sql)
{
	char *pub = PQescapeIdentifier(c, cfg->publication, strlen(cfg->publication));
	char *list = NULL;
	size_t used = 0;
	bool partitioned = false;
	int r = 0;

	*sql = NULL;
	if (pub == NULL)
		return OBX_ENOMEM;
	if (obx_tables_wild(cfg)) {
		if (asprintf(sql,
		        "CREATE PUBLICATION %s FOR ALL TABLES WITH (publish = 'insert', "
		        "publish_via_partition_root = true)",
		        pub) < 0)
			*sql = NULL;
		goto out;
	}
	for (size_t i = 0; i < tl->n && r == 0; i++) {
		char *si = PQescapeIdentifier(c, tl->t[i].schema, strlen(tl->t[i].schema));
		char *ti = PQescapeIdentifier(c, tl->t[i].name, strlen(tl->t[i].name));
		size_t need = (si ? strlen(si) : 0) + (ti ? strlen(ti) : 0) + 4;
		char *grown = si != NULL && ti != NULL ? realloc(list, used + need) : NULL;

		if (grown == NULL) {
			r = OBX_ENOMEM;
		} else {
			list = grown;
			used += (size_t)snprintf(list + used, need, "%s%s.%s", i ? ", " : "", si, ti);
			partitioned = partitioned || tl->t[i].relkind == 'p';
		}
		PQfreemem(si);
		PQfreemem(ti);
	}
	if (r == 0 &&
	    asprintf(sql, "CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)", pub,
	        list != NULL ? list : "", partitioned ? ", publish_via_partition_root = true" : "") < 0)
		*sql = NULL;
out:
	free(list);
	PQfreemem(pub);
	return r != 0 || *sql == NULL ? OBX_ENOMEM : 0;
}

/*
 * An exact entry of [source] table that names no table the server has: a refusal before the
 * publication is created (it could not name the table), later a warning (a table dropped
 * while outboxd ran is not an error, and a reconnect must not make it one).  Returns 0 or
 * OBX_ECONFIG.
 */
static int
missing_table(const struct obx_config *cfg, const struct obx_pg_tables *tl, char *errbuf, size_t errlen)
{
	const struct obx_table_pat *p;
	size_t next = 0;

	while ((p = obx_tables_next_missing(cfg, &next, obx_pg_tables_has, (void *)tl)) != NULL) {
		if (!tl->pub_exists)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "outbox table %s.%s of [source] table does not exist (create it, see sql/, or take it "
			    "out of [source] table)",
			    p->schema, p->name);
		obx_log_warn("outbox table %s.%s of [source] table does not exist (dropped?); the other "
		             "tables are relayed",
		    p->schema, p->name);
	}
	return 0;
}

/* The publication exists: refuses what would let events be confirmed unpublished.  Returns 0 or an OBX_E*. */
static int
check_existing(PGconn *c, const struct obx_config *cfg, const struct obx_pg_tables *tl, char *errbuf,
    size_t errlen)
{
	int r = 0;

	if (!tl->pub_insert)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
		    cfg->publication, cfg->publication);
	if (obx_tables_wild(cfg) && !tl->pub_all)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s names its tables, but [source] table has a pattern: the first rows of a "
		    "table created later would be missed; drop the publication and let outboxd create it FOR "
		    "ALL TABLES, or name every table without '*'",
		    cfg->publication);
	if (obx_tables_wild(cfg) && !tl->pub_viaroot)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s lacks publish_via_partition_root = true: the rows of a partitioned outbox "
		    "created later would arrive under its partitions' names, which [source] table does not "
		    "match (ALTER PUBLICATION %s SET (publish_via_partition_root = true))",
		    cfg->publication, cfg->publication);
	for (size_t i = 0; i < tl->n && r == 0; i++) {
		const struct obx_pg_table *t = &tl->t[i];
		struct obx_config view;
		struct obx_pgsetup_names nm;

		if (!t->published && tl->pub_all && obx_tables_may_leave_out(cfg, t->schema, t->name)) {
			/* FOR ALL TABLES publishes every table but an unlogged one, which has no WAL to
			 * decode: a tenant's such table cannot stop the others */
			obx_log_warn("outbox table %s.%s is not published (an unlogged table never is: its rows "
			             "are not in the WAL, so never decoded); left out, the other tables are "
			             "relayed (ALTER TABLE %s.%s SET LOGGED: rows inserted after it are relayed)",
			    t->schema, t->name, t->schema, t->name);
			continue;
		}
		if (!t->published)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not publish table %s.%s (ALTER PUBLICATION %s ADD TABLE ...; an "
			    "unlogged table is never published: ALTER TABLE ... SET LOGGED)",
			    cfg->publication, t->schema, t->name, cfg->publication);
		if (t->relkind == 'p' && !tl->pub_viaroot)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "outbox %s.%s is partitioned but publication %s lacks publish_via_partition_root = "
			    "true: events would arrive under partition names (ALTER PUBLICATION %s SET "
			    "(publish_via_partition_root = true))",
			    t->schema, t->name, cfg->publication, cfg->publication);
		if (tl->pub_all)
			continue; /* FOR ALL TABLES has neither row filters nor column lists */
		obx_tables_view(cfg, t->mapping, t->schema, t->name, &view);
		if ((r = obx_pgsetup_names_init(&nm, c, &view, errbuf, errlen)) != 0)
			return r;
		r = obx_pgsetup_check_columns(c, &view, &nm, errbuf, errlen);
		obx_pgsetup_names_free(&nm);
	}
	return r;
}

int
obx_pgsetup_publication_tables(PGconn *c, const struct obx_config *cfg, bool in_recovery, char *errbuf,
    size_t errlen)
{
	struct obx_pg_tables tl;
	char *sql = NULL;
	bool created;
	int r = OBX_EIO;

	for (int attempt = 0; attempt < OBX_PGSETUP_ATTEMPTS; attempt++) {
		if ((r = obx_pg_tables_read(c, cfg, &tl, errbuf, errlen)) != 0)
			goto out;
		if ((r = missing_table(cfg, &tl, errbuf, errlen)) != 0)
			goto out;
		if (tl.pub_exists) {
			if ((r = check_existing(c, cfg, &tl, errbuf, errlen)) == 0)
				obx_log_info("publication %s covers %zu outbox table(s)%s", cfg->publication, tl.n,
				    obx_tables_wild(cfg) ?
				        " and every table created later that [source] table matches" :
				        "");
			goto out;
		}
		if ((r = create_sql(c, cfg, &tl, &sql)) != 0) {
			r = obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
			goto out;
		}
		if (in_recovery || !cfg->create_publication) {
			r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not exist and %s: run %s%s", cfg->publication,
			    in_recovery ? "this server is a hot standby, where it cannot be created" :
			                  "create_publication = false",
			    sql, in_recovery ? " on the primary" : "");
			goto out;
		}
		if ((r = obx_pgsetup_create_publication(c, cfg, sql, &created, errbuf, errlen)) != 0) {
			char why[512];

			if (obx_tables_wild(cfg)) {
				strlcpy(why, errbuf, sizeof(why));
				r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
				    "%s (a publication FOR ALL TABLES, which a pattern in [source] table needs, is "
				    "created by a superuser: have one run %s)",
				    why, sql);
			}
			goto out;
		}
		if (created)
			obx_log_info("created publication %s %s (inserts only)", cfg->publication,
			    obx_tables_wild(cfg) ? "for all tables" : "for the tables of [source] table");
		free(sql);
		sql = NULL;
		obx_pg_tables_reset(&tl);
	}
	return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "publication %s was dropped each time it was created",
	    cfg->publication);
out:
	free(sql);
	obx_pg_tables_reset(&tl);
	return r;
}
