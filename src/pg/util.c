#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/connfail.h"
#include "obx/core/err.h"
#include "obx/pg/util.h"

/*
 * The settings the text of a value depends on, pinned whatever the
 * database, the role or the conninfo says: the event builder decodes bytea
 * from hex and parses timestamps in ISO form, and every value is passed on
 * as UTF-8 bytes, exactly.  On a replication connection they are the
 * walsender's, whose pgoutput renders the rows with them.  The field order
 * of DateStyle (MDY, DMY) is left alone, as are TimeZone (a timestamptz's
 * text carries its offset) and IntervalStyle (nothing read is an interval):
 * a snapshot_filter or a header keeps the meaning the role gave them.
 * SET after the connection rather than startup options, which a pooler
 * may refuse.  Returns 0, or OBX_EIO with the server's message in errbuf.
 */
static int
pin_session(PGconn *c, char *errbuf, size_t errlen)
{
	PGresult *res = PQexec(c,
	    "SELECT pg_catalog.set_config('bytea_output', 'hex', false), "
	    "pg_catalog.set_config('client_encoding', 'UTF8', false), "
	    "pg_catalog.set_config('datestyle', 'ISO', false), "
	    "pg_catalog.set_config('extra_float_digits', '1', false)");
	char err[512];
	int r = 0;

	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		snprintf(errbuf, errlen, "could not set the session's output settings: %s",
		    obx_pg_result_error_line(res, err, sizeof(err)));
		r = OBX_EIO;
	}
	PQclear(res);
	return r;
}

int
obx_pg_connect(const char *conninfo, const char *password, const char *const *extra_kw,
    const char *const *extra_val, const char *application_name, PGconn **out, char *errbuf, size_t errlen)
{
	const char *kw[25], *val[25];
	PGconn *c;
	int n = 0;

	/*
	 * Defaults that only the user may loosen: a connection attempt gives up
	 * after 10 s, and TCP keepalives notice a peer gone without a FIN in
	 * about a minute instead of the kernel's two hours.  They come first:
	 * libpq lets the expanded conninfo (and PGCONNECT_TIMEOUT, applied when
	 * the keyword is absent) override them.
	 */
	if (getenv("PGCONNECT_TIMEOUT") == NULL) {
		kw[n] = "connect_timeout";
		val[n++] = "10";
	}
	kw[n] = "keepalives";
	val[n++] = "1";
	kw[n] = "keepalives_idle";
	val[n++] = "30";
	kw[n] = "keepalives_interval";
	val[n++] = "10";
	kw[n] = "keepalives_count";
	val[n++] = "3";
	/*
	 * dbname is expanded by libpq: a conninfo string or URI given as
	 * "dbname" is parsed in full, and the later keywords override it.
	 */
	kw[n] = "dbname";
	val[n++] = conninfo;
	kw[n] = "application_name";
	val[n++] = application_name;
	if (password != NULL && password[0] != '\0') {
		kw[n] = "password";
		val[n++] = password;
	}
	for (int i = 0; extra_kw != NULL && extra_kw[i] != NULL && n < 24; i++) {
		kw[n] = extra_kw[i];
		val[n++] = extra_val[i];
	}
	kw[n] = NULL;
	val[n] = NULL;
	*out = NULL;
	c = PQconnectdbParams(kw, val, 1);
	if (c == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return OBX_ENOMEM;
	}
	if (PQstatus(c) != CONNECTION_OK) {
		char err[1024];

		/* classified on libpq's whole message: errbuf may be shorter */
		obx_pg_error_line(c, err, sizeof(err));
		snprintf(errbuf, errlen, "%s", err);
		PQfinish(c);
		return obx_connfail_class(err);
	}
	if (pin_session(c, errbuf, errlen) != 0) {
		/* a refused session setting is judged like a refused connection */
		PQfinish(c);
		return obx_connfail_class(errbuf);
	}
	*out = c;
	return 0;
}

static char *
one_line(const char *msg, char *buf, size_t len)
{
	size_t o = 0;

	if (len == 0)
		return buf;
	for (const char *p = msg; p != NULL && *p != '\0' && o + 3 < len; p++) {
		if (*p == '\n') {
			if (p[1] == '\0')
				break;
			buf[o++] = ';';
			buf[o++] = ' ';
		} else {
			buf[o++] = *p;
		}
	}
	buf[o] = '\0';
	return buf;
}

char *
obx_pg_error_line(PGconn *conn, char *buf, size_t len)
{
	return one_line(PQerrorMessage(conn), buf, len);
}

struct obx_pgfacts
obx_pg_facts(PGconn *c)
{
	struct obx_pgfacts f;
	char err[128];

	(void)obx_pgfacts_for(PQserverVersion(c), &f, err, sizeof(err));
	return f;
}

char *
obx_pg_result_error_line(const PGresult *res, char *buf, size_t len)
{
	return one_line(PQresultErrorMessage(res), buf, len);
}

int
obx_pg_literal_list(PGconn *c, const struct obx_names *names, char **out)
{
	char *list = strdup("");
	size_t used = 0;

	*out = NULL;
	for (size_t i = 0; list != NULL && i < names->n; i++) {
		char *lit = PQescapeLiteral(c, names->v[i], strlen(names->v[i]));
		size_t n = lit != NULL ? strlen(lit) : 0;
		char *grown = lit != NULL ? realloc(list, used + n + 2) : NULL;

		if (grown == NULL) {
			free(list);
			list = NULL;
		} else {
			list = grown;
			if (used > 0)
				list[used++] = ',';
			memcpy(list + used, lit, n + 1);
			used += n;
		}
		PQfreemem(lit);
	}
	if (list == NULL)
		return OBX_ENOMEM;
	*out = list;
	return 0;
}

void
obx_pg_conninfo_dbname(const char *conninfo, char *out, size_t len)
{
	PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
	const char *db = getenv("PGDATABASE");

	for (PQconninfoOption *o = opts; o != NULL && o->keyword != NULL; o++)
		if (strcmp(o->keyword, "dbname") == 0 && o->val != NULL && o->val[0] != '\0')
			db = o->val;
	snprintf(out, len, "%s", db != NULL ? db : "");
	PQconninfoFree(opts);
}

int
obx_pg_int64(const PGresult *res, int row, int col, int64_t *out)
{
	const char *s, *bad = NULL;
	long long v;

	if (PQgetisnull(res, row, col))
		return OBX_EPROTO;
	s = PQgetvalue(res, row, col);
	v = strtonum(s, INT64_MIN, INT64_MAX, &bad);
	if (bad != NULL)
		return OBX_EPROTO;
	*out = v;
	return 0;
}

int
obx_pg_double(const PGresult *res, int row, int col, double *out)
{
	const char *s;
	char *end;
	double v;

	if (PQgetisnull(res, row, col))
		return OBX_EPROTO;
	s = PQgetvalue(res, row, col);
	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end != '\0' || errno == ERANGE || isnan(v))
		return OBX_EPROTO;
	*out = v;
	return 0;
}
