/*
 * metrics.h - the numbers outboxd exposes (pure): a plain struct the relay
 * updates without locks, and a renderer of the Prometheus text exposition
 * format 0.0.4 from a snapshot of it.  The relay publishes snapshots to the
 * HTTP thread (see http.h); rendering never touches the live struct.
 */
#ifndef OBX_METRICS_H
#define OBX_METRICS_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

enum obx_state {
	OBX_STATE_CONNECTING,
	OBX_STATE_STREAMING,
	OBX_STATE_STANDBY,
	OBX_STATE_BACKPRESSURED,
	OBX_STATE_DRAINING,
	OBX_STATE_COUNT
};

/*
 * Why an instance is not ready, in the words /readyz gives any caller: one
 * of a fixed set chosen from the state, never from error text (which names
 * hosts, users and SQL, and stays in the log and state_reason).
 */
enum obx_not_ready {
	OBX_NOT_READY_NONE,
	OBX_NOT_READY_POSTGRES, /* connecting to PostgreSQL, or the last session failed on its side */
	OBX_NOT_READY_BROKER,   /* the last session failed on the broker's side */
	OBX_NOT_READY_SNAPSHOT, /* publishing the rows pending at the slot's creation */
	OBX_NOT_READY_LOGIN,    /* the broker refuses the producer's login (kafka_login_refused) */
	OBX_NOT_READY_TLS,      /* the broker's TLS certificate is not accepted (kafka_tls_refused) */
	OBX_NOT_READY_COUNT
};

/* commit-to-ack buckets: fine from 5 ms to 10 s, where delivery's latency lives, then 30 s to 5 min */
#define OBX_HIST_BUCKETS 16
/*
 * The librdkafka error codes outboxd_kafka_errors_total{code} has a series
 * for, each rendered from the start (0) so rate() sees the first error; any
 * other code counts under "other" (the log names it).  Indexes into
 * obx_metrics.kafka_errors, in obx_kafka_error_codes' order.
 */
#define OBX_KAFKA_ERR_CODES 13
extern const char *const obx_kafka_error_codes[OBX_KAFKA_ERR_CODES];

/*
 * outboxd_table_events_total{table} has a series for the first this many
 * tables that had an event; the events of any further table count under
 * table="_other", so thousands of tenant tables keep the scrape bounded.
 */
#define OBX_METRICS_TABLES 256

struct obx_metrics_table {
	char name[130]; /* "schema.table" */
	uint64_t events;
};

struct obx_metrics {
	enum obx_state state;
	enum obx_not_ready not_ready; /* why not ready, for /readyz */
	char state_reason[160];       /* the full reason; /readyz shows it only with [metrics] detailed_health */
	uint64_t received_lsn;
	uint64_t confirmed_flush_lsn;
	uint64_t stream_wal_end_lsn; /* how far the stream says the walsender has sent */
	/* from the slot watch (slotwatch.h): the server's own numbers */
	int server_ok;                 /* the last read of the server succeeded */
	uint64_t server_wal_lsn;       /* pg_current_wal_lsn(), or the replay position on a standby */
	int64_t lag_bytes;             /* server_wal_lsn minus the slot's confirmed_flush_lsn */
	uint64_t server_read_failures; /* reads of the server that failed */
	double oldest_unacked_age_seconds;
	uint64_t events_published;
	double last_event_unix; /* Unix time the broker last acknowledged an event; 0 before the first */
	uint64_t events_dead_lettered;
	uint64_t dedupe_skipped;      /* events a session found in Kafka already and did not send */
	uint64_t dedupe_fallbacks;    /* topics and partitions published without de-duplication */
	uint64_t kafka_txn_committed; /* exactly-once: Kafka transactions committed */
	uint64_t kafka_txn_aborted;   /* exactly-once: Kafka transactions ended without a commit */
	uint64_t transactions;
	uint64_t messages_refused;      /* non-transactional messages with our prefix */
	uint64_t stream_aborted_events; /* buffered events of streamed (sub)transactions rolled back */
	uint64_t stream_buffer_bytes;
	uint64_t inflight_events;
	uint64_t inflight_bytes;
	bool kafka_login_refused; /* the broker refused the producer's last login; no acknowledgement since */
	bool kafka_tls_refused;   /* the broker's certificate failed verification; no acknowledgement since */
	uint64_t reconnects_postgres;
	uint64_t reconnects_kafka;
	/* commit-to-ack histogram (seconds) */
	uint64_t hist_counts[OBX_HIST_BUCKETS]; /* per bucket, not cumulative */
	uint64_t hist_count;
	double hist_sum;
	/* kafka errors by code name, one per obx_kafka_error_codes entry (the last: "other") */
	uint64_t kafka_errors[OBX_KAFKA_ERR_CODES];
	/* from the slot watch; has_slot = 0 until the first read that found the slot */
	int has_slot;
	int64_t slot_retained_wal_bytes;
	int64_t slot_safe_wal_size_bytes; /* -1 when NULL (max_slot_wal_keep_size = -1) */
	int slot_wal_status; /* 0 unknown, 1 reserved, 2 extended, 3 unreserved, 4 lost (rendered as a state set) */
	int64_t slot_max_wal_keep_size_bytes; /* max_slot_wal_keep_size; -1 unbounded */
	char missing_topic[250]; /* a topic waited for because the cluster does not have it; "" none */
	double missing_topic_seconds;
	int64_t heartbeat_ms; /* monotonic time the loop last turned */
	/*
	 * Polling mode ([source] mode = poll): the WAL positions and lag above do
	 * not apply and render as NaN; these describe the table instead.
	 */
	int poll_mode;
	int64_t poll_pending_rows;              /* -1 until the first count */
	double poll_oldest_pending_age_seconds; /* 0 when none pending */
	int64_t poll_retrying_rows;             /* pending rows that failed at least once */
	int64_t poll_max_attempts_pending;      /* the highest attempts among pending rows */
	uint64_t poll_failed_attempts;          /* failures recorded (attempts + 1) by this process */
	uint64_t poll_batches;                  /* claim cycles that produced at least one row */
	uint64_t poll_tables_out; /* tables whose last turn was passed over or left out (a lock, a grant) */
	/* what these numbers describe, for outboxd_info (set once at start-up; the mode from poll_mode) */
	char info_slot[64];
	char info_database[64];
	char info_table[130];
	/* outbox rows of committed transactions read, by table (obx_metrics_table_slot()) */
	struct obx_metrics_table tables[OBX_METRICS_TABLES];
	size_t ntables;
	uint64_t other_table_events;
};

/*
 * The slot of table name ("schema.table") in m->tables, added while there
 * is room; OBX_METRICS_TABLES when the tables are full (the "_other"
 * series).  Linear in the tables seen: callers cache the slot.
 */
size_t obx_metrics_table_slot(struct obx_metrics *m, const char *name);

/* Counts one event of the table in slot (obx_metrics_table_slot()). */
void obx_metrics_table_event(struct obx_metrics *m, size_t slot);

/*
 * The process's own numbers, read at scrape time (procstat.h) and rendered
 * as the process_* metrics of the Prometheus client libraries.  -1: not
 * read (that metric is left out).
 */
struct obx_process {
	double cpu_seconds; /* user + system CPU time */
	int64_t resident_bytes;
	int64_t virtual_bytes;
	int64_t open_fds;
	int64_t max_fds;           /* the soft limit on open descriptors */
	double start_time_seconds; /* Unix time the process started */
};

/* The histogram's upper bounds in seconds (the +Inf bucket is implicit). */
extern const double obx_hist_bounds[OBX_HIST_BUCKETS];

/*
 * Sets events_published to published; when that is more than before, the
 * last event's time to now_unix (Unix seconds, read by the caller).
 */
void obx_metrics_published(struct obx_metrics *m, uint64_t published, double now_unix);

/* Records one commit-to-ack observation. */
void obx_metrics_observe(struct obx_metrics *m, double seconds);

/*
 * Counts one Kafka error under its librdkafka name (rd_kafka_err2name);
 * a name outside obx_kafka_error_codes, or NULL, counts as "other".
 * Returns the index counted.
 */
int obx_metrics_kafka_error(struct obx_metrics *m, const char *name);

/* Maps pg_replication_slots.wal_status text to slot_wal_status (0 for NULL or unknown text). */
int obx_metrics_wal_status(const char *s);

/* A printable state name ("streaming", ...). */
const char *obx_state_name(enum obx_state s);

/* The phrase for r ("" for OBX_NOT_READY_NONE); a static string. */
const char *obx_not_ready_text(enum obx_not_ready r);

/*
 * Renders m, and proc's process_* metrics (proc NULL: none), as Prometheus
 * text into a malloc'd NUL-terminated buffer (caller frees).  Returns NULL
 * when out of memory.  Both are borrowed for the call.
 */
char *obx_metrics_render(const struct obx_metrics *m, const struct obx_process *proc, size_t *len);

#endif
