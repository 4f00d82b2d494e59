/*
 * pgstream.c - the replication connection.
 *
 * A replication=database connection speaks only the simple query protocol,
 * so every literal and identifier in the SQL below goes through
 * PQescapeLiteral/PQescapeIdentifier.
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/err.h"
#include "obx/log.h"
#include "obx/pgoutput.h"
#include "obx/pgstream.h"
#include "obx/pgutil.h"
#include "obx/walmsg.h"

#define MARKER "outboxd-slot"

int64_t
obx_pg_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 - OBX_PG_EPOCH_OFFSET_US;
}

static enum obx_fail
failf(char *errbuf, size_t errlen, enum obx_fail f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum obx_fail
failf(char *errbuf, size_t errlen, enum obx_fail f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
	return f;
}

/* Escaped pieces of SQL, freed together. */
struct sqlnames {
	char *pub_ident, *pub_lit, *slot_ident, *slot_lit, *schema_lit, *table_lit, *qualified;
};

static void
sqlnames_free(struct sqlnames *n)
{
	PQfreemem(n->pub_ident);
	PQfreemem(n->pub_lit);
	PQfreemem(n->slot_ident);
	PQfreemem(n->slot_lit);
	PQfreemem(n->schema_lit);
	PQfreemem(n->table_lit);
	free(n->qualified);
}

static int
sqlnames_init(struct sqlnames *n, PGconn *c, const struct obx_config *cfg)
{
	char *si, *ti;

	memset(n, 0, sizeof(*n));
	n->pub_ident = PQescapeIdentifier(c, cfg->publication, strlen(cfg->publication));
	n->pub_lit = PQescapeLiteral(c, cfg->publication, strlen(cfg->publication));
	n->slot_ident = PQescapeIdentifier(c, cfg->slot, strlen(cfg->slot));
	n->slot_lit = PQescapeLiteral(c, cfg->slot, strlen(cfg->slot));
	n->schema_lit = PQescapeLiteral(c, cfg->table_schema, strlen(cfg->table_schema));
	n->table_lit = PQescapeLiteral(c, cfg->table_name, strlen(cfg->table_name));
	si = PQescapeIdentifier(c, cfg->table_schema, strlen(cfg->table_schema));
	ti = PQescapeIdentifier(c, cfg->table_name, strlen(cfg->table_name));
	if (si != NULL && ti != NULL && asprintf(&n->qualified, "%s.%s", si, ti) < 0)
		n->qualified = NULL;
	PQfreemem(si);
	PQfreemem(ti);
	if (!n->pub_ident || !n->pub_lit || !n->slot_ident || !n->slot_lit || !n->schema_lit ||
	    !n->table_lit || !n->qualified)
		return OBX_ENOMEM;
	return 0;
}

/* Runs sql expecting tuples or a command; returns the result (caller clears) or NULL with errbuf. */
static PGresult *
run(PGconn *c, const char *sql, char *errbuf, size_t errlen)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);

	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK || st == PGRES_COPY_BOTH)
		return r;
	obx_pg_result_error_line(r, errbuf, errlen);
	if (errbuf[0] == '\0')
		obx_pg_error_line(c, errbuf, errlen);
	PQclear(r);
	return NULL;
}

/*
 * Runs sql.  Returns true when it failed with one of states (SQLSTATEs
 * separated by commas); false otherwise, with *out set to the result on
 * success (caller clears) or NULL on any other error (errbuf filled).
 */
static bool
is_sqlstate(PGconn *c, const char *sql, const char *states, char *errbuf, size_t errlen,
    PGresult **out)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	const char *code;
	bool match;

	*out = NULL;
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
		*out = r;
		return false;
	}
	code = PQresultErrorField(r, PG_DIAG_SQLSTATE); /* owned by r */
	match = code != NULL && strlen(code) == 5 && strstr(states, code) != NULL;
	obx_pg_result_error_line(r, errbuf, errlen);
	PQclear(r);
	return match;
}

static enum obx_fail
classify_connect_error(const char *msg)
{
	static const char *const permanent[] = {
		"password authentication failed", "does not exist", "no pg_hba.conf entry",
		"must be superuser or replication role", "permission denied",
		"must have the REPLICATION", "certificate", "SSL error", "invalid",
		"could not translate host name", "Name or service not known",
		"root certificate file", "server does not support SSL",
	};

	for (size_t i = 0; i < sizeof(permanent) / sizeof(permanent[0]); i++)
		if (strstr(msg, permanent[i]) != NULL)
			return OBX_FAIL_FATAL;
	return OBX_FAIL_RETRY;
}

static int
parse_guc_ms(const char *v, int *out)
{
	long long ms;

	if (strcmp(v, "0") == 0) {
		*out = 0;
		return 0;
	}
	if (obx_parse_duration_ms(v, 0, 1LL << 31, &ms) != 0 &&
	    obx_parse_int(v, 0, 1LL << 31, &ms) != 0)
		return OBX_EINVAL;
	*out = (int)ms;
	return 0;
}

/*
 * The mapped columns (obx_config_mapped_columns), which a publication's
 * column list must keep, as SQL literals separated by commas for
 * ARRAY[...].  Returns a string the caller frees, or NULL when out of memory.
 */
static char *
mapped_columns_sql(PGconn *c, const struct obx_config *cfg)
{
	struct obx_names cols = { 0 };
	char *out = NULL;
	size_t used = 0;

	if (obx_config_mapped_columns(cfg, &cols) != 0)
		goto fail;
	for (size_t i = 0; i < cols.n; i++) {
		char *lit = PQescapeLiteral(c, cols.v[i], strlen(cols.v[i]));
		size_t n = lit != NULL ? strlen(lit) : 0;
		char *grown = lit != NULL ? realloc(out, used + n + 2) : NULL;

		if (grown == NULL) {
			PQfreemem(lit);
			goto fail;
		}
		out = grown;
		if (used > 0)
			out[used++] = ',';
		memcpy(out + used, lit, n + 1);
		used += n;
		PQfreemem(lit);
	}
	obx_names_reset(&cols);
	return out;
fail:
	obx_names_reset(&cols);
	free(out);
	return NULL;
}

/*
 * Runs a CREATE PUBLICATION.  Two instances racing make the loser see
 * duplicate_object, or the catalog's unique index (unique_violation): the
 * publication exists either way.  Returns 1 when this call created it, 0 when
 * another did, -1 with errbuf filled.
 */
static int
create_publication(PGconn *c, const struct obx_config *cfg, const char *sql, char *errbuf,
    size_t errlen)
{
	char err[1024];
	PGresult *r;

	if (is_sqlstate(c, sql, "42710,23505", err, sizeof(err), &r)) {
		obx_log_info("publication %s was created concurrently", cfg->publication);
		return 0;
	}
	if (r == NULL) {
		failf(errbuf, errlen, OBX_FAIL_FATAL, "could not create publication %s: %s",
		    cfg->publication, err);
		return -1;
	}
	PQclear(r);
	return 1;
}

/*
 * [source] messages = on without an outbox table: events come from logical
 * decoding messages only, which pgoutput sends whatever the publication
 * holds; an empty publication is enough.
 */
static enum obx_fail
setup_message_publication(PGconn *c, const struct obx_config *cfg, struct sqlnames *nm,
    char *errbuf, size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *r;
	bool exists;

	snprintf(sql, sizeof(sql), "SELECT 1 FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if ((r = run(c, sql, err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read publication %s: %s",
		    cfg->publication, err);
	exists = PQntuples(r) > 0;
	PQclear(r);
	if (!exists && !cfg->create_publication)
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "publication %s does not exist and create_publication = false "
		    "(with no outbox table, CREATE PUBLICATION %s is enough for messages)",
		    cfg->publication, cfg->publication);
	if (!exists) {
		snprintf(sql, sizeof(sql), "CREATE PUBLICATION %s WITH (publish = 'insert')", nm->pub_ident);
		if (create_publication(c, cfg, sql, errbuf, errlen) < 0)
			return OBX_FAIL_FATAL;
	}
	obx_log_info("outbox table %s.%s does not exist: publishing logical decoding messages with "
	    "prefix '%s' only", cfg->table_schema, cfg->table_name, cfg->message_prefix);
	return OBX_FAIL_NONE;
}

static enum obx_fail
setup_publication(PGconn *c, const struct obx_config *cfg, struct sqlnames *nm, char *errbuf,
    size_t errlen)
{
	char sql[4096], err[1024];
	PGresult *r;
	char relkind;
	bool viaroot;
	char *cols, *colsql;
	int n;

	snprintf(sql, sizeof(sql),
	    "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	    "WHERE n.nspname = %s AND c.relname = %s", nm->schema_lit, nm->table_lit);
	if ((r = run(c, sql, err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not look up table %s.%s: %s",
		    cfg->table_schema, cfg->table_name, err);
	if (PQntuples(r) == 0 && cfg->messages) {
		PQclear(r);
		return setup_message_publication(c, cfg, nm, errbuf, errlen);
	}
	if (PQntuples(r) == 0) {
		PQclear(r);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "outbox table %s.%s does not exist (create it, see sql/, or set [source] table)",
		    cfg->table_schema, cfg->table_name);
	}
	relkind = PQgetvalue(r, 0, 0)[0];
	PQclear(r);

	snprintf(sql, sizeof(sql),
	    "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if ((r = run(c, sql, err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read publication %s: %s",
		    cfg->publication, err);
	if (PQntuples(r) == 0) {
		PQclear(r);
		if (!cfg->create_publication)
			return failf(errbuf, errlen, OBX_FAIL_FATAL,
			    "publication %s does not exist and create_publication = false "
			    "(create it FOR TABLE %s.%s WITH (publish = 'insert'), see sql/)",
			    cfg->publication, cfg->table_schema, cfg->table_name);
		snprintf(sql, sizeof(sql),
		    "CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)",
		    nm->pub_ident, nm->qualified,
		    relkind == 'p' ? ", publish_via_partition_root = true" : "");
		switch (create_publication(c, cfg, sql, errbuf, errlen)) {
		case -1:
			return OBX_FAIL_FATAL;
		case 1:
			obx_log_info("created publication %s for table %s.%s (inserts only)",
			    cfg->publication, cfg->table_schema, cfg->table_name);
			break;
		}
		return setup_publication(c, cfg, nm, errbuf, errlen);
	}
	if (strcmp(PQgetvalue(r, 0, 0), "t") != 0) {
		PQclear(r);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "publication %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
		    cfg->publication, cfg->publication);
	}
	viaroot = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
	PQclear(r);
	if (relkind == 'p' && !viaroot)
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "outbox %s.%s is partitioned but publication %s lacks publish_via_partition_root = true: "
		    "events would arrive under partition names (ALTER PUBLICATION %s SET (publish_via_partition_root = true))",
		    cfg->table_schema, cfg->table_name, cfg->publication, cfg->publication);

	cols = mapped_columns_sql(c, cfg);
	if (cols == NULL)
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "out of memory");
	/* a column list hiding a mapped column is refused; a mapped column the table
	 * lacks now (renamed, dropped) is only said: its rows follow on_error */
	n = asprintf(&colsql,
	    "WITH t AS (SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) "
	    "AND attnum > 0 AND NOT attisdropped) "
	    "SELECT rowfilter IS NOT NULL, (SELECT string_agg(m, ', ') FROM unnest(ARRAY[%s]::name[]) m "
	    "WHERE attnames IS NOT NULL AND NOT m = ANY(attnames) AND m IN (SELECT attname FROM t)), "
	    "(SELECT string_agg(m, ', ') FROM unnest(ARRAY[%s]::name[]) m WHERE m NOT IN (SELECT attname FROM t)) "
	    "FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
	    nm->schema_lit, nm->table_lit, cols, cols, nm->pub_lit, nm->schema_lit,
	    nm->table_lit);
	free(cols);
	if (n < 0)
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "out of memory");
	r = run(c, colsql, err, sizeof(err));
	free(colsql);
	if (r == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read publication %s: %s",
		    cfg->publication, err);
	if (PQntuples(r) == 0) {
		PQclear(r);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "publication %s does not publish table %s.%s (ALTER PUBLICATION %s ADD TABLE ...)",
		    cfg->publication, cfg->table_schema, cfg->table_name, cfg->publication);
	}
	if (strcmp(PQgetvalue(r, 0, 0), "t") == 0) {
		PQclear(r);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "publication %s has a row filter on %s.%s: filtered events would be confirmed without being published",
		    cfg->publication, cfg->table_schema, cfg->table_name);
	}
	if (!PQgetisnull(r, 0, 1)) {
		failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "publication %s has a column list without the mapped column(s) %s",
		    cfg->publication, PQgetvalue(r, 0, 1));
		PQclear(r);
		return OBX_FAIL_FATAL;
	}
	if (!PQgetisnull(r, 0, 2))
		obx_log_warn("outbox table %s.%s has no column(s) %s now: rows without them cannot become "
		    "events and follow on_error (%s)", cfg->table_schema, cfg->table_name,
		    PQgetvalue(r, 0, 2), cfg->on_error == OBX_ON_ERROR_STOP ? "stop" : "dead_letter");
	PQclear(r);
	return OBX_FAIL_NONE;
}

/* Finds "outboxd-slot SLOT SYSID LSN" in the publication comment; returns true when present. */
static bool
find_marker(const char *comment, const char *slot, char *sysid, size_t sl, char *lsn, size_t ll)
{
	const char *p = comment;

	while (p != NULL && *p != '\0') {
		char s[128], id[32], l[32];

		if (sscanf(p, MARKER " %127s %31s %31s", s, id, l) == 3 && strcmp(s, slot) == 0) {
			snprintf(sysid, sl, "%s", id);
			snprintf(lsn, ll, "%s", l);
			return true;
		}
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	return false;
}

static void
record_marker(PGconn *c, const struct obx_config *cfg, struct sqlnames *nm, const char *comment,
    const char *sysid, const char *lsn)
{
	char *text = NULL, *lit, *sql = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&text, &len);
	char err[1024];
	PGresult *r;

	if (fp == NULL)
		return;
	/* keep the other lines (other slots, a human's note), replace ours */
	for (const char *p = comment; p != NULL && *p != '\0';) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char prefix[160];

		snprintf(prefix, sizeof(prefix), MARKER " %s ", cfg->slot);
		if (strncmp(p, prefix, strlen(prefix)) != 0 && n > 0)
			fprintf(fp, "%.*s\n", (int)n, p);
		p = nl ? nl + 1 : NULL;
	}
	fprintf(fp, MARKER " %s %s %s", cfg->slot, sysid, lsn);
	fclose(fp);
	lit = PQescapeLiteral(c, text, strlen(text));
	if (lit != NULL && asprintf(&sql, "COMMENT ON PUBLICATION %s IS %s", nm->pub_ident, lit) > 0) {
		if ((r = run(c, sql, err, sizeof(err))) != NULL)
			PQclear(r);
		else
			obx_log_warn("could not record the creation of slot %s on publication %s: %s; "
			    "a later loss of the slot will not be detected (make the outboxd role own the publication)",
			    cfg->slot, cfg->publication, err);
	}
	free(sql);
	PQfreemem(lit);
	free(text);
}

static enum obx_fail
setup_slot(struct obx_pgstream *s, const struct obx_config *cfg, struct sqlnames *nm,
    bool recreate, char *errbuf, size_t errlen)
{
	char sql[2048], err[1024], msysid[32], mlsn[32];
	char *comment = NULL;
	PGresult *r;
	bool marked;

	snprintf(sql, sizeof(sql),
	    "SELECT confirmed_flush_lsn, plugin, slot_type, database, coalesce(wal_status, '') "
	    "FROM pg_replication_slots WHERE slot_name = %s", nm->slot_lit);
	if ((r = run(s->conn, sql, err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read slot %s: %s", cfg->slot, err);
	if (PQntuples(r) > 0) {
		enum obx_fail f = OBX_FAIL_NONE;

		if (strcmp(PQgetvalue(r, 0, 2), "logical") != 0 || strcmp(PQgetvalue(r, 0, 1), "pgoutput") != 0)
			f = failf(errbuf, errlen, OBX_FAIL_FATAL,
			    "slot %s exists but is not a logical pgoutput slot (plugin %s)", cfg->slot,
			    PQgetvalue(r, 0, 1));
		else if (strcmp(PQgetvalue(r, 0, 4), "lost") == 0)
			f = failf(errbuf, errlen, OBX_FAIL_FATAL,
			    "slot %s is invalidated (wal_status = lost): the server removed WAL it still needed, "
			    "events committed after %s may have been lost; drop and recreate the slot, then "
			    "reconcile from the business tables", cfg->slot,
			    PQgetisnull(r, 0, 0) ? "its last position" : PQgetvalue(r, 0, 0));
		else if (PQgetisnull(r, 0, 0))
			/* another instance is creating it right now: wait for it like for a slot in use */
			f = failf(errbuf, errlen, OBX_FAIL_SLOT_IN_USE,
			    "slot %s is being created by another instance", cfg->slot);
		else if (obx_lsn_parse(PQgetvalue(r, 0, 0), &s->start_confirmed) != 0)
			f = failf(errbuf, errlen, OBX_FAIL_FATAL, "slot %s has a malformed confirmed position",
			    cfg->slot);
		PQclear(r);
		return f;
	}
	PQclear(r);

	snprintf(sql, sizeof(sql), "SELECT coalesce(obj_description(oid, 'pg_publication'), '') "
	    "FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if ((r = run(s->conn, sql, err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read publication comment: %s", err);
	comment = strdup(PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "");
	PQclear(r);
	if (comment == NULL)
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "out of memory");
	marked = find_marker(comment, cfg->slot, msysid, sizeof(msysid), mlsn, sizeof(mlsn));
	if (marked && !recreate) {
		free(comment);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "replication slot %s is missing but existed before (created at %s on system %s): "
		    "after a failover, a drop or a restore, events committed since its last position may "
		    "not be published; reconcile, then start once with --recreate-slot",
		    cfg->slot, mlsn, msysid);
	}
	if (!marked && !cfg->create_slot) {
		free(comment);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "replication slot %s does not exist and create_slot = false", cfg->slot);
	}

	if (s->server_version >= 150000)
		snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'nothing')",
		    nm->slot_ident);
	else
		snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput NOEXPORT_SNAPSHOT",
		    nm->slot_ident);
	if (is_sqlstate(s->conn, sql, "42710", err, sizeof(err), &r)) {
		/* another instance created it a moment ago: use it */
		free(comment);
		obx_log_info("slot %s was created concurrently", cfg->slot);
		return setup_slot(s, cfg, nm, recreate, errbuf, errlen);
	}
	if (r == NULL) {
		free(comment);
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "could not create slot %s: %s", cfg->slot, err);
	}
	if (obx_lsn_parse(PQgetvalue(r, 0, 1), &s->start_confirmed) != 0) {
		PQclear(r);
		free(comment);
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "slot %s: unexpected consistent point",
		    cfg->slot);
	}
	s->slot_created = true;
	if (marked)
		obx_log_warn("recreated slot %s at %s (--recreate-slot); the previous slot was created at %s: "
		    "events committed between its last confirmed position and %s are not published",
		    cfg->slot, PQgetvalue(r, 0, 1), mlsn, PQgetvalue(r, 0, 1));
	else
		obx_log_info("created slot %s at %s", cfg->slot, PQgetvalue(r, 0, 1));
	record_marker(s->conn, cfg, nm, comment, s->sysid, PQgetvalue(r, 0, 1));
	PQclear(r);
	free(comment);

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM (SELECT 1 FROM %s LIMIT 1000001) x", nm->qualified);
	if ((r = run(s->conn, sql, err, sizeof(err))) != NULL) {
		if (strcmp(PQgetvalue(r, 0, 0), "0") != 0)
			obx_log_warn("%s row(s) already in %s.%s will not be published: a new slot starts "
			    "at its creation point (no snapshot)", PQgetvalue(r, 0, 0), cfg->table_schema,
			    cfg->table_name);
		PQclear(r);
	}
	return OBX_FAIL_NONE;
}

enum obx_fail
obx_pgstream_open(struct obx_pgstream *s, const struct obx_config *cfg, bool recreate_slot,
    bool streaming, char *errbuf, size_t errlen)
{
	static const char *const kw[] = { "replication", NULL };
	static const char *const val[] = { "database", NULL };
	struct sqlnames nm;
	char err[1024], sql[1024];
	enum obx_fail f;
	PGresult *r;
	char *pubs = NULL, *pubs_lit = NULL;

	memset(s, 0, sizeof(*s));
	s->conn = obx_pg_connect(cfg->conninfo, kw, val, "outboxd");
	if (s->conn == NULL)
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "out of memory");
	if (PQstatus(s->conn) != CONNECTION_OK) {
		obx_pg_error_line(s->conn, err, sizeof(err));
		return failf(errbuf, errlen, classify_connect_error(err),
		    "could not connect to PostgreSQL: %s", err);
	}
	s->server_version = PQserverVersion(s->conn);
	if (s->server_version < 100000)
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "PostgreSQL %d is too old: pgoutput needs 10 or later", s->server_version);
	s->proto_version = obx_pgoutput_proto_for_server(s->server_version);
	if (cfg->messages && s->proto_version < 2)
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "[source] messages = on needs PostgreSQL 14 or later (server is %d)", s->server_version);
	s->streaming = streaming && s->proto_version >= 2;
	if (streaming && !s->streaming)
		obx_log_warn("[source] streaming = on needs PostgreSQL 14 or later (server is %d): "
		    "not streaming", s->server_version);

	if ((r = run(s->conn, "IDENTIFY_SYSTEM", err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "IDENTIFY_SYSTEM failed: %s", err);
	if (PQntuples(r) != 1 || PQnfields(r) < 4 || PQgetisnull(r, 0, 3)) {
		PQclear(r);
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "IDENTIFY_SYSTEM did not name a database: the connection is not a logical replication connection");
	}
	snprintf(s->sysid, sizeof(s->sysid), "%s", PQgetvalue(r, 0, 0));
	s->timeline = atoi(PQgetvalue(r, 0, 1));
	PQclear(r);

	if ((r = run(s->conn, "SHOW wal_level", err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read wal_level: %s", err);
	if (strcmp(PQgetvalue(r, 0, 0), "logical") != 0) {
		f = failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "wal_level is '%s' but logical replication needs wal_level = logical "
		    "(set it in postgresql.conf and restart the server)", PQgetvalue(r, 0, 0));
		PQclear(r);
		return f;
	}
	PQclear(r);
	if ((r = run(s->conn, "SHOW wal_sender_timeout", err, sizeof(err))) == NULL)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not read wal_sender_timeout: %s", err);
	if (parse_guc_ms(PQgetvalue(r, 0, 0), &s->wal_sender_timeout_ms) != 0) {
		f = failf(errbuf, errlen, OBX_FAIL_FATAL, "cannot parse wal_sender_timeout '%s'",
		    PQgetvalue(r, 0, 0));
		PQclear(r);
		return f;
	}
	PQclear(r);
	if (s->wal_sender_timeout_ms > 0 && cfg->status_interval_ms >= s->wal_sender_timeout_ms)
		return failf(errbuf, errlen, OBX_FAIL_FATAL,
		    "[source] status_interval (%d ms) must be below the server's wal_sender_timeout (%d ms)",
		    cfg->status_interval_ms, s->wal_sender_timeout_ms);

	if (sqlnames_init(&nm, s->conn, cfg) != 0) {
		sqlnames_free(&nm);
		return failf(errbuf, errlen, OBX_FAIL_FATAL, "out of memory");
	}
	/* publication first: a slot created before its publication breaks decoding */
	f = setup_publication(s->conn, cfg, &nm, errbuf, errlen);
	if (f == OBX_FAIL_NONE)
		f = setup_slot(s, cfg, &nm, recreate_slot, errbuf, errlen);
	if (f != OBX_FAIL_NONE) {
		sqlnames_free(&nm);
		return f;
	}

	pubs = nm.pub_ident; /* publication_names is a list of (quoted) identifiers */
	pubs_lit = PQescapeLiteral(s->conn, pubs, strlen(pubs));
	snprintf(sql, sizeof(sql),
	    "START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '%d', publication_names %s%s%s)",
	    nm.slot_ident, s->proto_version, pubs_lit ? pubs_lit : "''",
	    s->streaming ? ", streaming 'on'" : "", cfg->messages ? ", messages 'true'" : "");
	PQfreemem(pubs_lit);
	sqlnames_free(&nm);
	r = PQexec(s->conn, sql);
	if (PQresultStatus(r) != PGRES_COPY_BOTH) {
		const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);

		obx_pg_result_error_line(r, err, sizeof(err));
		f = (code != NULL && strcmp(code, "55006") == 0) ? OBX_FAIL_SLOT_IN_USE :
		    (code != NULL && code[0] == '4' && code[1] == '2') ? OBX_FAIL_FATAL : OBX_FAIL_RETRY;
		PQclear(r);
		return failf(errbuf, errlen, f, "could not start replication on slot %s: %s", cfg->slot,
		    err);
	}
	PQclear(r);
	if (PQsetnonblocking(s->conn, 1) != 0)
		return failf(errbuf, errlen, OBX_FAIL_RETRY, "could not make the connection non-blocking");
	return OBX_FAIL_NONE;
}

int
obx_pgstream_fd(const struct obx_pgstream *s)
{
	return PQsocket(s->conn);
}

int
obx_pgstream_consume(struct obx_pgstream *s, char *errbuf, size_t errlen)
{
	if (PQconsumeInput(s->conn) == 0) {
		obx_pg_error_line(s->conn, errbuf, errlen);
		return -1;
	}
	return 0;
}

int
obx_pgstream_read(struct obx_pgstream *s, const uint8_t **buf, size_t *len, char *errbuf,
    size_t errlen)
{
	char *copybuf = NULL;
	int n;

	if (s->copybuf != NULL) {
		PQfreemem(s->copybuf);
		s->copybuf = NULL;
	}
	n = PQgetCopyData(s->conn, &copybuf, 1);
	if (n > 0) {
		s->copybuf = (uint8_t *)copybuf;
		*buf = s->copybuf;
		*len = (size_t)n;
		return 1;
	}
	if (n == 0)
		return 0;
	if (n == -1) {
		PGresult *r = PQgetResult(s->conn);

		if (r != NULL && PQresultStatus(r) != PGRES_COMMAND_OK)
			obx_pg_result_error_line(r, errbuf, errlen);
		else
			snprintf(errbuf, errlen, "the server ended the replication stream");
		PQclear(r);
		return -1;
	}
	obx_pg_error_line(s->conn, errbuf, errlen);
	return -1;
}

int
obx_pgstream_send_status(struct obx_pgstream *s, obx_lsn write, obx_lsn flush, bool reply,
    char *errbuf, size_t errlen)
{
	uint8_t msg[OBX_STATUS_UPDATE_LEN];

	/* never report a position below what the slot had already confirmed */
	if (flush < s->start_confirmed)
		flush = s->start_confirmed;
	if (write < flush)
		write = flush;
	obx_walmsg_status(msg, write, flush, flush, obx_pg_now(), reply);
	if (PQputCopyData(s->conn, (const char *)msg, sizeof(msg)) <= 0) {
		obx_pg_error_line(s->conn, errbuf, errlen);
		return -1;
	}
	return 0;
}

int
obx_pgstream_flush(struct obx_pgstream *s)
{
	return PQflush(s->conn);
}

void
obx_pgstream_close(struct obx_pgstream *s)
{
	if (s->copybuf != NULL)
		PQfreemem(s->copybuf);
	s->copybuf = NULL;
	if (s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK &&
	    PQputCopyEnd(s->conn, NULL) == 1) {
		int64_t deadline = obx_pg_now() + 2000000;

		/* drain until the server ends COPY too (so a last error is not missed); bounded */
		while (obx_pg_now() < deadline) {
			struct pollfd p = { PQsocket(s->conn), POLLIN, 0 };
			char *buf = NULL;
			int n;

			if (PQflush(s->conn) == 1)
				p.events |= POLLOUT;
			n = PQgetCopyData(s->conn, &buf, 1);
			if (buf != NULL)
				PQfreemem(buf);
			if (n < 0)
				break;
			if (n == 0 && (poll(&p, 1, 100) < 0 || PQconsumeInput(s->conn) == 0))
				break;
		}
		for (int i = 0; i < 4; i++) {
			PGresult *r;

			if (PQisBusy(s->conn))
				break;
			if ((r = PQgetResult(s->conn)) == NULL)
				break;
			PQclear(r);
		}
	}
	if (s->conn != NULL)
		PQfinish(s->conn);
	s->conn = NULL;
}
