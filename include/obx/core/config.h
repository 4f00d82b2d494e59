/*
 * config.h - outboxd configuration (pure): INI file, then environment
 * overrides OUTBOXD_<SECTION>_<KEY>, then --set section.key=value.
 * Reading the file, and the checks that need libpq or librdkafka, are
 * config_load.h's; they reach this module through obx_config_set() and
 * cfg->checks.  What each key is (kind, range, default, field, whether
 * SIGHUP applies it) is described once, in config_table.h's table.
 *
 * Every value is validated as it is set; an error is one line in errbuf of
 * the form "config ORIGIN: key 'x': reason", where ORIGIN is FILE:LINE,
 * "environment OUTBOXD_..." or "--set section.key".  Secret values
 * (the conninfo password, [source] password, sensitive librdkafka properties) are never
 * copied into errbuf.
 *
 * Ownership: struct obx_config owns every string and list in it;
 * obx_config_reset() frees them.  Returned strings are borrowed from cfg.
 */
#ifndef OBX_CONFIG_H
#define OBX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/template.h"

enum obx_on_error { OBX_ON_ERROR_STOP, OBX_ON_ERROR_DEAD_LETTER };
enum obx_source_mode { OBX_SOURCE_LOGICAL, OBX_SOURCE_POLL };
/* what polling mode does with a row that failed [poll] max_attempts times */
enum obx_poll_exhausted { OBX_POLL_EXHAUSTED_DEAD_LETTER, OBX_POLL_EXHAUSTED_MARK };
enum obx_log_format { OBX_LOG_FORMAT_JSON, OBX_LOG_FORMAT_TEXT };
enum obx_log_level { OBX_LOG_ERROR, OBX_LOG_WARN, OBX_LOG_INFO, OBX_LOG_DEBUG };

struct obx_kv {
	char *key;
	char *value;
	char *origin; /* where the value came from, for later error messages */
};

/*
 * One entry of [source] table: a schema and a table name, each exact
 * (double-quoted, or unquoted and folded to lower case) or, unquoted with a
 * '*', a shell-style pattern where '*' matches any run of characters.
 */
struct obx_table_pat {
	char *schema;
	char *name;
	bool schema_wild;
	bool name_wild;
};

/*
 * One [outbox.<schema>.<table>] section: the [outbox] keys it gives (in
 * file order, with their origins) and, after obx_config_finish(), the
 * whole mapping (map: [outbox] with those keys applied over it).
 */
struct obx_table_override {
	struct obx_table_pat pat;
	char *section; /* "outbox.<schema>.<table>" as written */
	struct obx_kv *keys;
	size_t nkeys;
	struct obx_config *map; /* NULL until obx_config_finish() */
};

/*
 * Checks of values that only a library with I/O can judge.  Each member may
 * be NULL: the value is then taken as it is.  obx_config_init() installs
 * none; obx_config_load() installs libpq's and librdkafka's.
 */
struct obx_config_checks {
	/* Returns 0 when value is a connection string or URI libpq accepts. */
	int (*conninfo)(const char *value);
	/*
	 * Returns 0 when librdkafka accepts property key = value, OBX_ENOENT
	 * when it knows no such property, OBX_EINVAL when it
	 * refuses the value (errbuf filled), OBX_ENOMEM.
	 */
	int (*kafka_property)(const char *key, const char *value, char *errbuf, size_t errlen);
	/*
	 * Reads a secret's value from the file at path (OUTBOXD_<SECTION>_<KEY>_FILE)
	 * into *value (the caller frees it), one trailing newline removed.
	 * Returns 0, or OBX_EIO or OBX_ENOMEM with errbuf filled (never with the
	 * file's content).
	 */
	int (*read_file)(const char *path, char **value, char *errbuf, size_t errlen);
};

struct obx_config {
	const struct obx_config_checks *checks; /* borrowed, may be NULL */

	/* [source] */
	char *conninfo; /* "" means: libpq environment only */
	char *password; /* libpq's password, over conninfo's and PGPASSWORD ("" none); a secret */
	char *slot;
	char *publication;
	char *table_schema; /* the first entry of [source] table (the only one, usually) */
	char *table_name;
	struct obx_table_pat *tables; /* every entry of [source] table, in order */
	size_t n_tables;
	bool create_slot;
	bool create_publication;
	int status_interval_ms;
	bool streaming;                /* ask the server to stream large in-progress transactions */
	long long stream_buffer_bytes; /* cap on buffered streamed events before falling back */
	bool messages;                 /* transactional logical decoding messages become events */
	char *message_prefix;
	bool failover;         /* the slot is synchronized to standbys (PostgreSQL 17+) */
	bool failover_set;     /* failover was given (file, environment or --set) */
	bool snapshot;         /* a slot created by outboxd first publishes the pending rows */
	char *snapshot_filter; /* SQL condition of those rows; "" for the default (snapshot.c) */

	/* [outbox]: column names and the topic template */
	char *col_id;
	char *col_key;
	char *col_aggregate_type;
	char *col_type;
	char *col_payload;
	char *topic;
	char *col_headers;            /* "" when unset */
	char *col_timestamp;          /* "" when unset */
	struct obx_kv *extra_headers; /* header.<name> = column, in file order */
	size_t n_extra_headers;
	/* [outbox.<schema>.<table>] sections, in file order (core/tables.h reads them) */
	struct obx_table_override *overrides;
	size_t n_overrides;

	/* [kafka]: librdkafka properties, verbatim, in the order given */
	struct obx_kv *kafka;
	size_t n_kafka;

	/* [delivery] */
	long long max_inflight;
	long long max_inflight_bytes;
	enum obx_on_error on_error;
	char *dead_letter_topic;
	long long missing_topic_timeout_ms; /* a topic that does not exist yet is waited for this long */
	bool dedupe; /* skip events a restart finds in Kafka already (core/restart_dedupe.h) */
	bool
	    exactly_once; /* Kafka transactions with a progress record (docs/internals/design.md, "Exactly-once") */
	char *transactional_id; /* "" : outboxd-<slot> */
	char *progress_topic;
	long long txn_max_events; /* a Kafka transaction ends at the first commit past any of these */
	long long txn_max_bytes;
	long long txn_max_ms;

	/*
	 * Polling mode ([source] mode = poll; docs/internals/design.md, "Polling mode"):
	 * the bookkeeping columns, mapped in [outbox], and the [poll] section.
	 */
	enum obx_source_mode mode;
	char *col_seq; /* the ordering column (bigint identity) */
	char *col_published_at;
	char *col_attempts;
	char *col_last_error;
	char *col_next_attempt_at;
	char *col_created_at; /* for the age of the oldest pending row; "" for none */
	long long poll_batch;
	int poll_interval_ms;
	long long poll_max_attempts;
	int poll_backoff_min_ms;
	int poll_backoff_max_ms;
	enum obx_poll_exhausted poll_exhausted;
	char *poll_notify_channel; /* LISTEN on it; "" for none */

	/* [metrics] */
	char *metrics_host;
	int metrics_port;
	bool detailed_health; /* /readyz gives the full reason, error text included */

	/* [log] */
	enum obx_log_level log_level;
	enum obx_log_format log_format;
	int progress_interval_ms; /* 0: no periodic progress lines */

	/* bookkeeping: keys set from the file, for duplicate detection */
	struct obx_kv *seen;
	size_t n_seen;
};

/*
 * Writes "config ORIGIN: key 'KEY': REASON" (or "config ORIGIN: REASON"
 * when key is NULL) to errbuf: the one form of every configuration error.
 */
void obx_config_fail(char *errbuf, size_t errlen, const char *origin, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/*
 * Fills cfg with the defaults (config_table.c) and no checks.  Returns 0 or
 * OBX_ENOMEM; either way pair with obx_config_reset().
 */
int obx_config_init(struct obx_config *cfg);

/* Frees everything cfg owns; cfg may be re-initialised afterwards. */
void obx_config_reset(struct obx_config *cfg);

/*
 * Validates and stores one value.  origin names where it came from (copied).
 * from_file makes a second occurrence of the same key an error.
 * Returns 0, OBX_ECONFIG with errbuf filled, or OBX_ENOMEM.
 */
int obx_config_set(struct obx_config *cfg, const char *section, const char *key, const char *value,
    const char *origin, bool from_file, char *errbuf, size_t errlen);

/*
 * True when name (without "=value") and value have the shapes the kubelet
 * gives every pod for the Services of its namespace (<SVC>_SERVICE_HOST=addr,
 * <SVC>_SERVICE_PORT[_<name>]=port, <SVC>_PORT=tcp://addr:port,
 * <SVC>_PORT_<n>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]): such variables are
 * never configuration.  OUTBOXD_METRICS_PORT=9 is not one (and stays an error).
 */
bool obx_config_is_service_link(const char *name, const char *value);

/*
 * Applies OUTBOXD_<SECTION>_<KEY>=value entries of envp (a NULL-terminated
 * environ-style array; other entries, and Kubernetes service links, are
 * ignored).  In [kafka], '_' in KEY maps to '.'.  OUTBOXD_<SECTION>_<KEY>_FILE
 * =path takes the value from a file (through cfg->checks->read_file; both
 * forms for one key is an error).  Returns 0 or OBX_ECONFIG/OBX_ENOMEM with
 * errbuf filled.
 */
int obx_config_apply_env(struct obx_config *cfg, char *const *envp, char *errbuf, size_t errlen);

/*
 * Applies one "section.key=value" override (as given to --set).
 * Returns 0 or OBX_ECONFIG/OBX_ENOMEM with errbuf filled.
 */
int obx_config_apply_set(struct obx_config *cfg, const char *assignment, char *errbuf, size_t errlen);

/*
 * Checks what only the whole configuration can tell (required values,
 * combinations: one key constraining another).  path names the file in
 * messages.  Returns 0 or OBX_ECONFIG.
 */
int obx_config_finish(struct obx_config *cfg, const char *path, char *errbuf, size_t errlen);

/*
 * Compares a running configuration with a re-read one (SIGHUP).  Writes
 * the names of the settings that differ ("[source] slot", "[kafka]", ...;
 * static strings: config_table.c's diff_name or group) to names, in table
 * order, each once, at most max; returns how many it wrote.  The log level
 * and progress interval are included like every other setting.
 */
size_t obx_config_diff(const struct obx_config *a, const struct obx_config *b, const char **names, size_t max);

/*
 * obx_config_diff() of the settings a SIGHUP cannot apply to running (in
 * its [source] mode): those whose table entry says restart, so the runner
 * names them as waiting for one.  The others take effect at once.
 */
size_t obx_config_diff_restart(const struct obx_config *running, const struct obx_config *fresh,
    const char **names, size_t max);

/*
 * name = value lists: find returns the entry of key or NULL (borrowed);
 * put adds or replaces one (copies everything; returns 0 or OBX_ENOMEM);
 * free frees a list and its entries.
 */
struct obx_kv *obx_kv_find(struct obx_kv *kv, size_t n, const char *key);
int obx_kv_put(struct obx_kv **kv, size_t *n, const char *key, const char *value, const char *origin);
void obx_kv_free(struct obx_kv *kv, size_t n);

/* Returns the value of librdkafka property key, or NULL when not set. Borrowed. */
const char *obx_config_kafka_get(const struct obx_config *cfg, const char *key);

/*
 * Adds to out the outbox columns the event builder reads (id, key, type,
 * payload, the headers and timestamp columns when set, every header.<name>
 * column and the topic template's columns), each once, in that order.
 * The names are copies; the caller frees them with obx_names_reset().
 * Returns 0, OBX_ENOMEM, or OBX_EINVAL when cfg->topic is not a template
 * (obx_config_set() refuses those).
 */
int obx_config_mapped_columns(const struct obx_config *cfg, struct obx_names *out);

/* True when librdkafka treats property key as sensitive (never print its value). */
bool obx_kafka_prop_is_secret(const char *key);

/*
 * Parsers for value kinds, exposed for tests.  Each returns 0 or OBX_EINVAL
 * (malformed) / OBX_ERANGE (outside [min, max]).
 */
int obx_parse_bool(const char *s, bool *out);
int obx_parse_duration_ms(const char *s, long long min, long long max, long long *out);
int obx_parse_size(const char *s, long long min, long long max, long long *out);
int obx_parse_int(const char *s, long long min, long long max, long long *out);

#endif
