#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/pgoutput.h"
#include "obx/core/reader.h"

void
obx_pgoutput_init(struct obx_pgoutput *d, int proto_version)
{
	d->proto_version = proto_version;
	d->stream_parallel = false;
	d->in_stream = false;
	d->datums = NULL;
	d->datum_cap = 0;
	d->relcols = NULL;
	d->relcol_cap = 0;
	d->error_offset = 0;
}

void
obx_pgoutput_reset(struct obx_pgoutput *d)
{
	free(d->datums);
	free(d->relcols);
	obx_pgoutput_init(d, d->proto_version);
}

const char *
obx_pgoutput_type_name(char type)
{
	switch (type) {
	case 'B':
		return "Begin";
	case 'C':
		return "Commit";
	case 'O':
		return "Origin";
	case 'R':
		return "Relation";
	case 'Y':
		return "Type";
	case 'I':
		return "Insert";
	case 'U':
		return "Update";
	case 'D':
		return "Delete";
	case 'T':
		return "Truncate";
	case 'M':
		return "Message";
	case 'S':
		return "Stream Start";
	case 'E':
		return "Stream Stop";
	case 'c':
		return "Stream Commit";
	case 'A':
		return "Stream Abort";
	case 'b':
		return "Begin Prepare";
	case 'P':
		return "Prepare";
	case 'K':
		return "Commit Prepared";
	case 'r':
		return "Rollback Prepared";
	case 'p':
		return "Stream Prepare";
	}
	return "unknown";
}

static int
grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	void *p;
	size_t ncap;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap : 16;
	while (ncap < need)
		ncap *= 2;
	p = reallocarray(*arr, ncap, elem);
	if (p == NULL)
		return OBX_ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

static int
read_tuple(struct obx_pgoutput *d, struct obx_reader *r, struct obx_pg_tuple *t)
{
	uint16_t ncols;
	int rc;

	if ((rc = obx_read_u16(r, &ncols)) != 0)
		return rc;
	/* each column takes at least one byte: refuse counts the buffer cannot hold */
	if (ncols > obx_reader_left(r))
		return OBX_EPROTO;
	if ((rc = grow((void **)&d->datums, &d->datum_cap, ncols, sizeof(*d->datums))) != 0)
		return rc;
	for (uint16_t i = 0; i < ncols; i++) {
		struct obx_pg_datum *c = &d->datums[i];
		uint8_t kind;

		if ((rc = obx_read_u8(r, &kind)) != 0)
			return rc;
		c->kind = (char)kind;
		c->data = NULL;
		c->len = 0;
		switch (kind) {
		case 'n':
		case 'u':
			break;
		case 't':
		case 'b':
			if ((rc = obx_read_u32(r, &c->len)) != 0 ||
			    (rc = obx_read_bytes(r, c->len, &c->data)) != 0)
				return rc;
			break;
		default:
			return OBX_EPROTO;
		}
	}
	t->ncols = ncols;
	t->cols = d->datums;
	return 0;
}

/* Skips one TupleData (for Update/Delete, whose contents the relay does not use). */
static int
skip_tuple(struct obx_pgoutput *d, struct obx_reader *r)
{
	struct obx_pg_tuple t;

	return read_tuple(d, r, &t);
}

static int
decode_relation(struct obx_pgoutput *d, struct obx_reader *r, struct obx_pgmsg *m)
{
	uint16_t natts;
	int rc;

	if ((rc = obx_read_u32(r, &m->u.relation.relid)) != 0 ||
	    (rc = obx_read_cstring(r, &m->u.relation.nspname)) != 0 ||
	    (rc = obx_read_cstring(r, &m->u.relation.relname)) != 0 ||
	    (rc = obx_read_u8(r, &m->u.relation.replident)) != 0 || (rc = obx_read_u16(r, &natts)) != 0)
		return rc;
	/* a column takes at least 10 bytes (flags, empty name, oid, typmod) */
	if ((size_t)natts * 10 > obx_reader_left(r))
		return OBX_EPROTO;
	if ((rc = grow((void **)&d->relcols, &d->relcol_cap, natts, sizeof(*d->relcols))) != 0)
		return rc;
	for (uint16_t i = 0; i < natts; i++) {
		struct obx_pg_relcol *c = &d->relcols[i];
		uint32_t typmod;

		if ((rc = obx_read_u8(r, &c->flags)) != 0 || (rc = obx_read_cstring(r, &c->name)) != 0 ||
		    (rc = obx_read_u32(r, &c->type_oid)) != 0 || (rc = obx_read_u32(r, &typmod)) != 0)
			return rc;
		c->typmod = (int32_t)typmod;
	}
	m->u.relation.natts = natts;
	m->u.relation.cols = d->relcols;
	return 0;
}

/* 'b' Begin Prepare has no flags byte; 'P', 'K' and 'p' start with one. */
static int
decode_prepared(struct obx_reader *r, struct obx_pgmsg *m, bool has_flags)
{
	uint64_t t;
	int rc;

	m->u.prepared.flags = 0;
	if ((has_flags && (rc = obx_read_u8(r, &m->u.prepared.flags)) != 0) ||
	    (rc = obx_read_u64(r, &m->u.prepared.lsn)) != 0 ||
	    (rc = obx_read_u64(r, &m->u.prepared.end_lsn)) != 0 || (rc = obx_read_u64(r, &t)) != 0 ||
	    (rc = obx_read_u32(r, &m->u.prepared.xid)) != 0 || (rc = obx_read_cstring(r, &m->u.prepared.gid)) != 0)
		return rc;
	m->u.prepared.time = (int64_t)t;
	return 0;
}

/* The lowest protocol version that has message type t (0: unknown type). */
static int
type_version(char t)
{
	switch (t) {
	case 'B':
	case 'C':
	case 'O':
	case 'R':
	case 'Y':
	case 'I':
	case 'U':
	case 'D':
	case 'T':
	case 'M':
		return 1;
	case 'S':
	case 'E':
	case 'c':
	case 'A':
		return 2;
	case 'b':
	case 'P':
	case 'K':
	case 'r':
	case 'p':
		return 3;
	}
	return 0;
}

static int
decode_body(struct obx_pgoutput *d, struct obx_reader *r, struct obx_pgmsg *m)
{
	uint64_t t, t2;
	uint8_t b;
	uint32_t n;
	int rc;

	m->xid = 0;
	if (type_version(m->type) == 0 || type_version(m->type) > d->proto_version)
		return OBX_EPROTO; /* unknown, or not in the negotiated protocol version */
	/* inside a streamed block, data messages carry their (sub)transaction id first */
	if (d->in_stream && strchr("RYIUDTM", m->type) != NULL && (rc = obx_read_u32(r, &m->xid)) != 0)
		return rc;
	switch (m->type) {
	case 'S':
		if (d->in_stream)
			return OBX_EPROTO; /* Stream Start inside a stream */
		if ((rc = obx_read_u32(r, &m->u.stream_start.xid)) != 0 ||
		    (rc = obx_read_u8(r, &m->u.stream_start.first_segment)) != 0)
			return rc;
		d->in_stream = true;
		return 0;
	case 'E':
		if (!d->in_stream)
			return OBX_EPROTO;
		d->in_stream = false;
		return 0;
	case 'c':
		if ((rc = obx_read_u32(r, &m->u.stream_commit.xid)) != 0 ||
		    (rc = obx_read_u8(r, &m->u.stream_commit.flags)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.stream_commit.commit_lsn)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.stream_commit.end_lsn)) != 0 || (rc = obx_read_u64(r, &t)) != 0)
			return rc;
		m->u.stream_commit.commit_time = (int64_t)t;
		return 0;
	case 'A':
		m->u.stream_abort.abort_lsn = 0;
		m->u.stream_abort.abort_time = 0;
		if ((rc = obx_read_u32(r, &m->u.stream_abort.xid)) != 0 ||
		    (rc = obx_read_u32(r, &m->u.stream_abort.subxid)) != 0)
			return rc;
		if (d->proto_version >= 4 && d->stream_parallel) {
			if ((rc = obx_read_u64(r, &m->u.stream_abort.abort_lsn)) != 0 ||
			    (rc = obx_read_u64(r, &t)) != 0)
				return rc;
			m->u.stream_abort.abort_time = (int64_t)t;
		}
		return 0;
	case 'b':
		return decode_prepared(r, m, false);
	case 'P':
	case 'K':
	case 'p':
		return decode_prepared(r, m, true);
	case 'r':
		if ((rc = obx_read_u8(r, &m->u.rollback_prepared.flags)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.rollback_prepared.prepare_end_lsn)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.rollback_prepared.rollback_end_lsn)) != 0 ||
		    (rc = obx_read_u64(r, &t)) != 0 || (rc = obx_read_u64(r, &t2)) != 0 ||
		    (rc = obx_read_u32(r, &m->u.rollback_prepared.xid)) != 0 ||
		    (rc = obx_read_cstring(r, &m->u.rollback_prepared.gid)) != 0)
			return rc;
		m->u.rollback_prepared.prepare_time = (int64_t)t;
		m->u.rollback_prepared.rollback_time = (int64_t)t2;
		return 0;
	case 'B':
		if ((rc = obx_read_u64(r, &m->u.begin.final_lsn)) != 0 || (rc = obx_read_u64(r, &t)) != 0 ||
		    (rc = obx_read_u32(r, &m->u.begin.xid)) != 0)
			return rc;
		m->u.begin.commit_time = (int64_t)t;
		return 0;
	case 'C':
		if ((rc = obx_read_u8(r, &m->u.commit.flags)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.commit.commit_lsn)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.commit.end_lsn)) != 0 || (rc = obx_read_u64(r, &t)) != 0)
			return rc;
		m->u.commit.commit_time = (int64_t)t;
		return 0;
	case 'O':
		if ((rc = obx_read_u64(r, &m->u.origin.lsn)) != 0 ||
		    (rc = obx_read_cstring(r, &m->u.origin.name)) != 0)
			return rc;
		return 0;
	case 'R':
		return decode_relation(d, r, m);
	case 'Y':
		if ((rc = obx_read_u32(r, &m->u.type.oid)) != 0 ||
		    (rc = obx_read_cstring(r, &m->u.type.nspname)) != 0 ||
		    (rc = obx_read_cstring(r, &m->u.type.typname)) != 0)
			return rc;
		return 0;
	case 'I':
		if ((rc = obx_read_u32(r, &m->u.insert.relid)) != 0 || (rc = obx_read_u8(r, &b)) != 0)
			return rc;
		if (b != 'N')
			return OBX_EPROTO;
		return read_tuple(d, r, &m->u.insert.tuple);
	case 'U':
		if ((rc = obx_read_u32(r, &m->u.change.relid)) != 0 || (rc = obx_read_u8(r, &b)) != 0)
			return rc;
		m->u.change.old_kind = 0;
		if (b == 'K' || b == 'O') {
			m->u.change.old_kind = (char)b;
			/* the old tuple shares the scratch space: only the new one is kept */
			if ((rc = skip_tuple(d, r)) != 0 || (rc = obx_read_u8(r, &b)) != 0)
				return rc;
		}
		if (b != 'N')
			return OBX_EPROTO;
		return read_tuple(d, r, &m->u.change.tuple);
	case 'D':
		if ((rc = obx_read_u32(r, &m->u.change.relid)) != 0 || (rc = obx_read_u8(r, &b)) != 0)
			return rc;
		if (b != 'K' && b != 'O')
			return OBX_EPROTO;
		m->u.change.old_kind = (char)b;
		return read_tuple(d, r, &m->u.change.tuple);
	case 'T':
		if ((rc = obx_read_u32(r, &m->u.truncate.nrels)) != 0 ||
		    (rc = obx_read_u8(r, &m->u.truncate.options)) != 0)
			return rc;
		if (m->u.truncate.nrels > obx_reader_left(r) / 4)
			return OBX_EPROTO;
		for (uint32_t i = 0; i < m->u.truncate.nrels; i++)
			if ((rc = obx_read_u32(r, &n)) != 0)
				return rc;
		return 0;
	case 'M':
		if ((rc = obx_read_u8(r, &m->u.message.flags)) != 0 ||
		    (rc = obx_read_u64(r, &m->u.message.lsn)) != 0 ||
		    (rc = obx_read_cstring(r, &m->u.message.prefix)) != 0 ||
		    (rc = obx_read_u32(r, &m->u.message.len)) != 0 ||
		    (rc = obx_read_bytes(r, m->u.message.len, &m->u.message.content)) != 0)
			return rc;
		return 0;
	}
	return OBX_EPROTO;
}

int
obx_pgoutput_decode(struct obx_pgoutput *d, const uint8_t *buf, size_t len, struct obx_pgmsg *out)
{
	struct obx_reader r;
	uint8_t type;
	int rc;

	obx_reader_init(&r, buf, len);
	d->error_offset = 0;
	if (obx_read_u8(&r, &type) != 0)
		return OBX_EPROTO;
	out->type = (char)type;
	rc = decode_body(d, &r, out);
	if (rc == 0 && obx_reader_left(&r) != 0)
		rc = OBX_EPROTO; /* trailing bytes: the layout is not what we think */
	if (rc != 0)
		d->error_offset = r.off;
	return rc;
}

int
obx_pgoutput_proto_for_server(int server_version)
{
	if (server_version >= 160000)
		return 4;
	if (server_version >= 150000)
		return 3;
	if (server_version >= 140000)
		return 2;
	return 1;
}
