/*
 * Failover, against a primary and a physical standby of its own (made by
 * tests/stack/pgstack.sh standby, for the major OBX_PGBIN names):
 *
 * - PostgreSQL 17+: a failover slot synchronized to the standby survives a
 *   crash of the primary (-m immediate, under load) and the standby's
 *   promotion: outboxd, given both hosts with
 *   target_session_attrs=read-write, resumes on the new primary; every
 *   event the promoted server holds is in Kafka (no loss), every event in
 *   Kafka is on the promoted server (no invention: synchronized_standby_slots)
 *   and the slot guard did not refuse.
 * - Without a synchronized slot (before 17, or failover = off) the slot
 *   guard refuses the slot the failover lost; before 16 a standby as the
 *   source is refused with one line.
 * - PostgreSQL 16+: outboxd reading from the standby publishes what the
 *   primary commits, and carries on after the standby is promoted.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;
static struct t_stack P, S; /* the primary and its standby */
static char pstate[128], sstate[128];
static pid_t load_pid;
static int major;

/* ---- set-up ---- */

static int
setup(void **state)
{
	static int n;

	(void)state;
	memset(&R, 0, sizeof(R));
	snprintf(pstate, sizeof(pstate), "/tmp/obx-fo-%d-%d-p", (int)getpid(), n);
	snprintf(sstate, sizeof(sstate), "/tmp/obx-fo-%d-%d-s", (int)getpid(), n++);
	load_pid = 0;
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	if (load_pid > 0) {
		kill(load_pid, SIGKILL);
		waitpid(load_pid, NULL, 0);
		load_pid = 0;
	}
	t_relay_teardown(&R);
	/* the standby first: it gives its slot back while the primary may still run */
	t_stack_stop_extra(sstate);
	t_stack_stop_extra(pstate);
	rmdir(sstate);
	rmdir(pstate);
	return 0;
}

/* Starts the primary, a database on it with the outbox table and a broker; then the standby. */
static void
primary_and_standby(const char *prefix)
{
	char env[256];
	const char *saved = getenv("OBX_STACK_ENV");
	char *keep = saved != NULL ? strdup(saved) : NULL;

	t_stack_start_extra(&P, pstate, NULL);
	snprintf(env, sizeof(env), "%s/env", pstate);
	setenv("OBX_STACK_ENV", env, 1);
	t_relay_setup(&R, prefix, 0);
	if (keep != NULL)
		setenv("OBX_STACK_ENV", keep, 1);
	free(keep);
	t_stack_standby(&S, pstate, sstate);
}

/* Both hosts, the primary first; libpq picks the one that accepts writes. */
static void
both_hosts(char *buf, size_t len)
{
	snprintf(buf, len,
	    "host=%s,%s port=%s,%s user=%s dbname=%s target_session_attrs=read-write "
	    "connect_timeout=2",
	    P.host, S.host, P.port, S.port, P.user, R.db);
}

static void
one_host(const struct t_stack *st, char *buf, size_t len)
{
	snprintf(buf, len, "host=%s port=%s user=%s dbname=%s connect_timeout=2", st->host, st->port, st->user,
	    R.db);
}

/* Writes R's config with conninfo and extra [source] lines. */
static void
config(const char *conninfo, const char *source_extra)
{
	char text[4096];

	snprintf(text, sizeof(text),
	    "[source]\nconninfo = %s\nslot = %s\nstatus_interval = 1s\n%s"
	    "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
	    "[log]\nformat = text\nlevel = debug\n",
	    conninfo, R.slot, source_extra, R.b.bootstrap);
	if (R.conf[0] != '\0')
		unlink(R.conf);
	t_write_file(R.conf, sizeof(R.conf), text);
}

/* Runs outboxd on R's config until it exits (at most timeout_ms); returns its exit code. */
static int
run_to_exit(int timeout_ms)
{
	int st;

	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, timeout_ms);
	if (st == -1) {
		t_log_dump(&R);
		fail_msg("outboxd did not exit within %d ms", timeout_ms);
	}
	R.pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * Runs outboxd check on R's config, with --standby standby unless NULL;
 * returns its output (the caller frees it).
 */
static char *
check_output_standby(const char *standby)
{
	const char *bin = getenv("OBX_OUTBOXD");
	char out[160], *text;
	char *argv[] = { (char *)bin, "check", "-c", R.conf, standby ? "--standby" : NULL, (char *)standby, NULL };
	FILE *fp;
	long len;
	pid_t pid;

	snprintf(out, sizeof(out), "%s.check", R.log);
	unlink(out);
	pid = t_spawn(argv, out);
	if (t_wait(pid, 60000) == -1) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		fail_msg("outboxd check did not finish");
	}
	fp = fopen(out, "r");
	if (fp == NULL)
		fail_msg("no output from outboxd check");
	fseek(fp, 0, SEEK_END);
	len = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	text = calloc(1, (size_t)len + 1);
	if (fread(text, 1, (size_t)len, fp) != (size_t)len)
		fail_msg("could not read the output of outboxd check");
	fclose(fp);
	unlink(out);
	return text;
}

static char *
check_output(void)
{
	return check_output_standby(NULL);
}

static void
expect_in(const char *text, const char *needle)
{
	if (strstr(text, needle) == NULL)
		fail_msg("expected '%s' in:\n%s", needle, text);
}

static bool
running(pid_t pid)
{
	return pid > 0 && waitpid(pid, NULL, WNOHANG) == 0;
}

/* Waits until the outboxd log holds needle at least n times. */
static void
wait_log(const char *needle, int n, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (t_log_count(&R, needle) < n) {
		if (t_now_ms() > deadline || !running(R.pid)) {
			t_log_dump(&R);
			fail_msg("outboxd did not log '%s' %d time(s) within %d ms", needle, n, timeout_ms);
		}
		usleep(100000);
	}
}

/* Waits until the standby has replayed everything the primary has written so far. */
static void
wait_replayed(int timeout_ms)
{
	PGconn *p = t_pg(&P, "postgres", 0), *s = t_pg(&S, "postgres", 0);
	char *at = t_query1(p, "SELECT pg_current_wal_lsn()");
	int64_t deadline = t_now_ms() + timeout_ms;

	for (;;) {
		char *v = t_query1(s, "SELECT pg_last_wal_replay_lsn() >= '%s'", at);
		bool done = strcmp(v, "t") == 0;

		free(v);
		if (done)
			break;
		if (t_now_ms() > deadline)
			fail_msg("the standby did not replay up to %s", at);
		usleep(50000);
	}
	free(at);
	PQfinish(p);
	PQfinish(s);
}

/* Inserts n events of aggregate type agg through c, one transaction each. */
static void
insert_events(PGconn *c, const char *agg, int n)
{
	for (int i = 0; i < n; i++)
		t_exec(c,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('%s', 'k%d', 'E', '{\"i\": %d}')",
		    agg, i % 7, i);
}

/* A pgbench load on the primary: transactions of two events each, about 100 per second. */
static void
start_load(void)
{
	char script[64], pgbench[600], rate[] = "100";
	const char *text =
	    "\\set k random(1, 20)\n"
	    "BEGIN;\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('fo', 'k' || :k, 'E', '{}');\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('fo', 'k' || :k, 'E', '{}');\n"
	    "COMMIT;\n";
	char log[160];

	t_write_file(script, sizeof(script), text);
	snprintf(pgbench, sizeof(pgbench), "%s/pgbench", P.pgbin);
	snprintf(log, sizeof(log), "%s.pgbench", R.log);
	{
		char *argv[] = { pgbench, "-n", "-c", "2", "-j", "1", "-T", "600", "-R", rate, "-f", script, "-h",
			P.host, "-p", P.port, "-U", P.user, R.db, NULL };

		load_pid = t_spawn(argv, log);
	}
	usleep(500000);
	unlink(script);
	if (!running(load_pid))
		fail_msg("pgbench did not start (see %s)", log);
	unlink(log);
}

/*
 * Waits up to timeout_ms until every outbox id on truth is in the topic
 * outbox.event.<agg> (duplicates allowed); with no_invention, every record
 * in the topic must also be on truth.  Returns the number of distinct ids.
 */
static size_t
expect_ids(PGconn *truth, const char *agg, bool no_invention, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;
	char topic[128];
	PGresult *res;
	char **want;
	size_t nwant;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	res = PQexec(truth, "SELECT id::text FROM outbox ORDER BY 1");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		fail_msg("could not read the outbox: %s", PQresultErrorMessage(res));
	nwant = (size_t)PQntuples(res);
	want = calloc(nwant + 1, sizeof(*want));
	for (size_t i = 0; i < nwant; i++)
		want[i] = PQgetvalue(res, (int)i, 0);
	qsort(want, nwant, sizeof(*want), t_cmp_str); /* the server's collation may differ */
	for (;;) {
		struct t_msg *m = NULL;
		size_t n = t_consume_all(R.b.bootstrap, topic, 20000, &m), found = 0;
		char **got = calloc(n + 1, sizeof(*got));
		const char *missing = NULL;

		for (size_t j = 0; j < n; j++)
			got[j] = (char *)t_msg_header(&m[j], "id");
		qsort(got, n, sizeof(*got), t_cmp_str);
		for (size_t i = 0; i < nwant; i++) {
			if (bsearch(&want[i], got, n, sizeof(*got), t_cmp_str) != NULL)
				found++;
			else if (missing == NULL)
				missing = want[i];
		}
		for (size_t j = 0; no_invention && j < n; j++)
			if (bsearch(&got[j], want, nwant, sizeof(*want), t_cmp_str) == NULL) {
				t_log_dump(&R);
				fail_msg("invention: event %s is in Kafka but not on the promoted server", got[j]);
			}
		free(got);
		t_msgs_free(m, n);
		if (found == nwant)
			break;
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("loss: %zu of %zu committed events in Kafka after %d ms, e.g. %s missing "
			         "(%zu records read)",
			    found, nwant, timeout_ms, missing, n);
		}
		sleep(1);
	}
	free(want);
	PQclear(res);
	return nwant;
}

/* ---- a synchronized failover slot survives the failover (17+) ---- */

/*
 * A second instance given the standby alone, while it is in recovery, finds
 * the synchronized copy of the slot, which cannot be used before the
 * promotion: it says so once and keeps waiting instead of stopping.
 */
static void
standby_waits_for_promotion(void)
{
	const char *needle = "cannot be used while the server is in recovery: waiting for its promotion";
	struct t_relay tw;
	char text[2048], ci[512];
	int64_t deadline = t_now_ms() + 20000;

	one_host(&S, ci, sizeof(ci));
	t_relay_twin(&R, &tw, "standby");
	snprintf(text, sizeof(text),
	    "[source]\nconninfo = %s\nslot = %s\n[kafka]\n"
	    "bootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n[log]\nformat = text\n",
	    ci, R.slot, R.b.bootstrap);
	t_write_file(tw.conf, sizeof(tw.conf), text);
	t_relay_start(&tw, NULL, 0);
	while (t_log_count(&tw, needle) == 0) {
		if (t_now_ms() > deadline || !running(tw.pid)) {
			t_log_dump(&tw);
			fail_msg("an instance on the standby did not wait for the promotion");
		}
		usleep(100000);
	}
	sleep(2); /* several attempts, one line; meanwhile more load goes through the slot */
	assert_true(running(tw.pid));
	assert_int_equal(t_log_count(&tw, needle), 1);
	unlink(tw.conf);
	t_relay_twin_stop(&tw);
}

static void
test_failover_slot_survives_promotion(void **state)
{
	char ci[512], sql[256], *check;
	PGconn *p, *s;
	int64_t t0 = t_now_ms(), t_sync, t_fail, t_resume;
	int sessions;
	size_t n;

	(void)state;
	primary_and_standby("fo_sync");
	both_hosts(ci, sizeof(ci));
	config(ci, "");
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "with failover"), 1); /* created slot X at Y with failover */
	start_load();
	check = check_output();
	snprintf(sql, sizeof(sql), "ok   failover: slot %s is failover-enabled", R.slot);
	expect_in(check, sql);
	expect_in(check, "ok   failover: 1 slot sync worker(s) connected");
	expect_in(check, "(synchronized_standby_slots) is active: outboxd receives only what its standby has");
	free(check);

	/* the standby's copy of the slot is used only once it is persistent (not temporary) */
	p = t_pg(&P, R.db, 0);
	s = t_pg(&S, R.db, 0);
	snprintf(sql, sizeof(sql),
	    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s' "
	    "AND failover AND synced AND NOT temporary",
	    R.slot);
	for (int64_t deadline = t_now_ms() + 120000;;) {
		char *v;

		/* a running-transactions record moves the slot's catalog_xmin, which the sync waits for */
		t_exec(p, "SELECT pg_log_standby_snapshot()");
		v = t_query1(s, "%s", sql);
		if (strcmp(v, "1") == 0) {
			free(v);
			break;
		}
		free(v);
		if (t_now_ms() > deadline)
			fail_msg("the standby did not synchronize slot %s", R.slot);
		usleep(300000);
	}
	t_sync = t_now_ms();
	PQfinish(p);
	PQfinish(s);
	/* check --standby says the standby is ready: its copy is persistent */
	one_host(&S, ci, sizeof(ci));
	check = check_output_standby(ci);
	snprintf(sql, sizeof(sql),
	    "ok   standby: ready: it holds a persistent synchronized copy of "
	    "slot %s at ",
	    R.slot);
	expect_in(check, sql);
	free(check);
	both_hosts(ci, sizeof(ci));
	standby_waits_for_promotion();

	sessions = t_log_count(&R, "streaming from slot");
	t_stack_crash(pstate);
	t_fail = t_now_ms();
	t_stack_promote(sstate);
	/* the load fails with the primary */
	if (t_wait(load_pid, 30000) == -1)
		kill(load_pid, SIGKILL);
	waitpid(load_pid, NULL, WNOHANG);
	load_pid = 0;

	wait_log("streaming from slot", sessions + 1, 90000);
	t_resume = t_now_ms();
	assert_int_equal(t_log_count(&R, "was synchronized from the former primary"), 1);

	/* the new primary's own events follow */
	s = t_pg(&S, R.db, 0);
	insert_events(s, "fo", 20);
	n = expect_ids(s, "fo", true, 90000);
	PQfinish(s);
	assert_int_equal(t_log_count(&R, "is missing but existed before"), 0);
	assert_true(running(R.pid));
	print_message("failover slot: %zu events, synchronized after %.1f s, resumed %.2f s after "
	              "the crash, all in Kafka after %.2f s, %.1f s in all\n",
	    n, (t_sync - t0) / 1000.0, (t_resume - t_fail) / 1000.0, (t_now_ms() - t_fail) / 1000.0,
	    (t_now_ms() - t0) / 1000.0);
}

/* ---- without a synchronized slot, the guard refuses the lost one ---- */

static void
test_lost_slot_refused_after_failover(void **state)
{
	char ci[512];
	int64_t t0 = t_now_ms();
	int st;

	(void)state;
	primary_and_standby("fo_lost");
	if (major < 16) {
		/* a standby as the source needs 16: refused with one line, before anything is made */
		one_host(&S, ci, sizeof(ci));
		config(ci, "");
		assert_int_equal(run_to_exit(30000), 1);
		assert_int_equal(t_log_count(&R, "cannot decode there (16 and later can)"), 1);
	}
	both_hosts(ci, sizeof(ci));
	/* before 17 an explicit failover = on is ignored, said once */
	config(ci, major >= 17 ? "failover = off\n" : "failover = on\n");
	t_relay_start(&R, NULL, 1);
	if (major < 17)
		assert_int_equal(t_log_count(&R, "[source] failover = on is ignored"), 1);
	insert_events(R.pg, "lost", 10);
	if (!t_wait_confirmed_current(&R, 30000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not confirm the events");
	}
	wait_replayed(30000); /* the guard's record, in the publication's comment, is on the standby */
	{
		/* check --standby: not ready, and why; below 17 a warning that failover slots need 17 */
		char sb[512], needle[256], *check;

		one_host(&S, sb, sizeof(sb));
		check = check_output_standby(sb);
		if (major >= 17)
			snprintf(needle, sizeof(needle),
			    "FAIL standby: not ready: slot %s has failover off "
			    "on the primary",
			    R.slot);
		else
			snprintf(needle, sizeof(needle),
			    "WARN standby: failover slots need PostgreSQL 17 "
			    "or later");
		expect_in(check, needle);
		free(check);
	}
	PQfinish(R.pg);
	R.pg = NULL;
	t_stack_crash(pstate);
	t_stack_promote(sstate);
	st = t_wait(R.pid, 90000);
	if (st == -1) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop on the lost slot");
	}
	R.pid = 0;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	assert_int_equal(t_log_count(&R, "is missing but existed before"), 1);
	if (major < 17)
		assert_int_equal(t_log_count(&R, "[source] failover = on is ignored"), 1);
	print_message("lost slot refused after failover (PostgreSQL %d%s), %.1f s\n", major,
	    major >= 17 ? ", failover = off" : "", (t_now_ms() - t0) / 1000.0);
}

/* ---- a hot standby as the source (16+) ---- */

static void
test_standby_source(void **state)
{
	char ci[512], *check, *v;
	PGconn *p, *s;
	int64_t t0 = t_now_ms(), t_stream, t_promote;
	int sessions;
	size_t n;

	(void)state;
	primary_and_standby("fo_src");
	one_host(&S, ci, sizeof(ci));
	config(ci, "");
	check = check_output();
	expect_in(check, "ok   server: a hot standby (in recovery)");
	expect_in(check, "ok   hot_standby_feedback: on");
	expect_in(check, "FAIL publication: outboxd does not exist and this hot standby cannot create it");
	free(check);
	/* the standby cannot create the publication: one line naming what to run on the primary */
	assert_int_equal(run_to_exit(30000), 1);
	assert_int_equal(t_log_count(&R,
	                     "this server is a hot standby, where it cannot be created: "
	                     "run CREATE PUBLICATION"),
	    1);
	p = t_pg(&P, R.db, 0);
	t_exec(p, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	wait_replayed(30000);

	/* creating the slot waits for the primary's next running-transactions record */
	t_relay_start(&R, NULL, 0);
	for (int64_t deadline = t_now_ms() + 60000; t_log_count(&R, "streaming from slot") == 0;) {
		if (t_now_ms() > deadline || !running(R.pid)) {
			t_log_dump(&R);
			fail_msg("outboxd did not start streaming from the standby");
		}
		if (t_log_count(&R, "waiting for the primary's next running-transactions record") > 0)
			t_exec(p, "SELECT pg_log_standby_snapshot()");
		usleep(300000);
	}
	t_stream = t_now_ms();
	assert_int_equal(t_log_count(&R,
	                     "waiting for the primary's next running-transactions record "
	                     "(SELECT pg_log_standby_snapshot() on the primary"),
	    1);
	assert_int_equal(t_log_count(&R, "from a hot standby"), 1);
	assert_int_equal(t_log_count(&R, "the slot guard cannot record slot"), 1);
	if (major >= 17)
		assert_int_equal(t_log_count(&R, "where failover cannot be enabled"), 1);

	/* what the primary commits arrives through the standby */
	insert_events(p, "src", 30);
	expect_ids(p, "src", false, 60000);
	wait_replayed(30000);
	PQfinish(p);

	/* the primary dies, the standby is promoted: outboxd carries on */
	t_stack_crash(pstate);
	t_stack_promote(sstate);
	t_promote = t_now_ms();
	s = t_pg(&S, R.db, 0);
	insert_events(s, "src", 30);
	n = expect_ids(s, "src", true, 90000);
	PQfinish(s);
	assert_true(running(R.pid));
	assert_int_equal(t_log_count(&R, "is missing but existed before"), 0);
	t_promote = t_now_ms() - t_promote;
	sessions = t_log_count(&R, "streaming from slot");

	/*
	 * The next start on the promoted server records the slot for the guard
	 * and, from 17, enables failover on it; failover = off takes it back.
	 */
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "has no record on publication outboxd"), 1);
	if (major >= 17) {
		s = t_pg(&S, R.db, 0);
		assert_int_equal(t_log_count(&R, "enabled failover on slot"), 1);
		v = t_query1(s, "SELECT failover FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
		assert_string_equal(v, "t");
		free(v);
		assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
		config(ci, "failover = off\n");
		t_relay_start(&R, NULL, 1);
		assert_int_equal(t_log_count(&R, "disabled failover on slot"), 1);
		v = t_query1(s, "SELECT failover FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
		assert_string_equal(v, "f");
		free(v);
		PQfinish(s);
	}
	print_message("standby as the source (PostgreSQL %d): streaming after %.1f s, %zu events, "
	              "all in Kafka %.2f s after the promotion, %d session(s) through it, %.1f s in all\n",
	    major, (t_stream - t0) / 1000.0, n, t_promote / 1000.0, sessions, (t_now_ms() - t0) / 1000.0);
}

/* The server major of OBX_PGBIN (Debian's 15 when unset). */
static int
server_major(void)
{
	const char *bin = getenv("OBX_PGBIN");
	char cmd[1024], out[64] = "";
	FILE *fp;

	snprintf(cmd, sizeof(cmd), "%s/postgres --version", bin != NULL ? bin : "/usr/lib/postgresql/15/bin");
	fp = popen(cmd, "r");
	if (fp == NULL || fgets(out, sizeof(out), fp) == NULL) {
		fprintf(stderr, "test_failover: could not run %s\n", cmd);
		exit(1);
	}
	pclose(fp);
	/* "postgres (PostgreSQL) 17.4" */
	return atoi(strrchr(out, ' ') != NULL ? strrchr(out, ' ') + 1 : out);
}

int
main(void)
{
	struct CMUnitTest tests[3];
	size_t n = 0;

	major = server_major();
	if (major >= 17)
		tests[n++] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(
		    test_failover_slot_survives_promotion, setup, teardown);
	tests[n++] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_lost_slot_refused_after_failover,
	    setup, teardown);
	if (major >= 16)
		tests[n++] = (struct CMUnitTest)cmocka_unit_test_setup_teardown(test_standby_source, setup,
		    teardown);
	printf("test_failover: PostgreSQL %d: %zu test(s)%s\n", major, n,
	    major >= 17     ? "" :
	        major >= 16 ? " (failover slots need 17)" :
	                      " (failover slots need 17, a standby as the source 16)");
	return _cmocka_run_group_tests("test_failover", tests, n, NULL, NULL);
}
