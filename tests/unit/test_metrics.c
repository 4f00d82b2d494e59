/* The Prometheus text outboxd serves: families, series and values, from a struct. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/metrics.h"

static char *text;

static int
release(void **state)
{
	(void)state;
	free(text);
	text = NULL;
	return 0;
}

/* Renders m into text (freed by the teardown). */
static const char *
render(const struct obx_metrics *m)
{
	size_t len = 0;

	free(text);
	text = obx_metrics_render(m, NULL, &len);
	assert_non_null(text);
	assert_int_equal(strlen(text), len);
	return text;
}

/* Whether body has line as a whole line. */
static bool
has_line(const char *body, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = body; (p = strstr(p, line)) != NULL; p++)
		if ((p == body || p[-1] == '\n') && p[n] == '\n')
			return true;
	return false;
}

#define assert_line(body, line)                                                                                   \
	do {                                                                                                      \
		if (!has_line((body), (line)))                                                                    \
			fail_msg("no line '%s' in:\n%s", (line), (body));                                         \
	} while (0)
#define assert_no_text(body, s)                                                                                   \
	do {                                                                                                      \
		if (strstr((body), (s)) != NULL)                                                                  \
			fail_msg("'%s' should not be in:\n%s", (s), (body));                                      \
	} while (0)

static void
streaming(struct obx_metrics *m)
{
	memset(m, 0, sizeof(*m));
	m->state = OBX_STATE_STREAMING;
	m->poll_pending_rows = -1;
	snprintf(m->info_slot, sizeof(m->info_slot), "outboxd");
	snprintf(m->info_database, sizeof(m->info_database), "shop");
	snprintf(m->info_table, sizeof(m->info_table), "public.outbox");
}

/* Observations land in the buckets that resolve 0.5 to 10 s; the le labels are cumulative. */
static void
test_histogram_buckets(void **state)
{
	static const double want[] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 30, 60,
		300 };
	struct obx_metrics m;
	const char *b;

	(void)state;
	assert_int_equal(OBX_HIST_BUCKETS, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < OBX_HIST_BUCKETS; i++)
		assert_true(obx_hist_bounds[i] == want[i]);
	streaming(&m);
	obx_metrics_observe(&m, 0.004);
	obx_metrics_observe(&m, 0.7);
	obx_metrics_observe(&m, 1.5);
	obx_metrics_observe(&m, 2.5);
	obx_metrics_observe(&m, 6);
	obx_metrics_observe(&m, 9.9);
	obx_metrics_observe(&m, 1000);
	b = render(&m);
	assert_line(b, "# TYPE outboxd_commit_to_ack_seconds histogram");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"0.005\"} 1");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"0.5\"} 1");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"1\"} 2");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"2\"} 3");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"3\"} 4");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"5\"} 4");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"7.5\"} 5");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"10\"} 6");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"300\"} 6");
	assert_line(b, "outboxd_commit_to_ack_seconds_bucket{le=\"+Inf\"} 7");
	assert_line(b, "outboxd_commit_to_ack_seconds_count 7");
}

/* outboxd_info says the mode; outboxd_up is gone (Prometheus's own up says it). */
static void
test_info_and_no_up(void **state)
{
	struct obx_metrics m;
	const char *b;

	(void)state;
	streaming(&m);
	b = render(&m);
	assert_line(b,
	    "outboxd_info{slot=\"outboxd\",database=\"shop\",table=\"public.outbox\",mode=\"streaming\","
	    "version=\"" OBX_VERSION "\"} 1");
	assert_no_text(b, "outboxd_up");
	memset(&m, 0, sizeof(m));
	m.poll_mode = 1;
	m.poll_pending_rows = -1;
	snprintf(m.info_database, sizeof(m.info_database), "sh\"op");
	b = render(&m);
	assert_line(b,
	    "outboxd_info{slot=\"\",database=\"sh\\\"op\",table=\"\",mode=\"poll\",version=\"" OBX_VERSION
	    "\"} 1");
}

/* wal_status is a state set: one series per status, 1 for the slot's; none before the slot is read. */
static void
test_wal_status_state_set(void **state)
{
	struct obx_metrics m;
	const char *b;

	(void)state;
	streaming(&m);
	b = render(&m);
	assert_no_text(b, "outboxd_slot_wal_status");
	m.has_slot = 1;
	m.slot_wal_status = obx_metrics_wal_status("unreserved");
	b = render(&m);
	assert_line(b, "# TYPE outboxd_slot_wal_status gauge");
	assert_line(b, "outboxd_slot_wal_status{status=\"reserved\"} 0");
	assert_line(b, "outboxd_slot_wal_status{status=\"extended\"} 0");
	assert_line(b, "outboxd_slot_wal_status{status=\"unreserved\"} 1");
	assert_line(b, "outboxd_slot_wal_status{status=\"lost\"} 0");
	assert_no_text(b, "outboxd_slot_wal_status 3");
	m.slot_wal_status = obx_metrics_wal_status("lost");
	b = render(&m);
	assert_line(b, "outboxd_slot_wal_status{status=\"unreserved\"} 0");
	assert_line(b, "outboxd_slot_wal_status{status=\"lost\"} 1");
	m.slot_wal_status = obx_metrics_wal_status(NULL);
	b = render(&m);
	assert_line(b, "outboxd_slot_wal_status{status=\"reserved\"} 0");
	assert_line(b, "outboxd_slot_wal_status{status=\"lost\"} 0");
}

/* The lag is the server's while the slot exists; NaN when the read failed or the slot is gone, never 0. */
static void
test_lag_nan_without_slot(void **state)
{
	struct obx_metrics m;
	const char *b;

	(void)state;
	streaming(&m);
	m.server_ok = true;
	m.server_wal_lsn = 4096;
	m.lag_bytes = 0;
	b = render(&m);
	assert_line(b, "outboxd_lag_bytes NaN");
	assert_line(b, "outboxd_server_wal_lsn 4096");
	m.has_slot = 1;
	m.lag_bytes = 2048;
	b = render(&m);
	assert_line(b, "outboxd_lag_bytes 2048");
	m.server_ok = false;
	b = render(&m);
	assert_line(b, "outboxd_lag_bytes NaN");
	assert_line(b, "outboxd_server_wal_lsn NaN");
}

/* Every listed code has its series from the start; an unlisted one counts as other. */
static void
test_kafka_errors_from_zero(void **state)
{
	struct obx_metrics m;
	const char *b;
	char line[128];

	(void)state;
	streaming(&m);
	b = render(&m);
	for (const char *const *c =
	         (const char *const[]){ "_MSG_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "MSG_SIZE_TOO_LARGE",
	             "UNKNOWN_TOPIC_OR_PART", "TOPIC_AUTHORIZATION_FAILED", "_FENCED", "other", NULL };
	     *c != NULL; c++) {
		snprintf(line, sizeof(line), "outboxd_kafka_errors_total{code=\"%s\"} 0", *c);
		assert_line(b, line);
	}
	obx_metrics_kafka_error(&m, "_MSG_TIMED_OUT");
	obx_metrics_kafka_error(&m, "_MSG_TIMED_OUT");
	obx_metrics_kafka_error(&m, "_NO_OFFSET");
	obx_metrics_kafka_error(&m, NULL);
	b = render(&m);
	assert_line(b, "outboxd_kafka_errors_total{code=\"_MSG_TIMED_OUT\"} 2");
	assert_line(b, "outboxd_kafka_errors_total{code=\"other\"} 2");
	assert_line(b, "outboxd_kafka_errors_total{code=\"_TRANSPORT\"} 0");
	assert_no_text(b, "_NO_OFFSET");
}

/* The last event's time: 0 before the first, then when the count last grew. */
static void
test_last_event_timestamp(void **state)
{
	struct obx_metrics m;
	const char *b;

	(void)state;
	streaming(&m);
	b = render(&m);
	assert_line(b, "# TYPE outboxd_last_event_timestamp_seconds gauge");
	assert_line(b, "outboxd_last_event_timestamp_seconds 0.000");
	obx_metrics_published(&m, 0, 1700000000.0);
	assert_true(m.last_event_unix == 0);
	obx_metrics_published(&m, 3, 1700000001.5);
	obx_metrics_published(&m, 3, 1700000009.0); /* no new event: the time stays */
	b = render(&m);
	assert_line(b, "outboxd_last_event_timestamp_seconds 1700000001.500");
	assert_line(b, "outboxd_events_published_total 3");
	m.poll_mode = 1;
	obx_metrics_published(&m, 4, 1700000010.25);
	b = render(&m);
	assert_line(b, "outboxd_last_event_timestamp_seconds 1700000010.250");
}

/* The table label: a series per table up to the bound, then "_other", across thousands of tenants. */
static void
test_table_label_bounded(void **state)
{
	static struct obx_metrics m; /* large: not on the stack */
	char name[64];
	const char *b;
	size_t series = 0;

	(void)state;
	streaming(&m);
	b = render(&m);
	assert_line(b, "# TYPE outboxd_table_events_total counter");
	assert_no_text(b, "outboxd_table_events_total{");
	for (int t = 0; t < 3000; t++) {
		snprintf(name, sizeof(name), "tenant_%d.outbox", t);
		for (int e = 0; e <= t % 3; e++)
			obx_metrics_table_event(&m, obx_metrics_table_slot(&m, name));
	}
	/* a table seen before keeps its slot */
	assert_int_equal(obx_metrics_table_slot(&m, "tenant_0.outbox"), 0);
	assert_int_equal(obx_metrics_table_slot(&m, "tenant_2999.outbox"), OBX_METRICS_TABLES);
	b = render(&m);
	assert_line(b, "outboxd_table_events_total{table=\"tenant_0.outbox\"} 1");
	assert_line(b, "outboxd_table_events_total{table=\"tenant_2.outbox\"} 3");
	assert_no_text(b, "table=\"tenant_256.outbox\"");
	for (const char *p = b; (p = strstr(p, "outboxd_table_events_total{")) != NULL; p++)
		series++;
	assert_int_equal(series, OBX_METRICS_TABLES + 1);
	{
		/* every event counted once: the named series and _other add up to all of them */
		uint64_t named = 0, all = 0;

		for (size_t i = 0; i < m.ntables; i++)
			named += m.tables[i].events;
		for (int t = 0; t < 3000; t++)
			all += (uint64_t)(t % 3 + 1);
		assert_true(named + m.other_table_events == all);
		snprintf(name, sizeof(name), "outboxd_table_events_total{table=\"_other\"} %llu",
		    (unsigned long long)m.other_table_events);
		assert_line(b, name);
	}
}

/* The process_* families, under the client libraries' names; a number not read is left out. */
static void
test_process_metrics(void **state)
{
	struct obx_metrics m;
	struct obx_process p = { 12.5, 14680064, 300000000, 17, 1048576, 1700000000.25 };
	size_t len;

	(void)state;
	streaming(&m);
	assert_no_text(render(&m), "process_");
	free(text);
	text = obx_metrics_render(&m, &p, &len);
	assert_non_null(text);
	assert_line(text, "# TYPE process_cpu_seconds_total counter");
	assert_line(text, "process_cpu_seconds_total 12.50");
	assert_line(text, "# TYPE process_resident_memory_bytes gauge");
	assert_line(text, "process_resident_memory_bytes 14680064");
	assert_line(text, "process_virtual_memory_bytes 300000000");
	assert_line(text, "process_open_fds 17");
	assert_line(text, "process_max_fds 1048576");
	assert_line(text, "process_start_time_seconds 1700000000.25");
	p.open_fds = -1;
	p.cpu_seconds = -1;
	free(text);
	text = obx_metrics_render(&m, &p, &len);
	assert_no_text(text, "process_open_fds");
	assert_no_text(text, "process_cpu_seconds_total");
	assert_line(text, "process_max_fds 1048576");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_histogram_buckets, release),
		cmocka_unit_test_teardown(test_info_and_no_up, release),
		cmocka_unit_test_teardown(test_wal_status_state_set, release),
		cmocka_unit_test_teardown(test_lag_nan_without_slot, release),
		cmocka_unit_test_teardown(test_kafka_errors_from_zero, release),
		cmocka_unit_test_teardown(test_last_event_timestamp, release),
		cmocka_unit_test_teardown(test_process_metrics, release),
		cmocka_unit_test_teardown(test_table_label_bounded, release),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
