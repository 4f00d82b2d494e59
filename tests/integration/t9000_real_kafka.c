/*
 * Against a real Apache Kafka broker (tests/stack/kafkastack.sh, the kafka
 * fixture: one KRaft node on loopback with PLAINTEXT, SSL and SASL listeners
 * and an authorizer), what the test broker cannot show:
 *
 * - logins: SCRAM-SHA-512 and SCRAM-SHA-256 over TLS, PLAIN without it, the
 *   password from a file; a wrong password is one clear line within seconds,
 *   /readyz 503, the slot held, the password shown nowhere;
 * - TLS: ssl.ca.location verifies the broker; a CA that did not sign its
 *   certificate and a certificate for another host name each give one line
 *   naming that cause;
 * - exactly-once read back by a read_committed consumer (the broker writes
 *   transaction markers and hides aborted records): kill -9 inside an open
 *   Kafka transaction, and a takeover whose InitProducerId fences the old
 *   producer for real;
 * - at-least-once with librdkafka's default of 5 requests in flight across a
 *   broker kill -9 and restart: nothing lost, per-key order kept.
 *
 * Events carry a running number n in their payload, in commit order, so a
 * key's records must show n rising.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;
static struct t_kafka K;
static int N; /* the next event's running number */

static int
setup(void **state)
{
	(void)state;
	t_kafka_load(&K);
	N = 0;
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	unsetenv("OUTBOXD_KAFKA_SASL_PASSWORD_FILE");
	t_relay_teardown(&R);
	return 0;
}

/* One transaction of n events of aggregate type R.db over nkeys keys, numbered in commit order. */
static void
insert_txn(int n, int nkeys)
{
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || (g %% %d), 'T', jsonb_build_object('n', %d + g) FROM generate_series(0, %d) g",
	    R.db, nkeys, N, n - 1);
	N += n;
}

static void
topic_of(char *buf, size_t len)
{
	snprintf(buf, len, "outbox.event.%s", R.db);
}

static long
payload_n(const struct t_msg *m)
{
	const char *p = m->value != NULL ? strstr(m->value, "\"n\": ") : NULL;

	if (p == NULL)
		fail_msg("record at %s [%d] offset %lld has no running number: %s", m->topic, m->partition,
		    (long long)m->offset, m->value ? m->value : "(null)");
	return strtol(p + 5, NULL, 10);
}

/*
 * Every outbox row (those that where selects) is among the records, once
 * when once, at least once otherwise; per key, first occurrences in log order rise in commit order.
 * Returns how many records were duplicates.
 */
static size_t
check_records(struct t_msg *m, size_t n, bool once, const char *where)
{
	char sql[512];
	PGresult *res;

	snprintf(sql, sizeof(sql), "SELECT id::text FROM outbox %s", where != NULL ? where : "");
	res = PQexec(R.pg, sql);
	size_t dups = 0;
	struct {
		char key[32];
		long last;
	} keys[64];
	size_t nkeys = 0;

	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = t_count_id(m, n, PQgetvalue(res, i, 0));

		if (c == 0 || (once && c != 1))
			fail_msg("event %s is in the topic %zu time(s), of %zu records", PQgetvalue(res, i, 0), c,
			    n);
		dups += c - 1;
	}
	/* the records of one key sit in one partition, in log order as read */
	for (size_t i = 0; i < n; i++) {
		const char *id = t_msg_header(&m[i], "id");
		long v = payload_n(&m[i]);
		size_t k;
		bool seen = false;

		for (size_t j = 0; j < i && !seen; j++) {
			const char *other = t_msg_header(&m[j], "id");

			seen = other != NULL && id != NULL && strcmp(other, id) == 0;
		}
		if (seen)
			continue; /* a re-send: its first occurrence holds its place */
		for (k = 0; k < nkeys && strcmp(keys[k].key, m[i].key ? m[i].key : "") != 0; k++)
			;
		if (k == nkeys) {
			if (nkeys == sizeof(keys) / sizeof(keys[0]))
				fail_msg("too many keys");
			snprintf(keys[k].key, sizeof(keys[k].key), "%s", m[i].key ? m[i].key : "");
			keys[k].last = -1;
			nkeys++;
		}
		if (v <= keys[k].last)
			fail_msg("key %s: event %ld after event %ld (partition %d, offset %lld): order lost",
			    keys[k].key, v, keys[k].last, m[i].partition, (long long)m[i].offset);
		keys[k].last = v;
	}
	PQclear(res);
	return dups;
}

static void
wait_log(const struct t_relay *r, const char *needle, int timeout_ms)
{
	int64_t t0 = t_now_ms();

	while (t_log_count(r, needle) == 0) {
		if (t_now_ms() - t0 > timeout_ms) {
			t_log_dump(r);
			fail_msg("outboxd did not log '%s' within %d ms", needle, timeout_ms);
		}
		usleep(50000);
	}
}

static void
stop_relay(void)
{
	int st = t_relay_signal(&R, SIGTERM, 30000);

	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop with 0 (wait status %d)", st);
	}
}

/* The number of lines of the outboxd log that hold both a and b. */
static int
lines_with(const struct t_relay *r, const char *a, const char *b)
{
	FILE *fp = fopen(r->log, "r");
	char line[8192];
	int n = 0;

	while (fp != NULL && fgets(line, sizeof(line), fp) != NULL)
		n += strstr(line, a) != NULL && strstr(line, b) != NULL;
	if (fp != NULL)
		fclose(fp);
	return n;
}

/* The whole outboxd log, for searching it. */
static char *
read_log(const struct t_relay *r)
{
	FILE *fp = fopen(r->log, "r");
	char *buf = calloc(1, 1 << 20);
	size_t n = fp != NULL ? fread(buf, 1, (1 << 20) - 1, fp) : 0;

	buf[n] = '\0';
	if (fp != NULL)
		fclose(fp);
	return buf;
}

/* A SASL login over each listener and mechanism publishes and confirms; the password comes from a file. */
static void
test_sasl_logins(void **state)
{
	static const struct {
		const char *protocol, *mechanism;
		bool tls;
	} logins[] = {
		{ "SASL_SSL", "SCRAM-SHA-512", true },
		{ "SASL_SSL", "SCRAM-SHA-256", true },
		{ "SASL_PLAINTEXT", "PLAIN", false },
	};
	char conf[2048], topic[128];

	(void)state;
	t_relay_setup_kafka(&R, "rksasl", "");
	topic_of(topic, sizeof(topic));
	setenv("OUTBOXD_KAFKA_SASL_PASSWORD_FILE", K.admin_password_file, 1);
	for (size_t i = 0; i < sizeof(logins) / sizeof(logins[0]); i++) {
		snprintf(conf, sizeof(conf),
		    "bootstrap.servers = %s\nsecurity.protocol = %s\nsasl.mechanisms = %s\nsasl.username = %s\n%s%s%s",
		    logins[i].tls ? K.sasl_ssl : K.sasl_plaintext, logins[i].protocol, logins[i].mechanism,
		    K.admin, logins[i].tls ? "ssl.ca.location = " : "", logins[i].tls ? K.ca : "",
		    logins[i].tls ? "\n" : "");
		snprintf(R.kafka_conf, sizeof(R.kafka_conf), "%s", conf);
		t_relay_config(&R, NULL);
		t_relay_start(&R, NULL, 1);
		insert_txn(30, 5);
		t_expect_all_published(&R, R.db, 30000);
		assert_int_equal(t_log_count(&R, "refused the login"), 0);
		stop_relay();
		fprintf(stderr, "%s %s: published and confirmed\n", logins[i].protocol, logins[i].mechanism);
	}
	{
		struct t_msg *m;
		size_t n = t_consume_all(R.b.bootstrap, topic, 20000, &m);

		assert_int_equal(n, (size_t)N);
		assert_int_equal(check_records(m, n, true, NULL), 0);
		t_msgs_free(m, n);
	}
}

/*
 * A wrong password: one error line within 5 s naming the protocol, the
 * mechanism and the user; /readyz 503 with its reason; the slot not past the
 * events; the password in no line, /readyz, /metrics or status.  With the
 * right one every event arrives.
 */
static void
test_wrong_password(void **state)
{
	char conf[2048], pwfile[64], body[1 << 16], *bound, *log, cmd[1024], out[8192];
	char right[128] = "";
	const char *wrong = "Wr0ngPassw0rd-4711";
	FILE *fp;
	int port, code;
	int64_t t0;

	(void)state;
	t_relay_setup_kafka(&R, "rkpass", "");
	fp = fopen(K.admin_password_file, "r");
	assert_non_null(fp);
	assert_non_null(fgets(right, sizeof(right), fp));
	fclose(fp);
	t_write_file(pwfile, sizeof(pwfile), wrong);
	setenv("OUTBOXD_KAFKA_SASL_PASSWORD_FILE", pwfile, 1);
	snprintf(conf, sizeof(conf),
	    "bootstrap.servers = %s\nsecurity.protocol = SASL_SSL\nsasl.mechanisms = SCRAM-SHA-512\n"
	    "sasl.username = %s\nssl.ca.location = %s",
	    K.sasl_ssl, K.admin, K.ca);
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "%s", conf);
	t_relay_config(&R, NULL);
	t0 = t_now_ms();
	t_relay_start(&R, NULL, 1);
	bound = t_exec_commit_bound(R.pg, NULL,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT '%s', 'k' || g, 'T', jsonb_build_object('n', g) FROM generate_series(0, 9) g",
	    R.db);
	N = 10;
	wait_log(&R, "the broker refused the login", 5000);
	fprintf(stderr, "refused login said after %lld ms\n", (long long)(t_now_ms() - t0));
	assert_int_equal(t_log_count(&R, "the broker refused the login"), 1);
	assert_int_equal(lines_with(&R, "error kafka: the broker refused the login",
	                     "(security.protocol sasl_ssl, sasl.mechanisms SCRAM-SHA-512, sasl.username admin)"),
	    1);
	port = t_metrics_port(&R);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 5000; usleep(100000)) {
		code = t_http_get(port, "/readyz", body, sizeof(body));
		if (code == 503 && strstr(body, "the broker refuses the login") != NULL)
			break;
	}
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "the broker refuses the login"));
	assert_null(strstr(body, wrong));
	sleep(3); /* status updates every second: a confirmation would have come */
	if (t_slot_confirmed(&R) > t_lsn(bound))
		fail_msg("the slot moved past events nobody acknowledged");
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_null(strstr(body, wrong));
	snprintf(cmd, sizeof(cmd), "OUTBOXD_KAFKA_SASL_PASSWORD_FILE=%s %s status -c %s 2>&1", pwfile,
	    getenv("OBX_OUTBOXD"), R.conf);
	(void)t_run_capture(cmd, out, sizeof(out));
	assert_null(strstr(out, wrong));
	log = read_log(&R);
	assert_null(strstr(log, wrong));
	assert_null(strstr(log, right));
	free(log);
	/* a stop would wait out the drain for events the broker cannot take; a crash loses nothing */
	assert_int_not_equal(t_relay_signal(&R, SIGKILL, 10000), -1);
	t_slot_wait_inactive(&R, 15000);

	/* the right password: nothing was lost meanwhile */
	t_write_file(pwfile, sizeof(pwfile), right);
	setenv("OUTBOXD_KAFKA_SASL_PASSWORD_FILE", pwfile, 1);
	t_relay_start(&R, NULL, 1);
	t_expect_all_published(&R, R.db, 30000);
	stop_relay();
	log = read_log(&R);
	assert_null(strstr(log, right));
	free(log);
	unlink(pwfile);
	free(bound);
}

/*
 * ssl.ca.location verifies the broker.  A CA that did not sign its
 * certificate, and a certificate for another host name, each give one error
 * line within 5 s naming that cause, and /readyz says why; nothing is
 * confirmed.  The right CA then publishes every event.
 */
static void
test_tls_verification(void **state)
{
	static const struct {
		const char *what, *needle;
		bool other_ca, wrong_name;
	} cases[] = {
		{ "another CA", "no CA in ssl.ca.location signed it", true, false },
		{ "another host name", "it does not name the host outboxd connected to", false, true },
	};
	char body[4096];

	(void)state;
	t_relay_setup_kafka(&R, "rktls", "");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int port, code = 0;
		int64_t t0;
		char *bound;

		snprintf(R.kafka_conf, sizeof(R.kafka_conf),
		    "bootstrap.servers = %s\nsecurity.protocol = SSL\nssl.ca.location = %s",
		    cases[i].wrong_name ? K.ssl_wrong_name : K.ssl, cases[i].other_ca ? K.other_ca : K.ca);
		t_relay_config(&R, NULL);
		unlink(R.log); /* each case's lines alone */
		t0 = t_now_ms();
		t_relay_start(&R, NULL, 1);
		bound = t_exec_commit_bound(R.pg, NULL,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "SELECT '%s', 'k' || g, 'T', jsonb_build_object('n', %d + g) FROM generate_series(0, 9) g",
		    R.db, N);
		N += 10;
		wait_log(&R, "kafka: TLS with", 5000);
		fprintf(stderr, "%s: said after %lld ms\n", cases[i].what, (long long)(t_now_ms() - t0));
		if (t_log_count(&R, "kafka: TLS with") != 1) {
			t_log_dump(&R);
			fail_msg("%d lines say that TLS failed", t_log_count(&R, "kafka: TLS with"));
		}
		assert_int_equal(lines_with(&R, "error kafka: TLS with", cases[i].needle), 1);
		/* librdkafka's own lines for each attempt are not the operator's */
		assert_int_equal(t_log_count(&R, "warn kafka"), 0);
		port = t_metrics_port(&R);
		for (t0 = t_now_ms(); t_now_ms() - t0 < 5000; usleep(100000)) {
			code = t_http_get(port, "/readyz", body, sizeof(body));
			if (code == 503 && strstr(body, "certificate is not accepted") != NULL)
				break;
		}
		assert_int_equal(code, 503);
		assert_non_null(strstr(body, "the broker's certificate is not accepted"));
		sleep(2); /* status updates every second: a confirmation would have come */
		if (t_slot_confirmed(&R) > t_lsn(bound))
			fail_msg("the slot moved past events nobody acknowledged");
		free(bound);
		/* a stop would wait out the drain for events the broker cannot take; a crash loses nothing */
		assert_int_not_equal(t_relay_signal(&R, SIGKILL, 10000), -1);
		t_slot_wait_inactive(&R, 15000);
	}
	snprintf(R.kafka_conf, sizeof(R.kafka_conf),
	    "bootstrap.servers = %s\nsecurity.protocol = SSL\nssl.ca.location = %s", K.ssl, K.ca);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_expect_all_published(&R, R.db, 30000);
	stop_relay();
}

/* What a read_committed consumer of the topic sees: every event once, per-key order. */
static void
expect_committed_once(void)
{
	char topic[128];
	struct t_msg *m;
	size_t n;

	topic_of(topic, sizeof(topic));
	n = t_consume_committed(R.b.bootstrap, topic, 20000, &m);
	fprintf(stderr, "read_committed: %zu records of %d events\n", n, N);
	assert_int_equal(check_records(m, n, true, NULL), 0);
	assert_int_equal(n, (size_t)N);
	t_msgs_free(m, n);
}

/*
 * Exactly-once: outboxd killed with -9 three times inside an open Kafka
 * transaction (its records acknowledged, its commit 5 s away).  The next
 * instance's InitProducerId aborts it; a read_committed consumer sees every
 * event once, in per-key order, and none of the aborted records.
 */
static void
test_exactly_once_across_kill9(void **state)
{
	char topic[128];
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup_kafka(&R, "rkeos", "");
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "bootstrap.servers = %s", K.plaintext);
	t_relay_config(&R, "[delivery]\nexactly_once = on\ntransaction_max_time = 5s\n");
	for (int round = 0; round < 3; round++) {
		int st;

		/* killed at its 40th acknowledgement, its transaction 5 s from the commit */
		setenv("OBX_TEST_KILL_AFTER_ACKS", "40", 1);
		t_relay_start(&R, NULL, 1);
		unsetenv("OBX_TEST_KILL_AFTER_ACKS");
		insert_txn(60, 7);
		st = t_wait(R.pid, 60000);
		if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
			t_log_dump(&R);
			fail_msg("outboxd did not kill itself after 40 acknowledgements");
		}
		R.pid = 0;
		t_slot_wait_inactive(&R, 15000);
	}
	/* the aborted records are in the log, and a read_uncommitted reader sees them */
	topic_of(topic, sizeof(topic));
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	fprintf(stderr, "read_uncommitted after three kills: %zu records\n", n);
	assert_true(n >= 120);
	t_msgs_free(m, n);

	t_relay_start(&R, NULL, 1);
	insert_txn(30, 7);
	assert_true(t_wait_confirmed_current(&R, 60000));
	stop_relay();
	expect_committed_once();
}

/*
 * A takeover fences the old producer for real: the active instance is
 * stopped (SIGSTOP) inside an open Kafka transaction, the server ends its
 * connection after wal_sender_timeout, the standby takes the slot and its
 * InitProducerId bumps the epoch, which aborts the open transaction.  Woken,
 * the old instance publishes nothing: the broker refuses its epoch and it
 * exits 1 ("fenced"), or it finds its connection gone first and waits as a
 * standby.  A read_committed consumer sees every event once.
 */
static void
test_takeover_fences_the_old_producer(void **state)
{
	struct t_relay S;
	int64_t t0;
	int st;

	(void)state;
	t_relay_setup_kafka(&R, "rkfence", "");
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "bootstrap.servers = %s", K.plaintext);
	t_relay_config(&R, "[delivery]\nexactly_once = on\ntransaction_max_time = 12s\n");
	t_relay_start(&R, NULL, 1);
	insert_txn(50, 5);
	for (t0 = t_now_ms();
	     t_relay_metric(&R, "outboxd_events_published_total") < 50 && t_now_ms() - t0 < 15000;)
		usleep(20000);
	assert_true(t_relay_metric(&R, "outboxd_events_published_total") >= 50);
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	wait_log(&S, "standby:", 15000);
	assert_int_equal(kill(R.pid, SIGSTOP), 0);
	for (t0 = t_now_ms(); t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 40000;)
		usleep(100000);
	if (t_log_count(&S, "taking over slot") != 1) {
		kill(R.pid, SIGCONT);
		t_log_dump(&S);
		fail_msg("the standby did not take over");
	}
	insert_txn(20, 5);
	/* its transactions commit after transaction_max_time */
	assert_true(t_wait_confirmed_current(&R, 60000));
	assert_int_equal(kill(R.pid, SIGCONT), 0);
	st = t_wait(R.pid, 40000);
	if (st == -1 && t_log_count(&R, "fenced") == 0) {
		fprintf(stderr,
		    "old instance: noticed its lost connection before the fence; waits as a standby\n");
		assert_int_equal(kill(R.pid, SIGTERM), 0);
		st = t_wait(R.pid, 30000);
		if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			t_log_dump(&R);
			fail_msg("the old instance did not stop with 0 (wait status %d)", st);
		}
	} else if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1) {
		t_log_dump(&R);
		fail_msg("the fenced instance did not exit 1 (wait status %d)", st);
	} else {
		assert_int_equal(t_log_count(&R, "fenced: another instance took over transactional.id"), 1);
		fprintf(stderr, "old instance: fenced by the broker, exit 1\n");
	}
	R.pid = 0;
	assert_int_equal(t_log_count(&S, "fenced"), 0);
	if (t_relay_signal(&S, SIGTERM, 30000) == -1)
		fail_msg("the new instance did not stop");
	t_relay_twin_stop(&S);
	expect_committed_once();
}

static struct t_relay Q; /* a second instance (test_fenced_while_holding_the_slot) */

static int
teardown_two(void **state)
{
	t_relay_teardown(&Q);
	memset(&Q, 0, sizeof(Q));
	return teardown(state);
}

/*
 * The broker fences for real: another producer initialises the same
 * transactional.id (a second instance on another database given the same
 * [delivery] transactional_id) after the first acknowledged records of a
 * Kafka transaction.  The broker aborts what is open and refuses the first
 * instance's epoch at its next call.  That instance still holds its slot, so
 * nobody took its place: as documented (docs/guide/exactly-once.md) it
 * starts a new session instead of exiting, and a read_committed consumer
 * sees each of its events once.  (A fenced instance that lost its slot
 * exits 1: test_takeover_fences_the_old_producer.)
 */
static void
test_fenced_while_holding_the_slot(void **state)
{
	char conf[256], eos[256];
	int64_t t0;

	(void)state;
	t_relay_setup_kafka(&R, "rkfenced", "");
	snprintf(conf, sizeof(conf), "bootstrap.servers = %s", K.plaintext);
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "%s", conf);
	snprintf(eos, sizeof(eos),
	    "[delivery]\nexactly_once = on\ntransaction_max_time = 3s\ntransactional_id = fence-%s\n", R.db);
	t_relay_config(&R, eos);
	t_relay_start(&R, NULL, 1);
	insert_txn(20, 5);
	assert_true(t_wait_confirmed_current(&R, 30000));
	insert_txn(20, 5);
	for (t0 = t_now_ms();
	     t_relay_metric(&R, "outboxd_events_published_total") < 40 && t_now_ms() - t0 < 15000;)
		usleep(20000);
	assert_true(t_relay_metric(&R, "outboxd_events_published_total") >= 40);

	/* another producer initialises the same transactional.id */
	t_relay_setup_kafka(&Q, "rkfencedb", conf);
	t_relay_config(&Q, eos);
	t_relay_start(&Q, NULL, 1);
	if (t_relay_signal(&Q, SIGTERM, 30000) == -1)
		fail_msg("the second instance did not stop");
	insert_txn(10, 5);
	wait_log(&R, "the broker fenced transactional.id fence-", 30000);
	assert_true(t_wait_confirmed_current(&R, 60000));
	assert_true(R.pid > 0 && waitpid(R.pid, NULL, WNOHANG) == 0); /* it went on */
	stop_relay();
	expect_committed_once();
}

/*
 * At-least-once with librdkafka's defaults (5 requests in flight, idempotent
 * producer): the broker is killed with -9 while events flow and started
 * again on its data 3 s later.  Every event arrives, per-key order holds,
 * and the idempotent producer leaves no duplicate.
 */
static void
test_broker_kill9_default_inflight(void **state)
{
	char topic[128];
	struct t_msg *m;
	size_t n, dups;

	(void)state;
	t_relay_setup_kafka(&R, "rkcrash", "");
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "bootstrap.servers = %s", K.plaintext);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	for (int i = 0; i < 20; i++) {
		insert_txn(50, 9);
		usleep(20000);
	}
	t_kafka_ctl("kill");
	for (int i = 0; i < 20; i++) {
		insert_txn(50, 9);
		usleep(100000);
	}
	t_kafka_ctl("restart");
	for (int i = 0; i < 20; i++) {
		insert_txn(50, 9);
		usleep(20000);
	}
	if (!t_wait_confirmed_current(&R, 120000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm everything after the broker came back");
	}
	stop_relay();
	topic_of(topic, sizeof(topic));
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	dups = check_records(m, n, false, NULL);
	fprintf(stderr, "broker kill -9: %d events, %zu records, %zu duplicates\n", N, n, dups);
	assert_int_equal(dups, 0);
	t_msgs_free(m, n);
}

/*
 * A SASL user without any ACL: the broker refuses the idempotent producer
 * id, a fatal producer error, at every session.  The sessions back off (a
 * handful in 15 s, not one every 200 ms), the line says what to grant, and
 * /readyz says the broker side fails.  Once WRITE on the topic (created by an
 * administrator, as auto-creation needs CREATE) is granted, every event
 * arrives without a restart.
 */
static void
test_no_acl_backs_off(void **state)
{
	char topic[128], body[4096], principal[128];
	int sessions;

	(void)state;
	t_relay_setup_kafka(&R, "rkacl", "");
	topic_of(topic, sizeof(topic));
	t_kafka_create_topic(&K, topic, 3, NULL);
	snprintf(R.kafka_conf, sizeof(R.kafka_conf),
	    "bootstrap.servers = %s\nsecurity.protocol = SASL_PLAINTEXT\nsasl.mechanisms = PLAIN\nsasl.username = %s",
	    K.sasl_plaintext, K.user);
	setenv("OUTBOXD_KAFKA_SASL_PASSWORD_FILE", K.password_file, 1);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	insert_txn(10, 3);
	sleep(15);
	sessions = t_log_count(&R, "streaming from slot");
	fprintf(stderr, "no ACL: %d sessions in 15 s\n", sessions);
	if (sessions > 10 || sessions < 2) {
		t_log_dump(&R);
		fail_msg("%d sessions in 15 s: the backoff (200 ms doubling to 30 s) allows 5 to 9", sessions);
	}
	assert_true(t_log_count(&R, "grant it WRITE on the outbox topics") >= 1);
	assert_true(lines_with(&R, "warn", "grant it WRITE on the outbox topics") == 1);
	assert_int_equal(t_http_get(t_metrics_port(&R), "/readyz", body, sizeof(body)), 503);
	assert_non_null(strstr(body, "waiting for the broker"));

	snprintf(principal, sizeof(principal), "User:%s", K.user);
	t_kafka_grant(&K, principal, "WRITE", "TOPIC", topic, 0);
	t_expect_all_published(&R, R.db, 60000);
	stop_relay();
}

/* insert_with_big(): the WAL position read just before its COMMIT; a slot confirmed up to it
 * confirmed nothing of that transaction */
static uint64_t big_bound;

/* One transaction: n small events, then one of about 30 kB (its id into big), then n small ones. */
static void
insert_with_big(int n, char *big, size_t len)
{
	char *id;

	t_exec(R.pg, "BEGIN");
	insert_txn(n, 5);
	id = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('%s', 'k2', 'T', jsonb_build_object('n', %d, 'pad', repeat('x', 30000))) RETURNING id::text",
	    R.db, N);
	N++;
	insert_txn(n, 5);
	{
		char *at = t_query1(R.pg, "SELECT pg_current_wal_insert_lsn()::text");

		big_bound = t_lsn(at);
		free(at);
	}
	t_exec(R.pg, "COMMIT");
	snprintf(big, len, "%s", id);
	free(id);
}

/* The records of topic that carry id, read as read_committed when committed. */
static size_t
count_in(const char *topic, const char *id, size_t *total, bool committed)
{
	struct t_msg *m;
	size_t n = committed ? t_consume_committed(R.b.bootstrap, topic, 20000, &m) :
	                       t_consume_all(R.b.bootstrap, topic, 20000, &m);
	size_t c = t_count_id(m, n, id);

	*total = n;
	t_msgs_free(m, n);
	return c;
}

/*
 * A record over the topic's max.message.bytes among small ones: the broker
 * refuses the whole request, so every record in it fails with
 * MSG_SIZE_TOO_LARGE.  With on_error = dead_letter, only the big record
 * goes to the dead-letter topic; every small one is on its topic, in per-key
 * order: outboxd sends what was in flight again one record at a time.  At
 * linger.ms = 0 (the default) in one transaction, then at 50 ms across
 * several; exactly-once too.
 */
static void
oversized_dead_letter(bool eos)
{
	char topic[128], dl[160], extra[512], big1[64], big2[64], where[256];
	struct t_msg *m;
	size_t n, total;

	t_relay_setup_kafka(&R, eos ? "rkbige" : "rkbig", "");
	topic_of(topic, sizeof(topic));
	snprintf(dl, sizeof(dl), "dl.%s", R.db);
	t_kafka_create_topic(&K, topic, 3, "max.message.bytes=10000");
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "bootstrap.servers = %s", K.plaintext);
	snprintf(extra, sizeof(extra), "[delivery]\non_error = dead_letter\ndead_letter_topic = %s\n%s", dl,
	    eos ? "exactly_once = on\n" : "");
	t_relay_config(&R, extra);
	t_relay_start(&R, NULL, 1);
	insert_with_big(10, big1, sizeof(big1));
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm the transaction with the oversized record");
	}
	assert_int_not_equal(t_relay_signal(&R, SIGTERM, 30000), -1);

	/* with a little linger, records of the next transactions share its requests */
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "bootstrap.servers = %s\nlinger.ms = 50", K.plaintext);
	t_relay_config(&R, extra);
	t_relay_start(&R, NULL, 1);
	insert_txn(10, 5);
	insert_with_big(5, big2, sizeof(big2));
	insert_txn(10, 5);
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm the transactions around the second oversized record");
	}
	stop_relay();

	/* the way it went: refused beside others, then found alone, twice */
	if (t_log_count(&R, "with the records sent beside it") < 2 || t_log_count(&R, "refused alone") < 2) {
		t_log_dump(&R);
		fail_msg("the oversized records were not refused beside others and then found alone");
	}
	assert_int_equal(count_in(dl, big1, &total, eos), 1);
	assert_int_equal(count_in(dl, big2, &total, eos), 1);
	if (total != 2) {
		t_log_dump(&R);
		fail_msg("%zu records on the dead-letter topic: only the 2 oversized ones belong there", total);
	}
	snprintf(where, sizeof(where), "WHERE id NOT IN ('%s', '%s')", big1, big2);
	n = eos ? t_consume_committed(R.b.bootstrap, topic, 20000, &m) :
	          t_consume_all(R.b.bootstrap, topic, 20000, &m);
	fprintf(stderr, "oversized%s: %zu records on %s for %d small events, 2 on the dead-letter topic\n",
	    eos ? " (exactly-once)" : "", n, topic, N - 2);
	assert_int_equal(check_records(m, n, eos, where), 0);
	assert_int_equal(n, (size_t)(N - 2));
	assert_int_equal(t_count_id(m, n, big1) + t_count_id(m, n, big2), 0);
	t_msgs_free(m, n);
}

static void
test_oversized_record_alone_to_dead_letter(void **state)
{
	(void)state;
	oversized_dead_letter(false);
}

static void
test_oversized_record_alone_exactly_once(void **state)
{
	(void)state;
	oversized_dead_letter(true);
}

/* With on_error = stop, the stop line names the oversized record, its size, and nothing small is lost. */
static void
test_oversized_record_stop_names_it(void **state)
{
	char topic[128], big[64], line[160], where[256];
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup_kafka(&R, "rkbigstop", "");
	topic_of(topic, sizeof(topic));
	t_kafka_create_topic(&K, topic, 3, "max.message.bytes=10000");
	snprintf(R.kafka_conf, sizeof(R.kafka_conf), "bootstrap.servers = %s", K.plaintext);
	t_relay_config(&R, "[delivery]\non_error = stop\n");
	t_relay_start(&R, NULL, 1);
	insert_with_big(10, big, sizeof(big));
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop with exit 1 (wait status %d)", st);
	}
	R.pid = 0;
	snprintf(line, sizeof(line), "event id=%s lsn=", big);
	if (lines_with(&R, "error", line) != 1 || lines_with(&R, line, "refused alone") != 1) {
		t_log_dump(&R);
		fail_msg("the stop line does not name the oversized event %s", big);
	}
	assert_int_equal(lines_with(&R, "error event id=", "on_error = stop"), 1);
	/* the slot stays below the oversized row: its transaction is not confirmed */
	if (t_slot_confirmed(&R) > big_bound) {
		t_log_dump(&R);
		fail_msg("the slot was confirmed past the oversized event");
	}
	/* the small ones before it are published; nothing after it is confirmed */
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	snprintf(where, sizeof(where),
	    "WHERE (payload->>'n')::int < (SELECT (payload->>'n')::int FROM outbox WHERE id = '%s')", big);
	assert_int_equal(check_records(m, n, false, where), 0);
	t_msgs_free(m, n);
}

/* Kills outboxd after n acknowledgements, with events of one transaction of 2n in flight. */
static void
kill_after(int n)
{
	char v[16];
	int st;

	snprintf(v, sizeof(v), "%d", n);
	setenv("OBX_TEST_KILL_AFTER_ACKS", v, 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	insert_txn(2 * n, 5);
	st = t_wait(R.pid, 60000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd did not kill itself after %d acknowledgements", n);
	}
	R.pid = 0;
	t_slot_wait_inactive(&R, 15000);
}

/*
 * The ACLs docs/guide/security.md lists, and no more, for a SASL user:
 * at-least-once with restart de-duplication and dead-lettering (WRITE and
 * READ on the topic, WRITE on the dead-letter topic), then exactly-once
 * (WRITE on the topic, WRITE and READ on the progress topic, WRITE and
 * DESCRIBE on the transactional id).  Each runs through a kill -9 and the
 * restart that reads back: no fallback, every event once.
 */
static void
test_least_acls(void **state)
{
	char topic[128], dl[128], prog[128], extra[512], principal[128], big[64], where[128];
	struct t_msg *m;
	size_t n, total;

	(void)state;
	snprintf(principal, sizeof(principal), "User:%s", K.user);
	setenv("OUTBOXD_KAFKA_SASL_PASSWORD_FILE", K.password_file, 1);

	/* at-least-once, dedupe on (the default), on_error = dead_letter */
	t_relay_setup_kafka(&R, "rkleast", "");
	topic_of(topic, sizeof(topic));
	snprintf(dl, sizeof(dl), "dl.%s", R.db);
	t_kafka_create_topic(&K, topic, 3, "max.message.bytes=10000");
	t_kafka_create_topic(&K, dl, 1, NULL);
	t_kafka_grant(&K, principal, "WRITE", "TOPIC", topic, 0);
	t_kafka_grant(&K, principal, "READ", "TOPIC", topic, 0);
	t_kafka_grant(&K, principal, "WRITE", "TOPIC", dl, 0);
	snprintf(R.kafka_conf, sizeof(R.kafka_conf),
	    "bootstrap.servers = %s\nsecurity.protocol = SASL_PLAINTEXT\nsasl.mechanisms = PLAIN\nsasl.username = %s",
	    K.sasl_plaintext, K.user);
	snprintf(extra, sizeof(extra), "[delivery]\non_error = dead_letter\ndead_letter_topic = %s\n", dl);
	t_relay_config(&R, extra);
	kill_after(30);
	t_relay_start(&R, NULL, 1);
	insert_with_big(5, big, sizeof(big));
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm with the documented ACLs");
	}
	stop_relay();
	if (t_log_count(&R, "(at-least-once)") != 0 || t_log_count(&R, "uthorization") != 0) {
		t_log_dump(&R);
		fail_msg("with the documented ACLs, a read-back fell back or the broker refused something");
	}
	assert_true(t_log_count(&R, "were in Kafka already and were not sent again") >= 1);
	n = t_consume_all(R.b.bootstrap, topic, 20000, &m);
	snprintf(where, sizeof(where), "WHERE id <> '%s'", big);
	assert_int_equal(check_records(m, n, true, where), 0);
	t_msgs_free(m, n);
	assert_int_equal(count_in(dl, big, &total, false), 1);
	t_relay_teardown(&R);

	/* exactly-once */
	N = 0;
	t_relay_setup_kafka(&R, "rkleasteos", "");
	topic_of(topic, sizeof(topic));
	snprintf(prog, sizeof(prog), "progress.%s", R.db);
	t_kafka_create_topic(&K, topic, 3, NULL);
	t_kafka_create_topic(&K, prog, 1, NULL);
	t_kafka_grant(&K, principal, "WRITE", "TOPIC", topic, 0);
	t_kafka_grant(&K, principal, "WRITE", "TOPIC", prog, 0);
	t_kafka_grant(&K, principal, "READ", "TOPIC", prog, 0);
	t_kafka_grant(&K, principal, "WRITE", "TRANSACTIONAL_ID", "outboxd-", 1);
	t_kafka_grant(&K, principal, "DESCRIBE", "TRANSACTIONAL_ID", "outboxd-", 1);
	snprintf(R.kafka_conf, sizeof(R.kafka_conf),
	    "bootstrap.servers = %s\nsecurity.protocol = SASL_PLAINTEXT\nsasl.mechanisms = PLAIN\nsasl.username = %s",
	    K.sasl_plaintext, K.user);
	snprintf(extra, sizeof(extra), "[delivery]\nexactly_once = on\nprogress_topic = %s\n", prog);
	t_relay_config(&R, extra);
	kill_after(30);
	t_relay_start(&R, NULL, 1);
	insert_txn(20, 5);
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("exactly-once did not confirm with the documented ACLs");
	}
	stop_relay();
	if (t_log_count(&R, "uthorization") != 0) {
		t_log_dump(&R);
		fail_msg("with the documented ACLs, the broker refused something");
	}
	expect_committed_once();
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sasl_logins, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrong_password, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tls_verification, setup, teardown),
		cmocka_unit_test_setup_teardown(test_exactly_once_across_kill9, setup, teardown),
		cmocka_unit_test_setup_teardown(test_takeover_fences_the_old_producer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fenced_while_holding_the_slot, setup, teardown_two),
		cmocka_unit_test_setup_teardown(test_broker_kill9_default_inflight, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_acl_backs_off, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversized_record_alone_to_dead_letter, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversized_record_alone_exactly_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversized_record_stop_names_it, setup, teardown),
		cmocka_unit_test_setup_teardown(test_least_acls, setup, teardown),
	};

	return T_RUN_TESTS(tests);
}
