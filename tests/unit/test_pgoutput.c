/* pgoutput v1 decoding from hand-made byte fixtures (layouts from proto.c), walmsg framing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "bytes.h"
#include "obx/core/err.h"
#include "obx/core/pgoutput.h"
#include "obx/core/pgversion.h"
#include "obx/core/reader.h"
#include "obx/core/walmsg.h"

static struct obx_pgoutput dec;

static int
setup(void **state)
{
	(void)state;
	obx_pgoutput_init(&dec, 1);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	obx_pgoutput_reset(&dec);
	return 0;
}

static void
relation_fixture(struct bytes *w)
{
	w->n = 0;
	put8(w, 'R');
	put32(w, 16384);
	putstr(w, "public");
	putstr(w, "outbox");
	put8(w, 'd');
	put16(w, 3);
	put8(w, 1);
	putstr(w, "id");
	put32(w, 2950);
	put32(w, 0xffffffff);
	put8(w, 0);
	putstr(w, "aggregateid");
	put32(w, 25);
	put32(w, 0xffffffff);
	put8(w, 0);
	putstr(w, "payload");
	put32(w, 3802);
	put32(w, 0xffffffff);
}

static void
insert_fixture(struct bytes *w)
{
	w->n = 0;
	put8(w, 'I');
	put32(w, 16384);
	put8(w, 'N');
	put16(w, 3);
	puttext(w, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
	puttext(w, "order-1");
	put8(w, 'n');
}

static void
test_begin_commit(void **state)
{
	struct bytes w = { .n = 0 };
	struct obx_pgmsg m;

	(void)state;
	put8(&w, 'B');
	put64(&w, 0x0000000100000200ULL);
	put64(&w, 123456789);
	put32(&w, 4711);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_int_equal(m.type, 'B');
	assert_int_equal(m.u.begin.final_lsn, 0x0000000100000200ULL);
	assert_int_equal(m.u.begin.commit_time, 123456789);
	assert_int_equal(m.u.begin.xid, 4711);

	w.n = 0;
	put8(&w, 'C');
	put8(&w, 0);
	put64(&w, 0x200);
	put64(&w, 0x230);
	put64(&w, 99);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_int_equal(m.type, 'C');
	assert_int_equal(m.u.commit.commit_lsn, 0x200);
	assert_int_equal(m.u.commit.end_lsn, 0x230);
	assert_int_equal(m.u.commit.commit_time, 99);
}

static void
test_relation_and_insert(void **state)
{
	struct bytes w;
	struct obx_pgmsg m;

	(void)state;
	relation_fixture(&w);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_int_equal(m.u.relation.relid, 16384);
	assert_string_equal(m.u.relation.nspname, "public");
	assert_string_equal(m.u.relation.relname, "outbox");
	assert_int_equal(m.u.relation.natts, 3);
	assert_string_equal(m.u.relation.cols[1].name, "aggregateid");
	assert_int_equal(m.u.relation.cols[2].type_oid, 3802);
	assert_int_equal(m.u.relation.cols[0].typmod, -1);

	insert_fixture(&w);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_int_equal(m.type, 'I');
	assert_int_equal(m.u.insert.relid, 16384);
	assert_int_equal(m.u.insert.tuple.ncols, 3);
	assert_int_equal(m.u.insert.tuple.cols[0].kind, 't');
	assert_int_equal(m.u.insert.tuple.cols[1].len, 7);
	assert_memory_equal(m.u.insert.tuple.cols[1].data, "order-1", 7);
	assert_int_equal(m.u.insert.tuple.cols[2].kind, 'n');
}

static void
test_skipped_messages(void **state)
{
	struct bytes w = { .n = 0 };
	struct obx_pgmsg m;

	(void)state;
	/* Update with an old key tuple */
	put8(&w, 'U');
	put32(&w, 7);
	put8(&w, 'K');
	put16(&w, 1);
	puttext(&w, "k");
	put8(&w, 'N');
	put16(&w, 2);
	puttext(&w, "k");
	put8(&w, 'u');
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_int_equal(m.u.change.relid, 7);
	/* Update without old tuple */
	w.n = 0;
	put8(&w, 'U');
	put32(&w, 7);
	put8(&w, 'N');
	put16(&w, 1);
	puttext(&w, "x");
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	/* Delete with old tuple */
	w.n = 0;
	put8(&w, 'D');
	put32(&w, 7);
	put8(&w, 'O');
	put16(&w, 1);
	puttext(&w, "x");
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	/* Truncate of two relations */
	w.n = 0;
	put8(&w, 'T');
	put32(&w, 2);
	put8(&w, 1);
	put32(&w, 7);
	put32(&w, 8);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_int_equal(m.u.truncate.nrels, 2);
	/* Message */
	w.n = 0;
	put8(&w, 'M');
	put8(&w, 1);
	put64(&w, 0x99);
	putstr(&w, "outboxd");
	put32(&w, 3);
	memcpy(w.b + w.n, "abc", 3);
	w.n += 3;
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_string_equal(m.u.message.prefix, "outboxd");
	assert_int_equal(m.u.message.len, 3);
	/* Origin and Type */
	w.n = 0;
	put8(&w, 'O');
	put64(&w, 0x10);
	putstr(&w, "origin1");
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_string_equal(m.u.origin.name, "origin1");
	w.n = 0;
	put8(&w, 'Y');
	put32(&w, 16500);
	putstr(&w, "public");
	putstr(&w, "mood");
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), 0);
	assert_string_equal(m.u.type.typname, "mood");
}

/* Every prefix of a valid message is refused without reading past it. */
static void
truncation_sweep_with(struct obx_pgoutput *d, const struct bytes *w)
{
	struct obx_pgmsg m;

	for (size_t n = 0; n < w->n; n++) {
		/* a fresh heap copy of exactly n bytes lets ASan catch any over-read */
		uint8_t *copy = malloc(n ? n : 1);

		memcpy(copy, w->b, n);
		assert_int_equal(obx_pgoutput_decode(d, copy, n, &m), OBX_EPROTO);
		free(copy);
	}
}

static void
truncation_sweep(const struct bytes *w)
{
	truncation_sweep_with(&dec, w);
}

static void
test_truncation_and_garbage(void **state)
{
	struct bytes w;
	struct obx_pgmsg m;

	(void)state;
	relation_fixture(&w);
	truncation_sweep(&w);
	insert_fixture(&w);
	truncation_sweep(&w);
	/* trailing bytes */
	w.b[w.n++] = 0;
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* unknown message type */
	w.n = 0;
	put8(&w, 'Z');
	put32(&w, 1);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	assert_string_equal(obx_pgoutput_type_name('Z'), "unknown");
	/* Insert without 'N' */
	w.n = 0;
	put8(&w, 'I');
	put32(&w, 1);
	put8(&w, 'X');
	put16(&w, 0);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* unknown column kind */
	w.n = 0;
	put8(&w, 'I');
	put32(&w, 1);
	put8(&w, 'N');
	put16(&w, 1);
	put8(&w, 'q');
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* column count larger than the message can hold */
	w.n = 0;
	put8(&w, 'I');
	put32(&w, 1);
	put8(&w, 'N');
	put16(&w, 65535);
	put8(&w, 'n');
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* a length pointing past the end */
	w.n = 0;
	put8(&w, 'I');
	put32(&w, 1);
	put8(&w, 'N');
	put16(&w, 1);
	put8(&w, 't');
	put32(&w, 0xfffffff0);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* relation: attribute count larger than the message */
	w.n = 0;
	put8(&w, 'R');
	put32(&w, 1);
	putstr(&w, "s");
	putstr(&w, "t");
	put8(&w, 'd');
	put16(&w, 500);
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* string without NUL */
	w.n = 0;
	put8(&w, 'O');
	put64(&w, 1);
	w.b[w.n++] = 'x';
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, w.n, &m), OBX_EPROTO);
	/* empty */
	assert_int_equal(obx_pgoutput_decode(&dec, w.b, 0, &m), OBX_EPROTO);
}

/* Protocol versions 2-4 (streaming, two-phase), layouts from proto.c. */
static void
test_protocol_v2_to_v4(void **state)
{
	struct obx_pgoutput d;
	struct bytes w = { .n = 0 };
	struct obx_pgmsg m;

	(void)state;
	obx_pgoutput_init(&d, 4);
	d.stream_parallel = true;
	put8(&w, 'S');
	put32(&w, 900);
	put8(&w, 1);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.u.stream_start.xid, 900);
	assert_int_equal(m.u.stream_start.first_segment, 1);
	assert_true(d.in_stream);
	/* inside the block: Insert carries the subtransaction id first */
	w.n = 0;
	put8(&w, 'I');
	put32(&w, 901);
	put32(&w, 16384);
	put8(&w, 'N');
	put16(&w, 1);
	puttext(&w, "v");
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.xid, 901);
	assert_int_equal(m.u.insert.relid, 16384);
	w.n = 0;
	put8(&w, 'M');
	put32(&w, 900);
	put8(&w, 1);
	put64(&w, 5);
	putstr(&w, "p");
	put32(&w, 0);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.xid, 900);
	w.n = 0;
	put8(&w, 'S');
	put32(&w, 900);
	put8(&w, 0);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), OBX_EPROTO); /* nested start */
	w.n = 0;
	put8(&w, 'E');
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_false(d.in_stream);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), OBX_EPROTO); /* stop without start */
	/* outside the block: no xid */
	w.n = 0;
	put8(&w, 'I');
	put32(&w, 16384);
	put8(&w, 'N');
	put16(&w, 0);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.xid, 0);

	w.n = 0;
	put8(&w, 'c');
	put32(&w, 900);
	put8(&w, 0);
	put64(&w, 0x500);
	put64(&w, 0x530);
	put64(&w, 77);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.u.stream_commit.xid, 900);
	assert_int_equal(m.u.stream_commit.commit_lsn, 0x500);
	assert_int_equal(m.u.stream_commit.end_lsn, 0x530);
	assert_int_equal(m.u.stream_commit.commit_time, 77);

	/* Stream Abort: abort LSN and time only with streaming = parallel (v4) */
	w.n = 0;
	put8(&w, 'A');
	put32(&w, 900);
	put32(&w, 901);
	put64(&w, 0x600);
	put64(&w, 88);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.u.stream_abort.subxid, 901);
	assert_int_equal(m.u.stream_abort.abort_lsn, 0x600);
	assert_int_equal(m.u.stream_abort.abort_time, 88);
	d.stream_parallel = false;
	assert_int_equal(obx_pgoutput_decode(&d, w.b, 9, &m), 0);
	assert_int_equal(m.u.stream_abort.abort_lsn, 0);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), OBX_EPROTO); /* trailing fields */

	w.n = 0;
	put8(&w, 'b');
	put64(&w, 0x700);
	put64(&w, 0x730);
	put64(&w, 99);
	put32(&w, 42);
	putstr(&w, "gid-1");
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.u.prepared.lsn, 0x700);
	assert_int_equal(m.u.prepared.xid, 42);
	assert_string_equal(m.u.prepared.gid, "gid-1");
	for (const char *t = "PKp"; *t != '\0'; t++) {
		w.n = 0;
		put8(&w, (uint8_t)*t);
		put8(&w, 0);
		put64(&w, 0x800);
		put64(&w, 0x830);
		put64(&w, 5);
		put32(&w, 43);
		putstr(&w, "gid-2");
		assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
		assert_int_equal(m.u.prepared.end_lsn, 0x830);
		assert_string_equal(m.u.prepared.gid, "gid-2");
		truncation_sweep_with(&d, &w);
	}
	w.n = 0;
	put8(&w, 'r');
	put8(&w, 0);
	put64(&w, 0x900);
	put64(&w, 0x930);
	put64(&w, 1);
	put64(&w, 2);
	put32(&w, 44);
	putstr(&w, "gid-3");
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), 0);
	assert_int_equal(m.u.rollback_prepared.rollback_end_lsn, 0x930);
	assert_int_equal(m.u.rollback_prepared.rollback_time, 2);
	assert_string_equal(m.u.rollback_prepared.gid, "gid-3");
	truncation_sweep_with(&d, &w);
	obx_pgoutput_reset(&d);

	/* a message of a later version than negotiated is an error, not skipped */
	obx_pgoutput_init(&d, 1);
	w.n = 0;
	put8(&w, 'S');
	put32(&w, 1);
	put8(&w, 1);
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), OBX_EPROTO);
	obx_pgoutput_reset(&d);
	obx_pgoutput_init(&d, 2);
	w.n = 0;
	put8(&w, 'b');
	put64(&w, 1);
	put64(&w, 2);
	put64(&w, 3);
	put32(&w, 4);
	putstr(&w, "g");
	assert_int_equal(obx_pgoutput_decode(&d, w.b, w.n, &m), OBX_EPROTO);
	obx_pgoutput_reset(&d);
	assert_string_equal(obx_pgoutput_type_name('p'), "Stream Prepare");
}

static void
test_walmsg(void **state)
{
	struct bytes w = { .n = 0 };
	struct obx_walmsg m;
	uint8_t st[OBX_STATUS_UPDATE_LEN];
	struct obx_reader r;
	uint64_t v;
	uint8_t b;

	(void)state;
	put8(&w, 'w');
	put64(&w, 0x100);
	put64(&w, 0x200);
	put64(&w, 5);
	put8(&w, 'B');
	assert_int_equal(obx_walmsg_parse(w.b, w.n, &m), 0);
	assert_int_equal(m.kind, 'w');
	assert_int_equal(m.data_start, 0x100);
	assert_int_equal(m.wal_end, 0x200);
	assert_int_equal(m.payload_len, 1);
	assert_int_equal(m.payload[0], 'B');
	assert_int_equal(obx_walmsg_parse(w.b, 24, &m), OBX_EPROTO);

	w.n = 0;
	put8(&w, 'k');
	put64(&w, 0x300);
	put64(&w, 6);
	put8(&w, 1);
	assert_int_equal(obx_walmsg_parse(w.b, w.n, &m), 0);
	assert_int_equal(m.kind, 'k');
	assert_int_equal(m.wal_end, 0x300);
	assert_true(m.reply_requested);
	assert_int_equal(obx_walmsg_parse(w.b, w.n - 1, &m), OBX_EPROTO);
	w.b[w.n++] = 0;
	assert_int_equal(obx_walmsg_parse(w.b, w.n, &m), OBX_EPROTO); /* too long */
	w.b[0] = 'x';
	assert_int_equal(obx_walmsg_parse(w.b, 18, &m), OBX_EPROTO);

	obx_walmsg_status(st, 0x10, 0x20, 0x30, 7, true);
	obx_reader_init(&r, st, sizeof(st));
	assert_int_equal(obx_read_u8(&r, &b), 0);
	assert_int_equal(b, 'r');
	assert_int_equal(obx_read_u64(&r, &v), 0);
	assert_int_equal(v, 0x10);
	assert_int_equal(obx_read_u64(&r, &v), 0);
	assert_int_equal(v, 0x20);
	assert_int_equal(obx_read_u64(&r, &v), 0);
	assert_int_equal(v, 0x30);
	assert_int_equal(obx_read_u64(&r, &v), 0);
	assert_int_equal(v, 7);
	assert_int_equal(obx_read_u8(&r, &b), 0);
	assert_int_equal(b, 1);
	assert_int_equal(obx_reader_left(&r), 0);
}

/* The version asked for follows the server: what a PostgreSQL release's pgoutput accepts. */
/* One table of what each major offers; servers before 13 are refused with one line. */
static void
test_pgfacts(void **state)
{
	static const struct {
		int version, major, proto;
		bool streaming, filters, standby, failover;
	} want[] = {
		{ 130023, 13, 1, false, false, false, false },
		{ 140020, 14, 2, true, false, false, false },
		{ 150015, 15, 3, true, true, false, false },
		{ 160011, 16, 4, true, true, true, false },
		{ 170007, 17, 4, true, true, true, true },
		{ 180004, 18, 4, true, true, true, true },
	};
	struct obx_pgfacts f;
	char err[256], ver[32];

	(void)state;
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		assert_int_equal(obx_pgfacts_for(want[i].version, &f, err, sizeof(err)), 0);
		assert_int_equal(f.major, want[i].major);
		assert_int_equal(f.proto, want[i].proto);
		assert_int_equal(f.streaming, want[i].streaming);
		assert_int_equal(f.messages, want[i].streaming);
		assert_int_equal(f.publication_filters, want[i].filters);
		assert_int_equal(f.slot_options, want[i].filters);
		assert_int_equal(f.schema_publications, want[i].filters);
		assert_int_equal(f.standby_decoding, want[i].standby);
		assert_int_equal(f.failover_slots, want[i].failover);
	}
	assert_int_equal(obx_pgfacts_for(120022, &f, err, sizeof(err)), OBX_ECONFIG);
	assert_string_equal(err, "PostgreSQL 12.22 is not supported: outboxd needs 13 or later");
	assert_int_equal(obx_pgfacts_for(90624, &f, err, sizeof(err)), OBX_ECONFIG);
	assert_string_equal(err, "PostgreSQL 9.6.24 is not supported: outboxd needs 13 or later");
	assert_string_equal(obx_pgversion_format(170004, ver, sizeof(ver)), "17.4");
}

static void
test_proto_for_server(void **state)
{
	(void)state;
	assert_int_equal(obx_pgoutput_proto_for_server(100023), 1);
	assert_int_equal(obx_pgoutput_proto_for_server(130014), 1);
	assert_int_equal(obx_pgoutput_proto_for_server(140000), 2);
	assert_int_equal(obx_pgoutput_proto_for_server(150018), 3);
	assert_int_equal(obx_pgoutput_proto_for_server(160004), 4);
	assert_int_equal(obx_pgoutput_proto_for_server(170000), 4);
}

static void
test_lsn_text(void **state)
{
	obx_lsn l;
	char buf[OBX_LSN_STRLEN];

	(void)state;
	assert_int_equal(obx_lsn_parse("16/B374D848", &l), 0);
	assert_int_equal(l, 0x16B374D848ULL);
	assert_string_equal(obx_lsn_format(l, buf, sizeof(buf)), "16/B374D848");
	assert_string_equal(obx_lsn_format(0xFFFFFFFFFFFFFFFFULL, buf, sizeof(buf)), "FFFFFFFF/FFFFFFFF");
	assert_int_equal(obx_lsn_parse("1/123456789", &l), OBX_EINVAL);
	assert_int_equal(obx_lsn_parse("/1", &l), OBX_EINVAL);
	assert_int_equal(obx_lsn_parse("1/", &l), OBX_EINVAL);
	assert_int_equal(obx_lsn_parse("1/2/3", &l), OBX_EINVAL);
	assert_int_equal(obx_lsn_parse("g/1", &l), OBX_EINVAL);
	assert_int_equal(obx_lsn_parse("12", &l), OBX_EINVAL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_begin_commit),
		cmocka_unit_test(test_relation_and_insert),
		cmocka_unit_test(test_skipped_messages),
		cmocka_unit_test(test_truncation_and_garbage),
		cmocka_unit_test(test_protocol_v2_to_v4),
		cmocka_unit_test(test_walmsg),
		cmocka_unit_test(test_proto_for_server),
		cmocka_unit_test(test_pgfacts),
		cmocka_unit_test(test_lsn_text),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
