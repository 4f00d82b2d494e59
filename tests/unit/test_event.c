/* The event builder: outbox row -> Kafka record. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "bytes.h"
#include "obx/core/err.h"
#include "obx/core/event.h"
#include "obx/core/relcache.h"

struct col {
	const char *name;
	uint32_t oid;
	const char *value; /* NULL: SQL NULL */
};

struct fixture {
	struct obx_config cfg;
	struct obx_relcache rc;
	struct obx_pgoutput dec;
	struct obx_event_builder eb;
	struct bytes tup;
	struct obx_pgmsg ins;
	const struct obx_rel *rel;
};

static void
set(struct obx_config *cfg, const char *section, const char *key, const char *value)
{
	char err[512];

	assert_int_equal(obx_config_set(cfg, section, key, value, "test", false, err, sizeof(err)), 0);
}

/* Announces the relation and decodes an Insert of values into f->ins. */
static void
row(struct fixture *f, const char *nsp, const char *rel, const struct col *cols, int n)
{
	struct bytes w = { .n = 0 };
	struct obx_pgmsg m;

	put8(&w, 'R');
	put32(&w, 1);
	putstr(&w, nsp);
	putstr(&w, rel);
	put8(&w, 'd');
	put16(&w, (uint16_t)n);
	for (int i = 0; i < n; i++) {
		put8(&w, 0);
		putstr(&w, cols[i].name);
		put32(&w, cols[i].oid);
		put32(&w, 0xffffffff);
	}
	assert_int_equal(obx_pgoutput_decode(&f->dec, w.b, w.n, &m), 0);
	assert_int_equal(obx_relcache_update(&f->rc, &m), 0);
	f->rel = obx_relcache_get(&f->rc, 1);
	f->tup.n = 0;
	put8(&f->tup, 'I');
	put32(&f->tup, 1);
	put8(&f->tup, 'N');
	put16(&f->tup, (uint16_t)n);
	for (int i = 0; i < n; i++) {
		if (cols[i].value == NULL)
			put8(&f->tup, 'n');
		else
			puttext(&f->tup, cols[i].value);
	}
	assert_int_equal(obx_pgoutput_decode(&f->dec, f->tup.b, f->tup.n, &f->ins), 0);
}

static int
setup(void **state)
{
	static struct fixture f;

	memset(&f, 0, sizeof(f));
	obx_config_init(&f.cfg);
	obx_relcache_init(&f.rc);
	obx_pgoutput_init(&f.dec, 1);
	*state = &f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	obx_event_builder_reset(&f->eb);
	obx_relcache_reset(&f->rc);
	obx_pgoutput_reset(&f->dec);
	obx_config_reset(&f->cfg);
	return 0;
}

static const struct obx_txninfo txn = { 0x16B374D848ULL, 731, 0 /* 2000-01-01 */ };

static const char *
hdr(const struct obx_event *e, const char *name, size_t *len)
{
	for (size_t i = 0; i < e->nheaders; i++) {
		if (strcmp(e->headers[i].name, name) == 0) {
			*len = e->headers[i].len;
			return e->headers[i].value;
		}
	}
	fail_msg("header %s missing", name);
	return NULL;
}

static void
expect_hdr(const struct obx_event *e, const char *name, const char *want)
{
	size_t len;
	const char *v = hdr(e, name, &len);

	assert_int_equal(len, strlen(want));
	assert_memory_equal(v, want, len);
}

static const struct col debezium_cols[] = {
	{ "id", 2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" },
	{ "aggregatetype", 25, "order" },
	{ "aggregateid", 25, "o-42" },
	{ "type", 25, "OrderCreated" },
	{ "payload", 3802, "{\"total\": 12.5, \"note\": \"\\u00e9\"}" },
};

static void
test_debezium_defaults(void **state)
{
	struct fixture *f = *state;
	struct obx_event e;
	char errbuf[256];

	assert_int_equal(obx_event_builder_init(&f->eb, &f->cfg), 0);
	row(f, "public", "outbox", debezium_cols, 5);
	assert_true(obx_event_is_outbox(&f->eb, f->rel));
	assert_int_equal(
	    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 3, &e, errbuf, sizeof(errbuf)), 0);
	assert_string_equal(e.topic, "outbox.event.order");
	assert_int_equal(e.keylen, 4);
	assert_memory_equal(e.key, "o-42", 4);
	assert_int_equal(e.len, strlen(debezium_cols[4].value));
	assert_memory_equal(e.value, debezium_cols[4].value, e.len);
	assert_string_equal(e.id, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
	expect_hdr(&e, "id", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
	expect_hdr(&e, "type", "OrderCreated");
	expect_hdr(&e, "lsn", "16/B374D848");
	expect_hdr(&e, "seq", "3");
	expect_hdr(&e, "xid", "731");
	expect_hdr(&e, "commit_ts", "2000-01-01T00:00:00.000000Z");
	assert_int_equal(e.timestamp_ms, 946684800000LL);
}

static void
test_other_names_template_and_extras(void **state)
{
	struct fixture *f = *state;
	struct obx_event e;
	char errbuf[256];
	size_t len;
	static const struct col cols[] = {
		{ "event_id", 25, "e1" },
		{ "aggregate_id", 25, "k1" },
		{ "tipo", 25, "billing.invoice" },
		{ "body", 17, "\\x00ff41" },
		{ "hdrs", 3802, "{\"tenant\": \"t1\", \"n\": 5, \"z\": null}" },
		{ "created_at", 1184, "2026-11-30 08:40:12.345678+01" },
	};

	set(&f->cfg, "outbox", "id", "event_id");
	set(&f->cfg, "outbox", "key", "aggregate_id");
	set(&f->cfg, "outbox", "type", "tipo");
	set(&f->cfg, "outbox", "payload", "body");
	set(&f->cfg, "outbox", "topic", "${tipo}.v1");
	set(&f->cfg, "outbox", "headers", "hdrs");
	set(&f->cfg, "outbox", "timestamp", "created_at");
	set(&f->cfg, "outbox", "header.eventType", "tipo");
	set(&f->cfg, "source", "table", "billing.events");
	assert_int_equal(obx_event_builder_init(&f->eb, &f->cfg), 0);
	row(f, "billing", "events", cols, 6);
	assert_true(obx_event_is_outbox(&f->eb, f->rel));
	assert_int_equal(
	    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf, sizeof(errbuf)), 0);
	assert_string_equal(e.topic, "billing.invoice.v1");
	assert_int_equal(e.len, 3); /* bytea: raw bytes, not \x hex */
	assert_memory_equal(e.value, "\x00\xff\x41", 3);
	assert_int_equal(e.timestamp_ms, 1796028012345LL - 3600000);
	expect_hdr(&e, "eventType", "billing.invoice");
	expect_hdr(&e, "tenant", "t1");
	expect_hdr(&e, "n", "5");
	assert_null(hdr(&e, "z", &len));
}

static void
test_rows_that_cannot_become_events(void **state)
{
	struct fixture *f = *state;
	struct obx_event e;
	char errbuf[256];
	struct col cols[5];

	assert_int_equal(obx_event_builder_init(&f->eb, &f->cfg), 0);

	memcpy(cols, debezium_cols, sizeof(cols));
	cols[2].value = NULL;
	row(f, "public", "outbox", cols, 5);
	assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf,
	                     sizeof(errbuf)),
	    OBX_EINVAL);
	assert_string_equal(errbuf, "key column 'aggregateid' is NULL");

	memcpy(cols, debezium_cols, sizeof(cols));
	cols[0].value = NULL;
	row(f, "public", "outbox", cols, 5);
	assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf,
	                     sizeof(errbuf)),
	    OBX_EINVAL);
	assert_string_equal(errbuf, "id column 'id' is NULL");

	memcpy(cols, debezium_cols, sizeof(cols));
	cols[1].value = NULL;
	row(f, "public", "outbox", cols, 5);
	assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf,
	                     sizeof(errbuf)),
	    OBX_EINVAL);
	assert_string_equal(errbuf, "topic column 'aggregatetype' is NULL");

	memcpy(cols, debezium_cols, sizeof(cols));
	cols[1].value = "bad topic!";
	row(f, "public", "outbox", cols, 5);
	assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf,
	                     sizeof(errbuf)),
	    OBX_EINVAL);
	assert_non_null(strstr(errbuf, "is not a valid Kafka topic name"));

	memcpy(cols, debezium_cols, sizeof(cols));
	cols[3].name = "kind"; /* the table lost its 'type' column */
	row(f, "public", "outbox", cols, 5);
	assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf,
	                     sizeof(errbuf)),
	    OBX_EINVAL);
	assert_string_equal(errbuf, "column 'type' (type) is missing from the outbox table");

	/* a NULL payload is a tombstone, not an error */
	memcpy(cols, debezium_cols, sizeof(cols));
	cols[4].value = NULL;
	row(f, "public", "outbox", cols, 5);
	assert_int_equal(
	    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf, sizeof(errbuf)), 0);
	assert_null(e.value);

	/* other tables are not the outbox */
	row(f, "public", "orders", debezium_cols, 5);
	assert_false(obx_event_is_outbox(&f->eb, f->rel));
}

/*
 * A headers column member with the name of a header outboxd writes would
 * shadow it (two events could share one id): the row cannot become an
 * event, for on_error, whichever reserved name it is.
 */
static void
test_reserved_header_names(void **state)
{
	struct fixture *f = *state;
	struct obx_event e;
	char errbuf[256], hdrs[128], want[256], list[256] = "";
	struct col cols[6];
	size_t n = 0;

	for (size_t i = 0; obx_reserved_headers[i] != NULL; i++, n++) {
		assert_true(obx_header_is_reserved(obx_reserved_headers[i]));
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ", " : "",
		    obx_reserved_headers[i]);
	}
	assert_int_equal(n, 8);
	assert_string_equal(list, OBX_RESERVED_HEADERS);
	assert_false(obx_header_is_reserved("ID")); /* Kafka header names are case-sensitive */
	assert_false(obx_header_is_reserved("tenant"));
	assert_false(obx_header_is_reserved("original_topic"));

	set(&f->cfg, "outbox", "headers", "headers");
	assert_int_equal(obx_event_builder_init(&f->eb, &f->cfg), 0);
	memcpy(cols, debezium_cols, sizeof(debezium_cols));
	cols[5] = (struct col){ "headers", 3802, hdrs };
	for (size_t i = 0; obx_reserved_headers[i] != NULL; i++) {
		snprintf(hdrs, sizeof(hdrs), "{\"tenant\": \"t1\", \"%s\": \"x\"}", obx_reserved_headers[i]);
		row(f, "public", "outbox", cols, 6);
		assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf,
		                     sizeof(errbuf)),
		    OBX_EINVAL);
		snprintf(want, sizeof(want),
		    "headers column 'headers' holds header '%s', a name outboxd "
		    "writes itself (reserved: %s)",
		    obx_reserved_headers[i], OBX_RESERVED_HEADERS);
		assert_string_equal(errbuf, want);
	}

	/* other names, and the same letters in another case, are the user's */
	snprintf(hdrs, sizeof(hdrs), "{\"tenant\": \"t1\", \"ID\": \"x\"}");
	row(f, "public", "outbox", cols, 6);
	assert_int_equal(
	    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, errbuf, sizeof(errbuf)), 0);
	expect_hdr(&e, "id", debezium_cols[0].value);
	expect_hdr(&e, "ID", "x");
	expect_hdr(&e, "tenant", "t1");
	n = 0;
	for (size_t i = 0; i < e.nheaders; i++)
		n += strcmp(e.headers[i].name, "id") == 0;
	assert_int_equal(n, 1);
}

static void
test_time_formats(void **state)
{
	int64_t ms;
	char buf[64];

	(void)state;
	assert_int_equal(obx_parse_pg_timestamp("2000-01-01 00:00:00+00", 22, &ms), 0);
	assert_int_equal(ms, 946684800000LL);
	assert_int_equal(obx_parse_pg_timestamp("2000-01-01 00:00:00.5-02:30", 27, &ms), 0);
	assert_int_equal(ms, 946684800500LL + 9000000);
	assert_int_equal(obx_parse_pg_timestamp("2000-01-01 00:00:00", 19, &ms), 0);
	assert_int_equal(obx_parse_pg_timestamp("Sat Jan 01 00:00:00 2000", 24, &ms), OBX_EINVAL);
	assert_int_equal(obx_parse_pg_timestamp("2000-01-01 00:00:00+00x", 23, &ms), OBX_EINVAL);
	obx_format_pg_time(-1, buf, sizeof(buf));
	assert_string_equal(buf, "1999-12-31T23:59:59.999999Z");
	obx_format_pg_time(86400000001LL, buf, sizeof(buf));
	assert_string_equal(buf, "2000-01-02T00:00:00.000001Z");
}

/*
 * Several tables with their own mappings, rows alternating: each row is built in its table's
 * mapping (key, topic, headers), the first row after a switch too, and says its table.
 */
static void
test_mappings_alternate(void **state)
{
	struct fixture *f = *state;
	static const struct col orders[] = {
		{ "id", 25, "o1" },
		{ "aggregatetype", 25, "order" },
		{ "aggregateid", 25, "o-1" },
		{ "type", 25, "Created" },
		{ "payload", 3802, "{}" },
		{ "region", 25, "eu" },
	};
	static const struct col billing[] = {
		{ "id", 25, "b1" },
		{ "account", 25, "acc-9" },
		{ "kind", 25, "Billed" },
		{ "body", 3802, "{}" },
	};
	struct obx_event e;
	char err[512];

	(void)state;
	set(&f->cfg, "source", "table", "orders.outbox, billing.outbox");
	/* orders' own header (an [outbox] header.* would be inherited by billing too) */
	assert_int_equal(obx_config_set(&f->cfg, "outbox.orders.outbox", "header.region", "region", "t:0", false,
	                     err, sizeof(err)),
	    0);
	assert_int_equal(
	    obx_config_set(&f->cfg, "outbox.billing.outbox", "key", "account", "t:1", false, err, sizeof(err)), 0);
	assert_int_equal(
	    obx_config_set(&f->cfg, "outbox.billing.outbox", "type", "kind", "t:2", false, err, sizeof(err)), 0);
	assert_int_equal(obx_config_set(&f->cfg, "outbox.billing.outbox", "payload", "body", "t:3", false, err,
	                     sizeof(err)),
	    0);
	assert_int_equal(obx_config_set(&f->cfg, "outbox.billing.outbox", "topic", "billing", "t:4", false, err,
	                     sizeof(err)),
	    0);
	set(&f->cfg, "kafka", "bootstrap.servers", "x:1");
	assert_int_equal(obx_config_finish(&f->cfg, "t", err, sizeof(err)), 0);
	assert_int_equal(obx_event_builder_init(&f->eb, &f->cfg), 0);
	for (int round = 0; round < 2; round++) {
		row(f, "orders", "outbox", orders, 6);
		assert_true(obx_event_is_outbox(&f->eb, f->rel));
		assert_int_equal(
		    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, err, sizeof(err)), 0);
		assert_string_equal(e.topic, "outbox.event.order");
		assert_memory_equal(e.key, "o-1", 3);
		expect_hdr(&e, "region", "eu");
		expect_hdr(&e, "table", "orders.outbox");
		row(f, "billing", "outbox", billing, 4);
		assert_int_equal(
		    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, err, sizeof(err)), 0);
		assert_string_equal(e.topic, "billing");
		assert_memory_equal(e.key, "acc-9", 5);
		expect_hdr(&e, "type", "Billed");
		expect_hdr(&e, "table", "billing.outbox");
		/* billing maps no region: the header list is its own, not the last table's */
		for (size_t i = 0; i < e.nheaders; i++)
			assert_true(strcmp(e.headers[i].name, "region") != 0);
	}
	/* a NULL key is named in the table's own words */
	{
		struct col bad[4];

		memcpy(bad, billing, sizeof(bad));
		bad[1].value = NULL;
		row(f, "orders", "outbox", orders, 6);
		assert_int_equal(
		    obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, err, sizeof(err)), 0);
		row(f, "billing", "outbox", bad, 4);
		assert_int_equal(obx_event_build(&f->eb, f->rel, &f->ins.u.insert.tuple, &txn, 0, &e, err,
		                     sizeof(err)),
		    OBX_EINVAL);
		assert_string_equal(err, "key column 'account' is NULL");
	}
	/* a table no entry names is no outbox */
	row(f, "public", "business", billing, 4);
	assert_false(obx_event_is_outbox(&f->eb, f->rel));
}

/* The relation cache over many relations in any order: each found, a replaced one current. */
static void
test_relcache_many(void **state)
{
	struct obx_relcache rc;
	struct obx_pg_relcol col = { 0, "id", 25, -1 };
	char name[32];

	(void)state;
	obx_relcache_init(&rc);
	for (uint32_t i = 0; i < 2000; i++) {
		uint32_t relid = 16384 + (i * 7919) % 2000; /* every id once, out of order */
		struct obx_pgmsg m = { .type = 'R' };

		snprintf(name, sizeof(name), "t%u", relid);
		m.u.relation.relid = relid;
		m.u.relation.nspname = "tenant";
		m.u.relation.relname = name;
		m.u.relation.natts = 1;
		m.u.relation.cols = &col;
		assert_int_equal(obx_relcache_update(&rc, &m), 0);
	}
	assert_int_equal(rc.n, 2000);
	for (uint32_t relid = 16384; relid < 16384 + 2000; relid++) {
		const struct obx_rel *r = obx_relcache_get(&rc, relid);

		snprintf(name, sizeof(name), "t%u", relid);
		assert_non_null(r);
		assert_string_equal(r->relname, name);
	}
	assert_null(obx_relcache_get(&rc, 16383));
	assert_null(obx_relcache_get(&rc, 16384 + 2000));
	{
		/* a Relation message again (ALTER TABLE): replaced in place, a new version */
		struct obx_pgmsg m = { .type = 'R' };
		unsigned before = obx_relcache_get(&rc, 17000)->version;

		m.u.relation.relid = 17000;
		m.u.relation.nspname = "tenant";
		m.u.relation.relname = "renamed";
		m.u.relation.natts = 1;
		m.u.relation.cols = &col;
		assert_int_equal(obx_relcache_update(&rc, &m), 0);
		assert_int_equal(rc.n, 2000);
		assert_string_equal(obx_relcache_get(&rc, 17000)->relname, "renamed");
		assert_true(obx_relcache_get(&rc, 17000)->version != before);
	}
	obx_relcache_reset(&rc);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_debezium_defaults, setup, teardown),
		cmocka_unit_test_setup_teardown(test_other_names_template_and_extras, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rows_that_cannot_become_events, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reserved_header_names, setup, teardown),
		cmocka_unit_test(test_time_formats),
		cmocka_unit_test(test_relcache_many),
		cmocka_unit_test_setup_teardown(test_mappings_alternate, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
