/*
 * Running outboxd: the least-privileged role it documents, SIGHUP rereading
 * the configuration, and decommissioning with outboxd drop-slot.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

/* The deployed set-up: the table owner runs sql/, outboxd logs in as its least-privilege role. */
static void
test_least_privilege_role(void **state)
{
	char cmd[2048], ci[512], text[2048];
	const char *src = getenv("OBX_SOURCE_DIR");
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "role", 1);
	snprintf(cmd, sizeof(cmd),
	    "psql -X -q -v ON_ERROR_STOP=1 -h %s -p %s -U %s -d %s "
	    "-f %s/sql/001_outbox.sql -f %s/sql/002_publication.sql -f %s/sql/003_role.sql >/dev/null",
	    R.st.host, R.st.port, R.st.user, R.db, src, src, src);
	assert_int_equal(system(cmd), 0);
	snprintf(ci, sizeof(ci), "host=%s port=%s user=outboxd dbname=%s", R.st.host, R.st.port, R.db);
	snprintf(text, sizeof(text),
	    "[source]\nconninfo = %s\nslot = %s\ncreate_publication = false\n"
	    "status_interval = 1s\n[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
	    "[log]\nformat = text\n",
	    ci, R.slot, R.b.bootstrap);
	t_write_file(R.conf, sizeof(R.conf), text);
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "could not record"), 0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('role', 'r1', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.role", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	{
		char *comment = t_query1(R.pg,
		    "SELECT obj_description(oid, 'pg_publication') FROM pg_publication "
		    "WHERE pubname = 'outboxd'");

		assert_non_null(strstr(comment, "outboxd-slot"));
		free(comment);
	}
}

/* SIGHUP re-reads the configuration: no exit; level and progress apply, the rest is named. */
static void
test_sighup_rereads(void **state)
{
	char ci[512], text[2048];
	struct t_msg *m;
	size_t n;
	FILE *f;

	(void)state;
	t_relay_setup(&R, "hup", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_conninfo(&R.st, R.db, ci, sizeof(ci));
	snprintf(text, sizeof(text),
	    "[source]\nconninfo = %s\nslot = %s\nstatus_interval = 1s\n"
	    "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
	    "[delivery]\nmax_inflight = 5\n[log]\nformat = text\nlevel = info\nprogress_interval = 1s\n",
	    ci, R.slot, R.b.bootstrap);
	f = fopen(R.conf, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(kill(R.pid, SIGHUP), 0);
	usleep(2500000);
	assert_int_equal(t_wait(R.pid, 1), -1); /* still running */
	if (t_log_count(&R, "SIGHUP: log level info, progress every 1000 ms") != 1)
		t_log_dump(&R);
	assert_int_equal(t_log_count(&R, "SIGHUP: log level info, progress every 1000 ms"), 1);
	assert_int_equal(t_log_count(&R, "take effect only after a restart: [delivery] max_inflight"), 1);
	assert_true(t_log_count(&R, "progress: ") >= 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('hup', 'h1', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.hup", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);

	/* a file that no longer parses: the running configuration stays */
	f = fopen(R.conf, "w");
	assert_non_null(f);
	fputs("[source\n", f);
	fclose(f);
	assert_int_equal(kill(R.pid, SIGHUP), 0);
	usleep(1000000);
	assert_int_equal(t_wait(R.pid, 1), -1);
	assert_int_equal(t_log_count(&R, "SIGHUP: could not re-read the configuration, the running one stays"), 1);
}

/* Runs outboxd CMD -c conf ARGS, output (both streams) into out; returns the exit status. */
static int
run_cmd(const char *cmd, const char *args, char *out, size_t len)
{
	char line[1024];

	snprintf(line, sizeof(line), "%s %s -c %s %s 2>&1", getenv("OBX_OUTBOXD"), cmd, R.conf, args);
	return t_run_capture(line, out, len);
}

static int
slot_count(const char *name)
{
	char *v = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '%s'", name);
	int n = atoi(v);

	free(v);
	return n;
}

static char *
pub_comment(void)
{
	return t_query1(R.pg,
	    "SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication "
	    "WHERE pubname = 'outboxd'");
}

/*
 * Decommissioning: drop-slot refuses while an instance streams (naming its
 * pid), changes nothing without --yes, and with it drops the slot, the
 * snapshot marker and the guard record (not a human's line in the same
 * comment, nor the publication), so a fresh run creates the slot again
 * instead of taking it for a lost one.
 */
static void
test_drop_slot(void **state)
{
	char out[8192], guard[160], marker[80], want[256], *v, *pid;
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "dropslot", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	snprintf(guard, sizeof(guard), "outboxd-slot %s ", R.slot);
	snprintf(marker, sizeof(marker), "%s_snapshot", R.slot);
	/* what an interrupted snapshot leaves, and a note of someone's beside the guard */
	v = t_query1(R.pg, "SELECT pg_create_physical_replication_slot('%s') IS NOT NULL", marker);
	free(v);
	v = pub_comment();
	assert_non_null(strstr(v, guard));
	t_exec(R.pg, "COMMENT ON PUBLICATION outboxd IS 'owned by the orders team\n%s'", v);
	free(v);

	pid = t_query1(R.pg, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
	assert_int_equal(run_cmd("drop-slot", "--yes", out, sizeof(out)), 1);
	snprintf(want, sizeof(want), "slot %s is active (pid %s streams from it)", R.slot, pid);
	if (strstr(out, want) == NULL)
		fail_msg("drop-slot does not say \"%s\":\n%s", want, out);
	free(pid);
	assert_int_equal(slot_count(R.slot), 1);

	assert_int_equal(t_relay_signal(&R, SIGTERM, 15000), 0);
	t_slot_wait_inactive(&R, 10000);
	assert_int_equal(run_cmd("drop-slot", "", out, sizeof(out)), 2);
	snprintf(want, sizeof(want), "would drop slot %s (confirmed up to ", R.slot);
	assert_non_null(strstr(out, want));
	snprintf(want, sizeof(want), "would drop slot %s (the marker", marker);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "would drop the guard record of slot"));
	assert_non_null(strstr(out, "nothing dropped: run again with --yes"));
	assert_int_equal(slot_count(R.slot), 1);
	assert_int_equal(slot_count(marker), 1);
	v = pub_comment();
	assert_non_null(strstr(v, guard));
	free(v);

	if (run_cmd("drop-slot", "--yes", out, sizeof(out)) != 0)
		fail_msg("drop-slot --yes failed:\n%s", out);
	assert_int_equal(slot_count(R.slot), 0);
	assert_int_equal(slot_count(marker), 0);
	v = pub_comment();
	assert_null(strstr(v, guard));
	assert_string_equal(v, "owned by the orders team");
	free(v);
	assert_int_equal(run_cmd("drop-slot", "", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "nothing to drop for slot"));

	/* a fresh run: the slot is created again, the guard has nothing to refuse */
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "existed before"), 0);
	assert_int_equal(slot_count(R.slot), 1);
	v = pub_comment();
	assert_non_null(strstr(v, guard));
	free(v);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('drop', 'd1', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.drop", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);

	/* --drop-publication: the publication goes too, and run creates both again */
	assert_int_equal(t_relay_signal(&R, SIGTERM, 15000), 0);
	t_slot_wait_inactive(&R, 10000);
	if (run_cmd("drop-slot", "--yes --drop-publication", out, sizeof(out)) != 0)
		fail_msg("drop-slot --yes --drop-publication failed:\n%s", out);
	v = t_query1(R.pg, "SELECT count(*) FROM pg_publication WHERE pubname = 'outboxd'");
	assert_string_equal(v, "0");
	free(v);
	assert_int_equal(slot_count(R.slot), 0);
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "existed before"), 0);
}

/*
 * An instance alive without streaming: publishing the pending rows of a new slot's snapshot
 * while every broker is down, so the slot exists and nothing streams from it.  drop-slot must
 * refuse (it would have dropped the slot and its guard record, and the instance would create the
 * slot again when the brokers came back); once the instance is stopped, it drops.
 */
static void
test_drop_slot_refuses_live_instance(void **state)
{
	char out[8192], want[256];
	int64_t deadline;

	(void)state;
	t_relay_setup(&R, "dropalive", 0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'alive', 'k' || g, 'T', '{}' FROM generate_series(1, 50) g");
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	t_relay_config(&R, "[source]\nsnapshot = pending\n");
	t_relay_start(&R, NULL, 0);
	deadline = t_now_ms() + 60000;
	while (t_log_count(&R, ": publishing the rows of public.outbox") == 0 || slot_count(R.slot) == 0) {
		if (t_now_ms() > deadline) {
			t_log_dump(&R);
			fail_msg("outboxd did not start its snapshot");
		}
		usleep(50000);
	}
	{
		char *v = t_query1(R.pg,
		    "SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = '%s'", R.slot);

		assert_string_equal(v, "0"); /* nothing streams from it */
		free(v);
	}
	assert_int_equal(run_cmd("drop-slot", "--yes", out, sizeof(out)), 1);
	snprintf(want, sizeof(want), "instance(s) of slot %s still run", R.slot);
	if (strstr(out, want) == NULL) {
		t_log_dump(&R);
		fail_msg("drop-slot does not say \"%s\":\n%s", want, out);
	}
	assert_int_equal(slot_count(R.slot), 1);
	assert_int_equal(t_relay_signal(&R, SIGTERM, 30000), 0);
	if (run_cmd("drop-slot", "--yes", out, sizeof(out)) != 0)
		fail_msg("drop-slot --yes failed once the instance stopped:\n%s", out);
	assert_int_equal(slot_count(R.slot), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_least_privilege_role, teardown),
		cmocka_unit_test_teardown(test_sighup_rereads, teardown),
		cmocka_unit_test_teardown(test_drop_slot, teardown),
		cmocka_unit_test_teardown(test_drop_slot_refuses_live_instance, teardown),
	};

	return T_RUN_TESTS(tests);
}
