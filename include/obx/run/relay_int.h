/*
 * relay_int.h - the state of the streaming mode's process, shared by its
 * two files: relay.c (the loop of one session: the core's actions, the
 * stream, delivery reports, status updates) and relay_session.c (opening
 * and closing sessions, the snapshot hand-over, the metrics, the runner's
 * callbacks).  Not an interface: nothing else includes it.
 */
#ifndef OBX_RELAY_INT_H
#define OBX_RELAY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "obx/kafka/producer.h"
#include "obx/sys/log.h"
#include "obx/kafka/dedupe_lookup.h"
#include "obx/core/metrics.h"
#include "obx/pg/setup.h"
#include "obx/pg/stream.h"
#include "obx/run/relay.h"
#include "obx/run/relay_eos.h"
#include "obx/core/relaycore.h"
#include "obx/run/runner.h"
#include "obx/pg/slotwatch.h"
#include "obx/run/snapshot.h"

struct relay {
	struct obx_slotwatch watch; /* the slot as the server sees it: lag, and a standby's wait */
	const struct obx_config *cfg;
	const struct obx_run_opts *opts;
	struct obx_pgstream st;
	struct obx_kafka kf;
	struct obx_lookup lk;  /* reads topics back for restart de-duplication */
	struct obx_core *core; /* the decisions (relaycore.h) */
	struct obx_metrics m;
	struct obx_runner run;        /* HTTP, heartbeat, title, signals, the session loop */
	struct obx_pgsetup_ctx setup; /* lines said once, the tick while the setup waits */

	enum obx_core_end end; /* how the last session ended */
	char reason[1024];
	struct obx_logfields_kept reason_fields; /* what reason concerns, for its line */
	bool streamed;                           /* the last session got as far as streaming */
	int64_t streamed_since_ms;               /* when it did (obx_session_progressed()) */
	obx_lsn flush_at_stream;                 /* the confirmed position then */
	bool slot_seen;                          /* some session of this process found or created the slot */
	bool standby;                            /* the slot is in use by another instance */
	bool end_kafka;                          /* the last session ended because of the broker side */
	bool first_message;                      /* logged once per process */
	int announced_interval;                  /* the status interval the last session used */
	int64_t last_rx_ms;           /* the last message from the server (or the last time we were not reading) */
	int64_t reports_at_us;        /* PostgreSQL-epoch time of the delivery reports being served */
	int silence_factor;           /* times wal_sender_timeout that counts as dead (1, 2, 4, 8) */
	obx_lsn silence_at;           /* the received position when silence last ended a session */
	enum obx_log_level log_level; /* as running: SIGHUP may change it */
	int progress_interval_ms;
	uint32_t cov_pin; /* the slot watch's pin of this session (obx_slotwatch_pin()) */
	uint64_t cov_seq; /* the last coverage reading handed to the core */
	bool cov_unchecked_said;

	int64_t last_progress_ms;
	uint64_t progress_events;
	uint64_t progress_txns;
	struct obx_relay_eos eos; /* exactly-once: the session's transactions (relay_eos.h) */
	struct obx_snapshot snap; /* [source] snapshot = pending: the run under way */
	bool snapshotting;        /* delivery reports go to snap */
#ifdef OBX_TEST_HOOKS
	long test_fatal_after;
	long test_produced;
	long test_kill_after;
#endif
};

/* relay.c: the core's actions, and the delivery reports of every source of the session. */
extern const struct obx_core_ops obx_relay_core_ops;
void obx_relay_on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *m);
/* Hands the slot watch's newest coverage reading of this session to the core. */
void obx_relay_serve_coverage(struct relay *r);
/* One session's loop, until the core says it ended (the runner's run). */
void obx_relay_loop(void *ctx);

/* relay_session.c: the core's numbers into the metrics, the progress line, publishing. */
void obx_relay_update_metrics(struct relay *r);
/* While a setup or the snapshot waits: health, signals; true on a stop signal. */
bool obx_relay_setup_tick(void *arg);

#endif
