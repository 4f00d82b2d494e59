/*
 * The operational surface: /metrics (every family, live values), /healthz,
 * /readyz for the active instance and a standby, 404s, slow and malformed
 * clients that must not stall the relay, and the process title.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <math.h>
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
	"outboxd_stream_sent_lsn", "outboxd_server_wal_lsn", "outboxd_lag_bytes",
	"outboxd_server_read_failures_total", "outboxd_oldest_unacked_age_seconds",
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
	expect_names_scraped("deploy/kubernetes/prometheusrule.yaml", body);
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

/* The slot's lag as the server computes it (what outboxd status prints). */
static int64_t
server_lag(void)
{
	char *v = t_query1(R.pg, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
	    "FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
	int64_t lag = strtoll(v, NULL, 10);

	free(v);
	return lag;
}

/*
 * outboxd_lag_bytes is the server's number: with every broker down and
 * writes going on, the in-flight cap pauses the stream (the walsender's
 * sent position stops), yet the metric follows the server's WAL position
 * minus the slot's confirmed position within a status interval (1 s here).
 * And when the server cannot be read it says so: NaN, and a counter.
 */
static void
test_lag_is_the_servers(void **state)
{
	int port;
	int64_t before, after;
	double lag = 0;

	(void)state;
	t_relay_setup(&R, "opslag", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n[delivery]\nmax_inflight = 100\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	for (int i = 0; i < 20; i++)
		t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'opslag', "
		    "'k' || g, 'T', jsonb_build_object('pad', repeat('x', 200)) FROM generate_series(1, 500) g");
	sleep(3);
	before = server_lag();
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	lag = t_metric(body, "outboxd_lag_bytes");
	after = server_lag();
	if (before < (1 << 20) || lag < (double)before - 65536 || lag > (double)after + 65536)
		fail_msg("outboxd_lag_bytes %.0f, the server says %" PRId64 " to %" PRId64 " (stream at %.0f)",
		    lag, before, after, t_metric(body, "outboxd_stream_sent_lsn"));
	assert_true(t_metric(body, "outboxd_server_read_failures_total") == 0);

	/* the server goes away: NaN and a count, never a frozen number (immediate: a fast
	 * shutdown would wait for the paused walsender) */
	assert_int_equal(t_pg_ctl(&R.st, "stop -m immediate"), 0);
	sleep(3);
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	lag = t_metric(body, "outboxd_lag_bytes");
	assert_int_equal(t_pg_ctl(&R.st, "start"), 0);
	PQreset(R.pg);
	if (!isnan(lag) || !(t_metric(body, "outboxd_server_read_failures_total") >= 1))
		fail_msg("with the server down: outboxd_lag_bytes %f, failures %f", lag,
		    t_metric(body, "outboxd_server_read_failures_total"));
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	if (!t_wait_confirmed_current(&R, 60000)) {
		t_log_dump(&R);
		fail_msg("the relay did not catch up after the outage");
	}
}

/* Lines of the stack's server log from offset on that contain needle. */
static int
server_log_count(long offset, const char *needle)
{
	char path[600], line[4096];
	FILE *fp;
	int n = 0;

	snprintf(path, sizeof(path), "%s/server.log", R.st.root);
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s", path);
	fseek(fp, offset, SEEK_SET);
	while (fgets(line, sizeof(line), fp) != NULL)
		n += strstr(line, needle) != NULL;
	fclose(fp);
	return n;
}

static long
server_log_size(void)
{
	char path[600];
	FILE *fp;
	long size;

	snprintf(path, sizeof(path), "%s/server.log", R.st.root);
	fp = fopen(path, "r");
	if (fp == NULL)
		fail_msg("could not open %s", path);
	fseek(fp, 0, SEEK_END);
	size = ftell(fp);
	fclose(fp);
	return size;
}

/*
 * A hot standby is quiet: while the active instance streams, the standby
 * asks the server once a second on an ordinary connection, so 40 s of
 * waiting add at most a handful of ERROR lines to the server's log (a
 * refused START_REPLICATION writes one each); it still takes over within
 * seconds when the active instance dies.
 */
static void
test_standby_is_quiet(void **state)
{
	struct t_relay S;
	long offset;
	int64_t t0;
	int errors;

	(void)state;
	t_relay_setup(&R, "opsquiet", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	offset = server_log_size();
	t_relay_twin(&R, &S, "standby");
	t_relay_start(&S, NULL, 0);
	sleep(40);
	errors = server_log_count(offset, "ERROR:");
	if (errors > 3 || t_log_count(&S, "standby:") != 1) {
		t_log_dump(&S);
		fail_msg("a standby waiting 40 s wrote %d ERROR line(s) to the server log", errors);
	}
	assert_int_equal(kill(R.pid, SIGKILL), 0);
	assert_true(t_wait(R.pid, 10000) != -1);
	R.pid = 0;
	for (t0 = t_now_ms(); t_log_count(&S, "taking over slot") == 0 && t_now_ms() - t0 < 30000;)
		usleep(100000);
	if (t_log_count(&S, "taking over slot") != 1) {
		t_log_dump(&S);
		fail_msg("the standby did not take over within 30 s");
	}
	fprintf(stderr, "standby: took over %.1f s after the active instance died\n",
	    (double)(t_now_ms() - t0) / 1000.0);
	t_exec(R.pg, "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('opsq', 'k', 'T', '{}')");
	assert_true(t_wait_confirmed_current(&R, 20000));
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_metrics_health_and_slow_clients, teardown),
		cmocka_unit_test_teardown(test_standby_is_ready, teardown),
		cmocka_unit_test_teardown(test_lag_is_the_servers, teardown),
		cmocka_unit_test_teardown(test_standby_is_quiet, teardown),
		cmocka_unit_test_teardown(test_not_ready_while_failing, teardown),
		cmocka_unit_test_teardown(test_least_privilege_role, teardown),
		cmocka_unit_test_teardown(test_sighup_rereads, teardown),
	};

	return T_RUN_TESTS(tests);
}
