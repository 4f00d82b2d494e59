/*
 * cmd/check_int.h - what the files of "outboxd check" share: the tally of
 * verdicts, one query helper, and the checks one file runs for the other.
 * check.c holds the command (the server, the role, the table and its
 * columns, the publication, polling mode's table), check_slot.c the slot,
 * the snapshot of pending rows, failover and a standby, check_kafka.c the
 * broker and the topics.  Not an interface: only src/cmd/ includes it.
 * Every check prints its verdicts and returns nothing: a check that cannot
 * run is itself a FAIL line.
 */
#ifndef OBX_CHECK_INT_H
#define OBX_CHECK_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/pgversion.h"

/* The verdicts printed so far. */
struct obx_check {
	int failures;
	int warnings;
};

/* Prints one line, "ok", "WARN" or "FAIL" then fmt, and counts it in cx. */
void obx_check_report(struct obx_check *cx, const char *verdict, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Runs a one-row, one-column query with text parameters.  Returns 0 with
 * *out set to a copy of the value (the caller frees it); OBX_ENOENT when
 * there is no row or the value is NULL; OBX_EIO with the server's message
 * in errbuf; OBX_ENOMEM.  *out stays NULL unless 0 is returned.
 */
int obx_check_query_value(PGconn *conn, const char *sql, int nparams, const char *const *params, char **out,
    char *errbuf, size_t errlen);

/*
 * The number v holds (a count the server printed), or 0 when v is NULL or
 * not a number.
 */
long long obx_check_count(const char *v);

/* check.c: the mapped columns of cfg's table (named in each line when name_table) */
void obx_check_columns(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool name_table);

/*
 * check_tables.c: several tables or a pattern in [source] table: each table that exists, its
 * mapping's columns, the publication's coverage.  Returns true when a table exists.
 */
bool obx_check_tables(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool in_recovery);

/* check_slot.c */
void obx_check_slot(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg);
void obx_check_snapshot(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg);
void obx_check_failover(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg,
    const struct obx_pgfacts *f, bool in_recovery);
void obx_check_standby(struct obx_check *cx, PGconn *primary, const struct obx_config *cfg, const char *conninfo);

/* check_kafka.c: the broker, and with has_table the topics the outbox's rows map to */
void obx_check_kafka(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool has_table);

#endif
