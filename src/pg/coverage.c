/*
 * pg/coverage.c - reads the publication's hold on the outbox tables; see
 * pg/coverage.h and core/coverage.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/pg/coverage.h"
#include "obx/pg/util.h"

/* Appends the literal of s (with a comma before all but the first) to f.  Returns 0 or OBX_ENOMEM. */
static int
put_literal(PGconn *c, FILE *f, bool first, const char *s)
{
	char *lit = PQescapeLiteral(c, s, strlen(s));

	if (lit == NULL)
		return OBX_ENOMEM;
	fprintf(f, "%s%s", first ? "" : ", ", lit);
	PQfreemem(lit);
	return 0;
}

/* The statement reading cfg's exact entries (cfg has n >= 1 of them) into *sql.  Returns 0 or OBX_ENOMEM. */
static int
tables_sql(PGconn *c, const struct obx_config *cfg, const char *pub, char **sql)
{
	bool schemas = obx_pg_facts(c).schema_publications;
	size_t len = 0;
	FILE *f = open_memstream(sql, &len);
	int r = 0;

	if (f == NULL)
		return OBX_ENOMEM;
	/* rel_born: the row was made by the transaction that made the table, whose system columns'
	 * pg_attribute rows (attnum -1, ctid) keep the creating xid (no ALTER TABLE rewrites them) */
	fputs("WITH p AS (SELECT oid, puballtables FROM pg_publication WHERE pubname = ", f);
	fputs(pub, f);
	fputs(") SELECT coalesce(c.oid, 0), coalesce(c.relpersistence = 'u', false), coalesce(pr.oid, 0), "
	      "coalesce(pr.xmin = a.xmin, false), "
	      "CASE WHEN (SELECT puballtables FROM p) THEN 3 ",
	    f);
	if (schemas)
		fputs("WHEN pn.oid IS NOT NULL THEN 2 ", f);
	fputs("ELSE 0 END, CASE WHEN (SELECT puballtables FROM p) THEN (SELECT oid FROM p) ", f);
	if (schemas)
		fputs("WHEN pn.oid IS NOT NULL THEN pn.oid ", f);
	fputs("ELSE 0 END FROM unnest(ARRAY[", f);
	for (size_t i = 0, k = 0; i < cfg->n_tables && r == 0; i++)
		if (!cfg->tables[i].schema_wild && !cfg->tables[i].name_wild)
			r = put_literal(c, f, k++ == 0, cfg->tables[i].schema);
	fputs("]::text[], ARRAY[", f);
	for (size_t i = 0, k = 0; i < cfg->n_tables && r == 0; i++)
		if (!cfg->tables[i].schema_wild && !cfg->tables[i].name_wild)
			r = put_literal(c, f, k++ == 0, cfg->tables[i].name);
	/* a partition is not an outbox table of its own (pg/publication_tables.c reads it as missing) */
	fputs("]::text[]) WITH ORDINALITY e(s, t, ord) "
	      "LEFT JOIN pg_namespace n ON n.nspname = e.s "
	      "LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = e.t AND c.relkind IN ('r', 'p') "
	      "AND NOT c.relispartition "
	      "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = -1 "
	      "LEFT JOIN pg_publication_rel pr ON pr.prpubid = (SELECT oid FROM p) AND pr.prrelid = c.oid ",
	    f);
	if (schemas)
		fputs("LEFT JOIN pg_publication_namespace pn ON pn.pnpubid = (SELECT oid FROM p) "
		      "AND pn.pnnspid = n.oid ",
		    f);
	fputs("ORDER BY e.ord", f);
	if (fclose(f) != 0 || r != 0) {
		free(*sql);
		*sql = NULL;
		return OBX_ENOMEM;
	}
	return 0;
}

/* Reads the unsigned 32-bit oid in row, col into *out.  Returns 0 or OBX_EPROTO. */
static int
oid_at(const PGresult *res, int row, int col, uint32_t *out)
{
	int64_t v;

	if (obx_pg_int64(res, row, col, &v) != 0 || v < 0 || v > UINT32_MAX)
		return OBX_EPROTO;
	*out = (uint32_t)v;
	return 0;
}

int
obx_pg_coverage_read(PGconn *c, const struct obx_config *cfg, struct obx_cov *out, char *errbuf, size_t errlen)
{
	char *pub = PQescapeLiteral(c, cfg->publication, strlen(cfg->publication));
	char *sql = NULL, err[512];
	size_t n = obx_cov_entries(cfg, NULL, 0);
	PGresult *res = NULL;
	int r = OBX_ENOMEM;

	obx_cov_reset(out);
	if (pub == NULL ||
	    asprintf(&sql, "SELECT oid, pubinsert FROM pg_publication WHERE pubname = %s", pub) < 0) {
		sql = NULL;
		snprintf(errbuf, errlen, "out of memory");
		goto out;
	}
	res = PQexec(c, sql);
	r = OBX_EIO;
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		snprintf(errbuf, errlen, "could not read publication %s: %s", cfg->publication,
		    obx_pg_result_error_line(res, err, sizeof(err)));
		goto out;
	}
	if (PQntuples(res) > 0 && oid_at(res, 0, 0, &out->pubid) != 0) {
		snprintf(errbuf, errlen, "could not read publication %s: not an oid", cfg->publication);
		goto out;
	}
	out->pub_insert = PQntuples(res) > 0 && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	PQclear(res);
	res = NULL;
	free(sql);
	sql = NULL;
	if (n > 0) {
		if (tables_sql(c, cfg, pub, &sql) != 0 || (out->t = calloc(n, sizeof(*out->t))) == NULL) {
			r = OBX_ENOMEM;
			snprintf(errbuf, errlen, "out of memory");
			goto out;
		}
		res = PQexec(c, sql);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || (size_t)PQntuples(res) != n) {
			snprintf(errbuf, errlen, "could not read the outbox tables of publication %s: %s",
			    cfg->publication, obx_pg_result_error_line(res, err, sizeof(err)));
			goto out;
		}
		for (size_t i = 0; i < n; i++) {
			struct obx_cov_table *t = &out->t[i];
			int64_t via;

			if (oid_at(res, (int)i, 0, &t->relid) != 0 || oid_at(res, (int)i, 2, &t->rel_row) != 0 ||
			    oid_at(res, (int)i, 5, &t->whole_row) != 0 ||
			    obx_pg_int64(res, (int)i, 4, &via) != 0 || via < OBX_COV_NONE || via > OBX_COV_ALL) {
				snprintf(errbuf, errlen,
				    "could not read the outbox tables of publication %s: not an oid",
				    cfg->publication);
				goto out;
			}
			t->whole_via = (enum obx_cov_via)via;
			t->unlogged = strcmp(PQgetvalue(res, (int)i, 1), "t") == 0;
			t->rel_born = strcmp(PQgetvalue(res, (int)i, 3), "t") == 0;
		}
		out->n = n;
	}
	out->read = true;
	r = 0;
out:
	if (r != 0)
		obx_cov_reset(out);
	PQclear(res);
	free(sql);
	PQfreemem(pub);
	return r;
}
