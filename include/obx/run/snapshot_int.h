/*
 * run/snapshot_int.h - what snapshot.c (the run, the delivery of its
 * records, the waits) and snapshot_table.c (one table's rows) share.  Not
 * an interface: only src/run/snapshot*.c include it.  The codes are
 * snapshot.h's: 0, the run's end code (s->end), OBX_ESTATE when the tick
 * asked to stop, or a failed read's class with errbuf filled.
 */
#ifndef OBX_SNAPSHOT_INT_H
#define OBX_SNAPSHOT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/delivery.h"
#include "obx/run/snapshot.h"

/* Ends the run with end (OBX_EIO retry, OBX_ECONFIG stop, OBX_ENOMEM) and the reason; the first one stays. */
void obx_snap_fail(struct obx_snapshot *s, int end, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* What an outcome of the delivery policy means for the run (snapcore.h).  Returns 0 or the run's end code. */
int obx_snap_delivered(struct obx_snapshot *s, enum obx_dlv_outcome o, const struct obx_dlv_result *res);

/*
 * Runs one statement through the extended protocol (a single statement only).  Returns 0 or
 * OBX_EIO with the server's message in err and its SQLSTATE in state (state may be NULL).
 */
int obx_snap_exec(PGconn *c, const char *sql, char *err, size_t errlen, char state[6]);

/* A failed read's class from its SQLSTATE: OBX_ECONFIG (a person must act) or OBX_EIO. */
int obx_snap_sql_class(PGconn *c, const char *state);

/* Serves delivery reports until room(s, bytes) holds; the tick runs meanwhile. */
int obx_snap_wait_reports(struct obx_snapshot *s, bool (*room)(const struct obx_snapshot *, size_t), size_t bytes);
/* Room for a record of bytes within the in-flight bounds (one record always goes). */
bool obx_snap_room_for(const struct obx_snapshot *s, size_t bytes);
/* Every record produced has its report. */
bool obx_snap_all_reported(const struct obx_snapshot *s, size_t bytes);
/* Waits for c's next result, serving reports and the tick meanwhile. */
int obx_snap_wait_result(struct obx_snapshot *s, PGconn *c);

/* A hold: its reports, then obx_snap_pause_ms() (snapcore.h) before the rows are read again. */
int obx_snap_pause(struct obx_snapshot *s);

/*
 * Publishes the pending rows of s->cfg's table (describe, cursor, rows; the cursor is closed
 * after its last row).  Returns 0, the run's end code or OBX_ESTATE with errbuf "", or a
 * failed read's class with errbuf filled.
 */
int obx_snap_table(struct obx_snapshot *s, PGconn *c, bool imported, char *errbuf, size_t errlen);

#endif
