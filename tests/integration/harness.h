/*
 * harness.h - helpers for integration tests against the real stack:
 * the PostgreSQL cluster started by tests/stack/pgstack.sh (a ctest
 * fixture), a per-test obx-testbroker child, an outboxd child, and a
 * librdkafka consumer that reads topics back.  Helpers fail the current
 * cmocka test on any error; nothing is skipped when a service is missing.
 */
#ifndef OBX_TEST_HARNESS_H
#define OBX_TEST_HARNESS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <sys/types.h>

#include <cmocka.h>
#include <libpq-fe.h>

struct t_stack {
	char host[64];
	char port[16];
	char user[64];
	char pgdata[512];
	char pgbin[512];
	char root[512];
	int major; /* the server's PostgreSQL major (OBX_PGMAJOR) */
};

/* Loads OBX_STACK_ENV (written by pgstack.sh start); fails the test when absent. */
void t_stack_load(struct t_stack *st);

/*
 * The stack's PostgreSQL major, 13 to 18, from OBX_PGMAJOR in the stack env
 * file; fails the test when it is missing (an env file from an older
 * pgstack.sh) or out of that range.
 */
int t_pgmajor(void);
/* The pgoutput protocol version outboxd must ask a server of major for: 1 on 13, 2 on 14, 3 on 15, 4 from 16. */
int t_pgproto(int major);
/*
 * Whether what, which needs PostgreSQL min_major or later, applies to the
 * stack's server.  When it does not, prints one line "skipped on PostgreSQL
 * N: what (needs min_major)" and returns 0; the caller then asserts what
 * outboxd does instead where it does something, or ends the test with
 * skip().  Nothing else may be skipped: a missing service still fails.
 */
int t_pg_has(int min_major, const char *what);

/*
 * Runs the cmocka tests whose names match OBX_TEST_FILTER, a comma-separated
 * list of patterns (fnmatch: * and ?), or all of them when it is unset.
 * A filter that matches none of them fails (a misspelt name in the
 * compatibility set of tests/CMakeLists.txt must not pass by running
 * nothing).  Returns what cmocka_run_group_tests returns.
 */
int t_run_tests(const struct CMUnitTest *tests, size_t n);
#define T_RUN_TESTS(tests) t_run_tests((tests), sizeof(tests) / sizeof((tests)[0]))

/* Runs pg_ctl ARGS against the stack's cluster (as postgres when root); returns its exit status. */
int t_pg_ctl(const struct t_stack *st, const char *args);

/*
 * A volume snapshot and its restore in place: t_pg_save_data() stops the
 * stack's server cleanly, copies its data directory aside and starts it
 * again; t_pg_restore_data() stops it with -m immediate, puts the copy back
 * and starts it (the same system identifier and timeline, the WAL written
 * since the copy gone).  Fail the test on error.
 */
void t_pg_save_data(const struct t_stack *st);
void t_pg_restore_data(const struct t_stack *st);

/* Starts a second throwaway cluster in statedir with extra postgresql.conf lines. */
void t_stack_start_extra(struct t_stack *st, const char *statedir, const char *extra_conf_path);
void t_stack_stop_extra(const char *statedir);
/*
 * Makes a physical standby of the cluster in primary_statedir (pgstack.sh
 * standby: a physical slot, hot_standby_feedback, from 17 slot
 * synchronization and synchronized_standby_slots) in statedir and loads it
 * into st; stop it with t_stack_stop_extra(statedir).
 */
void t_stack_standby(struct t_stack *st, const char *primary_statedir, const char *statedir);
/* Promotes the standby of statedir and waits for it (pgstack.sh promote). */
void t_stack_promote(const char *statedir);
/* Stops the server of statedir with -m immediate, a crash (pgstack.sh stop-immediate). */
void t_stack_crash(const char *statedir);

/* Connects to db (replication=database when repl); fails the test on error. */
PGconn *t_pg(const struct t_stack *st, const char *db, int repl);

/* Key/value conninfo for db, for outboxd configs. */
void t_conninfo(const struct t_stack *st, const char *db, char *buf, size_t len);

/* Runs SQL (printf-style); fails the test unless it succeeds. */
void t_exec(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs the SQL file relpath of the source tree ($OBX_SOURCE_DIR) on c; fails the test if it cannot. */
void t_exec_file(PGconn *c, const char *relpath);

/* Runs SQL returning one value; returns a malloc'd string ("" for NULL). */
/* Runs one statement in a transaction of its own and returns the WAL position read just before
 * its COMMIT: the transaction's commit record starts at or after it, so a slot confirmed up to it
 * confirmed nothing of that transaction, whatever other databases write meanwhile. *first, when
 * given, gets the statement's first value (RETURNING) or NULL. */
char *t_exec_commit_bound(PGconn *c, char **first, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
char *t_query1(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Creates a fresh database named prefix_<pid>_<n>, written to name. */
void t_create_db(const struct t_stack *st, const char *prefix, char *name, size_t len);

struct t_broker {
	pid_t pid;
	int to_fd;
	int from_fd;
	char bootstrap[1024];
};

/* Starts obx-testbroker (OBX_TESTBROKER) with n brokers. */
void t_broker_start(struct t_broker *b, int n);
/* Sends one command; returns 0 when the broker answered "ok". */
int t_broker_cmd(struct t_broker *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Stops the broker child (by its pid) and reaps it. */
void t_broker_stop(struct t_broker *b);

struct t_header {
	char *name;
	char *value; /* NUL-terminated copy; NULL for a null header value */
};

struct t_msg {
	char *topic;
	int32_t partition;
	int64_t offset;
	char *key;   /* NUL-terminated copy, NULL when no key */
	char *value; /* NUL-terminated copy, NULL when null value */
	size_t len;
	int64_t timestamp;
	struct t_header *headers;
	size_t nheaders;
};

/* Returns the value of header name (first occurrence) or NULL. */
const char *t_msg_header(const struct t_msg *m, const char *name);

/*
 * Reads topic from the beginning of every partition until want messages
 * arrived or timeout_ms passed with no new message; fails the test when a
 * partition's low watermark is above 0 (the broker evicted records).
 * Returns the number read (may exceed want); *out is malloc'd.
 */
size_t t_consume(const char *bootstrap, const char *topic, size_t want, int timeout_ms, struct t_msg **out);
/* Reads every partition of topic up to its high watermark at the start (timeout_ms without progress fails short). */
size_t t_consume_all(const char *bootstrap, const char *topic, int timeout_ms, struct t_msg **out);
void t_msgs_free(struct t_msg *m, size_t n);

/*
 * Exactly-once: keeps in all (*nall records, compacted in place) only the
 * records of committed Kafka transactions, as a read_committed consumer
 * would.  The test broker (librdkafka's mock cluster) writes no transaction
 * markers and filters nothing for read_committed (README, "Exactly-once"),
 * so the filter is the txn header: a transaction committed when the
 * progress topic holds a progress record of slot with that txn.  Frees the
 * records dropped; returns how many.
 */
size_t t_committed_only(const char *bootstrap, const char *slot, struct t_msg *all, size_t *nall);

/* Rows of the outbox table on pg that are not marked published (polling's pending rows). */
long t_pending_rows(PGconn *pg);

/* Starts a child process with argv; stdout+stderr go to logpath. */
pid_t t_spawn(char *const argv[], const char *logpath);
/* Waits up to timeout_ms for pid; returns its wait status, or -1 on timeout. */
int t_wait(pid_t pid, int timeout_ms);

/* Writes text to a new temp file; path written to buf. */
void t_write_file(char *path, size_t len, const char *text);

/* The peak resident set of pid in KiB (VmHWM), -1 when it cannot be read. */
long t_vm_hwm_kb(pid_t pid);

/* Runs cmd through the shell, what it prints into out; returns its exit status (-1: not an exit). */
int t_run_capture(const char *cmd, char *out, size_t len);

/* Milliseconds on the monotonic clock. */
int64_t t_now_ms(void);

/* ---- a relay under test: database with the sql/ schema, broker, outboxd ---- */

struct t_relay {
	struct t_stack st;
	char db[64];
	struct t_broker b; /* with the real broker: no child, bootstrap its PLAINTEXT listener */
	/* with the real broker: what outboxd's [kafka] section says (t_relay_kafka) */
	char kafka_conf[2048];
	char conf[64];
	char log[128];
	char slot[64];
	pid_t pid;
	PGconn *pg;      /* an ordinary connection to db */
	const char *bin; /* the daemon to run; NULL: OBX_OUTBOXD */
};

/* Creates a database (with sql/001_outbox.sql unless bare) and starts a broker. */
void t_relay_setup(struct t_relay *r, const char *prefix, int bare);
/* Writes the config: the connection, slot, broker, 1s status interval, then extra lines. */
void t_relay_config(struct t_relay *r, const char *extra);
/* Starts outboxd run -c conf [arg]; waits for "streaming from slot" unless !wait. */
void t_relay_start(struct t_relay *r, const char *arg, int wait);
/* Sends sig and waits up to timeout_ms; returns the wait status (-1 on timeout). */
int t_relay_signal(struct t_relay *r, int sig, int timeout_ms);
/*
 * A second outboxd on the same database, slot, broker and config, logging to
 * its own file (tag names it).  Not started; stop it with t_relay_twin_stop().
 */
void t_relay_twin(const struct t_relay *r, struct t_relay *twin, const char *tag);
/* Kills the twin's process and removes its log; shares everything else with r. */
void t_relay_twin_stop(struct t_relay *twin);
/* Stops everything started (outboxd, broker) and closes the connection. */
void t_relay_teardown(struct t_relay *r);
/* Number of times needle appears in the outboxd log. */
int t_log_count(const struct t_relay *r, const char *needle);
/* Prints the outboxd log (for failures). */
void t_log_dump(const struct t_relay *r);
/* The slot's confirmed_flush_lsn (0 when missing). */
uint64_t t_slot_confirmed(struct t_relay *r);
/*
 * Waits up to timeout_ms for the slot's confirmed_flush_lsn to reach the
 * server's current WAL position (read now).  Returns 1 when it did.
 */
int t_wait_confirmed_current(struct t_relay *r, int timeout_ms);
/* Waits until the slot has no active walsender; fails after timeout_ms. */
void t_slot_wait_inactive(struct t_relay *r, int timeout_ms);
/* Parses "X/X". */
uint64_t t_lsn(const char *s);

/*
 * A minimal HTTP/1.0 GET to 127.0.0.1:port; returns the status code and
 * writes the body (NUL-terminated, truncated to len) to body.  -1 on error.
 */
int t_http_get(int port, const char *path, char *body, size_t len);
/* The metrics port outboxd logged ("metrics and health on HOST:PORT"), waiting up to 10 s. */
int t_metrics_port(const struct t_relay *r);
/* Value of a metric line "name value" in a /metrics body, or -1 when absent. */
double t_metric(const char *body, const char *name);

/* ---- the real Apache Kafka broker (tests/stack/kafkastack.sh, the kafka fixture) ---- */

struct t_kafka {
	char plaintext[128];      /* 127.0.0.1:PORT; its clients are super users */
	char ssl[128];            /* localhost:PORT, a certificate for localhost and 127.0.0.1 */
	char ssl_wrong_name[128]; /* localhost:PORT, a certificate for another host name */
	char sasl_ssl[128];       /* localhost:PORT: SCRAM-SHA-512, SCRAM-SHA-256, PLAIN over TLS */
	char sasl_plaintext[128]; /* 127.0.0.1:PORT: the same without TLS */
	char ca[512];             /* the CA that signed the broker's certificates (PEM) */
	char other_ca[512];       /* a CA that signed nothing the broker shows */
	char user[64];            /* a SASL user with no ACL */
	char password_file[512];
	char admin[64]; /* a SASL super user */
	char admin_password_file[512];
	char version[32];
	char statedir[512];
};

/* Loads OBX_KAFKA_ENV (written by kafkastack.sh start); fails the test when absent. */
void t_kafka_load(struct t_kafka *k);
/* Runs kafkastack.sh cmd (kill: SIGKILL, data kept; restart: up again and serving); fails on error. */
void t_kafka_ctl(const char *cmd);
/*
 * t_relay_setup() against the real broker: no test broker child; r->b.bootstrap is the PLAINTEXT
 * listener (what the test reads with), and outboxd's [kafka] section is kafka_conf, a
 * bootstrap.servers line and whatever else it needs.
 */
void t_relay_setup_kafka(struct t_relay *r, const char *prefix, const char *kafka_conf);
/*
 * Reads every partition of topic as a read_committed consumer, up to the end it sees (the last
 * stable offset: records of aborted or open transactions never show), or until timeout_ms pass
 * without progress.  Returns the number read; *out is malloc'd.
 */
size_t t_consume_committed(const char *bootstrap, const char *topic, int timeout_ms, struct t_msg **out);
/*
 * Grants principal ("User:relay") operation (librdkafka's name: "WRITE", "READ", "DESCRIBE",
 * "IDEMPOTENT_WRITE", ...) on the resource of type ("TOPIC", "GROUP", "CLUSTER",
 * "TRANSACTIONAL_ID") named name, a literal name or, when prefixed, a prefix.  Fails on error.
 */
void t_kafka_grant(const struct t_kafka *k, const char *principal, const char *op, const char *type,
    const char *name, int prefixed);
/*
 * Creates topic with partitions (replication 1) and, when config is not NULL, one topic property
 * ("max.message.bytes=10000"); waits until every partition has a leader.  Fails on error.
 */
void t_kafka_create_topic(const struct t_kafka *k, const char *topic, int partitions, const char *config);

/* ---- helpers several test programs share ---- */
void t_insert_events(struct t_relay *r, const char *agg, int from, int to);
/* Every id in the outbox table is in the topic at least once; returns the number of records. */
size_t t_expect_all_published(struct t_relay *r, const char *agg, int timeout_ms);
/* One transaction with n events of aggregate type agg over keys k0..k(nkeys-1). */
void t_insert_txn(struct t_relay *r, const char *agg, int n, int nkeys);
/*
 * Starts outboxd that kills itself after n acknowledgements; once it
 * streams, commits one transaction of n events of agg (agg NULL: none, a
 * workload runs) and waits until it died.
 */
void t_run_until_killed_after_acks(struct t_relay *r, int n, const char *agg, int nkeys);
size_t t_count_id(const struct t_msg *m, size_t n, const char *id);
double t_relay_metric(struct t_relay *r, const char *name);
int t_cmp_str(const void *a, const void *b);
size_t t_count_header(const struct t_msg *m, size_t n, const char *header, const char *value);

#endif
