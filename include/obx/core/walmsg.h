/*
 * walmsg.h - CopyData framing of the streaming replication protocol (pure).
 *
 *   'w' XLogData:  dataStart u64, walEnd u64, sendTime i64, then the payload
 *   'k' keepalive: walEnd u64, sendTime i64, replyRequested u8
 *   'r' standby status update (client to server, 34 bytes):
 *                  write u64, flush u64, apply u64, sendTime i64, replyRequested u8
 * sendTime is microseconds since 2000-01-01 UTC (PostgreSQL epoch).
 */
#ifndef OBX_WALMSG_H
#define OBX_WALMSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/lsn.h"

#define OBX_STATUS_UPDATE_LEN 34
/* microseconds between 1970-01-01 and 2000-01-01 */
#define OBX_PG_EPOCH_OFFSET_US 946684800000000LL

struct obx_walmsg {
	char kind;          /* 'w' or 'k' */
	obx_lsn data_start; /* 'w' only; 0/0 for messages without a position */
	obx_lsn wal_end;
	int64_t send_time;
	bool reply_requested;   /* 'k' only */
	const uint8_t *payload; /* 'w' only: borrowed view into the CopyData buffer */
	size_t payload_len;
};

/*
 * Parses one CopyData message.  Returns 0, or OBX_EPROTO when it is
 * truncated, too long ('k') or of an unknown kind.
 */
int obx_walmsg_parse(const void *buf, size_t len, struct obx_walmsg *out);

/* Builds a standby status update into out (OBX_STATUS_UPDATE_LEN bytes). */
void obx_walmsg_status(uint8_t out[OBX_STATUS_UPDATE_LEN], obx_lsn write, obx_lsn flush, obx_lsn apply,
    int64_t send_time, bool reply_requested);

#endif
