/*
 * pgoutput.h - decoder of pgoutput logical replication messages (pure).
 *
 * Layouts follow PostgreSQL's src/backend/replication/logical/proto.c.
 * obx_pgoutput_decode() fills a caller-supplied struct; every string and
 * byte view in it is borrowed from the payload buffer and lives until that
 * buffer is freed.  Tuple columns live in the decoder's scratch array until
 * the next decode call.  The decoder never reads past the buffer.
 */
#ifndef OBX_PGOUTPUT_H
#define OBX_PGOUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/lsn.h"

/* One column of TupleData: kind 'n' null, 'u' unchanged TOAST, 't' text, 'b' binary. */
struct obx_pg_datum {
	char kind;
	const uint8_t *data; /* 't'/'b' only; not NUL-terminated */
	uint32_t len;
};

struct obx_pg_tuple {
	uint16_t ncols;
	const struct obx_pg_datum *cols;
};

/* One column of a Relation message. */
struct obx_pg_relcol {
	uint8_t flags; /* 1 = part of the replica identity key */
	const char *name;
	uint32_t type_oid;
	int32_t typmod;
};

struct obx_pgmsg {
	/*
	 * v1: 'B' Begin, 'C' Commit, 'O' Origin, 'R' Relation, 'Y' Type,
	 *     'I' Insert, 'U' Update, 'D' Delete, 'T' Truncate, 'M' Message;
	 * v2: 'S' Stream Start, 'E' Stream Stop, 'c' Stream Commit, 'A' Stream Abort;
	 * v3: 'b' Begin Prepare, 'P' Prepare, 'K' Commit Prepared,
	 *     'r' Rollback Prepared, 'p' Stream Prepare.
	 */
	char type;
	/* inside a streamed block (v2+), R Y I U D T M carry the (sub)transaction id: */
	uint32_t xid; /* 0 when the message carries none */
	union {
		struct {
			obx_lsn final_lsn;   /* the commit LSN */
			int64_t commit_time; /* microseconds since 2000-01-01 */
			uint32_t xid;
		} begin;
		struct {
			uint8_t flags;
			obx_lsn commit_lsn;
			obx_lsn end_lsn;
			int64_t commit_time;
		} commit;
		struct {
			obx_lsn lsn;
			const char *name;
		} origin;
		struct {
			uint32_t relid;
			const char *nspname;
			const char *relname;
			uint8_t replident;
			uint16_t natts;
			const struct obx_pg_relcol *cols;
		} relation;
		struct {
			uint32_t oid;
			const char *nspname;
			const char *typname;
		} type;
		struct {
			uint32_t relid;
			struct obx_pg_tuple tuple;
		} insert;
		struct {
			uint32_t relid;
			char old_kind;             /* 'K' old key, 'O' old tuple, 0 none (Update only) */
			struct obx_pg_tuple tuple; /* Update: the new tuple; Delete: the old key or tuple */
		} change;
		struct {
			uint32_t nrels;
			uint8_t options;
		} truncate;
		struct {
			uint8_t flags; /* 1 = transactional */
			obx_lsn lsn;
			const char *prefix;
			const uint8_t *content;
			uint32_t len;
		} message;
		struct {
			uint32_t xid;
			uint8_t first_segment;
		} stream_start;
		struct {
			uint32_t xid;
			uint8_t flags;
			obx_lsn commit_lsn;
			obx_lsn end_lsn;
			int64_t commit_time;
		} stream_commit;
		struct {
			uint32_t xid;
			uint32_t subxid;
			obx_lsn abort_lsn; /* v4 with streaming = parallel only, else 0 */
			int64_t abort_time;
		} stream_abort;
		/* 'b' 'P' 'K' 'p': lsn is the prepare (or commit) LSN, time likewise */
		struct {
			uint8_t flags;
			obx_lsn lsn;
			obx_lsn end_lsn;
			int64_t time;
			uint32_t xid;
			const char *gid;
		} prepared;
		struct {
			uint8_t flags;
			obx_lsn prepare_end_lsn;
			obx_lsn rollback_end_lsn;
			int64_t prepare_time;
			int64_t rollback_time;
			uint32_t xid;
			const char *gid;
		} rollback_prepared;
	} u;
};

struct obx_pgoutput {
	int proto_version;
	bool stream_parallel;        /* streaming = parallel was requested (v4 abort fields) */
	bool in_stream;              /* between Stream Start and Stream Stop */
	struct obx_pg_datum *datums; /* scratch for tuples, grown on demand */
	size_t datum_cap;
	struct obx_pg_relcol *relcols; /* scratch for Relation columns */
	size_t relcol_cap;
	size_t error_offset; /* where the last decode failed */
};

/*
 * Prepares a decoder for proto_version (1-4).  Pair with obx_pgoutput_reset().
 * Messages of a later protocol version than negotiated are decode errors.
 */
void obx_pgoutput_init(struct obx_pgoutput *d, int proto_version);
void obx_pgoutput_reset(struct obx_pgoutput *d);

/*
 * Decodes one pgoutput message (the payload of an XLogData).  Returns 0;
 * OBX_EPROTO when the message is truncated, inconsistent or of an unknown
 * type (d->error_offset then says where); OBX_ENOMEM when growing scratch
 * space failed.
 */
int obx_pgoutput_decode(struct obx_pgoutput *d, const uint8_t *buf, size_t len, struct obx_pgmsg *out);

/*
 * The highest pgoutput protocol version a server of server_version
 * (PQserverVersion) speaks: 1 before 14, 2 on 14, 3 on 15, 4 from 16.
 */
int obx_pgoutput_proto_for_server(int server_version);

/* A printable name for a message type byte ("Begin", "Insert", ... or "unknown"). */
const char *obx_pgoutput_type_name(char type);

#endif
