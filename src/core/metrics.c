#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/metrics.h"

#define OBX_STR_(x) #x
#define OBX_STR(x) OBX_STR_(x)

const double obx_hist_bounds[OBX_HIST_BUCKETS] = {
	0.005,
	0.01,
	0.025,
	0.05,
	0.1,
	0.25,
	0.5,
	1,
	2,
	3,
	5,
	7.5,
	10,
	30,
	60,
	300,
};

static const char *const state_names[OBX_STATE_COUNT] = {
	"connecting",
	"streaming",
	"standby",
	"backpressured",
	"draining",
};

const char *
obx_state_name(enum obx_state s)
{
	return s < OBX_STATE_COUNT ? state_names[s] : "unknown";
}

static const char *const not_ready_texts[OBX_NOT_READY_COUNT] = {
	"",
	"connecting to PostgreSQL",
	"waiting for the broker",
	"snapshot in progress",
	"the broker refuses the login",
	"the broker's certificate is not accepted",
};

const char *
obx_not_ready_text(enum obx_not_ready r)
{
	return r < OBX_NOT_READY_COUNT ? not_ready_texts[r] : "";
}

void
obx_metrics_published(struct obx_metrics *m, uint64_t published, double now_unix)
{
	if (published > m->events_published)
		m->last_event_unix = now_unix;
	m->events_published = published;
}

void
obx_metrics_observe(struct obx_metrics *m, double seconds)
{
	size_t i;

	for (i = 0; i < OBX_HIST_BUCKETS; i++)
		if (seconds <= obx_hist_bounds[i])
			break;
	if (i < OBX_HIST_BUCKETS)
		m->hist_counts[i]++;
	m->hist_count++;
	m->hist_sum += seconds;
}

/*
 * Delivery reports (timeouts, refusals, a missing topic or authorization),
 * the error callback (connections, brokers), and the transaction's fencing.
 */
const char *const obx_kafka_error_codes[OBX_KAFKA_ERR_CODES] = {
	"_MSG_TIMED_OUT",
	"_TRANSPORT",
	"_ALL_BROKERS_DOWN",
	"_FENCED",
	"_FATAL",
	"MSG_SIZE_TOO_LARGE",
	"UNKNOWN_TOPIC_OR_PART",
	"_UNKNOWN_TOPIC",
	"TOPIC_AUTHORIZATION_FAILED",
	"NOT_ENOUGH_REPLICAS",
	"NOT_ENOUGH_REPLICAS_AFTER_APPEND",
	"REQUEST_TIMED_OUT",
	"other",
};

int
obx_metrics_kafka_error(struct obx_metrics *m, const char *name)
{
	int i;

	for (i = 0; i < OBX_KAFKA_ERR_CODES - 1; i++)
		if (name != NULL && strcmp(obx_kafka_error_codes[i], name) == 0)
			break;
	m->kafka_errors[i]++;
	return i;
}

static const char *const wal_status_names[] = { "reserved", "extended", "unreserved", "lost" };

int
obx_metrics_wal_status(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (s != NULL && strcmp(s, wal_status_names[i]) == 0)
			return i + 1;
	return 0;
}

static void
family(FILE *fp, const char *name, const char *type, const char *help)
{
	fprintf(fp, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void
gauge_u64(FILE *fp, const char *name, const char *help, uint64_t v)
{
	family(fp, name, "gauge", help);
	fprintf(fp, "%s %" PRIu64 "\n", name, v);
}

static void
counter_u64(FILE *fp, const char *name, const char *help, uint64_t v)
{
	family(fp, name, "counter", help);
	fprintf(fp, "%s %" PRIu64 "\n", name, v);
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static const char *
label_value(const char *v, char *out, size_t outlen)
{
	size_t o = 0;

	for (; *v != '\0' && o + 3 < outlen; v++) {
		if (*v == '\\' || *v == '"' || *v == '\n')
			out[o++] = '\\';
		out[o++] = *v == '\n' ? 'n' : *v;
	}
	out[o] = '\0';
	return out;
}

static void
info(FILE *fp, const struct obx_metrics *m)
{
	char slot[2 * sizeof(m->info_slot)], db[2 * sizeof(m->info_database)];
	char table[2 * sizeof(m->info_table)];

	family(fp, "outboxd_info", "gauge",
	    "1; the labels say which slot, database and table this instance relays, in which mode (streaming or poll)");
	fprintf(fp, "outboxd_info{slot=\"%s\",database=\"%s\",table=\"%s\",mode=\"%s\",version=\"%s\"} 1\n",
	    label_value(m->info_slot, slot, sizeof(slot)), label_value(m->info_database, db, sizeof(db)),
	    label_value(m->info_table, table, sizeof(table)), m->poll_mode ? "poll" : "streaming", OBX_VERSION);
}

static void
poll_metrics(FILE *fp, const struct obx_metrics *m)
{
	if (m->poll_pending_rows >= 0) {
		gauge_u64(fp, "outboxd_poll_pending_rows", "rows not yet published (published_at IS NULL)",
		    (uint64_t)m->poll_pending_rows);
		family(fp, "outboxd_poll_oldest_pending_age_seconds", "gauge",
		    "age of the oldest row not yet published, 0 when none");
		fprintf(fp, "outboxd_poll_oldest_pending_age_seconds %.3f\n", m->poll_oldest_pending_age_seconds);
		gauge_u64(fp, "outboxd_poll_retrying_rows", "rows not yet published that failed at least once",
		    (uint64_t)m->poll_retrying_rows);
		gauge_u64(fp, "outboxd_poll_max_attempts",
		    "the highest attempts count among rows not yet published",
		    (uint64_t)m->poll_max_attempts_pending);
	}
	counter_u64(fp, "outboxd_poll_failed_attempts_total",
	    "failed attempts this process recorded (attempts + 1, last_error, next_attempt_at)",
	    m->poll_failed_attempts);
	counter_u64(fp, "outboxd_poll_batches_total", "claimed batches of at least one row", m->poll_batches);
	gauge_u64(fp, "outboxd_poll_tables_left_out",
	    "outbox tables whose last turn was passed over or left out: locked, unreadable, half set up",
	    m->poll_tables_out);
}

/* The process_* families under the client libraries' names and help texts. */
static void
process_metrics(FILE *fp, const struct obx_process *p)
{
	if (p->cpu_seconds >= 0) {
		family(fp, "process_cpu_seconds_total", "counter",
		    "Total user and system CPU time spent in seconds.");
		fprintf(fp, "process_cpu_seconds_total %.2f\n", p->cpu_seconds);
	}
	if (p->resident_bytes >= 0) {
		family(fp, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
		fprintf(fp, "process_resident_memory_bytes %" PRId64 "\n", p->resident_bytes);
	}
	if (p->virtual_bytes >= 0) {
		family(fp, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
		fprintf(fp, "process_virtual_memory_bytes %" PRId64 "\n", p->virtual_bytes);
	}
	if (p->open_fds >= 0) {
		family(fp, "process_open_fds", "gauge", "Number of open file descriptors.");
		fprintf(fp, "process_open_fds %" PRId64 "\n", p->open_fds);
	}
	if (p->max_fds >= 0) {
		family(fp, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
		fprintf(fp, "process_max_fds %" PRId64 "\n", p->max_fds);
	}
	if (p->start_time_seconds >= 0) {
		family(fp, "process_start_time_seconds", "gauge",
		    "Start time of the process since unix epoch in seconds.");
		fprintf(fp, "process_start_time_seconds %.2f\n", p->start_time_seconds);
	}
}

size_t
obx_metrics_table_slot(struct obx_metrics *m, const char *name)
{
	for (size_t i = 0; i < m->ntables; i++)
		if (strcmp(m->tables[i].name, name) == 0)
			return i;
	if (m->ntables == OBX_METRICS_TABLES)
		return OBX_METRICS_TABLES;
	strlcpy(m->tables[m->ntables].name, name, sizeof(m->tables[m->ntables].name));
	m->tables[m->ntables].events = 0;
	return m->ntables++;
}

void
obx_metrics_table_event(struct obx_metrics *m, size_t slot)
{
	if (slot < m->ntables)
		m->tables[slot].events++;
	else
		m->other_table_events++;
}

char *
obx_metrics_render(const struct obx_metrics *m, const struct obx_process *proc, size_t *len)
{
	char *out = NULL;
	size_t sz = 0;
	FILE *fp = open_memstream(&out, &sz);
	uint64_t cum = 0;

	if (fp == NULL)
		return NULL;
	info(fp, m);
	family(fp, "outboxd_state", "gauge", "1 for the current state, 0 for the others");
	for (int s = 0; s < OBX_STATE_COUNT; s++)
		fprintf(fp, "outboxd_state{state=\"%s\"} %d\n", state_names[s], m->state == (enum obx_state)s);
	if (m->poll_mode) {
		/* polling mode reads no WAL: the positions and lags are not applicable (NaN), not 0 */
		static const char *const na[][2] = {
			{ "outboxd_received_lsn",
			    "highest WAL position received from the server (NaN: polling mode)" },
			{ "outboxd_confirmed_flush_lsn",
			    "WAL position confirmed to the slot (NaN: polling mode)" },
			{ "outboxd_stream_sent_lsn",
			    "how far the walsender says it has sent (NaN: polling mode)" },
			{ "outboxd_server_wal_lsn", "the server's current WAL position (NaN: polling mode)" },
			{ "outboxd_lag_bytes",
			    "server WAL position minus the slot's confirmed position (NaN: polling mode)" },
			{ "outboxd_oldest_unacked_age_seconds",
			    "age (since commit) of the oldest event not yet acknowledged (NaN: polling mode, see outboxd_poll_oldest_pending_age_seconds)" },
		};

		for (size_t i = 0; i < sizeof(na) / sizeof(na[0]); i++) {
			family(fp, na[i][0], "gauge", na[i][1]);
			fprintf(fp, "%s NaN\n", na[i][0]);
		}
		poll_metrics(fp, m);
	} else {
		gauge_u64(fp, "outboxd_received_lsn", "highest WAL position received from the server",
		    m->received_lsn);
		gauge_u64(fp, "outboxd_confirmed_flush_lsn",
		    "WAL position confirmed to the slot (everything before it is acknowledged by the broker)",
		    m->confirmed_flush_lsn);
		gauge_u64(fp, "outboxd_stream_sent_lsn",
		    "how far the walsender says it has sent (decoding's position, "
		    "not the server's WAL end: it stops while the stream is paused or down)",
		    m->stream_wal_end_lsn);
		family(fp, "outboxd_server_wal_lsn", "gauge",
		    "the server's current WAL position (a standby's replay position), read every status interval; "
		    "NaN when the last read failed");
		family(fp, "outboxd_lag_bytes", "gauge",
		    "the server's WAL position minus the slot's confirmed_flush_lsn, as the server computes it "
		    "(what outboxd status prints); NaN when the last read failed or the slot does not exist");
		if (m->server_ok)
			fprintf(fp, "outboxd_server_wal_lsn %" PRIu64 "\n", m->server_wal_lsn);
		else
			fprintf(fp, "%s NaN\n", "outboxd_server_wal_lsn");
		/* a slot that does not exist has no lag, not a lag of 0 */
		if (m->server_ok && m->has_slot)
			fprintf(fp, "outboxd_lag_bytes %" PRId64 "\n", m->lag_bytes);
		else
			fprintf(fp, "%s NaN\n", "outboxd_lag_bytes");
		counter_u64(fp, "outboxd_server_read_failures_total",
		    "reads of the slot, the server's WAL position or the publication's hold on the outbox tables that failed",
		    m->server_read_failures);
		family(fp, "outboxd_oldest_unacked_age_seconds", "gauge",
		    "age (since commit) of the oldest event not yet acknowledged by the broker, 0 when none");
		fprintf(fp, "outboxd_oldest_unacked_age_seconds %.3f\n", m->oldest_unacked_age_seconds);
	}
	family(fp, "outboxd_commit_to_ack_seconds", "histogram",
	    "time from the transaction's commit to the broker's acknowledgement, per event");
	for (int i = 0; i < OBX_HIST_BUCKETS; i++) {
		cum += m->hist_counts[i];
		fprintf(fp, "outboxd_commit_to_ack_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", obx_hist_bounds[i],
		    cum);
	}
	fprintf(fp, "outboxd_commit_to_ack_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", m->hist_count);
	fprintf(fp, "outboxd_commit_to_ack_seconds_sum %.6f\n", m->hist_sum);
	fprintf(fp, "outboxd_commit_to_ack_seconds_count %" PRIu64 "\n", m->hist_count);
	family(fp, "outboxd_missing_topic_seconds", "gauge",
	    "how long outboxd has been waiting for a topic the cluster does not have (yet); no series when none");
	if (m->missing_topic[0] != '\0') {
		char topic[2 * sizeof(m->missing_topic)];

		fprintf(fp, "outboxd_missing_topic_seconds{topic=\"%s\"} %.3f\n",
		    label_value(m->missing_topic, topic, sizeof(topic)), m->missing_topic_seconds);
	}
	counter_u64(fp, "outboxd_events_published_total", "events acknowledged by the broker",
	    m->events_published);
	family(fp, "outboxd_last_event_timestamp_seconds", "gauge",
	    "Unix time the broker last acknowledged an event (counted in outboxd_events_published_total); 0 before the first");
	fprintf(fp, "outboxd_last_event_timestamp_seconds %.3f\n", m->last_event_unix);
	counter_u64(fp, "outboxd_events_dead_lettered_total", "events sent to the dead-letter topic",
	    m->events_dead_lettered);
	family(fp, "outboxd_table_events_total", "counter",
	    "outbox rows of committed transactions read, by table (the first " OBX_STR(
	        OBX_METRICS_TABLES) " tables; later ones under table=\"_other\")");
	for (size_t i = 0; i < m->ntables; i++) {
		char table[2 * sizeof(m->tables[i].name)];

		fprintf(fp, "outboxd_table_events_total{table=\"%s\"} %" PRIu64 "\n",
		    label_value(m->tables[i].name, table, sizeof(table)), m->tables[i].events);
	}
	if (m->ntables == OBX_METRICS_TABLES)
		fprintf(fp, "outboxd_table_events_total{table=\"_other\"} %" PRIu64 "\n", m->other_table_events);
	counter_u64(fp, "outboxd_dedupe_skipped_total",
	    "events not sent again after a restart: read back from their partition (de-duplication)",
	    m->dedupe_skipped);
	counter_u64(fp, "outboxd_dedupe_fallbacks_total",
	    "topics and partitions whose events a session published without de-duplication (at-least-once)",
	    m->dedupe_fallbacks);
	counter_u64(fp, "outboxd_transactions_total", "committed transactions received", m->transactions);
	counter_u64(fp, "outboxd_kafka_transactions_committed_total",
	    "Kafka transactions committed ([delivery] exactly_once)", m->kafka_txn_committed);
	counter_u64(fp, "outboxd_kafka_transactions_aborted_total",
	    "Kafka transactions ended without a commit ([delivery] exactly_once): aborted, or left to the next "
	    "session's init_transactions",
	    m->kafka_txn_aborted);
	counter_u64(fp, "outboxd_messages_refused_total",
	    "non-transactional logical decoding messages with the event prefix, not published",
	    m->messages_refused);
	counter_u64(fp, "outboxd_stream_aborted_events_total",
	    "buffered events of streamed transactions or savepoints that rolled back, discarded",
	    m->stream_aborted_events);
	gauge_u64(fp, "outboxd_stream_buffer_bytes",
	    "memory held by outbox rows of streamed transactions not yet committed", m->stream_buffer_bytes);
	gauge_u64(fp, "outboxd_inflight_events", "events handed to the producer and not yet acknowledged",
	    m->inflight_events);
	gauge_u64(fp, "outboxd_inflight_bytes", "bytes of those events", m->inflight_bytes);
	family(fp, "outboxd_reconnects_total", "counter", "sessions ended by a failure, by the side that failed");
	fprintf(fp, "outboxd_reconnects_total{target=\"postgres\"} %" PRIu64 "\n", m->reconnects_postgres);
	fprintf(fp, "outboxd_reconnects_total{target=\"kafka\"} %" PRIu64 "\n", m->reconnects_kafka);
	family(fp, "outboxd_kafka_errors_total", "counter",
	    "delivery and producer errors by librdkafka code name (other: any code not listed)");
	for (int i = 0; i < OBX_KAFKA_ERR_CODES; i++)
		fprintf(fp, "outboxd_kafka_errors_total{code=\"%s\"} %" PRIu64 "\n", obx_kafka_error_codes[i],
		    m->kafka_errors[i]);
	if (m->has_slot) {
		family(fp, "outboxd_slot_retained_wal_bytes", "gauge",
		    "WAL the slot retains (current WAL LSN minus restart_lsn)");
		fprintf(fp, "outboxd_slot_retained_wal_bytes %" PRId64 "\n", m->slot_retained_wal_bytes);
		family(fp, "outboxd_slot_safe_wal_size_bytes", "gauge",
		    "WAL that can still be written before the slot is lost (-1: unbounded, max_slot_wal_keep_size = -1)");
		fprintf(fp, "outboxd_slot_safe_wal_size_bytes %" PRId64 "\n", m->slot_safe_wal_size_bytes);
		family(fp, "outboxd_slot_wal_status", "gauge",
		    "1 for the slot's wal_status in pg_replication_slots, 0 for the others (all 0: unknown)");
		for (int i = 0; i < 4; i++)
			fprintf(fp, "outboxd_slot_wal_status{status=\"%s\"} %d\n", wal_status_names[i],
			    m->slot_wal_status == i + 1);
		family(fp, "outboxd_slot_max_wal_keep_size_bytes", "gauge",
		    "the server's max_slot_wal_keep_size (-1: unbounded), for alerts relative to it");
		fprintf(fp, "outboxd_slot_max_wal_keep_size_bytes %" PRId64 "\n", m->slot_max_wal_keep_size_bytes);
	}
	if (proc != NULL)
		process_metrics(fp, proc);
	if (fclose(fp) != 0) {
		free(out);
		return NULL;
	}
	*len = sz;
	return out;
}
