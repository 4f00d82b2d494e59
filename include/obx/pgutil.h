/*
 * pgutil.h - small helpers around libpq shared by the commands and the relay.
 */
#ifndef OBX_PGUTIL_H
#define OBX_PGUTIL_H

#include <stddef.h>

#include <libpq-fe.h>

/*
 * Opens a connection with conninfo plus extra keyword/value pairs
 * (NULL-terminated; may be NULL), e.g. replication=database.  conninfo may
 * be a key/value string or a URI.  Returns the connection (check
 * PQstatus); NULL only when out of memory.  Caller frees with PQfinish().
 */
PGconn *obx_pg_connect(const char *conninfo, const char *const *extra_kw,
    const char *const *extra_val, const char *application_name);

/*
 * Copies libpq's last error for conn into buf as one line (newlines become
 * "; ", trailing ones dropped).  Returns buf.
 */
char *obx_pg_error_line(PGconn *conn, char *buf, size_t len);

/* Same, for a result's error message. */
char *obx_pg_result_error_line(const PGresult *res, char *buf, size_t len);

#endif
