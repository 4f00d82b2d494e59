/*
 * Metrics and health: /metrics (every family, live values, promtool's lint,
 * every name the alerts and the dashboard use), /healthz and /readyz (not
 * ready while failing, with the reason), 404s, slow and malformed clients
 * that must not stall the relay nor starve the probes, the process title,
 * and the lag as the server computes it.
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

static char body[1 << 20];

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

static const char *const families[] = {
	"outboxd_state",
	"outboxd_received_lsn",
	"outboxd_confirmed_flush_lsn",
	"outboxd_stream_sent_lsn",
	"outboxd_server_wal_lsn",
	"outboxd_lag_bytes",
	"outboxd_server_read_failures_total",
	"outboxd_oldest_unacked_age_seconds",
	"outboxd_commit_to_ack_seconds",
	"outboxd_events_published_total",
	"outboxd_events_dead_lettered_total",
	"outboxd_transactions_total",
	"outboxd_inflight_events",
	"outboxd_inflight_bytes",
	"outboxd_reconnects_total",
	"outboxd_kafka_errors_total",
	"outboxd_slot_retained_wal_bytes",
	"outboxd_slot_safe_wal_size_bytes",
	"outboxd_slot_wal_status",
	"outboxd_slot_max_wal_keep_size_bytes",
	"outboxd_info",
};

/* Every outboxd_* and process_* metric named in file exists in the scrape body. */
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
	assert_int_equal(regcomp(&re, "(outboxd|process)_[a-z_]+", REG_EXTENDED), 0);
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

/* promtool check metrics accepts the scrape: the format, and the naming conventions it lints. */
static void
expect_promtool_accepts(const char *scrape)
{
	char path[] = "/tmp/obx-scrape.XXXXXX", cmd[256], out[8192];
	int fd = mkstemp(path);
	size_t len = strlen(scrape);
	int st;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, scrape, len), (ssize_t)len);
	close(fd);
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
	st = t_run_capture(cmd, out, sizeof(out));
	unlink(path);
	if (st != 0)
		fail_msg("promtool check metrics (status %d): %s\non:\n%s", st, out, scrape);
}

/* The soft limit on open files in /proc/PID/limits; -1 when not found. */
static double
proc_max_files(pid_t pid)
{
	char path[64], line[256];
	double v = -1;
	FILE *fp;

	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	fp = fopen(path, "r");
	assert_non_null(fp);
	while (fgets(line, sizeof(line), fp) != NULL)
		if (strncmp(line, "Max open files", 14) == 0)
			v = strtod(line + 14, NULL);
	fclose(fp);
	return v;
}

/* Descriptors open in PID, as /proc/PID/fd lists them. */
static int
proc_open_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	assert_non_null(d);
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* The process_* metrics describe the daemon, which started shortly before started_by. */
static void
expect_process_metrics(const char *scrape, pid_t pid, double started_by)
{
	double start = t_metric(scrape, "process_start_time_seconds");
	double fds = t_metric(scrape, "process_open_fds"), there = proc_open_fds(pid);

	if (start > started_by + 1 || start < started_by - 60)
		fail_msg("process_start_time_seconds %.2f, the daemon was running by %.0f", start, started_by);
	if (fds < 5 || fds < there - 5 || fds > there + 5)
		fail_msg("process_open_fds %.0f, /proc/%d/fd lists %.0f", fds, (int)pid, there);
	assert_true(t_metric(scrape, "process_max_fds") == proc_max_files(pid));
	assert_true(t_metric(scrape, "process_resident_memory_bytes") > 1 << 20);
	assert_true(t_metric(scrape, "process_virtual_memory_bytes") >=
	    t_metric(scrape, "process_resident_memory_bytes"));
	assert_true(t_metric(scrape, "process_cpu_seconds_total") >= 0);
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
	double t_start, last;

	(void)state;
	t_relay_setup(&R, "ops", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n[log]\nprogress_interval = 1s\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);

	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_last_event_timestamp_seconds") == 0); /* none yet */
	t_start = (double)time(NULL);
	/* a client that sends half a request and holds the socket, and one that sends garbage */
	slow = raw_connect(port);
	assert_int_equal(write(slow, "GET /metr", 9), 9);
	bad = raw_connect(port);
	assert_int_equal(write(bad, "\x16\x03\x01garbage\r\n\r\n", 14), 14);

	for (int i = 0; i < 3; i++)
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('ops', 'k%d', 'T', '{}')",
		    i);
	n = t_consume(R.b.bootstrap, "outbox.event.ops", 3, 15000, &m);
	assert_int_equal(n, 3); /* the relay kept going */
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 10000));

	/* every family with HELP and TYPE, and live values; slot gauges arrive from the poller */
	t0 = t_now_ms();
	do {
		t0 = t0 ? t0 : t_now_ms();
		assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
		if (t_metric(body, "outboxd_slot_wal_status{status=\"reserved\"}") == 1 &&
		    t_metric(body, "outboxd_events_published_total") == 3)
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
	if (strstr(body, "outboxd_up") != NULL)
		fail_msg("outboxd_up is still served (Prometheus's up says it):\n%s", body);
	assert_true(t_metric(body, "outboxd_state{state=\"streaming\"}") == 1);
	assert_true(t_metric(body, "outboxd_state{state=\"standby\"}") == 0);
	assert_true(t_metric(body, "outboxd_events_published_total") == 3);
	assert_true(t_metric(body, "outboxd_transactions_total") >= 3);
	assert_true(t_metric(body, "outboxd_inflight_events") == 0);
	assert_true(t_metric(body, "outboxd_oldest_unacked_age_seconds") == 0);
	assert_true(t_metric(body, "outboxd_commit_to_ack_seconds_count") == 3);
	last = t_metric(body, "outboxd_last_event_timestamp_seconds");
	if (last < t_start - 1 || last > (double)time(NULL) + 1)
		fail_msg("outboxd_last_event_timestamp_seconds %.3f, the events went out after %.0f", last,
		    t_start);
	assert_true(t_metric(body, "outboxd_confirmed_flush_lsn") > 0);
	assert_true(t_metric(body, "outboxd_slot_wal_status{status=\"reserved\"}") == 1);
	assert_true(t_metric(body, "outboxd_slot_wal_status{status=\"lost\"}") == 0);
	assert_true(t_metric(body, "outboxd_slot_safe_wal_size_bytes") == -1); /* max_slot_wal_keep_size = -1 */
	assert_true(t_metric(body, "outboxd_slot_max_wal_keep_size_bytes") == -1);
	{
		/* every series says which slot, database and table it describes */
		char want[512];

		snprintf(want, sizeof(want),
		    "outboxd_info{slot=\"%s\",database=\"%s\",table=\"public.outbox\","
		    "mode=\"streaming\",version=\"",
		    R.slot, R.db);
		if (strstr(body, want) == NULL)
			fail_msg("no %s in:\n%s", want, body);
	}
	/* the error codes alerts take rate() of are there before the first error */
	assert_true(t_metric(body, "outboxd_kafka_errors_total{code=\"_MSG_TIMED_OUT\"}") == 0);
	assert_true(t_metric(body, "outboxd_kafka_errors_total{code=\"UNKNOWN_TOPIC_OR_PART\"}") == 0);
	assert_true(t_metric(body, "outboxd_kafka_errors_total{code=\"other\"}") >= 0);
	expect_process_metrics(body, R.pid, t_start);
	expect_promtool_accepts(body);

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
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('ops', 'late', 'T', '{}')");
	sleep(3);
	assert_int_equal(t_http_get(port, "/metrics", body, sizeof(body)), 200);
	assert_true(t_metric(body, "outboxd_oldest_unacked_age_seconds") >= 2);
	assert_true(t_metric(body, "outboxd_inflight_events") == 1);
	assert_true(t_metric(body, "outboxd_lag_bytes") > 0);
	/* the producer's error callback counts too: deliveries never time out, connections fail */
	if (t_metric(body, "outboxd_kafka_errors_total{code=\"_TRANSPORT\"}") +
	        t_metric(body, "outboxd_kafka_errors_total{code=\"_ALL_BROKERS_DOWN\"}") <
	    1)
		fail_msg("brokers down, no _TRANSPORT or _ALL_BROKERS_DOWN counted:\n%s", body);
	assert_int_equal(t_http_get(port, "/healthz", body, sizeof(body)),
	    200); /* an outage is not a restart reason */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	close(slow);
	close(bad);
}

static struct t_relay P;

static int
teardown_both(void **state)
{
	t_relay_teardown(&P);
	return teardown(state);
}

/* Scrapes port until series reaches want (20 s at most); the body stays in out. */
static void
scrape_until(int port, const char *series, double want, char *out, size_t len)
{
	int64_t t0 = t_now_ms();

	do {
		assert_int_equal(t_http_get(port, "/metrics", out, len), 200);
		if (t_metric(out, series) == want)
			return;
		usleep(200000);
	} while (t_now_ms() - t0 < 20000);
	fail_msg("%s never reached %g:\n%s", series, want, out);
}

/*
 * Every metric the alerts and the dashboard name exists: in a streaming
 * instance's scrape (with the slot read) or a polling one's, both of which
 * promtool accepts; the polling mode says so in outboxd_info and keeps the
 * last event's time too.
 */
static void
test_alerts_and_dashboard_name_scraped_metrics(void **state)
{
	static char both[2 << 20];
	char want[512];
	struct t_msg *m;
	size_t n, used;
	double t_start = (double)time(NULL);
	int port;

	(void)state;
	t_relay_setup(&R, "opsnames", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);
	scrape_until(port, "outboxd_slot_wal_status{status=\"reserved\"}", 1, body, sizeof(body));
	expect_promtool_accepts(body);
	used = (size_t)snprintf(both, sizeof(both), "%s", body);

	t_relay_setup(&P, "opsnamespoll", 0);
	t_exec_file(P.pg, "sql/008_polling.sql");
	t_relay_config(&P, "[source]\nmode = poll\n[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&P, NULL, 0);
	port = t_metrics_port(&P);
	t_exec(P.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('opspoll', 'k', 'T', '{}')");
	n = t_consume(P.b.bootstrap, "outbox.event.opspoll", 1, 20000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	scrape_until(port, "outboxd_events_published_total", 1, body, sizeof(body));
	expect_promtool_accepts(body);
	snprintf(want, sizeof(want),
	    "outboxd_info{slot=\"\",database=\"%s\",table=\"public.outbox\",mode=\"poll\",", P.db);
	if (strstr(body, want) == NULL)
		fail_msg("no %s in:\n%s", want, body);
	if (t_metric(body, "outboxd_last_event_timestamp_seconds") < t_start - 1)
		fail_msg("polling: outboxd_last_event_timestamp_seconds %.3f, the event went out after %.0f",
		    t_metric(body, "outboxd_last_event_timestamp_seconds"), t_start);
	assert_true(t_metric(body, "outboxd_poll_oldest_pending_age_seconds") >= 0);
	snprintf(both + used, sizeof(both) - used, "%s", body);

	expect_names_scraped("deploy/kubernetes/components/monitoring/prometheusrule.yaml", both);
	expect_names_scraped("deploy/grafana/outboxd-dashboard.json", both);
}

/* A non-blocking TCP connection from loopback address src to 127.0.0.1:port; -1 when refused at once. */
static int
loop_connect(const char *src, int port)
{
	struct sockaddr_in a, s;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

	assert_true(fd >= 0);
	memset(&s, 0, sizeof(s));
	s.sin_family = AF_INET;
	assert_int_equal(inet_pton(AF_INET, src, &s.sin_addr), 1);
	assert_int_equal(bind(fd, (struct sockaddr *)&s, sizeof(s)), 0);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Whether the server has closed fd (end of file or a reset); reads and drops what came. */
static bool
peer_closed(int fd)
{
	char buf[4096];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n > 0)
			continue;
		if (n == 0)
			return true;
		return errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN && errno != EINTR;
	}
}

/*
 * GET path from 127.0.0.1 with a deadline of ms for the whole exchange, as
 * a kubelet probe does.  Returns the status with the body in out, or -1
 * when no whole answer came in time.
 */
static int
probe(int port, const char *path, int ms, char *out, size_t len)
{
	char req[256], resp[4096];
	int64_t until = t_now_ms() + ms;
	size_t used = 0, sent = 0, reqlen;
	int fd = loop_connect("127.0.0.1", port), status = -1;
	char *sep;

	if (fd < 0)
		return -1;
	reqlen = (size_t)snprintf(req, sizeof(req),
	    "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path);
	for (;;) {
		struct pollfd p = { fd, sent < reqlen ? POLLOUT : POLLIN, 0 };
		int64_t left = until - t_now_ms();
		ssize_t n;

		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			break;
		if (sent < reqlen) {
			n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
			if (n < 0 && errno != EAGAIN && errno != EINPROGRESS && errno != ENOTCONN)
				break;
			sent += n > 0 ? (size_t)n : 0;
			continue;
		}
		n = recv(fd, resp + used, sizeof(resp) - 1 - used, 0);
		if (n <= 0 || (used += (size_t)n) + 1 >= sizeof(resp)) {
			resp[used] = '\0';
			if (n == 0 && sscanf(resp, "HTTP/1.%*d %d", &status) == 1 &&
			    (sep = strstr(resp, "\r\n\r\n")) != NULL)
				snprintf(out, len, "%s", sep + 4);
			else
				status = -1;
			break;
		}
	}
	close(fd);
	return status;
}

#define SLOW_CLIENTS 200

#define PER_CLIENT 8 /* connections one source address may hold (src/sys/http.c) */

/*
 * 200 connections from one client (127.0.0.2) that send a header byte every
 * 2 s and reconnect whenever dropped; /healthz and /readyz from another
 * (127.0.0.1), as the kubelet probes from the node's address, answer 200
 * within 1 s every time.  Beside them: one client gets no more than its
 * share of connections, and a request dripped byte by byte, a connection
 * that sends nothing and an idle keep-alive connection are each dropped
 * after the request deadline.
 */
static void
test_slow_clients_do_not_starve_probes(void **state)
{
	static const char head[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
	int slow[SLOW_CLIENTS], share[20], drip, silent, idle, port, ok = 0, held = 0;
	size_t pos[SLOW_CLIENTS], dpos = 0;
	int64_t t0, next_tick = 0, drip_end = 0, silent_end = 0, idle_end = 0, idle_answered = 0;
	int open_share = 0;

	(void)state;
	t_relay_setup(&R, "opsslow", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_relay_start(&R, NULL, 1);
	port = t_metrics_port(&R);

	for (size_t i = 0; i < SLOW_CLIENTS; i++) {
		slow[i] = loop_connect("127.0.0.2", port);
		pos[i] = 0;
	}
	drip = loop_connect("127.0.0.4", port);
	silent = loop_connect("127.0.0.5", port);
	idle = loop_connect("127.0.0.6", port);
	assert_true(drip >= 0 && silent >= 0 && idle >= 0);
	usleep(100000);
	{
		static const char keep[] = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

		assert_int_equal(send(idle, keep, sizeof(keep) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(keep) - 1);
	}
	t0 = t_now_ms();
	for (int k = 0; k < 12; k++) {
		const char *path = k % 2 ? "/readyz" : "/healthz";
		int64_t at = t0 + 1250LL * k, start;
		int code;
		char got[256] = "";

		while (t_now_ms() < at) {
			int64_t now = t_now_ms();

			if (now >= next_tick) {
				/* every 2 s: one more header byte on each, a new connection for each dropped */
				int open = 0;

				for (size_t i = 0; i < SLOW_CLIENTS; i++) {
					if (slow[i] >= 0 && peer_closed(slow[i])) {
						close(slow[i]);
						slow[i] = -1;
					}
					if (slow[i] < 0) {
						slow[i] = loop_connect("127.0.0.2", port);
						pos[i] = 0;
						continue;
					}
					open++;
					if (send(slow[i], pos[i] < sizeof(head) - 1 ? head + pos[i] : "a", 1,
					        MSG_NOSIGNAL) == 1)
						pos[i]++;
				}
				held = open > held ? open : held;
				if (drip_end == 0 &&
				    send(drip, dpos < sizeof(head) - 1 ? head + dpos : "a", 1, MSG_NOSIGNAL) == 1)
					dpos++;
				next_tick = now + 2000;
			}
			if (drip_end == 0 && peer_closed(drip))
				drip_end = now;
			if (silent_end == 0 && peer_closed(silent))
				silent_end = now;
			if (idle_answered == 0) {
				char buf[512];
				ssize_t n = recv(idle, buf, sizeof(buf), MSG_DONTWAIT);

				if (n > 0)
					idle_answered = now;
				else if (n == 0)
					fail_msg("the keep-alive connection closed before its answer");
			} else if (idle_end == 0 && peer_closed(idle))
				idle_end = now;
			usleep(20000);
		}
		start = t_now_ms();
		code = probe(port, path, 1000, got, sizeof(got));
		printf("# probe %2d %-8s %d after %lld ms\n", k + 1, path, code, (long long)(t_now_ms() - start));
		if (code == 200 && strcmp(got, k % 2 ? "ready: streaming\n" : "ok\n") == 0)
			ok++;
	}
	for (size_t i = 0; i < SLOW_CLIENTS; i++)
		if (slow[i] >= 0)
			close(slow[i]);
	close(drip);
	close(silent);
	close(idle);
	printf("# slow client held up to %d connections; drip dropped after %lld ms, silent after %lld ms, "
	       "idle keep-alive after %lld ms\n",
	    held, (long long)(drip_end ? drip_end - t0 : -1), (long long)(silent_end ? silent_end - t0 : -1),
	    (long long)(idle_end ? idle_end - idle_answered : -1));
	if (ok != 12)
		fail_msg("%d of 12 probes answered 200 within 1 s with %d slow clients connected", ok,
		    SLOW_CLIENTS);
	assert_true(held >= 1 && held <= PER_CLIENT); /* the attack reached the server, within its share */
	/* the request deadline (5 s) drops each, whatever it sends; 2 s to spare */
	assert_true(drip_end > 0 && drip_end - t0 >= 4000 && drip_end - t0 <= 7000);
	assert_true(silent_end > 0 && silent_end - t0 <= 7000);
	assert_true(idle_answered > 0 && idle_end > 0 && idle_end - idle_answered <= 7000);

	/* one client's share: 20 connections, only PER_CLIENT stay (the others are closed at once) */
	for (size_t i = 0; i < 20; i++)
		assert_true((share[i] = loop_connect("127.0.0.3", port)) >= 0);
	usleep(500000);
	for (size_t i = 0; i < 20; i++)
		open_share += !peer_closed(share[i]);
	for (size_t i = 0; i < 20; i++)
		close(share[i]);
	if (open_share != PER_CLIENT)
		fail_msg("one client holds %d of 20 connections, expected %d", open_share, PER_CLIENT);
}

/* The slot's lag as the server computes it (what outboxd status prints). */
static int64_t
server_lag(void)
{
	char *v = t_query1(R.pg,
	    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
	    "FROM pg_replication_slots WHERE slot_name = '%s'",
	    R.slot);
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
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'opslag', "
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

/*
 * A server that refuses the configured role (NOLOGIN, which outboxd
 * retries, as a role may be granted it later): not ready, but healthy.  /readyz says why in a fixed phrase; the server's error text
 * (its address, the user name) only with [metrics] detailed_health = on,
 * and the log has it either way.
 */
static void
not_ready_while_failing(const char *extra)
{
	static char other[1 << 16];
	char text[2048];
	int port;
	int64_t t0;

	t_relay_setup(&R, "opsdown", 0);
	t_relay_config(&R, "[metrics]\nlisten = 127.0.0.1:0\n");
	t_exec(R.pg,
	    "DO $$BEGIN CREATE ROLE obx_ops_nologin NOLOGIN; "
	    "EXCEPTION WHEN duplicate_object THEN NULL; END$$");
	snprintf(text, sizeof(text),
	    "[source]\nconninfo = host=%s port=%s user=obx_ops_nologin dbname=%s\n"
	    "[kafka]\nbootstrap.servers = %s\n[metrics]\nlisten = 127.0.0.1:0\n%s[log]\nformat = text\n",
	    R.st.host, R.st.port, R.db, R.b.bootstrap, extra);
	t_write_file(R.conf, sizeof(R.conf), text);
	t_relay_start(&R, NULL, 0);
	port = t_metrics_port(&R);
	for (t0 = t_now_ms(); t_now_ms() - t0 < 10000; usleep(100000))
		if (t_log_count(&R, "role \"obx_ops_nologin\" is not permitted to log in") >= 1)
			break;
	assert_true(t_log_count(&R, "role \"obx_ops_nologin\" is not permitted to log in") >= 1);
	assert_int_equal(t_http_get(port, "/readyz", body, sizeof(body)), 503);
	assert_int_equal(t_http_get(port, "/healthz", other, sizeof(other)), 200);
	assert_int_equal(t_http_get(port, "/metrics", other, sizeof(other)), 200);
	assert_true(t_metric(other, "outboxd_reconnects_total{target=\"postgres\"}") >= 1);
	assert_true(t_metric(other, "outboxd_state{state=\"connecting\"}") == 1);
}

static void
test_not_ready_while_failing(void **state)
{
	(void)state;
	not_ready_while_failing("");
	assert_string_equal(body, "not ready: connecting: connecting to PostgreSQL\n");
}

static void
test_not_ready_detailed_health(void **state)
{
	static const char want[] =
	    "not ready: connecting: connecting to PostgreSQL: could not connect to PostgreSQL";

	(void)state;
	not_ready_while_failing("detailed_health = on\n");
	if (strncmp(body, want, sizeof(want) - 1) != 0 || strstr(body, "\"obx_ops_nologin\"") == NULL ||
	    strstr(body, R.st.host) == NULL)
		fail_msg("/readyz with detailed_health = on: %s", body);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_metrics_health_and_slow_clients, teardown),
		cmocka_unit_test_teardown(test_alerts_and_dashboard_name_scraped_metrics, teardown_both),
		cmocka_unit_test_teardown(test_slow_clients_do_not_starve_probes, teardown),
		cmocka_unit_test_teardown(test_lag_is_the_servers, teardown),
		cmocka_unit_test_teardown(test_not_ready_while_failing, teardown),
		cmocka_unit_test_teardown(test_not_ready_detailed_health, teardown),
	};

	return T_RUN_TESTS(tests);
}
