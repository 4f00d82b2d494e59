/*
 * The operational surface: /metrics (every family, live values), /healthz,
 * /readyz for the active instance and a standby, 404s, slow and malformed
 * clients that must not stall the relay, the process title, and
 * decommissioning with outboxd drop-slot.
 */
#include <arpa/inet.h>
#include <regex.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct t_relay R;
static char body[1 << 20];

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

static const char *const families[] = {
	"outboxd_up", "outboxd_state", "outboxd_received_lsn", "outboxd_confirmed_flush_lsn",
	"outboxd_server_wal_end_lsn", "outboxd_lag_bytes", "outboxd_oldest_unacked_age_seconds",
	"outboxd_commit_to_ack_seconds", "outboxd_events_published_total",
	"outboxd_events_dead_lettered_total", "outboxd_transactions_total", "outboxd_inflight_events",
	"outboxd_inflight_bytes", "outboxd_reconnects_total", "outboxd_kafka_errors_total",
	"outboxd_slot_retained_wal_bytes", "outboxd_slot_safe_wal_size_bytes", "outboxd_slot_wal_status",
	"outboxd_slot_max_wal_keep_size_bytes", "outboxd_info",
};

/* Every outboxd_* metric named in file exists in the scrape body. */
static void
expect_names_scraped(const char *relpath, const char *scrape)
{
	const char *src = getenv("OBX_SOURCE_DIR");
	char path[1024], *text;
	regex_t re;
	regmatch_t mt;
	FILE *fp;
	long len;
	int names = 0;

	snprintf(path, sizeof(path), "%s/%s", src, relpath);
	fp = fopen(path, "r");
	assert_non_null(fp);
	fseek(fp, 0, SEEK_END);
	len = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	text = calloc(1, (size_t)len + 1);
	assert_int_equal(fread(text, 1, (size_t)len, fp), (size_t)len);
	fclose(fp);
	assert_int_equal(regcomp(&re, "outboxd_[a-z_]+", REG_EXTENDED), 0);
	for (const char *p = text; regexec(&re, p, 1, &mt, 0) == 0; p += mt.rm_eo) {
		char name[128], type[160];
		size_t n = (size_t)(mt.rm_eo - mt.rm_so);
		const char *suffixes[] = { "_bucket", "_sum", "_count" };

		if (n >= sizeof(name))
			continue;
		memcpy(name, p + mt.rm_so, n);
		name[n] = '\0';
		for (size_t i = 0; i < 3; i++) {
			size_t sl = strlen(suffixes[i]);

			if (n > sl && strcmp(name + n - sl, suffixes[i]) == 0)
				name[n - sl] = '\0';
		}
		if (strcmp(name, "outboxd_slot_status") == 0)
			continue; /* the SQL view, not a metric */
		snprintf(type, sizeof(type), "# TYPE %s ", name);
		if (strstr(scrape, type) == NULL)
			fail_msg("%s names %s, which a live scrape does not have", relpath, name);
		names++;
	}
	regfree(&re);
	free(text);
	assert_true(names > 5);
}

static int
raw_connect(int port)
{
	struct sockaddr_in a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

static void
test_metrics_health_and_slow_clients(void **state)
{
	int port, slow, bad;
	struct t_msg *m;
	size_t n;
	int64_t t0;
	char title[512];

	(void)state;
	t_relay_setup(&R, "ops", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n[log]\nprogress_interval = 1s\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);

	/* a client that sends half a request and holds the socket, and one that sends garbage */
	slow = raw_connect(port);
	assert_int_equal(write(slow, "GET /metr", 9), 9);
	bad = raw_connect(port);
	assert_int_equal(write(bad, "\x16\x03\x01garbage\r\n\r\n", 14), 14);

	for (int i = 0; i < 3; i++)
		t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('ops', 'k%d', 'T', '{}')", i);
	n = t_consume(R.b.bootstrap, "outbox.event.ops", 3, 15000, &m);
	assert_int_equal(n, 3); /* the relay kept going */
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 10000));

	/* every family with HELP and TYPE, and live values; slot gauges arrive from the poller */
	t0 = t_now_ms();
	do {
		t0 = t0 ? t0 : t_now_ms();
		assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
		if (t_metric(body, "outboxd_slot_wal_status") > 0 && t_metric(body, "outboxd_events_published_total") == 3)
			break;
		usleep(200000);
	} while (t_now_ms() - t0 < 20000);
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
		char help[128], type[128];

		snprintf(help, sizeof(help), "# HELP %s ", families[i]);
		snprintf(type, sizeof(type), "# TYPE %s ", families[i]);
		if (strstr(body, help) == NULL || strstr(body, type) == NULL)
			fail_msg("family %s missing from /metrics:\n%s", families[i], body);
	}
	assert_true(t_metric(body, "outboxd_up") == 1);
	assert_true(t_metric(body, "outboxd_state{state=\"streaming\"}") == 1);
	assert_true(t_metric(body, "outboxd_state{state=\"standby\"}") == 0);
	assert_true(t_metric(body, "outboxd_events_published_total") == 3);
	assert_true(t_metric(body, "outboxd_transactions_total") >= 3);
	assert_true(t_metric(body, "outboxd_inflight_events") == 0);
	assert_true(t_metric(body, "outboxd_oldest_unacked_age_seconds") == 0);
	assert_true(t_metric(body, "outboxd_commit_to_ack_seconds_count") == 3);
	assert_true(t_metric(body, "outboxd_confirmed_flush_lsn") > 0);
	assert_true(t_metric(body, "outboxd_slot_wal_status") == 1); /* reserved */
	assert_true(t_metric(body, "outboxd_slot_safe_wal_size_bytes") == -1); /* max_slot_wal_keep_size = -1 */
	assert_true(t_metric(body, "outboxd_slot_max_wal_keep_size_bytes") == -1);
	{
		/* every series says which slot, database and table it describes */
		char want[512];

		snprintf(want, sizeof(want), "outboxd_info{slot=\"%s\",database=\"%s\",table=\"public.outbox\","
		    "version=\"", R.slot, R.db);
		if (strstr(body, want) == NULL)
			fail_msg("no %s in:\n%s", want, body);
	}
	expect_names_scraped("deploy/kubernetes/components/monitoring/prometheusrule.yaml", body);
	expect_names_scraped("deploy/grafana/outboxd-dashboard.json", body);

	assert_int_equal(t_http_get(port, "/healthz", body, sizeof(body)), 200);
	assert_int_equal(t_http_get(port, "/readyz", body, sizeof(body)), 200);
	assert_string_equal(body, "ready: streaming\n");
	assert_int_equal(t_http_get(port, "/nope", body, sizeof(body)), 404);
	assert_int_equal(t_http_get(port, "/", body, sizeof(body)), 404);

	/* periodic progress lines, and the state in ps */
	sleep(2);
	assert_true(t_log_count(&R, "progress: streaming, received") >= 1);
	{
		char path[64];
		FILE *fp;
		size_t k;

		snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)R.pid);
		fp = fopen(path, "r");
		assert_non_null(fp);
		k = fread(title, 1, sizeof(title) - 1, fp);
		fclose(fp);
		title[k] = '\0';
		for (size_t i = 0; i < k; i++)
			if (title[i] == '\0')
				title[i] = ' ';
		assert_non_null(strstr(title, "streaming slot"));
	}

	/* broker down with an event outstanding: the age of the oldest unacked event grows */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('ops', 'late', 'T', '{}')");
	sleep(3);
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_oldest_unacked_age_seconds") >= 2);
	assert_true(t_metric(body, "outboxd_inflight_events") == 1);
	assert_true(t_metric(body, "outboxd_lag_bytes") > 0);
	assert_int_equal(t_http_get(port, "/healthz", body, sizeof(body)), 200); /* an outage is not a restart reason */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	close(slow);
	close(bad);
}

static void
test_standby_is_ready(void **state)
{
	struct t_relay S;
	int port;
	int64_t t0;

	(void)state;
	t_relay_setup(&R, "opsstandby", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	port = t_metrics_port(&S);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 10000; usleep(100000))
		if (t_http_get(port, "/readyz", body, sizeof(body)) == 200)
			break;
	assert_string_equal(body, "ready: standby\n");
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_state{state=\"standby\"}") == 1);
	assert_true(t_metric(body, "outboxd_state{state=\"streaming\"}") == 0);
	t_relay_twin_stop(&S);
}

static void
test_not_ready_while_failing(void **state)
{
	int port;
	int64_t t0;

	(void)state;
	t_relay_setup(&R, "opsdown", 0);
	/* a server that is not there: retried, not ready, but healthy */
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	{
		char text[2048];
		FILE *fp = fopen(R.conf, "w");

		snprintf(text, sizeof(text), "[source]\nconninfo = host=127.0.0.1 port=1 dbname=x\n"
		    "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n[log]\nformat = text\n",
		    R.b.bootstrap);
		fputs(text, fp);
		fclose(fp);
	}
	t_relay_start(&R, NULL, 0);
	port = t_metrics_port(&R);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 10000; usleep(100000))
		if (t_http_get(port, "/readyz", body, sizeof(body)) == 503 && strstr(body, "Connection refused"))
			break;
	assert_non_null(strstr(body, "not ready: connecting: could not connect to PostgreSQL"));
	assert_int_equal(t_http_get(port, "/healthz", body, sizeof(body)), 200);
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_reconnects_total{target=\"postgres\"}") >= 1);
	assert_true(t_metric(body, "outboxd_state{state=\"connecting\"}") == 1);
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
	snprintf(cmd, sizeof(cmd), "psql -X -q -v ON_ERROR_STOP=1 -h %s -p %s -U %s -d %s "
	    "-f %s/sql/001_outbox.sql -f %s/sql/002_publication.sql -f %s/sql/003_role.sql >/dev/null",
	    R.st.host, R.st.port, R.st.user, R.db, src, src, src);
	assert_int_equal(system(cmd), 0);
	snprintf(ci, sizeof(ci), "host=%s port=%s user=outboxd dbname=%s", R.st.host, R.st.port, R.db);
	snprintf(text, sizeof(text), "[source]\nconninfo = %s\nslot = %s\ncreate_publication = false\n"
	    "status_interval = 1s\n[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n"
	    "[log]\nformat = text\n", ci, R.slot, R.b.bootstrap);
	t_write_file(R.conf, sizeof(R.conf), text);
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_log_count(&R, "could not record"), 0);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('role', 'r1', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.role", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	{
		char *comment = t_query1(R.pg, "SELECT obj_description(oid, 'pg_publication') FROM pg_publication "
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
	snprintf(text, sizeof(text), "[source]\nconninfo = %s\nslot = %s\nstatus_interval = 1s\n"
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
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('hup', 'h1', 'T', '{}')");
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
	FILE *fp;
	size_t n;
	int st;

	snprintf(line, sizeof(line), "%s %s -c %s %s 2>&1", getenv("OBX_OUTBOXD"), cmd, R.conf, args);
	fp = popen(line, "r");
	assert_non_null(fp);
	n = fread(out, 1, len - 1, fp);
	out[n] = '\0';
	st = pclose(fp);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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
	return t_query1(R.pg, "SELECT coalesce(obj_description(oid, 'pg_publication'), '') FROM pg_publication "
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
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('drop', 'd1', 'T', '{}')");
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_metrics_health_and_slow_clients, teardown),
		cmocka_unit_test_teardown(test_standby_is_ready, teardown),
		cmocka_unit_test_teardown(test_not_ready_while_failing, teardown),
		cmocka_unit_test_teardown(test_least_privilege_role, teardown),
		cmocka_unit_test_teardown(test_sighup_rereads, teardown),
		cmocka_unit_test_teardown(test_drop_slot, teardown),
	};

	return T_RUN_TESTS(tests);
}
