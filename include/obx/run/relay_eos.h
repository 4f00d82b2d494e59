/*
 * relay_eos.h - the loop's exactly-once I/O ([delivery] exactly_once;
 * docs/internals/design.md, "Exactly-once"): init_transactions and the progress read
 * at a session's start, the progress record and the sliced commit of each
 * Kafka transaction, the abort at a session's end.  Every decision is the
 * pure core's (relaycore.h: obx_core_commit_due(), the txn verdicts;
 * core/eos_progress.h: the floor, the partition); this module performs them.
 */
#ifndef OBX_RELAY_EOS_H
#define OBX_RELAY_EOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/kafka/producer.h"
#include "obx/core/metrics.h"
#include "obx/pg/stream.h"
#include "obx/core/eos_progress.h"
#include "obx/core/relaycore.h"

/* What the loop lends a session's exactly-once part; every pointer borrowed for the session. */
struct obx_relay_eos_io {
	const struct obx_config *cfg;
	struct obx_pgstream *st; /* started: START_REPLICATION made the slot this instance's */
	struct obx_kafka *kf;    /* the session's transactional producer */
	struct obx_core *core;
	struct obx_metrics *m;
	int64_t *reports_at_us; /* the loop's: set before each call that serves delivery reports */
	bool (*tick)(void *);   /* health and signals while the start waits (true: give up) */
	void *tick_arg;
	long kill_after; /* test builds: SIGKILL after a commit past N events (0: never) */
};

/* Embedded in the loop's state, zeroed once; fenced_before outlives sessions. */
struct obx_relay_eos {
	struct obx_relay_eos_io io;
	bool committing;                   /* a commit is under way (obx_kafka_txn_commit again) */
	int32_t partition;                 /* where the progress records go */
	struct obx_progress_source source; /* the history this session's records name */
	int64_t status_ms;                 /* the last status update while the session starts */
	bool have_floor;
	struct obx_progress floor; /* the trusted record, when have_floor */
	bool fenced_before;        /* the last session was fenced while its connection looked alive */
	char fenced_id[256];       /* its transactional.id */
};

/*
 * Once the slot is ours: init_transactions (fencing every older producer
 * of the transactional.id and ending its open transaction), then the last
 * committed progress record of the slot, with one line saying what the
 * replay will skip.  io is copied.  Returns OBX_CORE_RUNNING, or how the
 * session ends (OBX_CORE_END_RETRY, OBX_CORE_END_FATAL) with errbuf set
 * when it cannot go on.
 */
enum obx_core_end obx_relay_eos_open(struct obx_relay_eos *e, const struct obx_relay_eos_io *io, char *errbuf,
    size_t errlen);

/* Hands the floor found by obx_relay_eos_open() to the core; after obx_core_session_start(). */
void obx_relay_eos_start(struct obx_relay_eos *e);

/*
 * When the core says the open Kafka transaction should commit, produces
 * its progress record and commits it, a slice of at most 500 ms per call,
 * so that the loop serves status updates, health and signals while the
 * broker answers.  The outcome goes to the core (obx_core_commit_done()).
 */
void obx_relay_eos_commit(struct obx_relay_eos *e, bool idle);

/* The producer was fenced while the session runs: ends it as the core's verdict says. */
void obx_relay_eos_fenced(struct obx_relay_eos *e);

/*
 * At a session's end (end: how it ended): aborts the open transaction,
 * purging what it holds.  Returns true when a fence found another instance
 * took over (the run must stop: errbuf rewritten); a fence while the
 * connection looked alive is remembered for the next session
 * (obx_progress_taken_over()).
 */
bool obx_relay_eos_close(struct obx_relay_eos *e, enum obx_core_end end, char *errbuf, size_t errlen);

#endif
