/*
 * Failure handling: lost PostgreSQL connections, a server crash, a producer
 * fatal error, two instances on one slot, a long broker outage under a
 * memory bound, an invalidated slot, bad credentials, TLS.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	unsetenv("OBX_TEST_FATAL_AFTER");
	return 0;
}

static void
insert_events(struct t_relay *r, const char *agg, int from, int to)
{
	for (int i = from; i < to; i++)
		t_exec(r->pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('%s', 'k%d', 'E', '{\"i\": %d}')", agg, i % 11, i);
}

/* Every id in the outbox table is in the topic at least once; returns the number of records. */
static size_t
expect_all_published(struct t_relay *r, const char *agg, int timeout_ms)
{
	char topic[128];
	struct t_msg *m;
	size_t n;
	PGresult *res;

	snprintf(topic, sizeof(topic), "outbox.event.%s", agg);
	/* once the slot confirmed everything, the topic holds every event */
	if (!t_wait_confirmed_current(r, timeout_ms)) {
		t_log_dump(r);
		fail_msg("outboxd did not confirm up to the server's WAL position");
	}
	n = t_consume_all(r->b.bootstrap, topic, 20000, &m);
	res = PQexec(r->pg, "SELECT id::text FROM outbox");
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = 0;

		for (size_t j = 0; j < n; j++)
			if (strcmp(t_msg_header(&m[j], "id"), PQgetvalue(res, i, 0)) == 0)
				c++;
		if (c == 0) {
			t_log_dump(r);
			fail_msg("committed event %s never published (%zu records read)", PQgetvalue(res, i, 0), n);
		}
	}
	PQclear(res);
	t_msgs_free(m, n);
	return n;
}

static void
test_walsender_terminated(void **state)
{
	(void)state;
	t_relay_setup(&R, "term", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	for (int round = 0; round < 3; round++) {
		insert_events(&R, "term", round * 50, round * 50 + 50);
		t_exec(R.pg, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
		    "WHERE slot_name = '%s' AND active", R.slot);
		usleep(300000);
	}
	insert_events(&R, "term", 150, 160);
	expect_all_published(&R, "term", 30000);
	assert_true(t_log_count(&R, "streaming from slot") >= 2);
	assert_true(t_wait_confirmed_current(&R, 15000));
}

/*
 * A walsender that hangs (SIGSTOP: its socket stays open, the kernel still
 * answers keepalive probes): outboxd, silent for wal_sender_timeout (10 s on
 * the test stack), treats the connection as dead and reconnects; the slot is
 * then held by the hung process, so it waits as a standby and takes over once
 * that process goes.
 */
static void
test_hung_walsender_detected(void **state)
{
	char *pid;
	int64_t deadline;

	(void)state;
	t_relay_setup(&R, "hung", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	insert_events(&R, "hung", 0, 10);
	expect_all_published(&R, "hung", 30000);
	pid = t_query1(R.pg, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
	assert_int_equal(kill((pid_t)atoi(pid), SIGSTOP), 0);
	deadline = t_now_ms() + 20000;
	while (t_log_count(&R, "treating the replication connection as dead") == 0 && t_now_ms() < deadline)
		usleep(100000);
	kill((pid_t)atoi(pid), SIGCONT);
	if (t_log_count(&R, "treating the replication connection as dead") != 1)
		t_log_dump(&R);
	assert_int_equal(t_log_count(&R, "treating the replication connection as dead"), 1);
	free(pid);
	insert_events(&R, "hung", 10, 20);
	expect_all_published(&R, "hung", 30000);
	assert_true(t_wait_confirmed_current(&R, 15000));
}

static void
test_server_crash_and_restart(void **state)
{
	(void)state;
	t_relay_setup(&R, "crash", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	insert_events(&R, "crash", 0, 100);
	PQfinish(R.pg);
	R.pg = NULL;
	assert_int_equal(t_pg_ctl(&R.st, "restart -m immediate"), 0);
	R.pg = t_pg(&R.st, R.db, 0);
	insert_events(&R, "crash", 100, 150);
	expect_all_published(&R, "crash", 60000);
	assert_true(t_log_count(&R, "streaming from slot") >= 2);
	/* one warning for the outage, not one per retry */
	assert_true(t_log_count(&R, "retrying") <= 3);
}

static void
test_producer_fatal_error_rewinds(void **state)
{
	(void)state;
	t_relay_setup(&R, "fatal", 0);
	t_relay_config(&R, NULL);
	setenv("OBX_TEST_FATAL_AFTER", "30", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OBX_TEST_FATAL_AFTER");
	insert_events(&R, "fatal", 0, 100);
	expect_all_published(&R, "fatal", 30000);
	if (t_log_count(&R, "recreating it and rewinding to the slot") != 1) {
		t_log_dump(&R);
		fail_msg("the test hook did not raise a fatal error (is OBX_TEST_HOOKS on?)");
	}
	assert_int_equal(t_log_count(&R, "streaming from slot"), 2);
	assert_true(t_wait_confirmed_current(&R, 15000));
}

static void
test_standby_takes_over(void **state)
{
	struct t_relay S;
	int64_t t0, takeover;

	(void)state;
	t_relay_setup(&R, "standby", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	insert_events(&R, "standby", 0, 50);

	/* a second instance, same slot and config: it waits as a hot standby */
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	for (t0 = t_now_ms(); t_log_count(&S, "standby:") == 0 && t_now_ms() - t0 < 10000;)
		usleep(50000);
	assert_int_equal(t_log_count(&S, "standby:"), 1);
	sleep(3);
	assert_int_equal(t_log_count(&S, "standby:"), 1); /* said once, not per retry */
	assert_int_equal(t_log_count(&S, "streaming from slot"), 0);

	assert_true(t_relay_signal(&R, SIGKILL, 10000) != -1);
	t0 = t_now_ms();
	while (t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 20000)
		usleep(20000);
	takeover = t_now_ms() - t0;
	assert_int_equal(t_log_count(&S, "taking over slot"), 1);
	print_message("standby took over %lld ms after kill -9 of the active instance\n", (long long)takeover);
	assert_true(takeover < 10000);
	insert_events(&R, "standby", 50, 100);
	expect_all_published(&R, "standby", 30000);
	t_relay_twin_stop(&S);
}

static void
test_long_broker_outage_memory_bound(void **state)
{
	const long bound_kb = 64 * 1024;
	long hwm;
	int64_t t0;
	int i = 0;

	(void)state;
	t_relay_setup(&R, "outage", 0);
	R.bin = getenv("OBX_OUTBOXD_PLAIN"); /* RSS of a build without sanitizers */
	assert_non_null(R.bin);
	t_relay_config(&R, "[delivery]\nmax_inflight = 1000\nmax_inflight_bytes = 1MiB\n");
	t_relay_start(&R, NULL, 1);
	insert_events(&R, "outage", 0, 1);
	expect_all_published(&R, "outage", 15000);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	/* longer than 3 x wal_sender_timeout (10 s), with ~4 KiB events: ~40 MiB of backlog */
	for (t0 = t_now_ms(); t_now_ms() - t0 < 32000; i += 100) {
		t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "SELECT 'outage', 'k' || (g %% 13), 'Big', jsonb_build_object('pad', "
		    "(SELECT string_agg(md5(random()::text || x), '') FROM generate_series(1, 128) x), 'g', g) "
		    "FROM generate_series(%d, %d) g", i, i + 99);
		usleep(50000);
	}
	hwm = t_vm_hwm_kb(R.pid);
	print_message("peak RSS during the outage: %ld KiB (bound %ld KiB), %d events committed\n", hwm, bound_kb, i);
	assert_true(hwm > 0 && hwm < bound_kb);
	assert_int_equal(t_log_count(&R, "retrying"), 0); /* the connection survived */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	/* drain: 4 partitions x 5 MiB of broker memory hold this topic's ~40 MiB only partly,
	 * so check the slot instead of reading every record back */
	assert_true(t_wait_confirmed_current(&R, 120000));
	hwm = t_vm_hwm_kb(R.pid);
	print_message("peak RSS after draining: %ld KiB\n", hwm);
	assert_true(hwm < bound_kb);
}

static void
test_invalidated_slot(void **state)
{
	char *status = NULL;

	(void)state;
	t_relay_setup(&R, "lost", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	insert_events(&R, "lost", 0, 5);
	assert_true(t_wait_confirmed_current(&R, 10000));
	assert_true(WIFEXITED(t_relay_signal(&R, SIGTERM, 40000)));
	t_slot_wait_inactive(&R, 10000);
	t_exec(R.pg, "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'");
	t_exec(R.pg, "SELECT pg_reload_conf()");
	for (int i = 0; i < 20; i++) {
		free(status);
		t_exec(R.pg, "CREATE TABLE IF NOT EXISTS filler (v text)");
		t_exec(R.pg, "INSERT INTO filler SELECT repeat('f', 1000) FROM generate_series(1, 3000)");
		t_exec(R.pg, "SELECT pg_switch_wal()");
		t_exec(R.pg, "CHECKPOINT");
		status = t_query1(R.pg, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = '%s'",
		    R.slot);
		if (strcmp(status, "lost") == 0)
			break;
	}
	t_exec(R.pg, "ALTER SYSTEM RESET max_slot_wal_keep_size");
	t_exec(R.pg, "SELECT pg_reload_conf()");
	assert_string_equal(status, "lost");
	free(status);
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	{
		int st = t_wait(R.pid, 20000);

		R.pid = 0;
		assert_true(st != -1 && WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 1);
	}
	assert_int_equal(t_log_count(&R, "is invalidated (wal_status = lost)"), 1);
	assert_int_equal(t_log_count(&R, "may have been lost"), 1);
}

/* Runs outboxd with conninfo; expects exit 1 within seconds, needle in the log and no secret. */
static void
expect_permanent(const char *conninfo, const char *needle, const char *secret)
{
	char text[2048];
	int st;

	snprintf(text, sizeof(text), "[source]\nconninfo = %s\n", conninfo);
	t_relay_config(&R, NULL);
	{
		/* rewrite the config with this conninfo instead of the harness's */
		FILE *fp = fopen(R.conf, "w");

		fprintf(fp, "%s[kafka]\nbootstrap.servers = %s\n[log]\nformat = text\nlevel = debug\n", text,
		    R.b.bootstrap);
		fclose(fp);
	}
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 30000);
	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || t_log_count(&R, needle) != 1 ||
	    (secret != NULL && t_log_count(&R, secret) != 0)) {
		t_log_dump(&R);
		fail_msg("expected exit 1 with \"%s\" (status %d)", needle, st);
	}
	assert_int_equal(t_log_count(&R, "retrying"), 0); /* no endless retry */
}

/*
 * Runs outboxd with conninfo; expects it still running after a few seconds,
 * retrying (needle in the log, once, with "; retrying"), and a clean stop on
 * SIGTERM.
 */
static void
expect_transient(const char *conninfo, const char *needle)
{
	char text[2048];
	int st;

	snprintf(text, sizeof(text), "[source]\nconninfo = %s\n", conninfo);
	t_relay_config(&R, NULL);
	{
		FILE *fp = fopen(R.conf, "w");

		fprintf(fp, "%s[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
		    "[log]\nformat = text\nlevel = debug\n", text, R.b.bootstrap);
		fclose(fp);
	}
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 4000);
	if (st != -1 || t_log_count(&R, needle) < 1 || t_log_count(&R, "; retrying") != 1) {
		t_log_dump(&R);
		fail_msg("expected retries with \"%s\" (status %d)", needle, st);
	}
	st = t_relay_signal(&R, SIGTERM, 10000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void
test_bad_credentials_and_privileges(void **state)
{
	char ci[512];

	(void)state;
	t_relay_setup(&R, "creds", 0);
	t_exec(R.pg, "DO $$ BEGIN CREATE ROLE pwuser LOGIN REPLICATION PASSWORD 'right-pw'; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
	t_exec(R.pg, "DO $$ BEGIN CREATE ROLE norepl LOGIN; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");

	snprintf(ci, sizeof(ci), "host=%s port=%s user=pwuser password=wrong-pw-hunter2 dbname=%s",
	    R.st.host, R.st.port, R.db);
	expect_permanent(ci, "password authentication failed", "hunter2");
	snprintf(ci, sizeof(ci), "postgresql://pwuser:wrong-pw-hunter2@%s:%s/%s", R.st.host, R.st.port, R.db);
	expect_permanent(ci, "password authentication failed", "hunter2");
	/* a name that does not resolve may resolve soon (a Service being created): retried */
	snprintf(ci, sizeof(ci), "host=no-such-host.invalid port=%s user=pwuser dbname=%s", R.st.port, R.db);
	expect_transient(ci, "could not translate host name");
	snprintf(ci, sizeof(ci), "host=%s port=%s user=norepl dbname=%s", R.st.host, R.st.port, R.db);
	/* the server's words changed in 16 */
	expect_permanent(ci, t_pgmajor() >= 16 ? "permission denied to start WAL sender" :
	    "must be superuser or replication role", NULL);
	snprintf(ci, sizeof(ci), "host=%s port=%s user=postgres dbname=no_such_db", R.st.host, R.st.port);
	expect_permanent(ci, "does not exist", NULL);
}

/*
 * The password from a mounted file, as a Kubernetes Secret volume with
 * fsGroup holds it (mode 0440): libpq's own pgpass file of that mode is
 * refused, so OUTBOXD_SOURCE_PASSWORD_FILE ([source] password) carries it,
 * over the replication connection and the ordinary one alike.
 */
static void
test_password_from_mounted_file(void **state)
{
	char ci[512], pwfile[64] = "", passfile[64] = "", cmd[1024];
	PGconn *c;

	(void)state;
	t_relay_setup(&R, "pwfile", 0);
	t_exec(R.pg, "DO $$ BEGIN CREATE ROLE pwuser LOGIN REPLICATION PASSWORD 'right-pw'; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
	t_exec(R.pg, "ALTER ROLE pwuser PASSWORD 'right-pw'");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	t_exec(R.pg, "GRANT SELECT ON outbox TO pwuser");

	/* libpq refuses a pgpass file the group may read */
	snprintf(cmd, sizeof(cmd), "%s:%s:*:pwuser:right-pw\n", R.st.host, R.st.port);
	t_write_file(passfile, sizeof(passfile), cmd);
	assert_int_equal(chmod(passfile, 0440), 0);
	snprintf(ci, sizeof(ci), "host=%s port=%s user=pwuser dbname=%s passfile=%s", R.st.host,
	    R.st.port, R.db, passfile);
	c = PQconnectdb(ci);
	assert_int_not_equal(PQstatus(c), CONNECTION_OK);
	PQfinish(c);
	unlink(passfile);

	t_write_file(pwfile, sizeof(pwfile), "right-pw\n");
	assert_int_equal(chmod(pwfile, 0440), 0);
	snprintf(ci, sizeof(ci), "host=%s port=%s user=pwuser dbname=%s", R.st.host, R.st.port, R.db);
	t_relay_config(&R, NULL);
	{
		FILE *fp = fopen(R.conf, "w");

		fprintf(fp, "[source]\nconninfo = %s\nslot = %s\nstatus_interval = 1s\ncreate_publication = false\n"
		    "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
		    "[log]\nformat = text\nlevel = debug\n", ci, R.slot, R.b.bootstrap);
		fclose(fp);
	}
	/* without the file: no password, refused */
	snprintf(cmd, sizeof(cmd), "%s status -c %s >/dev/null 2>&1", getenv("OBX_OUTBOXD"), R.conf);
	assert_int_not_equal(system(cmd), 0);
	assert_int_equal(setenv("OUTBOXD_SOURCE_PASSWORD_FILE", pwfile, 1), 0);
	t_relay_start(&R, NULL, 1); /* the replication connection */
	assert_int_equal(t_log_count(&R, "right-pw"), 0);
	unsetenv("OUTBOXD_SOURCE_PASSWORD_FILE");
	/* status's ordinary connection (the slot exists now) */
	snprintf(cmd, sizeof(cmd), "OUTBOXD_SOURCE_PASSWORD_FILE=%s %s status -c %s >/dev/null 2>&1", pwfile,
	    getenv("OBX_OUTBOXD"), R.conf);
	assert_int_equal(system(cmd), 0);
	unlink(pwfile);
}

/*
 * Creating a slot waits for the transactions running when it started to
 * end.  A transaction left open must not make outboxd deaf to SIGTERM while
 * it waits (Kubernetes would have to kill it, again on every restart).
 */
static void
test_slot_creation_wait_ends_on_sigterm(void **state)
{
	PGconn *open_txn;
	int st;

	(void)state;
	t_relay_setup(&R, "slotwait", 0);
	open_txn = t_pg(&R.st, R.db, 0);
	t_exec(open_txn, "BEGIN");
	t_exec(open_txn, "CREATE TABLE held (v int)"); /* takes an xid */
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 0);
	sleep(3);
	assert_int_equal(t_log_count(&R, "streaming from slot"), 0); /* still waiting */
	st = t_relay_signal(&R, SIGTERM, 10000);
	if (st == -1 || !WIFEXITED(st)) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop on SIGTERM while creating its slot (status %d)", st);
	}
	t_exec(open_txn, "COMMIT");
	PQfinish(open_txn);
	/* and once the transaction is over, the slot is created and the relay streams */
	t_relay_start(&R, NULL, 1);
}

/*
 * A slot of another database can never decode this one: outboxd stops with
 * one line naming both databases instead of retrying START_REPLICATION.
 */
static void
test_slot_of_another_database(void **state)
{
	char other[64];
	PGconn *o;
	int st;

	(void)state;
	t_relay_setup(&R, "slotdb", 0);
	t_create_db(&R.st, "slotdb_other", other, sizeof(other));
	o = t_pg(&R.st, other, 0);
	t_exec(o, "SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", R.slot);
	t_relay_config(&R, NULL);
	unlink(R.log);
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 30000);
	R.pid = 0;
	t_exec(o, "SELECT pg_drop_replication_slot('%s')", R.slot);
	PQfinish(o);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 ||
	    t_log_count(&R, "belongs to database") != 1) {
		t_log_dump(&R);
		fail_msg("expected exit 1 naming the slot's database (status %d)", st);
	}
	assert_int_equal(t_log_count(&R, other), 1); /* the same line names it */
	assert_int_equal(t_log_count(&R, "retrying"), 0);
}

/* A second cluster with TLS and wal_level = replica: verify-full connects, then wal_level is refused. */
static void
test_tls_and_wal_level(void **state)
{
	char dir[] = "/tmp/obx-tls.XXXXXX";
	char cmd[4096], conf[600], ci[1024], statedir[700];
	struct t_stack st2;
	FILE *fp;

	(void)state;
	t_relay_setup(&R, "tls", 0);
	assert_non_null(mkdtemp(dir));
	chmod(dir, 0755);
	snprintf(cmd, sizeof(cmd),
	    "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=obx-test-ca "
	    "-keyout ca.key -out ca.crt >/dev/null 2>&1 && "
	    "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr >/dev/null 2>&1 && "
	    "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && "
	    "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
	    "-extfile san.ext -out server.crt >/dev/null 2>&1 && "
	    "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=other-ca -keyout other.key "
	    "-out other.crt >/dev/null 2>&1", dir);
	assert_int_equal(system(cmd), 0);
	snprintf(conf, sizeof(conf), "%s/extra.conf", dir);
	fp = fopen(conf, "w");
	fprintf(fp, "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nwal_level = replica\n");
	fclose(fp);
	snprintf(statedir, sizeof(statedir), "%s/stack", dir);
	t_stack_start_extra(&st2, statedir, conf);

	snprintf(ci, sizeof(ci), "host=127.0.0.1 port=%s user=postgres dbname=postgres sslmode=verify-full "
	    "sslrootcert=%s/ca.crt", st2.port, dir);
	expect_permanent(ci, "wal_level is 'replica' but logical replication needs wal_level = logical", NULL);
	snprintf(ci, sizeof(ci), "host=127.0.0.1 port=%s user=postgres dbname=postgres sslmode=verify-full "
	    "sslrootcert=%s/other.crt", st2.port, dir);
	expect_permanent(ci, "certificate verify failed", NULL);

	t_stack_stop_extra(statedir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* Two instances starting together on a fresh database: one creates and streams, one waits. */
static void
test_two_instances_start_together(void **state)
{
	struct t_relay S;
	int64_t t0;
	int a, b;

	(void)state;
	t_relay_setup(&R, "together", 0);
	t_relay_config(&R, NULL);
	t_relay_twin(&R, &S, "second");
	t_relay_start(&R, NULL, 0);
	t_relay_start(&S, NULL, 0);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 20000; usleep(50000)) {
		a = t_log_count(&R, "streaming from slot") + t_log_count(&S, "streaming from slot");
		b = t_log_count(&R, "standby:") + t_log_count(&S, "standby:");
		if (a == 1 && b == 1)
			break;
	}
	if (a != 1 || b != 1) {
		t_log_dump(&R);
		t_log_dump(&S);
		fail_msg("expected one streaming and one standby instance (streaming %d, standby %d)", a, b);
	}
	assert_int_equal(t_log_count(&R, "could not create") + t_log_count(&S, "could not create"), 0);
	insert_events(&R, "together", 0, 20);
	expect_all_published(&R, "together", 20000);
	t_relay_twin_stop(&S);
}

/* A second SIGTERM stops at once, without confirming what is not acknowledged. */
static void
test_second_signal_exits_at_once(void **state)
{
	char *before;
	int64_t t0;
	int st;

	(void)state;
	t_relay_setup(&R, "twice", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	insert_events(&R, "twice", 0, 1);
	expect_all_published(&R, "twice", 15000);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	before = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	insert_events(&R, "twice", 1, 5);
	sleep(1);
	kill(R.pid, SIGTERM);
	sleep(2);
	assert_int_equal(waitpid(R.pid, &st, WNOHANG), 0); /* still draining */
	t0 = t_now_ms();
	st = t_relay_signal(&R, SIGTERM, 5000);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_true(t_now_ms() - t0 < 3000);
	assert_int_equal(t_log_count(&R, "second signal: stopping at once"), 1);
	t_slot_wait_inactive(&R, 10000);
	assert_true(t_slot_confirmed(&R) <= t_lsn(before));
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	free(before);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_walsender_terminated, teardown),
		cmocka_unit_test_teardown(test_hung_walsender_detected, teardown),
		cmocka_unit_test_teardown(test_producer_fatal_error_rewinds, teardown),
		cmocka_unit_test_teardown(test_standby_takes_over, teardown),
		cmocka_unit_test_teardown(test_two_instances_start_together, teardown),
		cmocka_unit_test_teardown(test_second_signal_exits_at_once, teardown),
		cmocka_unit_test_teardown(test_bad_credentials_and_privileges, teardown),
		cmocka_unit_test_teardown(test_password_from_mounted_file, teardown),
		cmocka_unit_test_teardown(test_slot_creation_wait_ends_on_sigterm, teardown),
		cmocka_unit_test_teardown(test_slot_of_another_database, teardown),
		cmocka_unit_test_teardown(test_tls_and_wal_level, teardown),
		cmocka_unit_test_teardown(test_invalidated_slot, teardown),
		cmocka_unit_test_teardown(test_long_broker_outage_memory_bound, teardown),
		cmocka_unit_test_teardown(test_server_crash_and_restart, teardown),
	};

	return T_RUN_TESTS(tests);
}
