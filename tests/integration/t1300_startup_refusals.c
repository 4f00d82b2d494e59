/*
 * What outboxd refuses at start-up, with one line naming the thing: a
 * missing or wrong publication or table (a partitioned outbox gets the
 * publication it needs), the slot guard (a recorded slot gone missing, and
 * --recreate-slot), a publication recreated behind its slot, bad
 * credentials and missing privileges (permanent) against an unreachable
 * server (transient), a password from a mounted file, a slot of another
 * database, TLS verification and wal_level.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

/* Runs outboxd with extra config; expects exit status 1 and needle in its log. */
static void
expect_refusal(const char *extra, const char *arg, const char *needle)
{
	int st;

	t_relay_config(&R, extra);
	unlink(R.log);
	t_relay_start(&R, arg, 0);
	st = t_wait(R.pid, 20000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || t_log_count(&R, needle) != 1) {
		t_log_dump(&R);
		fail_msg("expected exit 1 with \"%s\" (status %d)", needle, st);
	}
	R.pid = 0;
}

static void
test_publication_and_table_refusals(void **state)
{
	(void)state;
	t_relay_setup(&R, "refuse", 0);
	t_exec(R.pg, "CREATE TABLE other (id int)");

	expect_refusal("[source]\ncreate_publication = false\n", NULL,
	    "publication outboxd does not exist and create_publication = false");
	expect_refusal("[source]\ntable = public.nothere\n", NULL, "outbox table public.nothere does not exist");

	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE other");
	expect_refusal(NULL, NULL, "publication outboxd does not publish table public.outbox");
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'update, delete')");
	expect_refusal(NULL, NULL, "publication outboxd does not publish inserts");
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	if (t_pg_has(15, "publications with a row filter or a column list")) {
		t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WHERE (aggregatetype <> 'secret')");
		expect_refusal(NULL, NULL, "publication outboxd has a row filter on public.outbox");
		t_exec(R.pg, "DROP PUBLICATION outboxd");
		t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox (id, aggregateid, type, payload)");
		expect_refusal(NULL, NULL, "has a column list without the mapped column(s) aggregatetype");
		t_exec(R.pg, "DROP PUBLICATION outboxd");
	}
	/* no slot may have been created by any of the refused starts */
	{
		char *n = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'",
		    R.slot);

		assert_string_equal(n, "0");
		free(n);
	}

	/* a partitioned outbox needs publish_via_partition_root */
	t_exec(R.pg, "DROP TABLE outbox");
	t_exec(R.pg,
	    "CREATE TABLE outbox (id uuid DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, "
	    "aggregateid text NOT NULL, type text NOT NULL, payload jsonb) PARTITION BY HASH (aggregateid)");
	t_exec(R.pg, "CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)");
	t_exec(R.pg, "CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	expect_refusal(NULL, NULL,
	    "is partitioned but publication outboxd lacks publish_via_partition_root = true");
}

static void
test_partitioned_outbox_created_publication(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "parts", 1);
	t_exec(R.pg,
	    "CREATE TABLE outbox (id uuid DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, "
	    "aggregateid text NOT NULL, type text NOT NULL, payload jsonb) PARTITION BY HASH (aggregateid)");
	t_exec(R.pg, "CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)");
	t_exec(R.pg, "CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'part', 'k' || i, 'P', '{}' FROM generate_series(1, 10) i");
	n = t_consume(R.b.bootstrap, "outbox.event.part", 10, 15000, &m);
	assert_int_equal(n, 10);
	t_msgs_free(m, n);
}

static void
test_slot_guard(void **state)
{
	int st;

	(void)state;
	t_relay_setup(&R, "guard", 0);
	/* rows that exist before the slot cannot be published: say so */
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('g', 'old', 'O', '{}')");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "1 row(s) already in public.outbox will not be published"), 1);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);

	/* the slot vanishes (failover, drop, restore): refuse to recreate it silently */
	t_exec(R.pg, "SELECT pg_drop_replication_slot('%s')", R.slot);
	expect_refusal(NULL, NULL, "is missing but existed before");
	{
		char *n = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'",
		    R.slot);

		assert_string_equal(n, "0");
		free(n);
	}
	/* an explicit --recreate-slot does it, with a warning naming the gap */
	unlink(R.log);
	t_relay_start(&R, "--recreate-slot", 1);
	assert_int_equal(t_log_count(&R, "recreated slot"), 1);

	/* ... once: the same slot lost again while that process runs is refused as usual */
	{
		int64_t deadline = t_now_ms() + 20000;
		char *dropped = NULL;

		while (t_now_ms() < deadline) {
			t_exec(R.pg,
			    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
			    "WHERE slot_name = '%s' AND active_pid IS NOT NULL",
			    R.slot);
			dropped = t_query1(R.pg,
			    "SELECT count(pg_drop_replication_slot(slot_name)) FROM "
			    "pg_replication_slots WHERE slot_name = '%s' AND NOT active",
			    R.slot);
			if (strcmp(dropped, "1") == 0)
				break;
			free(dropped);
			dropped = NULL;
			usleep(20000);
		}
		assert_non_null(dropped);
		free(dropped);
	}
	st = t_wait(R.pid, 20000);
	R.pid = 0;
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1)
		t_log_dump(&R);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_int_equal(t_log_count(&R, "is missing but existed before"), 1);
	assert_int_equal(t_log_count(&R, "recreated slot"), 1);
}

/*
 * A publication dropped and created again behind an existing slot is refused,
 * naming the recovery; a slot made outside outboxd, after its publication,
 * is adopted and recorded.
 */
static void
test_publication_recreated_behind_slot(void **state)
{
	struct t_msg *m;
	size_t n;
	char *gap;
	int st;

	(void)state;
	t_relay_setup(&R, "pubre", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_slot_wait_inactive(&R, 10000);
	t_exec(R.pg, "DROP PUBLICATION outboxd");
	gap = t_exec_commit_bound(R.pg, NULL,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('pubre', 'gap', 'T', '{}')");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	/* the server cannot decode the gap without the publication (up to 17 it stops with an
	 * error, 18 warns and skips it): a stop naming the recovery, the gap not confirmed */
	expect_refusal(NULL, NULL, "the publication was dropped behind slot");
	assert_int_equal(t_log_count(&R, "retrying"), 0);
	if (t_slot_confirmed(&R) > t_lsn(gap)) {
		t_log_dump(&R);
		fail_msg("the slot was confirmed past the row written without the publication (at %s)", gap);
	}
	free(gap);
	/* the new publication had no record of the slot: written at start-up */
	assert_int_equal(t_log_count(&R, "(made outside outboxd?): recorded it"), 1);

	/* the recovery it names: drop the slot, start once with --recreate-slot */
	t_exec(R.pg, "SELECT pg_drop_replication_slot('%s')", R.slot);
	unlink(R.log);
	t_relay_start(&R, "--recreate-slot", 1);
	assert_int_equal(t_log_count(&R, "recreated slot"), 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('pubre', 'after', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.pubre", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(m[0].key, "after");
	t_msgs_free(m, n);
	{
		char *comment = t_query1(R.pg,
		    "SELECT obj_description(oid, 'pg_publication') FROM pg_publication "
		    "WHERE pubname = 'outboxd'");

		assert_non_null(strstr(comment, "outboxd-slot"));
		free(comment);
	}
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

		fprintf(fp,
		    "%s[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
		    "[log]\nformat = text\nlevel = debug\n",
		    text, R.b.bootstrap);
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
	t_exec(R.pg,
	    "DO $$ BEGIN CREATE ROLE pwuser LOGIN REPLICATION PASSWORD 'right-pw'; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
	t_exec(R.pg,
	    "DO $$ BEGIN CREATE ROLE norepl LOGIN; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");

	snprintf(ci, sizeof(ci), "host=%s port=%s user=pwuser password=wrong-pw-hunter2 dbname=%s", R.st.host,
	    R.st.port, R.db);
	expect_permanent(ci, "password authentication failed", "hunter2");
	snprintf(ci, sizeof(ci), "postgresql://pwuser:wrong-pw-hunter2@%s:%s/%s", R.st.host, R.st.port, R.db);
	expect_permanent(ci, "password authentication failed", "hunter2");
	/* a name that does not resolve may resolve soon (a Service being created): retried */
	snprintf(ci, sizeof(ci), "host=no-such-host.invalid port=%s user=pwuser dbname=%s", R.st.port, R.db);
	expect_transient(ci, "could not translate host name");
	snprintf(ci, sizeof(ci), "host=%s port=%s user=norepl dbname=%s", R.st.host, R.st.port, R.db);
	/* the server's words changed in 16 */
	expect_permanent(ci,
	    t_pgmajor() >= 16 ? "permission denied to start WAL sender" : "must be superuser or replication role",
	    NULL);
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
	t_exec(R.pg,
	    "DO $$ BEGIN CREATE ROLE pwuser LOGIN REPLICATION PASSWORD 'right-pw'; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END $$");
	t_exec(R.pg, "ALTER ROLE pwuser PASSWORD 'right-pw'");
	t_exec(R.pg, "CREATE PUBLICATION outboxd FOR TABLE outbox WITH (publish = 'insert')");
	t_exec(R.pg, "GRANT SELECT ON outbox TO pwuser");

	/* libpq refuses a pgpass file the group may read */
	snprintf(cmd, sizeof(cmd), "%s:%s:*:pwuser:right-pw\n", R.st.host, R.st.port);
	t_write_file(passfile, sizeof(passfile), cmd);
	assert_int_equal(chmod(passfile, 0440), 0);
	snprintf(ci, sizeof(ci), "host=%s port=%s user=pwuser dbname=%s passfile=%s", R.st.host, R.st.port, R.db,
	    passfile);
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

		fprintf(fp,
		    "[source]\nconninfo = %s\nslot = %s\nstatus_interval = 1s\ncreate_publication = false\n"
		    "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
		    "[log]\nformat = text\nlevel = debug\n",
		    ci, R.slot, R.b.bootstrap);
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
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || t_log_count(&R, "belongs to database") != 1) {
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
	    "-out other.crt >/dev/null 2>&1",
	    dir);
	assert_int_equal(system(cmd), 0);
	snprintf(conf, sizeof(conf), "%s/extra.conf", dir);
	fp = fopen(conf, "w");
	fprintf(fp, "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nwal_level = replica\n");
	fclose(fp);
	snprintf(statedir, sizeof(statedir), "%s/stack", dir);
	t_stack_start_extra(&st2, statedir, conf);

	snprintf(ci, sizeof(ci),
	    "host=127.0.0.1 port=%s user=postgres dbname=postgres sslmode=verify-full "
	    "sslrootcert=%s/ca.crt",
	    st2.port, dir);
	expect_permanent(ci, "wal_level is 'replica' but logical replication needs wal_level = logical", NULL);
	snprintf(ci, sizeof(ci),
	    "host=127.0.0.1 port=%s user=postgres dbname=postgres sslmode=verify-full "
	    "sslrootcert=%s/other.crt",
	    st2.port, dir);
	expect_permanent(ci, "certificate verify failed", NULL);

	t_stack_stop_extra(statedir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_publication_and_table_refusals, teardown),
		cmocka_unit_test_teardown(test_partitioned_outbox_created_publication, teardown),
		cmocka_unit_test_teardown(test_slot_guard, teardown),
		cmocka_unit_test_teardown(test_publication_recreated_behind_slot, teardown),
		cmocka_unit_test_teardown(test_bad_credentials_and_privileges, teardown),
		cmocka_unit_test_teardown(test_password_from_mounted_file, teardown),
		cmocka_unit_test_teardown(test_slot_of_another_database, teardown),
		cmocka_unit_test_teardown(test_tls_and_wal_level, teardown),
	};

	return T_RUN_TESTS(tests);
}
