/*
 * Restart de-duplication against the real stack (docs/internals/design.md, "Restart
 * de-duplication"): after kill -9, every committed event is in Kafka exactly
 * once and in per-key commit order; with [delivery] dedupe = off the same
 * crashes leave duplicates (so the checks can fail).  Exactly-once mode
 * (docs/internals/design.md, "Exactly-once") under the same crash loop, a fenced
 * zombie and an abortable transaction.  And the fallbacks: a
 * record of another writer at the end of a partition, a partition count
 * changed between runs and a read-back that times out all make outboxd
 * publish (at-least-once), with one line naming what it met, and lose
 * nothing.
 *
 * OBX_TEST_KILL_AFTER_ACKS (a test-build hook) makes outboxd kill itself
 * right after N acknowledgements, before a status update can confirm them.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "harness.h"

#define AGGS 96
#define TOPICS 8
#define WRITERS 2

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	t_relay_teardown(&R);
	return 0;
}

/* ---- helpers ---- */

/* One transaction with n events of aggregate type agg over keys k0..k(nkeys-1). */
static void
insert_txn(const char *agg, int n, int nkeys)
{
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || (g %% %d), 'T', jsonb_build_object('i', g) FROM generate_series(0, %d) g",
	    agg, nkeys, n - 1);
}

/*
 * Starts outboxd that kills itself after n acknowledgements; once it
 * streams, commits one transaction of n events of agg (agg NULL: none, a
 * workload runs) and waits until it died.
 */
static void
run_until_killed_after_acks(int n, const char *agg, int nkeys)
{
	char v[32];
	int st;

	snprintf(v, sizeof(v), "%d", n);
	setenv("OBX_TEST_KILL_AFTER_ACKS", v, 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	if (agg != NULL)
		insert_txn(agg, n, nkeys);
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd did not kill itself after %d acknowledgements", n);
	}
	R.pid = 0;
	t_slot_wait_inactive(&R, 15000);
}

static size_t
count_id(const struct t_msg *m, size_t n, const char *id)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++) {
		const char *v = t_msg_header(&m[i], "id");

		if (v != NULL && strcmp(v, id) == 0)
			c++;
	}
	return c;
}

/* The events outboxd said it found in Kafka and did not send again, over every run in the log. */
static long
skipped_in_log(void)
{
	FILE *fp = fopen(R.log, "r");
	char line[4096];
	long sum = 0;

	while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
		const char *p = strstr(line, "de-duplication: ");
		const char *q = strstr(line, "exactly-once: ");

		if (p != NULL && strstr(p, "were in Kafka already") != NULL)
			sum += atol(p + 16);
		if (q != NULL && strstr(q, "were in committed Kafka transactions already") != NULL)
			sum += atol(q + 14);
	}
	if (fp != NULL)
		fclose(fp);
	return sum;
}

static double
metric(const char *name)
{
	static char body[1 << 16];

	if (t_http_get(t_metrics_port(&R), "/metrics", body, sizeof(body)) != 200)
		fail_msg("could not read /metrics");
	return t_metric(body, name);
}

static rd_kafka_t *
producer(void)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char err[512];
	rd_kafka_t *rk;

	rd_kafka_conf_set(conf, "bootstrap.servers", R.b.bootstrap, err, sizeof(err));
	rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		fail_msg("producer: %s", err);
	return rk;
}

static void
produce_to(rd_kafka_t *rk, const char *topic, int32_t partition, const char *key, const char *value,
    const struct t_header *hs, size_t nh)
{
	rd_kafka_headers_t *h = rd_kafka_headers_new(nh + 1);

	for (size_t i = 0; i < nh; i++)
		rd_kafka_header_add(h, hs[i].name, -1, hs[i].value, hs[i].value ? -1 : 0);
	if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
	    RD_KAFKA_V_KEY(key, key ? strlen(key) : 0), RD_KAFKA_V_VALUE((void *)value, value ? strlen(value) : 0),
	    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END) != 0)
		fail_msg("could not produce to %s [%d]", topic, partition);
}

static void
producer_done(rd_kafka_t *rk)
{
	if (rd_kafka_flush(rk, 15000) != 0)
		fail_msg("test producer could not flush");
	rd_kafka_destroy(rk);
}

/* ---- the crash loop ---- */

static volatile sig_atomic_t writer_stop;

static void
on_term(int sig)
{
	(void)sig;
	writer_stop = 1;
}

/* Transactions of 1 to 3 aggregates (one event each, locked in id order); the side table is the truth. */
static void
writer(unsigned seed)
{
	static const char one[] =
	    "WITH v AS (UPDATE agg SET version = version + 1 WHERE id = %d RETURNING id, version), "
	    "e AS (INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "  SELECT 'dd' || (id %% %d), id::text, 'V', jsonb_build_object('version', version) FROM v "
	    "  RETURNING id, aggregateid, payload) "
	    "INSERT INTO dd_events (event_id, agg, version) "
	    "  SELECT id, aggregateid::int, (payload->>'version')::int FROM e;";
	char ci[512], sql[4096];
	PGconn *c;

	signal(SIGTERM, on_term);
	t_conninfo(&R.st, R.db, ci, sizeof(ci));
	c = PQconnectdb(ci);
	while (!writer_stop && PQstatus(c) == CONNECTION_OK) {
		int a, k;
		size_t n = 0;

		seed = seed * 1103515245u + 12345u;
		a = (int)((seed >> 8) % AGGS) + 1;
		k = (int)((seed >> 20) % 3) + 1;
		n += (size_t)snprintf(sql + n, sizeof(sql) - n, "BEGIN;");
		for (int i = 0; i < k && a + i <= AGGS; i++)
			n += (size_t)snprintf(sql + n, sizeof(sql) - n, one, a + i, TOPICS);
		snprintf(sql + n, sizeof(sql) - n, "COMMIT;");
		PQclear(PQexec(c, sql));
		usleep(1500);
	}
	PQfinish(c);
	_exit(0);
}

static int
cmp_msg(const void *a, const void *b)
{
	const struct t_msg *x = a, *y = b;
	int c = strcmp(x->topic, y->topic);

	if (c != 0)
		return c;
	if (x->partition != y->partition)
		return x->partition < y->partition ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * A workload runs while outboxd is killed with kill -9 at random moments
 * (also during start-up and its read-backs) and, every third round, kills
 * itself right after a random number of acknowledgements, before a status
 * update; then it is restarted.  Returns the number of duplicate records.
 */
enum mode { DEDUPE_OFF, DEDUPE_ON, EXACTLY_ONCE };

static const char *const mode_name[] = { "dedupe off", "dedupe on", "exactly_once" };

static size_t
crash_loop(enum mode mode, int rounds, unsigned seed)
{
	pid_t writers[WRITERS];
	struct t_msg *all = NULL;
	size_t nall = 0, dups = 0, committed, uncommitted = 0;
	char **ids;
	PGresult *res;
	int hooked = 0;
	bool dedupe = mode != DEDUPE_OFF;

	srandom(seed);
	print_message("crash loop: %s, %d rounds, seed %u\n", mode_name[mode], rounds, seed);
	t_relay_setup(&R, mode == EXACTLY_ONCE ? "eos" : dedupe ? "ddon" : "ddoff", 0);
	t_exec(R.pg, "CREATE TABLE agg (id int PRIMARY KEY, version int NOT NULL)");
	t_exec(R.pg, "INSERT INTO agg SELECT g, 0 FROM generate_series(1, %d) g", AGGS);
	t_exec(R.pg, "CREATE TABLE dd_events (event_id uuid PRIMARY KEY, agg int, version int)");
	t_relay_config(&R, mode == EXACTLY_ONCE ? "[delivery]\nexactly_once = on\n" :
	    dedupe ? "[delivery]\ndedupe = on\n" : "[delivery]\ndedupe = off\n");
	setenv("OUTBOXD_LOG_LEVEL", "info", 1);
	t_relay_start(&R, NULL, 1);
	for (int w = 0; w < WRITERS; w++) {
		writers[w] = fork();
		if (writers[w] == 0)
			writer(seed + (unsigned)w * 7919u);
	}
	for (int round = 0; round < rounds; round++) {
		usleep((useconds_t)(300000 + random() % 1200000));
		if (R.pid > 0 && waitpid(R.pid, NULL, WNOHANG) == R.pid) {
			t_log_dump(&R);
			fail_msg("outboxd exited by itself");
		}
		if (R.pid > 0) {
			kill(R.pid, SIGKILL);
			waitpid(R.pid, NULL, 0);
			R.pid = 0;
		}
		if (round % 3 == 2) {
			/* dies right after acknowledgements, before their status update */
			t_slot_wait_inactive(&R, 15000);
			run_until_killed_after_acks(1 + (int)(random() % 400), NULL, 0);
			hooked++;
		}
		/* sometimes at once, sometimes after the slot is free: during start-up and read-back too */
		t_relay_start(&R, NULL, (int)(random() % 2));
	}
	for (int w = 0; w < WRITERS; w++) {
		kill(writers[w], SIGTERM);
		waitpid(writers[w], NULL, 0);
	}
	if (R.pid > 0 && waitpid(R.pid, NULL, WNOHANG) == R.pid)
		R.pid = 0;
	if (R.pid <= 0)
		t_relay_start(&R, NULL, 1);
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not catch up");
	}
	unsetenv("OUTBOXD_LOG_LEVEL");

	for (int t = 0; t < TOPICS; t++) {
		char topic[64];
		struct t_msg *m;
		size_t n;

		snprintf(topic, sizeof(topic), "outbox.event.dd%d", t);
		n = t_consume_all(R.b.bootstrap, topic, 20000, &m); /* fails on a low watermark above 0 */
		all = realloc(all, (nall + n + 1) * sizeof(*all));
		memcpy(all + nall, m, n * sizeof(*m));
		nall += n;
		free(m);
	}

	if (mode == EXACTLY_ONCE)
		uncommitted = t_committed_only(R.b.bootstrap, R.slot, all, &nall);

	/* every committed event is there, nothing else is; count the copies */
	res = PQexec(R.pg, "SELECT event_id::text, agg, version FROM dd_events ORDER BY event_id");
	committed = (size_t)PQntuples(res);
	assert_true(committed > 0);
	ids = calloc(nall + 1, sizeof(char *));
	for (size_t i = 0; i < nall; i++)
		ids[i] = (char *)t_msg_header(&all[i], "id");
	qsort(ids, nall, sizeof(char *), cmp_str);
	{
		size_t j = 0;

		for (size_t i = 0; i < committed; i++) {
			const char *want = PQgetvalue(res, (int)i, 0);

			if (j < nall && strcmp(ids[j], want) < 0)
				fail_msg("invented event %s", ids[j]);
			if (j >= nall || strcmp(ids[j], want) != 0)
				fail_msg("committed event %s (aggregate %s version %s) is missing", want,
				    PQgetvalue(res, (int)i, 1), PQgetvalue(res, (int)i, 2));
			for (j++; j < nall && strcmp(ids[j], want) == 0; j++)
				dups++;
		}
		if (j < nall)
			fail_msg("invented event %s", ids[j]);
	}
	free(ids);
	PQclear(res);

	/* per key, in partition order: exactly 1, 2, 3, ... without duplicates; a re-sent run restarts lower */
	qsort(all, nall, sizeof(*all), cmp_msg);
	{
		int last[AGGS + 1] = { 0 };

		for (size_t i = 0; i < nall; i++) {
			int k = atoi(all[i].key);
			const char *v = strstr(all[i].value, "\"version\": ");
			int ver = v ? atoi(v + 11) : -1;

			assert_true(k >= 1 && k <= AGGS);
			if (ver > last[k] + 1)
				fail_msg("aggregate %d: version %d after %d: order broken", k, ver, last[k]);
			if (dedupe && ver != last[k] + 1)
				fail_msg("aggregate %d: version %d after %d: sent again", k, ver, last[k]);
			last[k] = ver;
		}
	}
	t_msgs_free(all, nall);
	print_message("crash loop: %s: %d kills (%d right after acknowledgements), %zu events "
	    "committed, %zu duplicates, %ld found in Kafka and not sent again, %d read-back(s) logged as "
	    "falling back, %zu record(s) of Kafka transactions that never committed\n", mode_name[mode],
	    rounds, hooked, committed, dups, skipped_in_log(), t_log_count(&R, "(at-least-once)"),
	    uncommitted);
	/* with de-duplication the restarts had events to skip: the exactly-once check proved something */
	if (dedupe)
		assert_true(skipped_in_log() > 0);
	else
		assert_int_equal(skipped_in_log(), 0);
	return dups;
}

static void
test_crash_loop_dedupe_no_duplicates(void **state)
{
	const char *s = getenv("OBX_DEDUPE_SEED");
	size_t dups;

	(void)state;
	dups = crash_loop(DEDUPE_ON, 12, s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL));
	assert_int_equal(dups, 0);
	assert_int_equal(t_log_count(&R, "(at-least-once)"), 0);
}

/*
 * The same crash loop with [delivery] exactly_once = on, 5 requests in
 * flight (the mock broker checks a transactional producer's sequences):
 * what committed Kafka transactions hold is every committed event once, in
 * per-key order.
 */
static void
test_crash_loop_transactions(void **state)
{
	const char *s = getenv("OBX_DEDUPE_SEED");
	size_t dups;

	(void)state;
	dups = crash_loop(EXACTLY_ONCE, 12, s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL));
	assert_int_equal(dups, 0);
	assert_true(t_log_count(&R, "no progress record of it") >= 1);
}

static void
test_crash_loop_dedupe_off_duplicates(void **state)
{
	const char *s = getenv("OBX_DEDUPE_SEED");

	(void)state;
	/* the same crashes without de-duplication: the checks above can fail */
	assert_true(crash_loop(DEDUPE_OFF, 6, s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL)) > 0);
}

/* Every outbox row of the database is in the committed records of topic exactly once. */
static void
expect_committed_once(const char *topic, size_t want)
{
	struct t_msg *m;
	size_t n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	PGresult *res;

	t_committed_only(R.b.bootstrap, R.slot, m, &n);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	assert_int_equal((size_t)PQntuples(res), want);
	for (int i = 0; i < PQntuples(res); i++)
		if (count_id(m, n, PQgetvalue(res, i, 0)) != 1)
			fail_msg("event %s is in committed Kafka transactions %zu time(s)", PQgetvalue(res, i, 0),
			    count_id(m, n, PQgetvalue(res, i, 0)));
	assert_int_equal(n, want);
	PQclear(res);
	t_msgs_free(m, n);
}

/*
 * A zombie: the active instance stops (SIGSTOP) with a Kafka transaction
 * open, the server ends its connection after wal_sender_timeout, a second
 * instance takes the slot, initialises transactions with the same
 * transactional.id and publishes from the last committed progress.  When
 * the first one wakes up it must publish nothing and exit 1 on the fencing
 * error.  The test broker does not fence an older producer (librdkafka's
 * mock cluster gives each InitProducerId a new producer id; README,
 * "Exactly-once"), so once the second instance is idle the test has the
 * broker answer Produce, AddPartitionsToTxn and EndTxn with
 * INVALID_PRODUCER_EPOCH, what a broker answers a fenced producer.
 */
static void
test_zombie_is_fenced(void **state)
{
	static const int apis[] = { 0 /* Produce */, 24 /* AddPartitionsToTxn */, 26 /* EndTxn */ };
	struct t_relay S;
	int64_t t0;
	int st;

	(void)state;
	t_relay_setup(&R, "eoszombie", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	insert_txn("zomb", 100, 10);
	assert_true(t_wait_confirmed_current(&R, 30000));

	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	for (t0 = t_now_ms(); t_log_count(&S, "standby:") == 0 && t_now_ms() - t0 < 15000;)
		usleep(50000);
	assert_int_equal(t_log_count(&S, "standby:"), 1);

	/* the next transaction stays open: the brokers answer late, and the instance stops */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 5000", b), 0);
	insert_txn("zomb", 100, 10);
	for (t0 = t_now_ms(); metric("outboxd_inflight_events") == 0 && t_now_ms() - t0 < 15000;)
		usleep(20000);
	assert_true(metric("outboxd_inflight_events") > 0);
	assert_int_equal(kill(R.pid, SIGSTOP), 0);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);

	/* wal_sender_timeout ends its connection; the standby takes over and publishes */
	for (t0 = t_now_ms(); t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 40000;)
		usleep(100000);
	if (t_log_count(&S, "taking over slot") != 1) {
		kill(R.pid, SIGCONT);
		t_log_dump(&S);
		fail_msg("the standby did not take over");
	}
	assert_true(t_wait_confirmed_current(&R, 30000));
	sleep(1); /* the standby is idle: what the broker answers next is the old instance's */

	for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
		assert_int_equal(t_broker_cmd(&R.b, "request-errors %d 1000 INVALID_PRODUCER_EPOCH", apis[i]), 0);
	assert_int_equal(kill(R.pid, SIGCONT), 0);
	st = t_wait(R.pid, 30000);
	if (st == -1 && t_log_count(&R, "standby:") > 0 && t_log_count(&R, "fenced") == 0) {
		/*
		 * On waking it read its lost connection before any answer of the broker
		 * arrived: its transaction ended with the session and it waits as a standby,
		 * holding nothing.  That it published nothing is checked below like the
		 * fenced path; it must stop cleanly.
		 */
		fprintf(stderr, "zombie: noticed its lost connection before the fence; waited as a standby\n");
		assert_int_equal(kill(R.pid, SIGTERM), 0);
		st = t_wait(R.pid, 30000);
		if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			t_log_dump(&R);
			fail_msg("the old instance waiting as a standby did not stop with 0 (wait status %d)", st);
		}
		R.pid = 0;
	} else if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1) {
		t_log_dump(&R);
		fail_msg("the fenced instance did not exit 1 (wait status %d)", st);
	} else {
		/* the id names the source: system identifier, database, slot */
		char *sysid = t_query1(R.pg, "SELECT system_identifier::text FROM pg_control_system()");
		char want[512];

		snprintf(want, sizeof(want), "fenced: another instance took over transactional.id "
		    "outboxd-%s-%s-%s", sysid, R.db, R.slot);
		free(sysid);
		R.pid = 0;
		assert_int_equal(t_log_count(&R, want), 1);
	}
	for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
		assert_int_equal(t_broker_cmd(&R.b, "clear %d", apis[i]), 0);

	/* the new instance goes on; every event is in committed transactions exactly once */
	insert_txn("zomb", 50, 10);
	assert_true(t_wait_confirmed_current(&R, 30000));
	expect_committed_once("outbox.event.zomb", 250);
	assert_int_equal(t_log_count(&S, "fenced"), 0);
	t_relay_twin_stop(&S);
}

/*
 * A transaction the broker refuses to extend (AddPartitionsToTxn answered
 * TOPIC_AUTHORIZATION_FAILED once: the transaction becomes abortable): the
 * session aborts it and rewinds to the slot, and what committed Kafka
 * transactions hold is every event once.
 */
static void
test_abortable_transaction_rewinds(void **state)
{
	(void)state;
	t_relay_setup(&R, "eosabort", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	insert_txn("eosab", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_broker_cmd(&R.b, "request-errors 24 1 TOPIC_AUTHORIZATION_FAILED"), 0);
	insert_txn("eosab", 50, 5);
	insert_txn("eosab", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	if (metric("outboxd_kafka_transactions_aborted_total") < 1 || t_log_count(&R, "streaming from slot") < 2) {
		t_log_dump(&R);
		fail_msg("the injected error did not abort a transaction and rewind");
	}
	/* said in words: the commit failed, or the transaction took no more records */
	assert_int_equal(t_log_count(&R, "could not commit the Kafka transaction") +
	    t_log_count(&R, "the Kafka transaction can take no more records"), 1);
	assert_true(metric("outboxd_kafka_transactions_committed_total") >= 2);
	expect_committed_once("outbox.event.eosab", 150);
}

/*
 * The broker fences the epoch while this instance still holds the slot
 * (what a broker does to a transaction that outlived transaction.timeout.ms):
 * nobody took over, so outboxd starts a new session instead of exiting, and
 * nothing is lost or duplicated in committed transactions.
 */
static void
test_fenced_while_holding_the_slot(void **state)
{
	(void)state;
	t_relay_setup(&R, "eosfence", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	insert_txn("eosfn", 40, 4);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_broker_cmd(&R.b, "request-errors 26 1 INVALID_PRODUCER_EPOCH"), 0);
	insert_txn("eosfn", 40, 4);
	insert_txn("eosfn", 40, 4);
	if (!t_wait_confirmed_current(&R, 30000) ||
	    t_log_count(&R, "while this instance still holds slot") != 1) {
		t_log_dump(&R);
		fail_msg("the fenced epoch did not start a new session");
	}
	assert_true(waitpid(R.pid, NULL, WNOHANG) == 0); /* still running */
	assert_int_equal(t_log_count(&R, "fenced: another instance took over"), 0);
	expect_committed_once("outbox.event.eosfn", 120);
}

/*
 * Every outbox row of aggregate type agg is in the committed records of its
 * topic exactly once (at least once unless exact), and nothing else is.
 */
static void
expect_agg_committed(const char *agg, size_t want, bool exact)
{
	char topic[128];
	struct t_msg *m;
	size_t n, total = 0;
	PGresult *res;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	t_committed_only(R.b.bootstrap, R.slot, m, &n);
	res = PQexecParams(R.pg, "SELECT id::text FROM outbox WHERE aggregatetype = $1", 1, NULL, &agg, NULL,
	    NULL, 0);
	assert_int_equal((size_t)PQntuples(res), want);
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = count_id(m, n, PQgetvalue(res, i, 0));

		if (c == 0 || (exact && c != 1)) {
			t_log_dump(&R);
			fail_msg("event %s of %s is in committed Kafka transactions %zu time(s)",
			    PQgetvalue(res, i, 0), agg, c);
		}
		total += c;
	}
	assert_int_equal(n, total);
	PQclear(res);
	t_msgs_free(m, n);
}

/*
 * The data directory restored in place from an earlier copy (a volume
 * snapshot: the same system identifier, timeline and slot) while outboxd
 * was stopped, then 150 transactions committed: their commit LSNs run over
 * positions that the last progress record of the lost history already
 * covers.  None of them may be taken for a replay: every one is in
 * committed Kafka transactions, once.
 */
static void
test_restored_data_directory_publishes(void **state)
{
	uint64_t lost_end, first;
	char *v;

	(void)state;
	t_relay_setup(&R, "eosrestore", 0);
	t_relay_config(&R, "[delivery]\nexactly_once = on\n");
	t_relay_start(&R, NULL, 1);
	insert_txn("rsa", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	R.pid = 0;

	/* the copy; then a history that the restore will take away, published and marked */
	t_pg_save_data(&R.st);
	PQreset(R.pg);
	t_relay_start(&R, NULL, 1);
	for (int i = 0; i < 40; i++)
		insert_txn("rsb", 20, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	R.pid = 0;
	v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text");
	lost_end = t_lsn(v);
	free(v);

	/* the restore, and new transactions over the same positions */
	t_pg_restore_data(&R.st);
	PQreset(R.pg);
	assert_int_equal(PQstatus(R.pg), CONNECTION_OK);
	v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text");
	first = t_lsn(v);
	free(v);
	assert_true(first < lost_end); /* the restore went back */
	for (int i = 0; i < 150; i++)
		insert_txn("rsc", 1, 150);
	while (t_lsn(v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text")) <= lost_end) {
		free(v);
		insert_txn("rsd", 1, 1); /* the server's WAL goes past the lost history's end */
	}
	free(v);

	t_relay_start(&R, NULL, 1);
	if (!t_wait_confirmed_current(&R, 30000)) {
		t_log_dump(&R);
		fail_msg("the relay did not catch up after the restore");
	}
	expect_agg_committed("rsc", 150, true);
	/* the record was refused: what the replay holds of the common history may come again */
	expect_agg_committed("rsa", 50, false);
	assert_int_equal(t_log_count(&R, "is of another history"), 1);
}

static struct t_relay Q;     /* a relay on a second cluster (test_shared_transactional_id) */
static char qstate[128];

static int
teardown_two_clusters(void **state)
{
	Q.b.pid = 0; /* R's broker, stopped with R */
	t_relay_teardown(&Q);
	memset(&Q, 0, sizeof(Q));
	if (qstate[0] != '\0') {
		t_stack_stop_extra(qstate);
		rmdir(qstate);
		qstate[0] = '\0';
	}
	return teardown(state);
}

/*
 * Two databases on two servers share one explicit [delivery]
 * transactional_id and the slot name (the default, say): the last progress
 * record is the other database's, with a mark far beyond this server's
 * positions.  It names another system and database, so this session skips
 * nothing: every one of its 100 events is in committed transactions (they
 * were all skipped as "replayed" before).
 */
static void
test_shared_transactional_id(void **state)
{
	char eos[256];
	const char *saved = getenv("OBX_STACK_ENV");
	char *keep = saved != NULL ? strdup(saved) : NULL, env[160];
	uint64_t b_lsn, a_mark;
	char *v;

	(void)state;
	t_relay_setup(&R, "eosshare", 0);
	/* the id holds the slot's name, which the tests' read-back of progress records matches */
	snprintf(eos, sizeof(eos), "[delivery]\nexactly_once = on\ntransactional_id = shared-%s\n", R.slot);
	t_relay_config(&R, eos);
	/* this server's positions well beyond the second one's: four WAL segments on */
	t_exec(R.pg, "CREATE TABLE walpad (x int)");
	for (int i = 0; i < 4; i++) {
		t_exec(R.pg, "INSERT INTO walpad VALUES (%d)", i);
		free(t_query1(R.pg, "SELECT pg_switch_wal()::text"));
	}
	t_relay_start(&R, NULL, 1);
	insert_txn("sharea", 50, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	R.pid = 0;
	v = t_query1(R.pg, "SELECT pg_current_wal_lsn()::text");
	a_mark = t_lsn(v);
	free(v);

	/* the second server: a database, the same slot name, the same broker and transactional_id */
	snprintf(qstate, sizeof(qstate), "/tmp/obx-eosq-%d", (int)getpid());
	t_stack_start_extra(&Q.st, qstate, NULL);
	snprintf(env, sizeof(env), "%s/env", qstate);
	setenv("OBX_STACK_ENV", env, 1);
	t_relay_setup(&Q, "eosshareb", 0);
	if (keep != NULL)
		setenv("OBX_STACK_ENV", keep, 1);
	free(keep);
	t_broker_stop(&Q.b);
	Q.b = R.b;
	snprintf(Q.slot, sizeof(Q.slot), "%s", R.slot);
	t_relay_config(&Q, eos);
	t_relay_start(&Q, NULL, 1); /* creates the slot: nothing to skip */
	assert_int_equal(t_relay_signal(&Q, SIGTERM, 30000), 0);
	Q.pid = 0;
	for (int i = 0; i < 20; i++)
		t_exec(Q.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'shareb', "
		    "'k' || g, 'T', jsonb_build_object('i', g) FROM generate_series(1, 5) g");
	v = t_query1(Q.pg, "SELECT pg_current_wal_lsn()::text");
	b_lsn = t_lsn(v);
	free(v);
	assert_true(b_lsn < a_mark); /* the other server's mark lies beyond every event here */

	t_relay_start(&Q, NULL, 1);
	if (!t_wait_confirmed_current(&Q, 30000)) {
		t_log_dump(&Q);
		fail_msg("the second database's relay did not catch up");
	}
	{
		/* its events, read back through R's helpers (the same broker and slot name) */
		struct t_relay keep_r = R;

		R.pg = Q.pg;
		expect_agg_committed("shareb", 100, true);
		R = keep_r;
	}
	assert_int_equal(t_log_count(&Q, "was written for system "), 1);
}

/*
 * [source] messages toggled between two sessions changes what the seq
 * ordinals of a transaction count.  A transaction of a row, a message and
 * 1,000 rows, split over Kafka transactions (the in-flight cap of 50 makes
 * each commit early): outboxd dies right after the first commit (the hook),
 * then starts with messages off.  The progress record's mark must not be
 * read against the new numbering, where every row after the message has
 * one less: each row reaches committed transactions.
 */
static void
test_messages_toggled_keeps_every_row(void **state)
{
	int st;

	(void)state;
	t_relay_setup(&R, "eosmsgs", 0);
	t_relay_config(&R, "[source]\nmessages = on\n[delivery]\nexactly_once = on\nmax_inflight = 50\n");
	setenv("OBX_TEST_KILL_AFTER_ACKS", "1", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	t_exec(R.pg, "BEGIN");
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('msgt', 'k1', 'row', '{\"n\": 0}')");
	t_exec(R.pg, "SELECT pg_logical_emit_message(true, 'outboxd', '{\"id\": \"6f1c1f7e-0000-4000-8000-0000000000a1\", \"aggregatetype\": \"msgm\", "
	    "\"aggregateid\": \"k1\", \"type\": \"msg\", \"payload\": {\"n\": 1}}')");
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'msgt', 'k' || (g %% 7), 'row', jsonb_build_object('n', g) FROM generate_series(2, 1001) g");
	t_exec(R.pg, "COMMIT");
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd did not kill itself after its first Kafka transaction");
	}
	R.pid = 0;
	t_slot_wait_inactive(&R, 15000);

	t_relay_config(&R, "[delivery]\nexactly_once = on\nmax_inflight = 50\n");
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 30000));
	expect_agg_committed("msgt", 1001, false);
	assert_int_equal(t_log_count(&R, "numbers the events of public.outbox+messages:outboxd, this "
	    "session those of public.outbox"), 1);
}

/*
 * Every event of one transaction acknowledged, none confirmed (the hook),
 * then a restart: all of them are found and skipped, and the skip counts as
 * the acknowledgement that lets the slot move on.
 */
static void
test_restart_after_acks_skips_all(void **state)
{
	struct t_msg *m;
	size_t n;
	uint64_t confirmed;
	PGresult *res;

	(void)state;
	t_relay_setup(&R, "ddacks", 0);
	t_relay_config(&R, NULL);
	run_until_killed_after_acks(300, "ddacks", 40);
	confirmed = t_slot_confirmed(&R);
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 20000));
	assert_true(t_slot_confirmed(&R) > confirmed);
	assert_int_equal((int)metric("outboxd_dedupe_skipped_total"), 300);
	assert_int_equal((int)metric("outboxd_events_published_total"), 0);
	assert_int_equal(t_log_count(&R, "300 event(s) of topic outbox.event.ddacks were in Kafka already"), 1);
	n = t_consume_all(R.b.bootstrap, "outbox.event.ddacks", 20000, &m);
	assert_int_equal(n, 300);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++)
		assert_int_equal(count_id(m, n, PQgetvalue(res, i, 0)), 1);
	PQclear(res);
	t_msgs_free(m, n);
}

/*
 * A record without outboxd's headers at the end of one partition: that
 * partition is published again (at-least-once), named in one line; the
 * others are de-duplicated; nothing is lost.
 */
static void
test_foreign_record_falls_back(void **state)
{
	struct t_msg *m;
	size_t n, again = 0, once = 0;
	int32_t part;
	PGresult *res;
	rd_kafka_t *rk;
	char line[256];

	(void)state;
	t_relay_setup(&R, "ddforeign", 0);
	t_relay_config(&R, NULL);
	run_until_killed_after_acks(200, "ddforeign", 40);
	part = rd_kafka_msg_partitioner_murmur2(NULL, "k0", 2, 4, NULL, NULL);
	rk = producer();
	produce_to(rk, "outbox.event.ddforeign", part, "k0", "not from outboxd", NULL, 0);
	producer_done(rk);

	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 20000));
	snprintf(line, sizeof(line), "de-duplication: topic outbox.event.ddforeign partition %d: the record at "
	    "offset", part);
	assert_int_equal(t_log_count(&R, line), 1);
	assert_int_equal(t_log_count(&R, "has no lsn and seq headers of outboxd (another writer); publishing "
	    "its events from the slot's position (at-least-once)"), 1);
	assert_int_equal((int)metric("outboxd_dedupe_fallbacks_total"), 1);
	n = t_consume_all(R.b.bootstrap, "outbox.event.ddforeign", 20000, &m);
	res = PQexec(R.pg, "SELECT id::text, aggregateid FROM outbox");
	assert_int_equal(PQntuples(res), 200);
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = count_id(m, n, PQgetvalue(res, i, 0));
		const char *key = PQgetvalue(res, i, 1);
		bool in_part = rd_kafka_msg_partitioner_murmur2(NULL, key, strlen(key), 4, NULL, NULL) == part;

		assert_int_equal(c, in_part ? 2 : 1); /* nothing lost; only that partition again */
		if (in_part)
			again++;
		else
			once++;
	}
	PQclear(res);
	assert_true(again > 0 && once > 0);
	assert_int_equal((int)metric("outboxd_dedupe_skipped_total"), (int)once);
	assert_int_equal(n, 200 + again + 1);
	t_msgs_free(m, n);
}

/*
 * The partition count changed between runs: the records already there were
 * placed among 4 partitions, the topic now has 8.  Detected (a key that
 * maps elsewhere), named in one line, everything published, nothing lost.
 * The test broker cannot add partitions to a topic, so the first run
 * writes to old.ddpc (4 partitions), the records are copied partition for
 * partition into new.ddpc (created with 8), and the second run's topic
 * template names new.ddpc.
 */
static void
test_partition_count_change_detected(void **state)
{
	struct t_msg *m, *m2;
	size_t n, n2;
	rd_kafka_t *rk;
	PGresult *res;

	(void)state;
	t_relay_setup(&R, "ddpc", 0);
	t_relay_config(&R, "[outbox]\ntopic = old.${aggregatetype}\n");
	run_until_killed_after_acks(100, "ddpc", 30);
	n = t_consume_all(R.b.bootstrap, "old.ddpc", 20000, &m);
	assert_int_equal(n, 100);
	assert_int_equal(t_broker_cmd(&R.b, "topic new.ddpc 8"), 0);
	rk = producer();
	for (size_t i = 0; i < n; i++)
		produce_to(rk, "new.ddpc", m[i].partition, m[i].key, m[i].value, m[i].headers, m[i].nheaders);
	producer_done(rk);
	t_msgs_free(m, n);

	t_relay_config(&R, "[outbox]\ntopic = new.${aggregatetype}\n");
	t_relay_start(&R, NULL, 1);
	assert_true(t_wait_confirmed_current(&R, 20000));
	assert_int_equal(t_log_count(&R, "de-duplication: topic new.ddpc: the record at offset"), 1);
	assert_int_equal(t_log_count(&R, "of today's 8: the partition count changed since it was written"), 1);
	assert_int_equal((int)metric("outboxd_dedupe_skipped_total"), 0);
	n2 = t_consume_all(R.b.bootstrap, "new.ddpc", 20000, &m2);
	assert_int_equal(n2, 200);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++)
		assert_int_equal(count_id(m2, n2, PQgetvalue(res, i, 0)), 2);
	PQclear(res);
	t_msgs_free(m2, n2);
}

/*
 * A read-back that cannot finish (every broker answers after 6 s, the
 * budget is 5 s): one line, the events are published, nothing is lost,
 * and the replication connection lives on meanwhile (status updates flow).
 */
static void
test_read_back_timeout_publishes(void **state)
{
	struct t_msg *m;
	size_t n;
	PGresult *res;
	int64_t deadline;

	(void)state;
	t_relay_setup(&R, "ddslow", 0);
	t_relay_config(&R, NULL);
	run_until_killed_after_acks(50, "ddslow", 10);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 6000", b), 0);
	t_relay_start(&R, NULL, 1);
	for (deadline = t_now_ms() + 30000; t_log_count(&R, "(at-least-once)") == 0;) {
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("no fallback line");
		}
		usleep(100000);
	}
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);
	assert_true(t_wait_confirmed_current(&R, 60000));
	assert_int_equal(t_log_count(&R, "de-duplication: topic outbox.event.ddslow: could not read its "
	    "metadata"), 1);
	assert_int_equal(t_log_count(&R, "streaming from slot"), 2); /* the hooked run and this one */
	n = t_consume_all(R.b.bootstrap, "outbox.event.ddslow", 20000, &m);
	assert_int_equal(n, 100);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++)
		assert_int_equal(count_id(m, n, PQgetvalue(res, i, 0)), 2);
	PQclear(res);
	t_msgs_free(m, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_restart_after_acks_skips_all, teardown),
		cmocka_unit_test_teardown(test_foreign_record_falls_back, teardown),
		cmocka_unit_test_teardown(test_partition_count_change_detected, teardown),
		cmocka_unit_test_teardown(test_read_back_timeout_publishes, teardown),
		cmocka_unit_test_teardown(test_crash_loop_dedupe_no_duplicates, teardown),
		cmocka_unit_test_teardown(test_crash_loop_transactions, teardown),
		cmocka_unit_test_teardown(test_zombie_is_fenced, teardown),
		cmocka_unit_test_teardown(test_restored_data_directory_publishes, teardown),
		cmocka_unit_test_teardown(test_messages_toggled_keeps_every_row, teardown),
		cmocka_unit_test_teardown(test_shared_transactional_id, teardown_two_clusters),
		cmocka_unit_test_teardown(test_abortable_transaction_rewinds, teardown),
		cmocka_unit_test_teardown(test_fenced_while_holding_the_slot, teardown),
		cmocka_unit_test_teardown(test_crash_loop_dedupe_off_duplicates, teardown),
	};

	return T_RUN_TESTS(tests); /* OBX_TEST_FILTER=a,b* runs the matching cases only */
}
