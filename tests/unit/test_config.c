/* Configuration: defaults, every value kind, every error path, precedence, secrets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "obx/core/config.h"
#include "obx/sys/config_load.h"
#include "obx/core/err.h"
#include "obx/core/config_table.h"
#include "obx/core/tables.h"

static char path[64];
static char errbuf[1024];

static void
write_conf(const char *text)
{
	FILE *fp;
	int fd;

	snprintf(path, sizeof(path), "/tmp/obx-config-test.XXXXXX");
	fd = mkstemp(path);
	assert_true(fd >= 0);
	fp = fdopen(fd, "w");
	fputs(text, fp);
	fclose(fp);
}

/* Loads text (plus env and sets); returns the result code; errbuf holds the message. */
static int
load(struct obx_config *cfg, const char *text, char *const *env, const char *const *sets, size_t nsets)
{
	int r;

	write_conf(text);
	errbuf[0] = '\0';
	r = obx_config_load(cfg, path, env, sets, nsets, errbuf, sizeof(errbuf));
	unlink(path);
	return r;
}

/* Expects text to fail with a message containing want (after "config PATH"). */
static void
expect_error(const char *text, const char *want)
{
	struct obx_config cfg;
	char full[600];
	int r = load(&cfg, text, NULL, NULL, 0);

	obx_config_reset(&cfg);
	if (r != OBX_ECONFIG || strstr(errbuf, want) == NULL)
		fail_msg("for config:\n%s\nwant error containing \"%s\", got %d \"%s\"", text, want, r, errbuf);
	snprintf(full, sizeof(full), "config %s", path);
	assert_memory_equal(errbuf, full, strlen(full));
}

#define KAFKA "[kafka]\nbootstrap.servers = 127.0.0.1:9092\n"

static void
test_defaults(void **state)
{
	struct obx_config cfg;

	(void)state;
	assert_int_equal(load(&cfg, KAFKA, NULL, NULL, 0), 0);
	assert_string_equal(cfg.slot, "outboxd");
	assert_string_equal(cfg.publication, "outboxd");
	assert_string_equal(cfg.table_schema, "public");
	assert_string_equal(cfg.table_name, "outbox");
	assert_true(cfg.create_slot);
	assert_true(cfg.create_publication);
	assert_int_equal(cfg.status_interval_ms, 10000);
	assert_false(cfg.streaming);
	assert_int_equal(cfg.stream_buffer_bytes, 64LL << 20);
	assert_false(cfg.messages);
	assert_string_equal(cfg.message_prefix, "outboxd");
	assert_true(cfg.failover);
	assert_false(cfg.failover_set);
	assert_string_equal(cfg.col_id, "id");
	assert_string_equal(cfg.col_key, "aggregateid");
	assert_string_equal(cfg.col_aggregate_type, "aggregatetype");
	assert_string_equal(cfg.col_type, "type");
	assert_string_equal(cfg.col_payload, "payload");
	assert_string_equal(cfg.topic, "outbox.event.${aggregatetype}");
	assert_string_equal(cfg.col_headers, "");
	assert_string_equal(cfg.col_timestamp, "");
	assert_int_equal(cfg.max_inflight, 4000);
	assert_int_equal(cfg.max_inflight_bytes, 4 << 20);
	assert_int_equal(cfg.on_error, OBX_ON_ERROR_STOP);
	assert_true(cfg.dedupe);
	assert_string_equal(cfg.dead_letter_topic, "outbox.dead_letter");
	assert_string_equal(cfg.metrics_host, "0.0.0.0");
	assert_int_equal(cfg.metrics_port, 9898);
	assert_false(cfg.detailed_health);
	assert_int_equal(cfg.log_level, OBX_LOG_INFO);
	assert_int_equal(cfg.log_format, OBX_LOG_FORMAT_JSON);
	assert_int_equal(cfg.progress_interval_ms, 60000);
	assert_string_equal(obx_config_kafka_get(&cfg, "bootstrap.servers"), "127.0.0.1:9092");
	obx_config_reset(&cfg);
}

static void
test_full_file(void **state)
{
	struct obx_config cfg;
	static const char text[] =
	    "; comment\n# another\n"
	    "[source]\nconninfo = host=db port=5433 dbname=shop\nslot = s1\npublication = p1\n"
	    "table = sales.\"Out Box\"\ncreate_slot = no\ncreate_publication = off\n"
	    "status_interval = 500ms\n"
	    "[outbox]\nid = event_id\nkey = aggregate_id\naggregate_type = agg\ntype = tipo\n"
	    "payload = body\ntopic = ${tipo}\nheaders = hdrs\ntimestamp = created_at\n" KAFKA "linger.ms = 5\n"
	    "[delivery]\nmax_inflight = 500\nmax_inflight_bytes = 4MiB\non_error = dead_letter\n"
	    "dead_letter_topic = dlq\ndedupe = off\n"
	    "[metrics]\nlisten = 127.0.0.1:9000\ndetailed_health = on\n"
	    "[log]\nlevel = debug\nformat = text\n";

	(void)state;
	assert_int_equal(load(&cfg, text, NULL, NULL, 0), 0);
	assert_string_equal(cfg.conninfo, "host=db port=5433 dbname=shop");
	assert_string_equal(cfg.slot, "s1");
	assert_string_equal(cfg.table_schema, "sales");
	assert_string_equal(cfg.table_name, "Out Box");
	assert_false(cfg.create_slot);
	assert_false(cfg.create_publication);
	assert_int_equal(cfg.status_interval_ms, 500);
	assert_string_equal(cfg.col_id, "event_id");
	assert_string_equal(cfg.col_key, "aggregate_id");
	assert_string_equal(cfg.topic, "${tipo}");
	assert_string_equal(cfg.col_headers, "hdrs");
	assert_string_equal(cfg.col_timestamp, "created_at");
	assert_string_equal(obx_config_kafka_get(&cfg, "linger.ms"), "5");
	assert_int_equal(cfg.max_inflight, 500);
	assert_int_equal(cfg.max_inflight_bytes, 4 << 20);
	assert_int_equal(cfg.on_error, OBX_ON_ERROR_DEAD_LETTER);
	assert_string_equal(cfg.dead_letter_topic, "dlq");
	assert_false(cfg.dedupe);
	assert_string_equal(cfg.metrics_host, "127.0.0.1");
	assert_int_equal(cfg.metrics_port, 9000);
	assert_true(cfg.detailed_health);
	assert_int_equal(cfg.log_level, OBX_LOG_DEBUG);
	assert_int_equal(cfg.log_format, OBX_LOG_FORMAT_TEXT);
	obx_config_reset(&cfg);

	/* table names read as the server reads them: unquoted folds to lower case */
	{
		static const struct {
			const char *in, *schema, *name;
		} cases[] = {
			{ "Outbox", "public", "outbox" },
			{ "\"Outbox\"", "public", "Outbox" },
			{ "Sales.\"Outbox\"", "sales", "Outbox" },
			{ "\"Sales\".OutBox", "Sales", "outbox" },
			{ "\"a\"\"b\".x", "a\"b", "x" },
		};

		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			char text2[256];

			snprintf(text2, sizeof(text2), KAFKA "[source]\ntable = %s\n", cases[i].in);
			assert_int_equal(load(&cfg, text2, NULL, NULL, 0), 0);
			assert_string_equal(cfg.table_schema, cases[i].schema);
			assert_string_equal(cfg.table_name, cases[i].name);
			obx_config_reset(&cfg);
		}
	}
}

static bool
has_none(void *ctx, const char *schema, const char *name)
{
	(void)ctx, (void)schema, (void)name;
	return false;
}

static bool
has_all(void *ctx, const char *schema, const char *name)
{
	(void)ctx, (void)schema, (void)name;
	return true;
}

/* [source] table as a list with patterns, and [outbox.<schema>.<table>] over [outbox]. */
static void
test_several_tables(void **state)
{
	struct obx_config cfg, view;
	char out[256];
	const char *names[8];

	(void)state;
	assert_int_equal(load(&cfg,
	                     KAFKA "[source]\ntable = orders.outbox, tenant_*.outbox , \"Billing\".\"Out*\"\n"
	                           "[outbox]\ntopic = ev.${aggregatetype}\nheader.region = region\n"
	                           "[outbox.\"Billing\".\"Out*\"]\nkey = account\ntopic = billing\n"
	                           "[outbox.tenant_*.outbox]\nheader.tenant = tenant\n",
	                     NULL, NULL, 0),
	    0);
	assert_int_equal(cfg.n_tables, 3);
	assert_string_equal(cfg.table_schema, "orders"); /* the first entry */
	assert_string_equal(cfg.table_name, "outbox");
	assert_true(cfg.tables[1].schema_wild && !cfg.tables[1].name_wild);
	assert_false(cfg.tables[2].schema_wild || cfg.tables[2].name_wild); /* quoted: a literal '*' */
	assert_true(obx_tables_several(&cfg) && obx_tables_wild(&cfg));
	/* which table is an outbox and which mapping it takes */
	assert_int_equal(obx_tables_mapping(&cfg, "orders", "outbox"), 0);
	assert_int_equal(obx_tables_mapping(&cfg, "tenant_42", "outbox"), 2);
	assert_int_equal(obx_tables_mapping(&cfg, "tenant_", "outbox"), 2);
	assert_int_equal(obx_tables_mapping(&cfg, "tenant_42", "outbox2"), -1);
	assert_int_equal(obx_tables_mapping(&cfg, "Billing", "Out*"), 1);
	assert_int_equal(obx_tables_mapping(&cfg, "Billing", "Outbox"), -1);
	assert_int_equal(obx_tables_mapping(&cfg, "public", "outbox"), -1);
	/* an override inherits what it does not give */
	obx_tables_view(&cfg, 1, "Billing", "Out*", &view);
	assert_string_equal(view.col_key, "account");
	assert_string_equal(view.topic, "billing");
	assert_string_equal(view.col_id, "id");
	assert_string_equal(view.table_name, "Out*");
	assert_int_equal(view.n_extra_headers, 1);
	obx_tables_view(&cfg, 2, "tenant_7", "outbox", &view);
	assert_string_equal(view.topic, "ev.${aggregatetype}");
	assert_string_equal(view.col_key, "aggregateid");
	assert_int_equal(view.n_extra_headers, 2);
	assert_string_equal(view.extra_headers[1].key, "tenant");
	obx_tables_view(&cfg, 0, "orders", "outbox", &view);
	assert_int_equal(view.n_extra_headers, 1);
	/* a table that cannot be read: left out only when no exact entry names it */
	assert_true(obx_tables_may_leave_out(&cfg, "tenant_42", "outbox"));
	assert_false(obx_tables_may_leave_out(&cfg, "orders", "outbox"));
	/* a failed read: a lock passes any table over; missing or refused leaves a tenant out; a
	 * named table missing stops, refused retries; anything else (or no SQLSTATE) retries */
	assert_int_equal(obx_tables_read_fault(&cfg, "orders", "outbox", "55P03"), OBX_TABLE_FAULT_NEXT_TURN);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", "55P03"), OBX_TABLE_FAULT_NEXT_TURN);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", "42501"), OBX_TABLE_FAULT_LEAVE_OUT);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", "42703"), OBX_TABLE_FAULT_LEAVE_OUT);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", "3F000"), OBX_TABLE_FAULT_LEAVE_OUT);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", "42883"), OBX_TABLE_FAULT_LEAVE_OUT);
	assert_int_equal(obx_tables_read_fault(&cfg, "orders", "outbox", "42883"), OBX_TABLE_FAULT_RETRY);
	assert_int_equal(obx_tables_read_fault(&cfg, "orders", "outbox", "42P01"), OBX_TABLE_FAULT_STOP);
	assert_int_equal(obx_tables_read_fault(&cfg, "orders", "outbox", "42501"), OBX_TABLE_FAULT_RETRY);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", "57P01"), OBX_TABLE_FAULT_RETRY);
	assert_int_equal(obx_tables_read_fault(&cfg, "tenant_42", "outbox", NULL), OBX_TABLE_FAULT_RETRY);
	{
		/* the listed tables the server lacks, named in order: patterns never are */
		size_t next = 0;
		const struct obx_table_pat *e = obx_tables_next_missing(&cfg, &next, has_none, NULL);

		assert_non_null(e);
		assert_string_equal(e->schema, "orders");
		e = obx_tables_next_missing(&cfg, &next, has_none, NULL);
		assert_non_null(e);
		assert_string_equal(e->schema, "Billing");
		assert_null(obx_tables_next_missing(&cfg, &next, has_none, NULL));
		next = 0;
		assert_null(obx_tables_next_missing(&cfg, &next, has_all, NULL));
	}
	/* printed as it reads back */
	assert_int_equal(obx_cfg_format(&cfg, obx_cfg_find("source", "table", &names[0]), out, sizeof(out)), 0);
	assert_string_equal(out, "orders.outbox, tenant_*.outbox, \"Billing\".\"Out*\"");
	obx_config_reset(&cfg);

	/* one table, as before */
	assert_int_equal(load(&cfg, KAFKA, NULL, NULL, 0), 0);
	assert_int_equal(cfg.n_tables, 1);
	assert_false(obx_tables_several(&cfg));
	assert_int_equal(obx_tables_mapping(&cfg, "public", "outbox"), 0);
	obx_config_reset(&cfg);

	/* a changed override is a restart's */
	{
		struct obx_config a, b;

		assert_int_equal(
		    load(&a, KAFKA "[source]\ntable = a.o, b.o\n[outbox.b.o]\ntopic = x\n", NULL, NULL, 0), 0);
		assert_int_equal(
		    load(&b, KAFKA "[source]\ntable = a.o, b.o\n[outbox.b.o]\ntopic = y\n", NULL, NULL, 0), 0);
		assert_int_equal(obx_config_diff_restart(&a, &b, names, 8), 1);
		assert_string_equal(names[0], "[outbox.<schema>.<table>]");
		obx_config_reset(&b);
		assert_int_equal(load(&b, KAFKA "[source]\ntable = a.o\n[outbox.a.o]\ntopic = y\n", NULL, NULL, 0),
		    0);
		assert_int_equal(obx_config_diff_restart(&a, &b, names, 8), 2);
		assert_string_equal(names[0], "[source] table");
		obx_config_reset(&a);
		obx_config_reset(&b);
	}

	expect_error(KAFKA "[source]\ntable = a.o, a.o\n", "key 'table': 'a.o, a.o' names a.o twice");
	expect_error(KAFKA "[source]\ntable = a.o,\n", "key 'table': expected [schema.]table, or several");
	expect_error(KAFKA "[source]\ntable = a.o b.o\n", "key 'table': expected [schema.]table, or several");
	expect_error(KAFKA "[source]\ntable = a.o\n[outbox.b.o]\ntopic = x\n",
	    "section [outbox.b.o]: b.o is not a table of [source] table");
	expect_error(KAFKA "[source]\ntable = a.o\n[outbox.a.o]\ncolour = red\n",
	    "key 'colour': unknown key in [outbox.a.o] (it takes [outbox]'s keys)");
	expect_error(KAFKA "[source]\ntable = a.o\n[outbox.a.o]\ntopic = x\ntopic = y\n",
	    "key 'topic': set twice in [outbox.a.o]");
	expect_error(KAFKA "[source]\ntable = a.o\n[outbox.a.o]\ntopic = ${nope\n", "key 'topic'");
	expect_error(KAFKA "[source]\ntable = a.o\n[outbox.a.o]\nheader.id = x\n", "key 'header.id'");
	expect_error(KAFKA "[outbox.a.b.c]\ntopic = x\n",
	    "section 'outbox.a.b.c': expected [outbox.<schema>.<table>]");
	/* polling reads several tables too */
	assert_int_equal(load(&cfg, KAFKA "[source]\ntable = a.o, t_*.o\nmode = poll\n", NULL, NULL, 0), 0);
	obx_config_reset(&cfg);
	/* the table header is reserved with several tables only */
	expect_error(KAFKA "[source]\ntable = a.o, b.o\n[outbox]\nheader.table = t\n",
	    "key 'header.table': header 'table' is reserved with several tables");
	expect_error(KAFKA "[source]\ntable = a.o, b.o\n[outbox.b.o]\nheader.table = t\n",
	    "key 'header.table': header 'table' is reserved with several tables");
	assert_int_equal(load(&cfg, KAFKA "[outbox]\nheader.table = t\n", NULL, NULL, 0), 0);
	obx_config_reset(&cfg);
	/* one table with an override reads it per table too */
	assert_int_equal(load(&cfg, KAFKA "[source]\ntable = a.o\n[outbox.a.o]\nkey = k\n", NULL, NULL, 0), 0);
	assert_true(obx_tables_several(&cfg));
	obx_config_reset(&cfg);
	expect_error(KAFKA "[source]\ntable = a.o\n[outbox.a.o]\nkey = k\n[outbox.\"a\".O]\nkey = j\n",
	    "section 'outbox.\"a\".O' names the tables of [outbox.a.o] again");
	/* a quoted part is a whole part; a pattern prints back unquoted */
	expect_error(KAFKA "[source]\ntable = \"a\"b.o\n", "key 'table': expected [schema.]table");
	expect_error(KAFKA "[source]\ntable = \"T\"*.o\n", "key 'table': expected [schema.]table");
	assert_int_equal(load(&cfg, KAFKA "[source]\ntable = Tenant-*.o\n", NULL, NULL, 0), 0);
	assert_int_equal(obx_tables_format(&cfg, out, sizeof(out)), 0);
	assert_string_equal(out, "tenant-*.o");
	obx_config_reset(&cfg);
}

static void
test_glob(void **state)
{
	(void)state;
	assert_true(obx_glob_match("*", ""));
	assert_true(obx_glob_match("a*", "a"));
	assert_true(obx_glob_match("a*c", "abbbc"));
	assert_true(obx_glob_match("*b*", "abc"));
	assert_true(obx_glob_match("a*b*c", "aXbYbZc"));
	assert_false(obx_glob_match("a*c", "abcd"));
	assert_false(obx_glob_match("abc", "ab"));
	assert_false(obx_glob_match("a*b", "a"));
	assert_true(obx_glob_match("t_*_x", "t_1_2_x"));
	assert_false(obx_glob_match("t_*", "t"));
}

static void
test_structure_errors(void **state)
{
	(void)state;
	/* libinih reports sections only with their first key: the key's line is named */
	expect_error(KAFKA "[sauce]\nslot = x\n", ":4: section 'sauce': unknown section");
	expect_error("slot = x\n" KAFKA, ":1: key 'slot': outside of any [section]");
	expect_error(KAFKA "[source]\nslott = x\n", ":4: key 'slott': unknown key in [source]");
	expect_error(KAFKA "[outbox]\nkeyy = x\n", ":4: key 'keyy': unknown key in [outbox]");
	expect_error(KAFKA "[delivery]\nmax = 1\n", ":4: key 'max': unknown key in [delivery]");
	expect_error(KAFKA "[metrics]\nport = 1\n", ":4: key 'port': unknown key in [metrics]");
	expect_error(KAFKA "[log]\nlevl = info\n", ":4: key 'levl': unknown key in [log]");
	expect_error(KAFKA "[source]\nslot = a\nslot = b\n", ":5: key 'slot': set twice in [source] (first at ");
	expect_error(KAFKA "[source]\nthis line has no equals sign\n", ":4: syntax error");
	expect_error(KAFKA "[source\n", ":3: syntax error");
	expect_error(KAFKA "[source]\n  slot = x\n", ":4: key 'slot': indented line");
}

/* A conninfo line of the given length (newline not counted): a long sslrootcert path. */
static char *
conninfo_line(size_t len)
{
	static const char head[] = "conninfo = host=db1.example.com,db2.example.com port=5432,5432 "
	                           "dbname=shop user=outboxd sslmode=verify-full target_session_attrs=read-write "
	                           "sslrootcert=/etc/outboxd/tls";
	static const char tail[] = "/ca.pem";
	char *line = malloc(len + 2);
	size_t o = sizeof(head) - 1;

	assert_non_null(line);
	assert_true(len >= sizeof(head) + sizeof(tail));
	memcpy(line, head, o);
	for (; o < len - (sizeof(tail) - 1); o++)
		line[o] = o % 8 == 0 ? '/' : 'd';
	memcpy(line + o, tail, sizeof(tail) - 1);
	line[len] = '\n';
	line[len + 1] = '\0';
	return line;
}

/* Lines of any practical length: libinih's buffer grows to OBX_CONFIG_MAX_LINE, and past it
 * the line is an error naming file and line (never cut, the rest read as a line of its own) */
static void
test_long_lines(void **state)
{
	struct obx_config cfg;
	size_t lens[] = { 1000, 199, 200, 201, 400, 4096, OBX_CONFIG_MAX_LINE };
	char *text;

	(void)state;
	text = malloc(OBX_CONFIG_MAX_LINE + 256);
	assert_non_null(text);
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		char *line = conninfo_line(lens[i]);

		snprintf(text, OBX_CONFIG_MAX_LINE + 256, KAFKA "[source]\n%sslot = s1\n", line);
		assert_int_equal(load(&cfg, text, NULL, NULL, 0), 0);
		line[lens[i]] = '\0';
		assert_int_equal(strlen(cfg.conninfo), lens[i] - strlen("conninfo = "));
		assert_string_equal(cfg.conninfo, line + strlen("conninfo = "));
		assert_string_equal(cfg.slot, "s1");
		obx_config_reset(&cfg);
		/* the lines after a long one keep their numbers */
		snprintf(text, OBX_CONFIG_MAX_LINE + 256, KAFKA "[source]\n%s\nslott = x\n", line);
		expect_error(text, ":5: key 'slott': unknown key in [source]");
		free(line);
	}
	{
		char *line = conninfo_line(OBX_CONFIG_MAX_LINE + 1);
		char want[64];

		snprintf(text, OBX_CONFIG_MAX_LINE + 256, KAFKA "[source]\n%sslot = s1\n", line);
		snprintf(want, sizeof(want), ":4: line longer than %d characters", OBX_CONFIG_MAX_LINE);
		expect_error(text, want);
		/* also as the last line, without its newline */
		line[OBX_CONFIG_MAX_LINE + 1] = '\0';
		snprintf(text, OBX_CONFIG_MAX_LINE + 256, KAFKA "[source]\n%s", line);
		expect_error(text, want);
		free(line);
	}
	{
		/* a line of the limit ending CRLF (a file written on Windows) is within it */
		char *line = conninfo_line(OBX_CONFIG_MAX_LINE);

		line[OBX_CONFIG_MAX_LINE] = '\0';
		snprintf(text, OBX_CONFIG_MAX_LINE + 256, KAFKA "[source]\r\n%s\r\nslot = s1\r\n", line);
		assert_int_equal(load(&cfg, text, NULL, NULL, 0), 0);
		assert_string_equal(cfg.conninfo, line + strlen("conninfo = "));
		obx_config_reset(&cfg);
		free(line);
	}
	free(text);
}

/* libpq's service= (a service file, PGSERVICEFILE or ~/.pg_service.conf) is a conninfo like
 * any other: accepted as given, judged by libpq only at connection time, never rewritten */
static void
test_service_conninfo(void **state)
{
	struct obx_config cfg;
	char *env[] = { "OUTBOXD_SOURCE_CONNINFO=service=outboxd_env", NULL };
	char out[256];

	(void)state;
	assert_int_equal(load(&cfg, KAFKA "[source]\nconninfo = service=outboxd\n", NULL, NULL, 0), 0);
	assert_string_equal(cfg.conninfo, "service=outboxd");
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg,
	                     KAFKA "[source]\nconninfo = service=outboxd sslmode=require application_name=x\n",
	                     NULL, NULL, 0),
	    0);
	assert_string_equal(cfg.conninfo, "service=outboxd sslmode=require application_name=x");
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA "[source]\nconninfo = service=outboxd\n", env, NULL, 0), 0);
	assert_string_equal(cfg.conninfo, "service=outboxd_env");
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA "[source]\nconninfo = postgresql:///?service=outboxd\n", NULL, NULL, 0),
	    0);
	obx_config_reset(&cfg);
	assert_int_equal(obx_conninfo_redact("service=outboxd password=hunter2", out, sizeof(out)), 0);
	assert_string_equal(out, "service=outboxd password=********");
}

/* [source] failover: on by default; whether it was given is kept (an info line below 17) */
static void
test_failover_setting(void **state)
{
	struct obx_config cfg;
	char *env[] = { "OUTBOXD_SOURCE_FAILOVER=on", NULL };
	const char *sets[] = { "source.failover=off" };

	(void)state;
	assert_int_equal(load(&cfg, KAFKA "[source]\nfailover = off\n", NULL, NULL, 0), 0);
	assert_false(cfg.failover);
	obx_config_reset(&cfg);
	/* the booleans every other key takes */
	assert_int_equal(load(&cfg, KAFKA "[source]\nfailover = false\n", NULL, NULL, 0), 0);
	assert_false(cfg.failover);
	assert_true(cfg.failover_set);
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), 0);
	assert_true(cfg.failover);
	assert_true(cfg.failover_set);
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA, env, sets, 1), 0);
	assert_false(cfg.failover);
	obx_config_reset(&cfg);
	{
		struct obx_config a, b;
		const char *names[8];

		assert_int_equal(load(&a, KAFKA, NULL, NULL, 0), 0);
		assert_int_equal(load(&b, KAFKA, NULL, sets, 1), 0);
		assert_int_equal(obx_config_diff(&a, &b, names, 8), 1);
		assert_string_equal(names[0], "[source] failover");
		obx_config_reset(&a);
		obx_config_reset(&b);
	}
}

static void
test_value_errors(void **state)
{
	(void)state;
	expect_error(KAFKA "[source]\ncreate_slot = maybe\n",
	    ":4: key 'create_slot': expected true or false, got 'maybe'");
	expect_error(KAFKA "[source]\ncreate_publication = 2\n",
	    "key 'create_publication': expected true or false");
	expect_error(KAFKA "[source]\nstreaming = parallel\n",
	    ":4: key 'streaming': expected on or off, got 'parallel'");
	expect_error(KAFKA "[source]\nmessages = sometimes\n", ":4: key 'messages': expected true or false");
	expect_error(KAFKA "[source]\nfailover = maybe\n", ":4: key 'failover': expected on or off, got 'maybe'");
	expect_error(KAFKA "[source]\nmessage_prefix =\n", ":4: key 'message_prefix'");
	expect_error(KAFKA "[source]\nstream_buffer = 12\n",
	    ":4: key 'stream_buffer': '12' is out of range (1KiB to 1TiB)");
	expect_error(KAFKA "[source]\nstream_buffer = lots\n", ":4: key 'stream_buffer': expected a size");
	expect_error(KAFKA "[source]\nstatus_interval = 10\n",
	    ":4: key 'status_interval': expected a duration such as 10s or 500ms, got '10'");
	expect_error(KAFKA "[source]\nstatus_interval = 10 parsecs\n",
	    "key 'status_interval': expected a duration");
	expect_error(KAFKA "[source]\nstatus_interval = -1s\n", "key 'status_interval': expected a duration");
	expect_error(KAFKA "[source]\nstatus_interval = 5ms\n",
	    "key 'status_interval': '5ms' is out of range (100ms to 1h)");
	expect_error(KAFKA "[source]\nstatus_interval = 99999999999999999999s\n", "out of range");
	expect_error(KAFKA "[source]\nslot =\n", ":4: key 'slot': must not be empty");
	expect_error(KAFKA "[source]\ntable = a.b.c\n", "key 'table': expected [schema.]table, or several");
	expect_error(KAFKA "[source]\ntable = \"unclosed\n", "key 'table': expected [schema.]table");
	expect_error(KAFKA "[source]\ntable = .x\n", "key 'table': expected [schema.]table");
	expect_error(KAFKA "[outbox]\ntopic = events.${type\n", "key 'topic': unclosed '${'");
	expect_error(KAFKA "[outbox]\ntopic = events.${}\n", "key 'topic': empty '${}'");
	expect_error(KAFKA "[outbox]\nid =\n", "key 'id': must not be empty");
	expect_error(KAFKA "[delivery]\nmax_inflight = many\n",
	    "key 'max_inflight': expected an integer, got 'many'");
	expect_error(KAFKA "[delivery]\nmax_inflight = 0\n",
	    "key 'max_inflight': '0' is out of range (1 to 10000000)");
	expect_error(KAFKA "[delivery]\nmax_inflight = 10000001\n", "out of range");
	expect_error(KAFKA "[delivery]\nmax_inflight_bytes = 16 MiBs\n",
	    "key 'max_inflight_bytes': expected a size");
	expect_error(KAFKA "[delivery]\nmax_inflight_bytes = 10\n",
	    "key 'max_inflight_bytes': '10' is out of range");
	expect_error(KAFKA "[delivery]\non_error = ignore\n",
	    "key 'on_error': expected stop or dead_letter, got 'ignore'");
	expect_error(KAFKA "[delivery]\non_error = dead_letter\ndead_letter_topic =\n",
	    "key 'dead_letter_topic': must not be empty");
	expect_error(KAFKA "[delivery]\ndedupe = maybe\n", ":4: key 'dedupe': expected on or off, got 'maybe'");
	expect_error(KAFKA "[metrics]\nlisten = 9898\n", "key 'listen': expected host:port");
	expect_error(KAFKA "[metrics]\nlisten = host:70000\n", "key 'listen': expected host:port");
	expect_error(KAFKA "[metrics]\ndetailed_health = yes please\n",
	    "key 'detailed_health': expected on or off");
	expect_error(KAFKA "[log]\nlevel = verbose\n",
	    "key 'level': expected error, warn, info or debug, got 'verbose'");
	expect_error(KAFKA "[log]\nformat = xml\n", "key 'format': expected json or text, got 'xml'");
	expect_error(KAFKA "[log]\nprogress_interval = often\n", "key 'progress_interval': expected a duration");
	expect_error(KAFKA "[log]\nprogress_interval = 10ms\n", "key 'progress_interval': '10ms' is out of range");
}

static void
test_kafka_properties(void **state)
{
	(void)state;
	expect_error(KAFKA "no.such.property = 1\n", ":3: key 'no.such.property': unknown librdkafka property");
	expect_error(KAFKA "linger.ms = soon\n", ":3: key 'linger.ms': ");
	expect_error(KAFKA "enable.idempotence = false\n", "key 'enable.idempotence': must stay true");
	expect_error(KAFKA "acks = 1\n", "key 'acks': must stay 'all'");
	expect_error(KAFKA "request.required.acks = 0\n", "key 'request.required.acks': must stay 'all'");
	expect_error(KAFKA "transactional.id = x\n",
	    "key 'transactional.id': is set by outboxd: use [delivery] exactly_once = on");
	expect_error(KAFKA "partitioner = random\n", "key 'partitioner': must not be 'random'");
	expect_error(KAFKA "delivery.report.only.error = true\n",
	    "key 'delivery.report.only.error': must stay false");
	{
		struct obx_config ok;

		assert_int_equal(load(&ok, KAFKA "partitioner = murmur2\ndelivery.report.only.error = false\n",
		                     NULL, NULL, 0),
		    0);
		obx_config_reset(&ok);
	}
	expect_error("[source]\nslot = x\n", "key 'bootstrap.servers': required in [kafka]");
	expect_error("[kafka]\nbootstrap.servers =\n", "key 'bootstrap.servers': required in [kafka]");
	{
		struct obx_config cfg;

		/* tuning that keeps the guarantees is fine */
		assert_int_equal(load(&cfg,
		                     KAFKA "acks = all\nenable.idempotence = true\n"
		                           "compression.type = lz4\n",
		                     NULL, NULL, 0),
		    0);
		obx_config_reset(&cfg);
	}
}

static void
test_secrets_never_printed(void **state)
{
	struct obx_config cfg;
	char out[512];

	(void)state;
	/* a later error does not drag an earlier secret into the message */
	assert_int_equal(load(&cfg, KAFKA "sasl.password = hunter2\nno.such.property = 1\n", NULL, NULL, 0),
	    OBX_ECONFIG);
	obx_config_reset(&cfg);
	assert_null(strstr(errbuf, "hunter2"));
	assert_true(obx_kafka_prop_is_secret("sasl.password"));
	assert_true(obx_kafka_prop_is_secret("sasl.username"));
	assert_true(obx_kafka_prop_is_secret("ssl.key.password"));
	assert_true(obx_kafka_prop_is_secret("ssl.key.pem"));
	assert_true(obx_kafka_prop_is_secret("ssl.keystore.password"));
	assert_true(obx_kafka_prop_is_secret("sasl.oauthbearer.config"));
	assert_true(obx_kafka_prop_is_secret("sasl.oauthbearer.client.secret"));
	assert_false(obx_kafka_prop_is_secret("bootstrap.servers"));

	/* a malformed conninfo is not echoed: it may carry the password */
	assert_int_equal(load(&cfg, KAFKA "[source]\nconninfo = host=db password=hunter2 'oops\n", NULL, NULL, 0),
	    OBX_ECONFIG);
	obx_config_reset(&cfg);
	assert_non_null(strstr(errbuf, "key 'conninfo': not a valid libpq connection string"));
	assert_null(strstr(errbuf, "hunter2"));
	assert_int_equal(load(&cfg, KAFKA "[source]\nconninfo = postgresql://u:hunter2@db:99999999/x?bogus=1\n",
	                     NULL, NULL, 0),
	    OBX_ECONFIG);
	obx_config_reset(&cfg);
	assert_null(strstr(errbuf, "hunter2"));

	/* redaction, key/value and URI forms */
	assert_int_equal(obx_conninfo_redact("host=db user=app password=hunter2 dbname=shop", out, sizeof(out)),
	    0);
	assert_null(strstr(out, "hunter2"));
	assert_non_null(strstr(out, "password=********"));
	assert_non_null(strstr(out, "host=db"));
	assert_int_equal(
	    obx_conninfo_redact("postgresql://app:hunter2@db:5432/shop?sslmode=require", out, sizeof(out)), 0);
	assert_null(strstr(out, "hunter2"));
	assert_non_null(strstr(out, "user=app"));
	assert_non_null(strstr(out, "sslmode=require"));
	assert_int_equal(obx_conninfo_redact("host='unclosed password=hunter2", out, sizeof(out)), OBX_EINVAL);
	assert_null(strstr(out, "hunter2"));

	/* a bad --set with a secret does not echo the value */
	{
		const char *sets[] = { "kafka_sasl.password=hunter2" };

		assert_int_not_equal(load(&cfg, KAFKA, NULL, sets, 1), 0);
		obx_config_reset(&cfg);
		assert_null(strstr(errbuf, "hunter2"));
	}
}

static void
test_environment_and_set_overrides(void **state)
{
	struct obx_config cfg;
	char *env[] = {
		"PATH=/usr/bin",
		"OUTBOXD_SOURCE_SLOT=from_env",
		"OUTBOXD_SOURCE_STATUS_INTERVAL=2s",
		"OUTBOXD_KAFKA_BOOTSTRAP_SERVERS=envhost:9092",
		"OUTBOXD_KAFKA_SASL_PASSWORD=hunter2",
		"OUTBOXD_DELIVERY_MAX_INFLIGHT=7",
		"OUTBOXD_DELIVERY_DEDUPE=off",
		NULL,
	};
	const char *sets[] = { "source.slot=from_set", "delivery.on_error=dead_letter" };

	(void)state;
	assert_int_equal(load(&cfg, KAFKA "[source]\nslot = from_file\npublication = pf\n", env, sets, 2), 0);
	assert_string_equal(cfg.slot, "from_set"); /* --set beats env beats file */
	assert_string_equal(cfg.publication, "pf");
	assert_int_equal(cfg.status_interval_ms, 2000);
	assert_int_equal(cfg.max_inflight, 7);
	assert_false(cfg.dedupe);
	assert_int_equal(cfg.on_error, OBX_ON_ERROR_DEAD_LETTER);
	assert_string_equal(obx_config_kafka_get(&cfg, "bootstrap.servers"), "envhost:9092");
	assert_string_equal(obx_config_kafka_get(&cfg, "sasl.password"), "hunter2");
	obx_config_reset(&cfg);

	/* bootstrap.servers may come from the environment alone */
	{
		char *env2[] = { "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS=h:1", NULL };

		assert_int_equal(load(&cfg, "[source]\nslot = s\n", env2, NULL, 0), 0);
		obx_config_reset(&cfg);
	}
	/* errors name the variable */
	{
		char *env3[] = { "OUTBOXD_SOURCE_STATUS_INTERVAL=soon", NULL };
		char *env4[] = { "OUTBOXD_SORCE_SLOT=x", NULL };
		char *env5[] = { "OUTBOXD_NOSECTION=x", NULL };

		assert_int_equal(load(&cfg, KAFKA, env3, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_string_equal(errbuf,
		    "config environment OUTBOXD_SOURCE_STATUS_INTERVAL: "
		    "key 'status_interval': expected a duration such as 10s or 500ms, got 'soon'");
		assert_int_equal(load(&cfg, KAFKA, env4, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf,
		    "environment OUTBOXD_SORCE_SLOT: section 'sorce': unknown section"));
		assert_int_equal(load(&cfg, KAFKA, env5, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf, "expected OUTBOXD_<SECTION>_<KEY>"));
	}
	/* --set errors */
	{
		const char *bad1[] = { "slot=x" };
		const char *bad2[] = { "source.slot" };
		const char *bad3[] = { "source.nokey=1" };

		assert_int_equal(load(&cfg, KAFKA, NULL, bad1, 1), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_string_equal(errbuf, "config --set: expected section.key=value");
		assert_int_equal(load(&cfg, KAFKA, NULL, bad2, 1), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_int_equal(load(&cfg, KAFKA, NULL, bad3, 1), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_string_equal(errbuf, "config --set source.nokey: key 'nokey': unknown key in [source]");
	}
}

/* The kubelet's service-link variables for Services named outboxd-... are not configuration. */
static void
test_kubernetes_service_links_ignored(void **state)
{
	struct obx_config cfg;
	char *env[] = {
		"OUTBOXD_METRICS_SERVICE_HOST=10.0.0.7",
		"OUTBOXD_METRICS_SERVICE_PORT=9898",
		"OUTBOXD_METRICS_SERVICE_PORT_METRICS=9898",
		"OUTBOXD_METRICS_PORT=tcp://10.0.0.7:9898",
		"OUTBOXD_METRICS_PORT_9898_TCP=tcp://10.0.0.7:9898",
		"OUTBOXD_METRICS_PORT_9898_TCP_PROTO=tcp",
		"OUTBOXD_METRICS_PORT_9898_TCP_PORT=9898",
		"OUTBOXD_METRICS_PORT_9898_TCP_ADDR=10.0.0.7",
		"OUTBOXD_ORDERS_METRICS_PORT_53_UDP_ADDR=10.0.0.8",
		"OUTBOXD_BILLING_SERVICE_HOST=10.0.0.9",
		"OUTBOXD_SERVICE_PORT=9898",
		"OUTBOXD_PORT_9898_SCTP=sctp://10.0.0.7:9898",
		"OUTBOXD_SOURCE_SLOT=from_env",
		NULL,
	};

	(void)state;
	assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), 0);
	assert_string_equal(cfg.slot, "from_env");
	obx_config_reset(&cfg);
	/* a misspelled key of a real section stays an error */
	{
		char *bad[] = { "OUTBOXD_METRICS_LISTN=0.0.0.0:1", NULL };
		char *bad2[] = { "OUTBOXD_METRICS_PORT_9898_TCP_HOST=x", NULL };

		assert_int_equal(load(&cfg, KAFKA, bad, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf, "key 'listn': unknown key in [metrics]"));
		assert_int_equal(load(&cfg, KAFKA, bad2, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
	}
	assert_false(obx_config_is_service_link("OUTBOXD_SOURCE_CONNINFO", "host=x"));
	assert_false(obx_config_is_service_link("OUTBOXD_SOURCE_CONNINFO_FILE", "/x"));
	assert_false(obx_config_is_service_link("OUTBOXD_METRICS_PORT_X_TCP", "tcp://1.2.3.4:5"));
	/* a name of that shape whose value is no service link is a mistake, said as one */
	assert_false(obx_config_is_service_link("OUTBOXD_METRICS_PORT", "9"));
	assert_false(obx_config_is_service_link("OUTBOXD_METRICS_SERVICE_HOST", "db.example.com"));
	{
		char *bad3[] = { "OUTBOXD_METRICS_PORT=9", NULL };

		assert_int_equal(load(&cfg, KAFKA, bad3, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf, "key 'port': unknown key in [metrics]"));
	}
}

/* OUTBOXD_<SECTION>_<KEY>_FILE: a mounted secret, one trailing newline removed, never printed. */
static void
test_values_from_files(void **state)
{
	struct obx_config cfg;
	char secret[] = "/tmp/obx-secret.XXXXXX", var[128], var2[128], plain[64];
	int fd = mkstemp(secret);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "host=db password=s3cr3t\n", 24), 24);
	close(fd);
	snprintf(var, sizeof(var), "OUTBOXD_SOURCE_CONNINFO_FILE=%s", secret);
	snprintf(var2, sizeof(var2), "OUTBOXD_KAFKA_SASL_PASSWORD_FILE=%s", secret);
	{
		char *env[] = { var, var2, NULL };

		assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), 0);
		assert_string_equal(cfg.conninfo, "host=db password=s3cr3t");
		assert_string_equal(obx_config_kafka_get(&cfg, "sasl.password"), "host=db password=s3cr3t");
		obx_config_reset(&cfg);
	}
	/* both forms for one key */
	snprintf(plain, sizeof(plain), "OUTBOXD_SOURCE_CONNINFO=host=x");
	{
		char *env[] = { plain, var, NULL };

		assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf, "OUTBOXD_SOURCE_CONNINFO is set too"));
	}
	/* a file that cannot be read names the file, never a value */
	unlink(secret);
	{
		char *env[] = { var, NULL };

		assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf,
		    "config environment OUTBOXD_SOURCE_CONNINFO_FILE: could not open /tmp/obx-secret."));
		assert_null(strstr(errbuf, "s3cr3t"));
	}
	/* an unknown key stays an error through a file too */
	{
		char *env[] = { "OUTBOXD_SOURCE_NOKEY_FILE=/dev/null", NULL };

		assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf, "key 'nokey': unknown key in [source]"));
	}
}

/*
 * [source] password: libpq's password from a mounted file
 * (OUTBOXD_SOURCE_PASSWORD_FILE), since libpq's own pgpass file is refused
 * when group-readable, as a Kubernetes Secret volume with fsGroup is.
 */
static void
test_source_password_from_file(void **state)
{
	struct obx_config cfg, other;
	char secret[] = "/tmp/obx-secret.XXXXXX", var[128];
	const char *names[8];
	int fd = mkstemp(secret);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "pw-s3cr3t\n", 10), 10);
	close(fd);
	assert_int_equal(chmod(secret, 0440), 0); /* as the kubelet mounts it: group may read */
	snprintf(var, sizeof(var), "OUTBOXD_SOURCE_PASSWORD_FILE=%s", secret);
	{
		char *env[] = { var, NULL };

		assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), 0);
		assert_string_equal(cfg.password, "pw-s3cr3t");
		/* a changed password is named on SIGHUP, never shown */
		assert_int_equal(load(&other, KAFKA, NULL, NULL, 0), 0);
		assert_string_equal(other.password, "");
		assert_int_equal(obx_config_diff(&cfg, &other, names, 8), 1);
		assert_string_equal(names[0], "[source] password");
		obx_config_reset(&other);
		obx_config_reset(&cfg);
	}
	unlink(secret);
	/* a line break is refused without the value */
	{
		const char *sets[] = { "source.password=pw-s3cr3t\nx" };

		assert_int_equal(load(&cfg, KAFKA, NULL, sets, 1), OBX_ECONFIG);
		obx_config_reset(&cfg);
		assert_non_null(strstr(errbuf, "key 'password': holds a line break"));
		assert_null(strstr(errbuf, "s3cr3t"));
	}
}

static void
test_missing_file(void **state)
{
	struct obx_config cfg;
	int r;

	(void)state;
	r = obx_config_load(&cfg, "/nonexistent/outboxd.ini", NULL, NULL, 0, errbuf, sizeof(errbuf));
	obx_config_reset(&cfg);
	assert_int_equal(r, OBX_ECONFIG);
	assert_string_equal(errbuf, "config /nonexistent/outboxd.ini: could not open: No such file or directory");
}

static void
test_value_parsers(void **state)
{
	long long v;
	bool b;

	(void)state;
	assert_int_equal(obx_parse_duration_ms("10s", 0, 1LL << 40, &v), 0);
	assert_int_equal(v, 10000);
	assert_int_equal(obx_parse_duration_ms("2min", 0, 1LL << 40, &v), 0);
	assert_int_equal(v, 120000);
	assert_int_equal(obx_parse_duration_ms("1h", 0, 1LL << 40, &v), 0);
	assert_int_equal(v, 3600000);
	assert_int_equal(obx_parse_duration_ms("", 0, 10, &v), OBX_EINVAL);
	assert_int_equal(obx_parse_duration_ms("s", 0, 10, &v), OBX_EINVAL);
	assert_int_equal(obx_parse_size("1GiB", 0, 1LL << 40, &v), 0);
	assert_int_equal(v, 1LL << 30);
	assert_int_equal(obx_parse_size("9223372036854775807G", 0, 1LL << 40, &v), OBX_ERANGE);
	assert_int_equal(obx_parse_int("12x", 0, 100, &v), OBX_EINVAL);
	assert_int_equal(obx_parse_int("101", 0, 100, &v), OBX_ERANGE);
	assert_int_equal(obx_parse_bool("TRUE", &b), 0);
	assert_true(b);
	assert_int_equal(obx_parse_bool("", &b), OBX_EINVAL);
}

static void
set_ok(struct obx_config *cfg, const char *section, const char *key, const char *value)
{
	errbuf[0] = '\0';
	if (obx_config_set(cfg, section, key, value, "test", false, errbuf, sizeof(errbuf)) != 0)
		fail_msg("%s.%s = %s: %s", section, key, value, errbuf);
}

/* Expects got->v[from...] to be prefix00, prefix01, ... (count names). */
static void
expect_numbered(const struct obx_names *got, size_t from, const char *prefix, int count)
{
	for (int i = 0; i < count; i++) {
		char want[32];

		snprintf(want, sizeof(want), "%s%02d", prefix, i);
		assert_true(from + (size_t)i < got->n);
		assert_string_equal(got->v[from + (size_t)i], want);
	}
}

static void
test_mapped_columns(void **state)
{
	struct obx_config cfg;
	struct obx_names cols = { 0 };
	char topic[512], key[32], col[32];
	size_t o = 0;

	(void)state;
	obx_config_init(&cfg);
	assert_int_equal(obx_config_mapped_columns(&cfg, &cols), 0);
	assert_int_equal(cols.n, 5);
	assert_string_equal(cols.v[0], "id");
	assert_string_equal(cols.v[1], "aggregateid");
	assert_string_equal(cols.v[2], "type");
	assert_string_equal(cols.v[3], "payload");
	assert_string_equal(cols.v[4], "aggregatetype"); /* from the default topic template */
	obx_names_reset(&cols);

	/* 56 distinct columns, 20 of them from the template: none is lost or repeated */
	set_ok(&cfg, "outbox", "headers", "meta");
	set_ok(&cfg, "outbox", "timestamp", "created_at");
	for (int i = 0; i < 30; i++) {
		snprintf(key, sizeof(key), "header.h%02d", i);
		snprintf(col, sizeof(col), "hcol%02d", i);
		set_ok(&cfg, "outbox", key, col);
	}
	set_ok(&cfg, "outbox", "header.again", "type");
	for (int i = 0; i < 20; i++)
		o += (size_t)snprintf(topic + o, sizeof(topic) - o, "${tcol%02d}.", i);
	snprintf(topic + o, sizeof(topic) - o, "${hcol05}.${type}.${tcol00}");
	set_ok(&cfg, "outbox", "topic", topic);
	assert_int_equal(obx_config_mapped_columns(&cfg, &cols), 0);
	assert_int_equal(cols.n, 56);
	assert_string_equal(cols.v[4], "meta");
	assert_string_equal(cols.v[5], "created_at");
	expect_numbered(&cols, 6, "hcol", 30);
	expect_numbered(&cols, 36, "tcol", 20);
	obx_names_reset(&cols);

	/* more header mappings than any fixed-size list held */
	for (int i = 30; i < 100; i++) {
		snprintf(key, sizeof(key), "header.h%02d", i);
		snprintf(col, sizeof(col), "hcol%02d", i);
		set_ok(&cfg, "outbox", key, col);
	}
	assert_int_equal(obx_config_mapped_columns(&cfg, &cols), 0);
	assert_int_equal(cols.n, 126);
	expect_numbered(&cols, 6, "hcol", 100);
	expect_numbered(&cols, 106, "tcol", 20);
	obx_names_reset(&cols);
	obx_config_reset(&cfg);
}

/*
 * [outbox] header.<name> may not take a name outboxd writes itself (it
 * would shadow outboxd's header): refused with the key named, in one line.
 */
static void
test_reserved_header_mapping_refused(void **state)
{
	static const char *const reserved[] = { "id", "type", "lsn", "seq", "xid", "commit_ts", "txn",
		"snapshot" };
	struct obx_config cfg;
	char text[256], want[256];

	(void)state;
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
		snprintf(text, sizeof(text), KAFKA "[outbox]\nheader.%s = type\n", reserved[i]);
		snprintf(want, sizeof(want),
		    ":4: key 'header.%s': header '%s' is reserved: outboxd writes it "
		    "itself (reserved: id, type, lsn, seq, xid, commit_ts, txn, snapshot); choose another name",
		    reserved[i], reserved[i]);
		expect_error(text, want);
		assert_null(strchr(errbuf, '\n'));
	}
	/* the same through --set, and any other name is the user's */
	obx_config_init(&cfg);
	assert_int_equal(obx_config_set(&cfg, "outbox", "header.id", "type", "--set", false, errbuf,
	                     sizeof(errbuf)),
	    OBX_ECONFIG);
	assert_non_null(strstr(errbuf, "config --set: key 'header.id': header 'id' is reserved"));
	assert_int_equal(cfg.n_extra_headers, 0);
	set_ok(&cfg, "outbox", "header.ID", "type");
	set_ok(&cfg, "outbox", "header.eventId", "id");
	assert_int_equal(cfg.n_extra_headers, 2);
	obx_config_reset(&cfg);
}

/* The pure core judges syntax only; libpq and librdkafka judge through the loader's checks. */
static void
test_io_checks_come_from_the_loader(void **state)
{
	struct obx_config cfg;

	(void)state;
	obx_config_init(&cfg);
	assert_null(cfg.checks);
	set_ok(&cfg, "kafka", "no.such.property", "1");
	set_ok(&cfg, "source", "conninfo", "host='unclosed");

	cfg.checks = &obx_config_io_checks;
	assert_int_equal(obx_config_set(&cfg, "kafka", "another.unknown", "1", "test", false, errbuf,
	                     sizeof(errbuf)),
	    OBX_ECONFIG);
	assert_string_equal(errbuf, "config test: key 'another.unknown': unknown librdkafka property");
	assert_int_equal(obx_config_set(&cfg, "kafka", "linger.ms", "5", "test", false, errbuf, sizeof(errbuf)),
	    0);
	assert_int_equal(obx_config_set(&cfg, "source", "conninfo", "host='unclosed", "test", false, errbuf,
	                     sizeof(errbuf)),
	    OBX_ECONFIG);
	assert_non_null(strstr(errbuf, "key 'conninfo': not a valid libpq connection string"));
	set_ok(&cfg, "source", "conninfo", "host=db dbname=shop");
	obx_config_reset(&cfg);
	assert_null(cfg.checks);
}

/*
 * What SIGHUP cannot apply comes from the table's reload column: the log
 * level at once in both modes, the progress interval at once in logical
 * mode only, a slot never.
 */
static void
test_diff_restart(void **state)
{
	struct obx_config a, b, pa, pb;
	const char *names[32];
	size_t n;

	(void)state;
	assert_int_equal(load(&a, KAFKA, NULL, NULL, 0), 0);
	assert_int_equal(load(&b,
	                     KAFKA "[log]\nlevel = debug\nprogress_interval = 5s\n"
	                           "[source]\nslot = other\n",
	                     NULL, NULL, 0),
	    0);
	assert_int_equal(obx_config_diff(&a, &b, names, 32), 3);
	n = obx_config_diff_restart(&a, &b, names, 32);
	assert_int_equal(n, 1);
	assert_string_equal(names[0], "[source] slot");
	assert_int_equal(load(&pa, KAFKA "[source]\nmode = poll\n", NULL, NULL, 0), 0);
	assert_int_equal(load(&pb, KAFKA "[source]\nmode = poll\n[log]\nlevel = debug\nprogress_interval = 5s\n",
	                     NULL, NULL, 0),
	    0);
	n = obx_config_diff_restart(&pa, &pb, names, 32);
	assert_int_equal(n, 1);
	assert_string_equal(names[0], "[log] progress_interval");
	obx_config_reset(&a);
	obx_config_reset(&b);
	obx_config_reset(&pa);
	obx_config_reset(&pb);
}

/* SIGHUP names a changed [delivery] dedupe as needing a restart, like every other key. */
static void
test_dedupe_diff(void **state)
{
	struct obx_config a, b;
	const char *names[32];
	size_t n;
	bool named = false;

	(void)state;
	assert_int_equal(load(&a, KAFKA, NULL, NULL, 0), 0);
	assert_int_equal(load(&b, KAFKA "[delivery]\ndedupe = off\n", NULL, NULL, 0), 0);
	n = obx_config_diff(&a, &b, names, 32);
	for (size_t i = 0; i < n; i++)
		named = named || strcmp(names[i], "[delivery] dedupe") == 0;
	assert_int_equal(n, 1);
	assert_true(named);
	assert_int_equal(obx_config_diff(&a, &a, names, 32), 0);
	obx_config_reset(&a);
	obx_config_reset(&b);
}

/* [delivery] exactly_once and its keys: defaults, values, errors that name the key. */
static void
test_exactly_once_keys(void **state)
{
	struct obx_config cfg;

	(void)state;
	assert_int_equal(load(&cfg, KAFKA, NULL, NULL, 0), 0);
	assert_false(cfg.exactly_once);
	assert_string_equal(cfg.transactional_id, "");
	assert_string_equal(cfg.progress_topic, "outboxd.progress");
	assert_int_equal(cfg.txn_max_events, 10000);
	assert_int_equal(cfg.txn_max_bytes, 16 << 20);
	assert_int_equal(cfg.txn_max_ms, 100);
	obx_config_reset(&cfg);
	assert_int_equal(
	    load(&cfg,
	        KAFKA "[delivery]\nexactly_once = on\ntransactional_id = orders-eos\n"
	              "progress_topic = ops.progress\ntransaction_max_events = 500\ntransaction_max_bytes = 1MiB\n"
	              "transaction_max_time = 20ms\n",
	        NULL, NULL, 0),
	    0);
	assert_true(cfg.exactly_once);
	assert_string_equal(cfg.transactional_id, "orders-eos");
	assert_string_equal(cfg.progress_topic, "ops.progress");
	assert_int_equal(cfg.txn_max_events, 500);
	assert_int_equal(cfg.txn_max_bytes, 1 << 20);
	assert_int_equal(cfg.txn_max_ms, 20);
	obx_config_reset(&cfg);
	expect_error(KAFKA "[delivery]\nexactly_once = maybe\n",
	    "key 'exactly_once': expected on or off, got 'maybe'");
	expect_error(KAFKA "[delivery]\ntransaction_max_events = 0\n",
	    "key 'transaction_max_events': '0' is out of range (1 to 10000000)");
	expect_error(KAFKA "[delivery]\ntransaction_max_time = 2min\n",
	    "key 'transaction_max_time': '2min' is out of range (0 to 60s)");
	expect_error(KAFKA "[delivery]\nprogress_topic = \n", "key 'progress_topic': must not be empty");
	expect_error(KAFKA "[source]\nmode = poll\n[delivery]\nexactly_once = on\n",
	    "key 'exactly_once': works with [source] mode = logical only");
}

/*
 * [source] snapshot and snapshot_filter: off and the default filter unless
 * given; pending or none only; a filter with ';' refused; refused with
 * polling mode and with exactly-once, naming the key and what it conflicts with; a reload that
 * changes either is named.
 */
static void
test_snapshot_keys(void **state)
{
	struct obx_config cfg, other;
	const char *names[8];
	char *env[] = { "OUTBOXD_SOURCE_SNAPSHOT=pending", NULL };

	(void)state;
	assert_int_equal(load(&cfg, KAFKA, NULL, NULL, 0), 0);
	assert_false(cfg.snapshot);
	assert_string_equal(cfg.snapshot_filter, "");
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg,
	                     KAFKA "[source]\nsnapshot = pending\n"
	                           "snapshot_filter = created_at > now() - interval '7 days'\n",
	                     NULL, NULL, 0),
	    0);
	assert_true(cfg.snapshot);
	assert_string_equal(cfg.snapshot_filter, "created_at > now() - interval '7 days'");
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA "[source]\nsnapshot = none\n", NULL, NULL, 0), 0);
	assert_false(cfg.snapshot);
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA, env, NULL, 0), 0);
	assert_true(cfg.snapshot);
	obx_config_reset(&cfg);
	/* one condition: no ';' that would end the read-only statement, quoted or not */
	expect_error(KAFKA "[source]\nsnapshot_filter = true; DROP TABLE outbox\n",
	    "key 'snapshot_filter': must be one SQL condition, without ';' (write chr(59) for the character)");
	expect_error(KAFKA "[source]\nsnapshot_filter = type <> 'a;b'\n",
	    "key 'snapshot_filter': must be one SQL condition, without ';'");
	/* from the environment too (in a file, a ';' after a space starts a comment) */
	{
		char *fenv[] = { "OUTBOXD_SOURCE_SNAPSHOT_FILTER=true) ;COMMIT", NULL };

		assert_int_equal(load(&cfg, KAFKA, fenv, NULL, 0), OBX_ECONFIG);
		assert_non_null(strstr(errbuf, "key 'snapshot_filter': must be one SQL condition"));
		obx_config_reset(&cfg);
	}
	assert_int_equal(
	    load(&cfg, KAFKA "[source]\nsnapshot_filter = type <> 'a' || chr(59) || 'b'\n", NULL, NULL, 0), 0);
	obx_config_reset(&cfg);
	expect_error(KAFKA "[source]\nsnapshot = on\n", "key 'snapshot': expected pending or none, got 'on'");
	expect_error(KAFKA "[source]\nsnapshot = initial\n",
	    "key 'snapshot': expected pending or none, got 'initial'");
	expect_error(KAFKA "[source]\nmode = poll\nsnapshot = pending\n",
	    "key 'snapshot': snapshot = pending works with [source] mode = logical only");
	expect_error(KAFKA "[source]\nsnapshot = pending\n[delivery]\nexactly_once = on\n",
	    "key 'snapshot': snapshot = pending does not work with [delivery] exactly_once = on");
	/* snapshot = none says nothing against either */
	assert_int_equal(load(&cfg, KAFKA "[source]\nmode = poll\nsnapshot = none\n", NULL, NULL, 0), 0);
	obx_config_reset(&cfg);
	assert_int_equal(
	    load(&cfg, KAFKA "[source]\nsnapshot = none\n[delivery]\nexactly_once = on\n", NULL, NULL, 0), 0);
	obx_config_reset(&cfg);
	assert_int_equal(load(&cfg, KAFKA, NULL, NULL, 0), 0);
	assert_int_equal(load(&other, KAFKA "[source]\nsnapshot_filter = true\n", NULL, NULL, 0), 0);
	assert_int_equal(obx_config_diff(&cfg, &other, names, 8), 1);
	assert_string_equal(names[0], "[source] snapshot");
	obx_config_reset(&other);
	assert_int_equal(load(&other, KAFKA "[source]\nsnapshot = pending\n", NULL, NULL, 0), 0);
	assert_int_equal(obx_config_diff(&cfg, &other, names, 8), 1);
	assert_string_equal(names[0], "[source] snapshot");
	obx_config_reset(&other);
	obx_config_reset(&cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_snapshot_keys),
		cmocka_unit_test(test_exactly_once_keys),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_full_file),
		cmocka_unit_test(test_structure_errors),
		cmocka_unit_test(test_long_lines),
		cmocka_unit_test(test_service_conninfo),
		cmocka_unit_test(test_value_errors),
		cmocka_unit_test(test_failover_setting),
		cmocka_unit_test(test_kafka_properties),
		cmocka_unit_test(test_secrets_never_printed),
		cmocka_unit_test(test_environment_and_set_overrides),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_value_parsers),
		cmocka_unit_test(test_kubernetes_service_links_ignored),
		cmocka_unit_test(test_values_from_files),
		cmocka_unit_test(test_source_password_from_file),
		cmocka_unit_test(test_mapped_columns),
		cmocka_unit_test(test_reserved_header_mapping_refused),
		cmocka_unit_test(test_io_checks_come_from_the_loader),
		cmocka_unit_test(test_dedupe_diff),
		cmocka_unit_test(test_diff_restart),
		cmocka_unit_test(test_several_tables),
		cmocka_unit_test(test_glob),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
