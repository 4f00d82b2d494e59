/*
 * slotwatch.h - the slot as the server sees it (I/O): a thread that reads
 * pg_replication_slots and the server's WAL position on one ordinary
 * connection, every interval, whatever the replication stream is doing
 * (paused by backpressure, down, or never opened by a standby).  What an
 * SRE reads as lag is this thread's number (docs/internals/design.md, invariant 10),
 * the same one `outboxd status` prints; and a hot standby asks it whether
 * another instance still streams from the slot instead of opening a
 * replication session that the server would refuse with an ERROR line.
 *
 * Thread-safety: obx_slotwatch_read() and obx_slotwatch_fast() may be
 * called from any thread; start and stop from the owner's only.
 */
#ifndef OBX_SLOTWATCH_H
#define OBX_SLOTWATCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/coverage.h"
#include "obx/core/lsn.h"

/*
 * The slot watch's connection is named OBX_SLOTWATCH_APP followed by the
 * slot (obx_slotwatch_app_name()), so that drop-slot can tell that an
 * instance of the slot lives: every running instance holds it, streaming,
 * in backoff, waiting as a standby or publishing a snapshot.
 */
#define OBX_SLOTWATCH_APP "outboxd slot watch "

/* The application_name of slot's watch into out (len >= 64). */
void obx_slotwatch_app_name(const char *slot, char *out, size_t len);

/* What the last read found. */
struct obx_slotview {
	bool ok;                         /* the last read succeeded (false: the fields below are stale) */
	int64_t read_ms;                 /* monotonic time of the last successful read (0: none yet) */
	uint64_t failures;               /* reads that failed since start (a coverage read too) */
	bool has_slot;                   /* the slot exists */
	bool active;                     /* a walsender streams from it */
	int active_pid;                  /* that walsender's pid (0: none) */
	obx_lsn server_lsn;              /* pg_current_wal_lsn(), or the replay position on a standby */
	obx_lsn confirmed;               /* the slot's confirmed_flush_lsn (0: NULL) */
	int64_t lag_bytes;               /* server_lsn minus confirmed, as the server computes it */
	int64_t retained_wal_bytes;      /* server_lsn minus restart_lsn */
	int64_t safe_wal_size_bytes;     /* -1: NULL (max_slot_wal_keep_size = -1) */
	int wal_status;                  /* obx_metrics_wal_status() of wal_status (0: unknown) */
	int64_t max_wal_keep_size_bytes; /* -1: unbounded */
	uint32_t pin;                    /* the obx_slotwatch_pin() the last read was made under */
};

struct obx_slotwatch_state; /* shared with the thread, freed by whichever of the two lets go last */

struct obx_slotwatch {
	struct obx_slotwatch_state *st;
	pthread_t thread;
	bool running;
};

/*
 * Starts reading every interval_ms (the relay's status interval) on a
 * connection of its own, made from cfg's conninfo, password and slot (copied:
 * cfg may go before the thread).  Returns 0, or OBX_ENOMEM / OBX_EIO when
 * the thread cannot start.  A server
 * that cannot be reached is not an error: view.ok stays false and
 * view.failures counts.
 */
int obx_slotwatch_start(struct obx_slotwatch *w, const struct obx_config *cfg, int interval_ms);

/*
 * Stops the thread and closes its connection; a watch never started is
 * fine.  Waits at most 2 s: a read hanging in a connection attempt is left
 * to end on its own (it frees what it shares then).
 */
void obx_slotwatch_stop(struct obx_slotwatch *w);

/* Copies the last view into *out. */
void obx_slotwatch_read(struct obx_slotwatch *w, struct obx_slotview *out);

/* fast: read every second from now on (and once at once); otherwise every interval. */
void obx_slotwatch_fast(struct obx_slotwatch *w, bool fast);

/*
 * Reads from now on the server of c (its host, address and port, the rest
 * of the conninfo as configured): a replication connection's, so that the
 * numbers and the coverage are that server's, not another host's of a
 * multi-host conninfo.  Returns the pin's number, which the reads made
 * under it carry (struct obx_slotview.pin, obx_slotwatch_coverage()): a
 * read that began before the pin never carries it.
 */
uint32_t obx_slotwatch_pin(struct obx_slotwatch *w, PGconn *c);

/*
 * The newest reading of the publication's hold on the outbox tables
 * (core/coverage.h) made under pin, if newer than *seq: copies it into
 * *out (the caller resets it), sets *lsn to the server's WAL position read
 * before it and *seq to its number, and returns true.  False when there is
 * none newer (or no memory to copy it).
 */
bool obx_slotwatch_coverage(struct obx_slotwatch *w, uint32_t pin, uint64_t *seq, struct obx_cov *out,
    obx_lsn *lsn);

/*
 * Asks for a read now and waits up to timeout_ms for one that began after
 * the call to end.  Returns true when one ended in time.
 */
bool obx_slotwatch_refresh(struct obx_slotwatch *w, int timeout_ms);

#endif
