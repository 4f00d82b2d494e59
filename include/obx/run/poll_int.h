/*
 * poll_int.h - the state of polling mode's process ([source] mode = poll),
 * shared by its three files: poll.c (one claimed batch: produce, delivery
 * reports, the wait), poll_mark.c (recording failures and marking rows in
 * the batch's transaction), poll_session.c (connections, the idle wait,
 * the runner's callbacks) and poll_tables.c (the tables polled, in turn).
 * Not an interface: nothing else includes it.
 */
#ifndef OBX_POLL_INT_H
#define OBX_POLL_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/delivery.h"
#include "obx/core/event.h"
#include "obx/kafka/producer.h"
#include "obx/sys/log.h"
#include "obx/core/metrics.h"
#include "obx/run/poll.h"
#include "obx/core/pollcore.h"
#include "obx/core/relcache.h"
#include "obx/run/runner.h"

#define OBX_POLL_STATS_INTERVAL_MS 5000
/* several tables: how long a statement waits for another session's lock on a table before the
 * table is passed over this round (session_open()) */
#define OBX_POLL_LOCK_TIMEOUT "5s"

/* One table polled: its names, its configuration (obx_tables_view()) and its statements. */
struct obx_poll_table {
	char *schema;
	char *name;
	struct obx_config view; /* borrows from the configuration and the names above */
	struct obx_poll_sql sql;
	bool checked; /* its columns were read once on this connection */
	bool skip;    /* a table a pattern matches that cannot be polled: left out until the next read */
	bool out;     /* its last turn was passed over or left out (outboxd_poll_tables_left_out) */
};

struct poller {
	const struct obx_config *cfg;  /* the table polled now: tables[round.cur].view, else base */
	const struct obx_config *base; /* the configuration */
	struct obx_poll_table *tables; /* every table polled, in turn (poll_tables.c) */
	size_t ntables;
	struct obx_poll_round round;
	bool tables_read_once;  /* a first session read the tables: a missing listed one is a warning now */
	bool warned_missing;    /* this session said so already */
	int64_t skips_until_ms; /* tables left out stay out until then (a warning each 30 s, not each round) */
	char failed_table[132]; /* the table whose claim ended the last session: the next starts after it */
	const struct obx_run_opts *opts;
	PGconn *pg;
	struct obx_kafka kf;
	bool kf_open;
	struct obx_event_builder eb;
	struct obx_poll_sql sql; /* the statements of the table polled now (tables[round.cur].sql's) */
	struct obx_rel rel;      /* the claim's result columns, built once per connection and table */
	bool rel_built;
	unsigned rel_version;
	struct obx_pg_datum *datums;
	struct obx_header *hdrs;
	size_t hdr_cap;
	struct obx_pollcore pc;  /* the claimed batch and its decisions */
	struct obx_delivery dlv; /* the delivery policy (delivery.h): pending records, copies, missing topics */
	struct obx_topic_waits waits;
	bool pg_busy; /* an early marking UPDATE is running (wait_acks) */
	struct obx_metrics m;
	struct obx_runner run;      /* HTTP, heartbeat, title, signals, the session loop */
	int signals;                /* stop signals received: the runner's count, kept here for the batch */
	int64_t stop_ms;            /* when the first one came (the runner's, for the batch) */
	int rc;                     /* how the session ended: 0 stopped, else a negative OBX_E* */
	uint64_t published_at_open; /* events published when the session opened: did it progress */
	bool listening;
	int64_t next_stats_ms;
	char reason[1024];
	enum obx_log_level log_level;
#ifdef OBX_TEST_HOOKS
	long test_kill_after; /* OBX_TEST_KILL_AFTER_ACKS: SIGKILL itself after that many acks */
	long test_acks;
	long test_fatal_before; /* OBX_TEST_FATAL_BEFORE: a producer fatal error before that produce call */
	long test_produced;
#endif
};

/* poll_tables.c: (re)reads the tables polled: one for [source] table without several, else each
 * table the server has that an entry matches.  Returns 0 or a negative OBX_E* with p->reason. */
int obx_poll_tables_read(struct poller *p);
/* poll_tables.c: makes table i the one polled (p->cfg, p->sql), reading its columns first the
 * first time on this connection.  Returns 0, OBX_ENOENT when the table is left out this round (a
 * pattern's table without polling's columns, or dropped: logged), or a negative OBX_E* with
 * p->reason. */
int obx_poll_tables_use(struct poller *p, size_t i);
/* poll_tables.c: table i's statement (what: "could not read the outbox table") failed with res:
 * what the failure does (obx_tables_read_fault()), logged.  Returns OBX_ENOENT when the table is
 * passed over or left out and the others go on, else OBX_ECONFIG or OBX_EIO; p->reason says why. */
int obx_poll_table_failed(struct poller *p, size_t i, const PGresult *res, const char *what);
/* poll_tables.c: the claim of the table polled now failed with res (freed here): nothing was
 * claimed.  Returns 0 when the table is passed over or left out (the transaction rolled back),
 * else OBX_EIO with p->reason (the session ends). */
int obx_poll_claim_failed(struct poller *p, PGresult *res);
/* poll_tables.c: frees the tables. */
void obx_poll_tables_reset(struct poller *p);

/* poll.c: one cycle (claim, produce, wait, record, mark, COMMIT): the rows claimed (> 0), 0 when
 * it claimed none or moved none (idle: wait for the poll interval), or a negative OBX_E* with
 * p->reason filled (the session ends). */
int obx_poll_cycle(struct poller *p);
/* poll.c: the producer's delivery report callback (kafka/producer.h). */
void obx_poll_on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *km);
/* poll.c: the delivery policy's actions for polled rows (delivery.h). */
extern const struct obx_delivery_ops obx_poll_dlv_ops;

/* poll_mark.c: the failed (with_delay: and their backoff) or given-up rows of the batch, by stmt.
 * Returns 0 or a negative OBX_E* with p->reason filled. */
int obx_poll_record_rows(struct poller *p, const char *stmt, enum obx_prow_state state, bool with_delay);
/* poll_mark.c: the result of an early marking UPDATE (block: wait for it).  As above. */
int obx_poll_mark_result(struct poller *p, bool block);
/* poll_mark.c: starts an early marking UPDATE when enough rows are acknowledged.  As above. */
int obx_poll_mark_early(struct poller *p);
/* poll_mark.c: marks the acknowledged rows published and COMMITs.  As above. */
int obx_poll_mark_and_commit(struct poller *p);

/*
 * poll_io.c: runs sql (one or more statements) without stopping the
 * loop: signals are read and the heartbeat published while the server
 * works, so /healthz stays green through a slow claim and a stop signal
 * cancels it (and gives the connection up when the server has not ended it
 * 5 s later, or at a second signal: the caller then ends the session).
 * Returns the last result (the caller PQclear()s it), or NULL with
 * p->reason filled when a stop signal cancelled it ("stopped") or it could
 * not be sent.  The claim and the statistics query run through it.
 */
PGresult *obx_poll_exec(struct poller *p, const char *sql);
/* poll_io.c: the claim's result columns as a relation the event builder resolves by name,
 * built once per connection.  Returns 0 or OBX_ENOMEM. */
int obx_poll_build_rel(struct poller *p, const PGresult *res);
/* poll_io.c: ev's headers for a polled row into p->hdrs (*n of them): seq is the row's. */
int obx_poll_headers(struct poller *p, const struct obx_event *ev, const char *seq, size_t *n);
/* poll_io.c: the state, /readyz's phrase for it and the full reason; published at once. */
void obx_poll_set_state(struct poller *p, enum obx_state s, enum obx_not_ready not_ready, const char *reason);

#endif
