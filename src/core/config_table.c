/*
 * config_table.c - every configuration key, once (pure).  config_table.h
 * says what each column means; config.c and the `outboxd config` command
 * read the table.  The checks of single values and the functions of a key
 * whose value is not one of the common kinds are config_kinds.c's.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config_kinds.h"
#include "obx/core/config_table.h"
#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/template.h"

/* ---- the table ------------------------------------------------------------ */

static const struct obx_cfg_choice on_off[] = { { "on", 1 }, { "off", 0 } };
static const struct obx_cfg_choice true_false[] = { { "true", 1 }, { "false", 0 } };
static const struct obx_cfg_choice modes[] = {
	{ "logical", OBX_SOURCE_LOGICAL },
	{ "poll", OBX_SOURCE_POLL },
};
static const struct obx_cfg_choice snapshots[] = { { "pending", 1 }, { "none", 0 } };
static const struct obx_cfg_choice on_errors[] = {
	{ "stop", OBX_ON_ERROR_STOP },
	{ "dead_letter", OBX_ON_ERROR_DEAD_LETTER },
};
static const struct obx_cfg_choice exhausted[] = {
	{ "dead_letter", OBX_POLL_EXHAUSTED_DEAD_LETTER },
	{ "mark", OBX_POLL_EXHAUSTED_MARK },
};
static const struct obx_cfg_choice levels[] = {
	{ "error", OBX_LOG_ERROR },
	{ "warn", OBX_LOG_WARN },
	{ "info", OBX_LOG_INFO },
	{ "debug", OBX_LOG_DEBUG },
};
static const struct obx_cfg_choice formats[] = {
	{ "json", OBX_LOG_FORMAT_JSON },
	{ "text", OBX_LOG_FORMAT_TEXT },
};

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define KEY(sec, nm) .section = sec, .name = nm, .diff_name = "[" sec "] " nm
#define FIELD(f) .off = offsetof(struct obx_config, f), .size = sizeof(((struct obx_config *)0)->f)
#define TEXT(f, fl, tn) .type = OBX_CFG_STRING, .type_name = tn, FIELD(f), .flags = (fl)
#define STR(f, fl) TEXT(f, fl, "string")
#define BOOL(f, words) .type = OBX_CFG_BOOL, .type_name = "boolean", FIELD(f), .choices = words, .nchoices = 2
#define ENUM(f, ch) .type = OBX_CFG_ENUM, .type_name = "enum", FIELD(f), .choices = ch, .nchoices = N(ch)
#define INT(f, lo, hi, txt)                                                                                       \
	.type = OBX_CFG_INT, .type_name = "integer", FIELD(f), .min = (lo), .max = (hi), .range = txt
#define DURATION(f, lo, hi, txt, ex)                                                                              \
	.type = OBX_CFG_DURATION, .type_name = "duration", FIELD(f), .min = (lo), .max = (hi), .range = txt,      \
	.example = ex
#define SIZE(f, lo, hi, txt, ex)                                                                                  \
	.type = OBX_CFG_SIZE, .type_name = "size", FIELD(f), .min = (lo), .max = (hi), .range = txt, .example = ex
#define MAP(f, n)                                                                                                 \
	.type = OBX_CFG_MAP, .off = offsetof(struct obx_config, f), .size = offsetof(struct obx_config, n)

#define HOUR (3600LL * 1000)
#define TIB (1LL << 40)

const struct obx_cfg_section obx_cfg_sections[] = {
	{ "source", "Where the events come from: the PostgreSQL server, the slot and the outbox table." },
	{ "outbox",
	    "The outbox table's columns and how a row becomes a Kafka record. A section "
	    "`[outbox.<schema>.<table>]` (a part may be a `*` pattern) gives any of these keys for the "
	    "tables it names; they take `[outbox]`'s for the keys it does not give." },
	{ "kafka",
	    "The producer's librdkafka properties, verbatim (any name librdkafka knows); "
	    "`bootstrap.servers` is required." },
	{ "delivery", "How events are handed to Kafka: bounds, failures, de-duplication, exactly-once." },
	{ "metrics", "The HTTP endpoint for `/metrics`, `/healthz` and `/readyz`." },
	{ "log", "The log lines on stderr." },
	{ "poll", "Polling mode (`[source] mode = poll`): how the table is read." },
};
const size_t obx_cfg_nsections = N(obx_cfg_sections);

const struct obx_cfg_key obx_cfg_keys[] = {
	/* [source] */
	{ KEY("source", "mode"), ENUM(mode, modes), .def = "logical",
	    .desc = "logical: read the replication slot; poll: read the table instead of the log" },
	{ KEY("source", "conninfo"), TEXT(conninfo, 0, "conninfo"), .def = "", .secret = OBX_CFG_CONNINFO,
	    .check = obx_cfg_check_conninfo,
	    .desc = "libpq key/value string or postgresql:// URI; empty: libpq's environment only" },
	{ KEY("source", "password"), STR(password, 0), .def = "", .secret = OBX_CFG_SECRET,
	    .check = obx_cfg_check_password,
	    .desc = "PostgreSQL password, over conninfo's and PGPASSWORD; set it with "
	            "OUTBOXD_SOURCE_PASSWORD_FILE" },
	{ KEY("source", "slot"), STR(slot, OBX_CFG_NONEMPTY), .def = "outboxd",
	    .desc = "logical replication slot" },
	{ KEY("source", "publication"), STR(publication, OBX_CFG_NONEMPTY), .def = "outboxd",
	    .desc = "publication of the outbox table" },
	{ KEY("source", "table"), .type = OBX_CFG_CUSTOM, .type_name = "[schema.]table, ...",
	    .custom = &obx_cfg_table_fns, .def = "public.outbox",
	    .desc = "outbox table, or several separated by commas; an unquoted `*` matches any run of "
	            "characters, in tables created later too; unquoted names fold to lower case, "
	            "double-quoted ones keep it ([several tables](../guide/several-tables.md))" },
	{ KEY("source", "create_slot"), BOOL(create_slot, true_false), .def = "true",
	    .desc = "create the slot the first time" },
	{ KEY("source", "create_publication"), BOOL(create_publication, true_false), .def = "true",
	    .desc = "create the publication if missing" },
	{ KEY("source", "status_interval"), DURATION(status_interval_ms, 100, HOUR, "100ms to 1h", "10s or 500ms"),
	    .def = "10s", .desc = "standby status update interval (a third of wal_sender_timeout when sooner)" },
	{ KEY("source", "streaming"), ENUM(streaming, on_off), .def = "off",
	    .desc = "on: the server streams large transactions before they commit (PostgreSQL 14+)" },
	{ KEY("source", "stream_buffer"), SIZE(stream_buffer_bytes, 1024, TIB, "1KiB to 1TiB", "64MiB or 65536"),
	    .def = "64MiB",
	    .desc = "memory for rows of streamed transactions not yet committed; past it, streaming off" },
	{ KEY("source", "messages"), BOOL(messages, true_false), .def = "false",
	    .desc = "transactional logical decoding messages with the prefix become events (14+)" },
	{ KEY("source", "message_prefix"), STR(message_prefix, OBX_CFG_NONEMPTY), .def = "outboxd",
	    .desc = "the prefix of those messages" },
	{ KEY("source", "failover"), BOOL(failover, on_off), .def = "on",
	    .given_off = offsetof(struct obx_config, failover_set),
	    .desc = "the slot is synchronized to standbys that run slot synchronization (17+)" },
	{ KEY("source", "snapshot"), ENUM(snapshot, snapshots), .group = "[source] snapshot", .def = "none",
	    .desc = "pending: a slot outboxd creates first publishes the rows already in the table" },
	{ KEY("source", "snapshot_filter"), STR(snapshot_filter, 0), .group = "[source] snapshot", .def = "",
	    .check = obx_cfg_check_snapshot_filter,
	    .desc = "SQL condition selecting those rows, without ';'; empty: published_at IS NULL when "
	            "the table has it, else every row" },

	/* [outbox] */
	{ KEY("outbox", "id"), STR(col_id, OBX_CFG_NONEMPTY), .group = "[outbox] columns", .def = "id",
	    .desc = "event id column (header id)" },
	{ KEY("outbox", "key"), STR(col_key, OBX_CFG_NONEMPTY), .group = "[outbox] columns", .def = "aggregateid",
	    .desc = "Kafka key column" },
	{ KEY("outbox", "aggregate_type"), STR(col_aggregate_type, OBX_CFG_NONEMPTY), .group = "[outbox] columns",
	    .def = "aggregatetype", .desc = "aggregate type column" },
	{ KEY("outbox", "type"), STR(col_type, OBX_CFG_NONEMPTY), .group = "[outbox] columns", .def = "type",
	    .desc = "event type column (header type)" },
	{ KEY("outbox", "payload"), STR(col_payload, OBX_CFG_NONEMPTY), .group = "[outbox] columns",
	    .def = "payload", .desc = "value column" },
	{ KEY("outbox", "headers"), STR(col_headers, 0), .group = "[outbox] columns", .def = "",
	    .desc = "jsonb column whose members become headers; empty: none" },
	{ KEY("outbox", "timestamp"), STR(col_timestamp, 0), .group = "[outbox] columns", .def = "",
	    .desc = "column used as the record timestamp; empty: none" },
	{ KEY("outbox", "topic"), TEXT(topic, 0, "template"), .check = obx_cfg_check_topic,
	    .def = "outbox.event.${aggregatetype}", .desc = "topic template with ${column} references" },
	{ KEY("outbox", "header.*"), MAP(extra_headers, n_extra_headers), .type_name = "column",
	    .check = obx_cfg_check_header,
	    .desc = "`header.<name> = column` adds header `<name>` from a column; outboxd's own "
	            "names are refused" },
	{ KEY("outbox", "seq"), STR(col_seq, OBX_CFG_NONEMPTY), .group = "[outbox] polling columns", .def = "seq",
	    .desc = "polling: ordering column (bigint identity)" },
	{ KEY("outbox", "published_at"), STR(col_published_at, OBX_CFG_NONEMPTY),
	    .group = "[outbox] polling columns", .def = "published_at",
	    .desc = "polling: timestamptz, NULL while pending" },
	{ KEY("outbox", "attempts"), STR(col_attempts, OBX_CFG_NONEMPTY), .group = "[outbox] polling columns",
	    .def = "attempts", .desc = "polling: integer, failed attempts" },
	{ KEY("outbox", "last_error"), STR(col_last_error, OBX_CFG_NONEMPTY), .group = "[outbox] polling columns",
	    .def = "last_error", .desc = "polling: text, why the last attempt failed" },
	{ KEY("outbox", "next_attempt_at"), STR(col_next_attempt_at, OBX_CFG_NONEMPTY),
	    .group = "[outbox] polling columns", .def = "next_attempt_at",
	    .desc = "polling: timestamptz, not claimed before" },
	{ KEY("outbox", "created_at"), STR(col_created_at, 0), .group = "[outbox] polling columns",
	    .def = "created_at",
	    .desc = "polling: record timestamp unless timestamp is set, and the age of the oldest "
	            "pending row; empty: none" },

	/* [kafka] */
	{ KEY("kafka", "*"), MAP(kafka, n_kafka), .type_name = "librdkafka property", .group = "[kafka]",
	    .secret = OBX_CFG_PROPS, .check = obx_cfg_check_kafka,
	    .desc = "any librdkafka property; enable.idempotence, acks, partitioner, "
	            "delivery.report.only.error and transactional.id are outboxd's" },

	/* [delivery] */
	{ KEY("delivery", "max_inflight"), INT(max_inflight, 1, 10000000, "1 to 10000000"), .def = "4000",
	    .desc = "events handed to the producer and not yet acknowledged" },
	{ KEY("delivery", "max_inflight_bytes"),
	    SIZE(max_inflight_bytes, 1024, TIB, "1KiB to 1TiB", "16MiB or 65536"), .def = "4MiB",
	    .desc = "their bytes; a larger record goes out alone" },
	{ KEY("delivery", "on_error"), ENUM(on_error, on_errors), .def = "stop",
	    .desc = "what an event the broker rejects for good does" },
	{ KEY("delivery", "dead_letter_topic"), STR(dead_letter_topic, OBX_CFG_NONEMPTY),
	    .def = "outbox.dead_letter", .desc = "where dead-lettered events go" },
	{ KEY("delivery", "missing_topic_timeout"),
	    DURATION(missing_topic_timeout_ms, 0, 7 * 24 * HOUR, "0 to 7 days", "5min or 30s"), .def = "5min",
	    .desc = "how long a topic the cluster does not have (yet) is waited for before on_error" },
	{ KEY("delivery", "dedupe"), BOOL(dedupe, on_off), .def = "on",
	    .desc = "after a restart, skip events already in Kafka; off: at-least-once only" },
	{ KEY("delivery", "exactly_once"), BOOL(exactly_once, on_off), .def = "off",
	    .desc = "Kafka transactions with a progress record (logical mode)" },
	{ KEY("delivery", "transactional_id"), STR(transactional_id, 0), .def = "",
	    .desc = "the producer's transactional.id with exactly_once; empty: derived from the slot" },
	{ KEY("delivery", "progress_topic"), STR(progress_topic, OBX_CFG_NONEMPTY), .def = "outboxd.progress",
	    .desc = "where each Kafka transaction's progress record goes" },
	{ KEY("delivery", "transaction_max_events"), INT(txn_max_events, 1, 10000000, "1 to 10000000"),
	    .group = "[delivery] transaction_max_*", .def = "10000",
	    .desc = "a Kafka transaction commits at this many records at the latest" },
	{ KEY("delivery", "transaction_max_bytes"),
	    SIZE(txn_max_bytes, 1024, TIB, "1KiB to 1TiB", "16MiB or 65536"),
	    .group = "[delivery] transaction_max_*", .def = "16MiB", .desc = "... or this many bytes" },
	{ KEY("delivery", "transaction_max_time"), DURATION(txn_max_ms, 0, 60000, "0 to 60s", "100ms or 1s"),
	    .group = "[delivery] transaction_max_*", .def = "100ms",
	    .desc = "... or this long after its first record" },

	/* [metrics] */
	{ KEY("metrics", "listen"), .type = OBX_CFG_CUSTOM, .type_name = "host:port",
	    .custom = &obx_cfg_listen_fns, .range = "port 0 to 65535", .def = "0.0.0.0:9898",
	    .desc = "metrics and health endpoint" },
	{ KEY("metrics", "detailed_health"), BOOL(detailed_health, on_off), .def = "off",
	    .desc = "/readyz adds the error behind a not-ready state" },

	/* [log] */
	{ KEY("log", "level"), ENUM(log_level, levels), .reload = OBX_CFG_SIGHUP, .def = "info",
	    .desc = "the lowest level logged" },
	{ KEY("log", "format"), ENUM(log_format, formats), .def = "json",
	    .desc = "one JSON object or one text line per message" },
	{ KEY("log", "progress_interval"),
	    DURATION(progress_interval_ms, 1000, 24 * HOUR, "1s to 24h, or 0 for none", "60s, or 0 for none"),
	    .flags = OBX_CFG_ZERO_NONE, .reload = OBX_CFG_SIGHUP_LOGICAL, .def = "1min",
	    .desc = "a progress line (positions, lag, rates) this often" },

	/* [poll] */
	{ KEY("poll", "batch"), INT(poll_batch, 1, 100000, "1 to 100000"), .group = "[poll]", .def = "10000",
	    .desc = "rows claimed per cycle" },
	{ KEY("poll", "poll_interval"), DURATION(poll_interval_ms, 1, 24 * HOUR, "1ms to 24h", "500ms or 5s"),
	    .group = "[poll]", .def = "1s", .desc = "the wait when a claim found nothing" },
	{ KEY("poll", "max_attempts"), INT(poll_max_attempts, 1, 1000000, "1 to 1000000"), .group = "[poll]",
	    .def = "10", .desc = "failures before a row is exhausted" },
	{ KEY("poll", "backoff_min"), DURATION(poll_backoff_min_ms, 1, 24 * HOUR, "1ms to 24h", "500ms or 5s"),
	    .group = "[poll]", .def = "1s", .desc = "delay after the first failure" },
	{ KEY("poll", "backoff_max"), DURATION(poll_backoff_max_ms, 1, 24 * HOUR, "1ms to 24h", "500ms or 5s"),
	    .group = "[poll]", .def = "5min", .desc = "the delay's cap" },
	{ KEY("poll", "exhausted"), ENUM(poll_exhausted, exhausted), .group = "[poll]", .def = "dead_letter",
	    .desc = "an exhausted row goes to dead_letter_topic, or is marked published (mark)" },
	{ KEY("poll", "notify_channel"), STR(poll_notify_channel, 0), .group = "[poll]", .def = "outboxd",
	    .desc = "LISTENed; a NOTIFY ends the wait early; empty: no LISTEN" },
};
const size_t obx_cfg_nkeys = N(obx_cfg_keys);

/* ---- lookups ---------------------------------------------------------------- */

const struct obx_cfg_section *
obx_cfg_section_find(const char *name)
{
	for (size_t i = 0; i < obx_cfg_nsections; i++)
		if (strcmp(obx_cfg_sections[i].name, name) == 0)
			return &obx_cfg_sections[i];
	return NULL;
}

const struct obx_cfg_key *
obx_cfg_find(const char *section, const char *name, const char **sub)
{
	const struct obx_cfg_key *map = NULL;

	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];
		size_t plen = strlen(k->name) - 1; /* a MAP's prefix: its name without the '*' */

		if (strcmp(k->section, section) != 0)
			continue;
		if (strcmp(k->name, name) == 0 && k->type != OBX_CFG_MAP) {
			*sub = NULL;
			return k;
		}
		if (k->type == OBX_CFG_MAP && map == NULL && strncmp(name, k->name, plen) == 0) {
			map = k;
			*sub = name + plen;
		}
	}
	return map;
}

int
obx_cfg_env_name(const struct obx_cfg_key *k, char *out, size_t outlen)
{
	size_t used = 0;
	const char *parts[] = { "OUTBOXD_", k->section, "_", k->name };
	bool kafka = strcmp(k->section, "kafka") == 0;

	/* the environment's names are upper case, and '_' stands for '.' in [kafka] only */
	if (k->type == OBX_CFG_MAP && !kafka)
		return OBX_ENOENT;
	for (size_t i = 0; i < N(parts); i++)
		for (const char *p = parts[i]; *p != '\0'; p++) {
			const char *s = *p == '*' ? "<NAME>" : NULL;
			char c = *p == '.' && kafka ? '_' : (char)toupper((unsigned char)*p);

			if (used + (s != NULL ? strlen(s) : 1) >= outlen)
				return OBX_ERANGE;
			if (s != NULL) {
				memcpy(out + used, s, strlen(s));
				used += strlen(s);
			} else {
				out[used++] = c;
			}
		}
	out[used] = '\0';
	return 0;
}

/* ---- printing a value ----------------------------------------------------- */

static long long
get_int(const struct obx_config *cfg, const struct obx_cfg_key *k)
{
	const char *p = (const char *)cfg + k->off;

	if (k->size == sizeof(bool))
		return *(const bool *)(const void *)p;
	if (k->size == sizeof(int))
		return *(const int *)(const void *)p;
	return *(const long long *)(const void *)p;
}

struct unit {
	const char *name;
	long long mult;
};

/* v in the largest of units (largest first) that divides it, the last one otherwise. */
static int
format_units(long long v, const struct unit *units, size_t n, char *out, size_t outlen)
{
	size_t i = 0;
	int len;

	while (i + 1 < n && (v == 0 || v % units[i].mult != 0))
		i++;
	len = snprintf(out, outlen, "%lld%s", v / units[i].mult, units[i].name);
	return len < 0 || (size_t)len >= outlen ? OBX_ERANGE : 0;
}

int
obx_cfg_format(const struct obx_config *cfg, const struct obx_cfg_key *k, char *out, size_t outlen)
{
	static const struct unit durations[] = { { "h", HOUR }, { "min", 60000 }, { "s", 1000 }, { "ms", 1 } };
	static const struct unit sizes[] = {
		{ "GiB", 1LL << 30 },
		{ "MiB", 1LL << 20 },
		{ "KiB", 1024 },
		{ "", 1 },
	};
	const char *s = NULL;
	long long v;
	int n;

	switch (k->type) {
	case OBX_CFG_STRING:
		s = *(char *const *)(const void *)((const char *)cfg + k->off);
		break;
	case OBX_CFG_BOOL:
		s = k->choices[get_int(cfg, k) ? 0 : 1].name;
		break;
	case OBX_CFG_ENUM:
		v = get_int(cfg, k);
		for (size_t i = 0; i < k->nchoices && s == NULL; i++)
			if (k->choices[i].value == v)
				s = k->choices[i].name;
		break;
	case OBX_CFG_INT:
		n = snprintf(out, outlen, "%lld", get_int(cfg, k));
		return n < 0 || (size_t)n >= outlen ? OBX_ERANGE : 0;
	case OBX_CFG_DURATION:
		v = get_int(cfg, k);
		if (v == 0 && (k->flags & OBX_CFG_ZERO_NONE))
			s = "0";
		else
			return format_units(v, durations, N(durations), out, outlen);
		break;
	case OBX_CFG_SIZE:
		return format_units(get_int(cfg, k), sizes, N(sizes), out, outlen);
	case OBX_CFG_CUSTOM:
		return k->custom->format(cfg, out, outlen);
	case OBX_CFG_MAP:
	default:
		return OBX_EINVAL;
	}
	if (s == NULL)
		s = "";
	return strlcpy(out, s, outlen) >= outlen ? OBX_ERANGE : 0;
}
