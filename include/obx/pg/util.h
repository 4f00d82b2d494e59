/*
 * pg/util.h - small helpers around libpq shared by the commands, the setup
 * and the metrics poller (I/O).  Functions that can fail return 0 or a
 * negative OBX_E* code (err.h).
 */
#ifndef OBX_PGUTIL_H
#define OBX_PGUTIL_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "obx/core/pgversion.h"

#include "obx/core/template.h"

/*
 * Opens a connection with conninfo plus extra keyword/value pairs
 * (NULL-terminated; may be NULL), e.g. replication=database.  conninfo may
 * be a key/value string or a URI.  password, unless NULL or "", is libpq's
 * password keyword after conninfo, so it wins over a password there and
 * over PGPASSWORD and the pgpass file ([source] password, read from the
 * mounted file OUTBOXD_SOURCE_PASSWORD_FILE names).  Unless it says otherwise, connect_timeout
 * is 10 s and TCP keepalives are on (idle 30 s, every 10 s, 3 probes).
 * Every connection's session then has the output settings outboxd reads
 * values with, whatever the database or role sets: bytea_output = hex,
 * client_encoding = UTF8, DateStyle ISO, extra_float_digits = 1.
 * Returns 0 with *out set (the caller
 * closes it with PQfinish()); otherwise *out is NULL, the message is in
 * errbuf (one line) and the code is OBX_ECONFIG (a refusal no retry heals,
 * of the connection or of those settings, obx_connfail_class():
 * authentication, an unknown database, TLS, a permission), OBX_EIO (could
 * not connect or set those, and may heal) or OBX_ENOMEM.
 */
int obx_pg_connect(const char *conninfo, const char *password, const char *const *extra_kw,
    const char *const *extra_val, const char *application_name, PGconn **out, char *errbuf, size_t errlen);

/*
 * Copies libpq's last error for conn into buf as one line (newlines become
 * "; ", trailing ones dropped).  Returns buf.
 */
char *obx_pg_error_line(PGconn *conn, char *buf, size_t len);

/* Same, for a result's error message. */
char *obx_pg_result_error_line(const PGresult *res, char *buf, size_t len);

/*
 * The integer (int8, int4, ...) in row, col of res: the whole text, in the
 * range of int64_t.  Returns 0 with *out set, or OBX_EPROTO (NULL or not
 * such an integer) with *out left alone.
 */
int obx_pg_int64(const PGresult *res, int row, int col, int64_t *out);

/* Same for a floating-point value (float8, numeric, ...) into *out. */
int obx_pg_double(const PGresult *res, int row, int col, double *out);

/*
 * What the server on c offers (obx_pgfacts_for on PQserverVersion); also
 * for a server older than supported, which callers refuse first.
 */
struct obx_pgfacts obx_pg_facts(PGconn *c);

/*
 * Escapes every name in names as an SQL literal, joined by commas (for
 * ARRAY[...] or IN (...)).  Returns 0 with *out set (the caller frees it;
 * "" for no names), or OBX_ENOMEM (also for a name the connection's
 * encoding rejects) with *out NULL.
 */
int obx_pg_literal_list(PGconn *c, const struct obx_names *names, char **out);

/*
 * Writes the database conninfo names (or PGDATABASE, or "") to out, for
 * outboxd_info before any session connected: a standby and an instance that
 * cannot connect say it too.
 */
void obx_pg_conninfo_dbname(const char *conninfo, char *out, size_t len);

#endif
