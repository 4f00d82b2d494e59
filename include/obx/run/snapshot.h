/*
 * snapshot.h - [source] snapshot = pending (I/O): publishes the outbox rows
 * that were already there when outboxd created its slot, read in the
 * slot's exported snapshot (or, after a crash, in a fresh one), before the
 * first streamed change.  docs/internals/design.md, "Rows pending at the slot's
 * creation", gives the argument; pg/setup.h the marker that says a snapshot
 * is unfinished.
 *
 * Ownership: the connection, the producer and the metrics are the caller's
 * and outlive the run; the run owns its builder and buffers
 * (obx_snapshot_reset()).
 */
#ifndef OBX_SNAPSHOT_H
#define OBX_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "obx/core/config.h"
#include "obx/core/delivery.h"
#include "obx/core/event.h"
#include "obx/kafka/producer.h"
#include "obx/core/lsn.h"
#include "obx/core/metrics.h"
#include "obx/core/relcache.h"
#include "obx/core/pgoutput.h"
#include "obx/core/snapcore.h"

struct obx_core;

struct obx_snapshot {
	const struct obx_config *cfg;
	struct obx_core *core;   /* the relay's: its missing-topic waits and generation (relaycore.h) */
	struct obx_delivery dlv; /* the delivery policy (delivery.h): in flight, pending, on_error */
	struct obx_kafka *kf;
	struct obx_metrics *m;
	struct obx_event_builder eb;
	bool eb_ready;
	struct obx_rel rel; /* the cursor's columns, as the event builder resolves them */
	struct obx_pg_datum *datums;
	struct obx_header *hdrs;
	size_t hdr_cap;
	char point[32];            /* the slot's creation point: the snapshot header */
	char table[600];           /* the outbox table, quoted and schema-qualified */
	uint64_t rows;             /* rows read (after a hold: the ordinal read again from) */
	struct obx_snap_hold hold; /* a missing topic's hold (snapcore.h) */
	uint64_t acked;            /* records acknowledged (dead-letter copies included) */
	uint64_t dead_lettered;
	int end;              /* 0, or how the run failed: OBX_EIO (retry) or OBX_ECONFIG (stop) */
	char reason[768];     /* why, when end != 0 */
	bool (*tick)(void *); /* the caller's, while records or the server are waited for */
	void *tick_arg;
	bool stopped;      /* the tick asked to stop */
	int64_t ticked_ms; /* when the tick last ran */
	int64_t started_ms;
	int64_t next_note_ms; /* the next progress line */
	int64_t resume_ms;    /* a hold: when the rows are read again */
	int64_t pause_ms;     /* the last hold's pause; 0 once a probe went through */
	long kill_after;      /* test builds: SIGKILL after that many acknowledgements (0: never) */
};

/*
 * What a snapshot of cfg's table reads: table (quoted, schema-qualified),
 * filter ([source] snapshot_filter, else the published_at column IS NULL
 * when the table has it, else true) and order (the seq column when the
 * table has it, else the created_at column and ctid, else ctid).  Returns
 * 0, OBX_ECONFIG (no such table, a name too long) or OBX_EIO, with errbuf.
 */
int obx_snapshot_describe(PGconn *c, const struct obx_config *cfg, char *table, size_t tlen, char *filter,
    size_t flen, char *order, size_t olen, char *errbuf, size_t errlen);

/*
 * Prepares s for one run; core (borrowed) decides how long a missing topic
 * is waited for.  Returns 0 or OBX_ENOMEM.
 */
int obx_snapshot_init(struct obx_snapshot *s, const struct obx_config *cfg, struct obx_core *core,
    struct obx_kafka *kf, struct obx_metrics *m);

/*
 * Publishes every row of cfg's outbox table that matches [source]
 * snapshot_filter (by default: the published_at column IS NULL when the
 * table has it, else every row), in insertion order
 * (obx_snapshot_describe()), and waits until each is acknowledged.  conn
 * is an ordinary connection; imported: it is already in a transaction in
 * the slot's exported snapshot, else a repeatable-read transaction starts
 * now.  start is the slot's creation point.  tick runs
 * about every 100 ms while records wait (health, signals) and returns true
 * to stop.  Returns 0 (every row acknowledged or, with on_error =
 * dead_letter, dead-lettered), OBX_EIO (a transient failure: the marker stays and
 * the next session publishes them again; so does a topic the cluster does not
 * have, until [delivery] missing_topic_timeout has passed, when on_error
 * takes its records), OBX_ESTATE (tick asked to stop)
 * or OBX_ECONFIG (the filter, the table or a rejected record with
 * on_error = stop); errbuf says why in one line.  On success the
 * transaction stays open until the caller closes conn (after dropping the
 * marker).
 */
int obx_snapshot_run(struct obx_snapshot *s, PGconn *conn, bool imported, obx_lsn start, bool (*tick)(void *),
    void *arg, char *errbuf, size_t errlen);

/* The delivery report of a record produced by obx_snapshot_run(). */
void obx_snapshot_report(struct obx_snapshot *s, uint64_t opaque, const rd_kafka_message_t *m);

/* Frees what s owns. */
void obx_snapshot_reset(struct obx_snapshot *s);

#endif
