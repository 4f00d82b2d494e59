/*
 * pg/publication.c - the publication the slot decodes through: made sure
 * of (created when [source] create_publication allows), and refused when it
 * would let events be confirmed unpublished (see pg/setup.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/pg/setup_int.h"
#include "obx/pg/util.h"
#include "obx/core/tables.h"
#include "obx/core/template.h"
#include "obx/sys/log.h"

/*
 * The mapped columns (obx_config_mapped_columns), which a publication's
 * column list must keep, as SQL literals separated by commas for
 * ARRAY[...].  Returns 0 with *out set (the caller frees it) or OBX_ENOMEM.
 */
static int
mapped_columns_sql(PGconn *c, const struct obx_config *cfg, char **out)
{
	struct obx_names cols = { 0 };
	int r;

	*out = NULL;
	r = obx_config_mapped_columns(cfg, &cols);
	if (r == 0)
		r = obx_pg_literal_list(c, &cols, out);
	obx_names_reset(&cols);
	return r;
}

/*
 * Runs a CREATE PUBLICATION.  Two instances racing make the loser see
 * duplicate_object, or the catalog's unique index (unique_violation): the
 * publication exists either way, and *created says whether this call made
 * it.  Returns 0 or OBX_ECONFIG (errbuf).
 */
int
obx_pgsetup_create_publication(PGconn *c, const struct obx_config *cfg, const char *sql, bool *created,
    char *errbuf, size_t errlen)
{
	char err[1024], state[6];
	PGresult *res;

	*created = false;
	if (obx_pgsetup_query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		*created = true;
		return 0;
	}
	if (strcmp(state, "42710") == 0 || strcmp(state, "23505") == 0) {
		obx_log_info("publication %s was created concurrently", cfg->publication);
		return 0;
	}
	return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG, "could not create publication %s: %s",
	    cfg->publication, err);
}

/*
 * [source] messages = on without an outbox table: events come from logical
 * decoding messages only, which pgoutput sends whatever the publication
 * holds; an empty publication is enough.
 */
static int
message_publication(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm, bool in_recovery,
    char *errbuf, size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *res;
	bool exists, created;
	int r;

	snprintf(sql, sizeof(sql), "SELECT 1 FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read publication %s: %s",
		    cfg->publication, err);
	exists = PQntuples(res) > 0;
	PQclear(res);
	if (!exists && in_recovery)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not exist and this server is a hot standby, where it cannot be "
		    "created: run CREATE PUBLICATION %s WITH (publish = 'insert') on the primary",
		    cfg->publication, nm->pub_ident);
	if (!exists && !cfg->create_publication)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not exist and create_publication = false "
		    "(with no outbox table, CREATE PUBLICATION %s is enough for messages)",
		    cfg->publication, cfg->publication);
	if (!exists) {
		snprintf(sql, sizeof(sql), "CREATE PUBLICATION %s WITH (publish = 'insert')", nm->pub_ident);
		if ((r = obx_pgsetup_create_publication(c, cfg, sql, &created, errbuf, errlen)) != 0)
			return r;
	}
	obx_log_info("outbox table %s.%s does not exist: publishing logical decoding messages with "
	             "prefix '%s' only",
	    cfg->table_schema, cfg->table_name, cfg->message_prefix);
	return 0;
}

/* Sets *relkind of the outbox table.  Returns 0, OBX_ENOENT (no such table), OBX_EIO. */
static int
table_relkind(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm, char *relkind,
    char *errbuf, size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *res;
	int r = OBX_ENOENT;

	snprintf(sql, sizeof(sql),
	    "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	    "WHERE n.nspname = %s AND c.relname = %s",
	    nm->schema_lit, nm->table_lit);
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not look up table %s.%s: %s",
		    cfg->table_schema, cfg->table_name, err);
	if (PQntuples(res) > 0) {
		*relkind = PQgetvalue(res, 0, 0)[0];
		r = 0;
	}
	PQclear(res);
	return r;
}

/*
 * Makes sure the publication exists, creating it for a table of relkind
 * when cfg allows, and publishes inserts; sets *viaroot.  Returns 0,
 * OBX_EIO or OBX_ECONFIG.
 */
static int
ensure_publication(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm, char relkind,
    bool in_recovery, bool *viaroot, char *errbuf, size_t errlen)
{
	char sql[2048], err[1024];
	PGresult *res;
	bool exists, inserts, created;
	int r;

	for (int attempt = 0; attempt < OBX_PGSETUP_ATTEMPTS; attempt++) {
		snprintf(sql, sizeof(sql), "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = %s",
		    nm->pub_lit);
		if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
			return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read publication %s: %s",
			    cfg->publication, err);
		exists = PQntuples(res) > 0;
		inserts = exists && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		*viaroot = exists && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
		PQclear(res);
		if (exists && !inserts)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
			    cfg->publication, cfg->publication);
		if (exists)
			return 0;
		if (in_recovery)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not exist and this server is a hot standby, where it cannot "
			    "be created: run CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s) "
			    "on the primary",
			    cfg->publication, nm->pub_ident, nm->qualified,
			    relkind == 'p' ? ", publish_via_partition_root = true" : "");
		if (!cfg->create_publication)
			return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not exist and create_publication = false "
			    "(create it FOR TABLE %s.%s WITH (publish = 'insert'), see sql/)",
			    cfg->publication, cfg->table_schema, cfg->table_name);
		snprintf(sql, sizeof(sql), "CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)",
		    nm->pub_ident, nm->qualified, relkind == 'p' ? ", publish_via_partition_root = true" : "");
		if ((r = obx_pgsetup_create_publication(c, cfg, sql, &created, errbuf, errlen)) != 0)
			return r;
		if (created)
			obx_log_info("created publication %s for table %s.%s (inserts only)", cfg->publication,
			    cfg->table_schema, cfg->table_name);
	}
	return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "publication %s was dropped each time it was created",
	    cfg->publication);
}

/*
 * Refuses a publication that would let events be confirmed unpublished: one
 * without the table, with a row filter, or with a column list hiding a
 * mapped column.  A mapped column the table lacks now (renamed, dropped) is
 * only logged: its rows follow on_error.  Returns 0, OBX_EIO, OBX_ECONFIG
 * or OBX_ENOMEM.
 */
int
obx_pgsetup_check_columns(PGconn *c, const struct obx_config *cfg, const struct obx_pgsetup_names *nm,
    char *errbuf, size_t errlen)
{
	char err[1024], state[6];
	char *cols = NULL, *sql = NULL;
	PGresult *res;
	/* row filters and column lists (pg_publication_tables.rowfilter, attnames) arrive in 15 */
	bool filters = obx_pg_facts(c).publication_filters;
	int r;

	if (mapped_columns_sql(c, cfg, &cols) != 0 ||
	    asprintf(&sql,
	        "WITH t AS (SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) "
	        "AND attnum > 0 AND NOT attisdropped) "
	        "SELECT %s, (SELECT string_agg(m, ', ') FROM unnest(ARRAY[%s]::name[]) m "
	        "WHERE %s AND m IN (SELECT attname FROM t)), "
	        "(SELECT string_agg(m, ', ') FROM unnest(ARRAY[%s]::name[]) m WHERE m NOT IN (SELECT attname FROM t)) "
	        "FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
	        nm->schema_lit, nm->table_lit, filters ? "rowfilter IS NOT NULL" : "false", cols,
	        filters ? "attnames IS NOT NULL AND NOT m = ANY(attnames)" : "false", cols, nm->pub_lit,
	        nm->schema_lit, nm->table_lit) < 0) {
		free(cols);
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	}
	free(cols);
	r = obx_pgsetup_query(c, sql, &res, state, err, sizeof(err));
	free(sql);
	if (r != 0)
		/* a catalog this server lacks (SQLSTATE class 42) heals with no retry */
		return obx_pgsetup_failf(errbuf, errlen, strncmp(state, "42", 2) == 0 ? OBX_ECONFIG : OBX_EIO,
		    "could not read publication %s: %s", cfg->publication, err);
	if (PQntuples(res) == 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not publish table %s.%s (ALTER PUBLICATION %s ADD TABLE ...)",
		    cfg->publication, cfg->table_schema, cfg->table_name, cfg->publication);
	else if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s has a row filter on %s.%s: filtered events would be confirmed without being published",
		    cfg->publication, cfg->table_schema, cfg->table_name);
	else if (!PQgetisnull(res, 0, 1))
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s has a column list without the mapped column(s) %s", cfg->publication,
		    PQgetvalue(res, 0, 1));
	else if (!PQgetisnull(res, 0, 2))
		obx_log_warn("outbox table %s.%s has no column(s) %s now: rows without them cannot become "
		             "events and follow on_error (%s)",
		    cfg->table_schema, cfg->table_name, PQgetvalue(res, 0, 2),
		    cfg->on_error == OBX_ON_ERROR_STOP ? "stop" : "dead_letter");
	PQclear(res);
	return r;
}

int
obx_pgsetup_publication(PGconn *c, const struct obx_config *cfg, bool in_recovery, char *errbuf, size_t errlen)
{
	struct obx_pgsetup_names nm;
	struct obx_config view;
	char relkind = 'r';
	bool viaroot = false;
	int r;

	/* one table (an override section or not): its publication as always, in its mapping */
	if (cfg->n_tables > 1 || obx_tables_wild(cfg))
		return obx_pgsetup_publication_tables(c, cfg, in_recovery, errbuf, errlen);
	obx_tables_view(cfg, obx_tables_mapping(cfg, cfg->table_schema, cfg->table_name), cfg->table_schema,
	    cfg->table_name, &view);
	cfg = &view;
	if ((r = obx_pgsetup_names_init(&nm, c, cfg, errbuf, errlen)) != 0)
		return r;
	r = table_relkind(c, cfg, &nm, &relkind, errbuf, errlen);
	if (r == OBX_ENOENT && cfg->messages) {
		r = message_publication(c, cfg, &nm, in_recovery, errbuf, errlen);
		goto out;
	}
	if (r == OBX_ENOENT)
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "outbox table %s.%s does not exist (create it, see sql/, or set [source] table)",
		    cfg->table_schema, cfg->table_name);
	if (r != 0)
		goto out;
	if ((r = ensure_publication(c, cfg, &nm, relkind, in_recovery, &viaroot, errbuf, errlen)) != 0)
		goto out;
	if (relkind == 'p' && !viaroot) {
		r = obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "outbox %s.%s is partitioned but publication %s lacks publish_via_partition_root = true: "
		    "events would arrive under partition names (ALTER PUBLICATION %s SET (publish_via_partition_root = true))",
		    cfg->table_schema, cfg->table_name, cfg->publication, cfg->publication);
		goto out;
	}
	r = obx_pgsetup_check_columns(c, cfg, &nm, errbuf, errlen);
out:
	obx_pgsetup_names_free(&nm);
	return r;
}
