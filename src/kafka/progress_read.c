/*
 * kafka/progress_read.c - exactly-once's read of its progress record at a
 * session's start (I/O); see kafka/progress_read.h and
 * docs/internals/design.md, "Exactly-once".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "obx/core/eos_progress.h"
#include "obx/core/err.h"
#include "obx/kafka/consumer.h"
#include "obx/kafka/progress_read.h"
#include "obx/sys/log.h"

#define PROGRESS_WINDOW 64

/*
 * Reads partition p of the progress topic from its end backwards, window by
 * window, until a record keyed key turns up, and takes the last one (the
 * newest: a tombstone, or a record without a value, is a reset and leaves
 * *have as it was).  The newest window is read up to the end of the
 * partition, and that end must be the high watermark: a read_committed
 * consumer stops at the first offset of a transaction still open (another
 * instance's, on a shared topic), and a record of ours after it would be
 * missed; it is waited for up to the deadline.  Returns 1 when a record of
 * the key was found (*out filled when it is not a reset), 0 none, OBX_EIO
 * with errbuf filled.
 */
static int
progress_partition(const struct obx_config *cfg, const char *key, rd_kafka_t *rk, rd_kafka_topic_t *rkt, int32_t p,
    int64_t deadline, bool (*tick)(void *), void *arg, struct obx_progress *out, bool *have, char *errbuf,
    size_t errlen)
{
	int64_t lo, hi, from, end;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
	int64_t window = PROGRESS_WINDOW;
	bool newest = true;

	while (obx_mono_ms() < deadline) {
		err = rd_kafka_query_watermark_offsets(rk, cfg->progress_topic, p, &lo, &hi,
		    obx_kafka_slice(deadline));
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR || (tick != NULL && tick(arg)))
			break;
	}
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
		snprintf(errbuf, errlen, "could not read the watermarks of %s [%d]: %s", cfg->progress_topic,
		    (int)p, rd_kafka_err2str(err));
		return OBX_EIO;
	}
	end = hi; /* the newest window reads on past it, to the end of the partition */
	do {
		int64_t last = -1;
		rd_kafka_message_t *keep = NULL;

		from = end - window > lo ? end - window : lo;
		if (rd_kafka_consume_start(rkt, p, from) != 0) {
			snprintf(errbuf, errlen, "could not read %s [%d]: %s", cfg->progress_topic, (int)p,
			    rd_kafka_err2str(rd_kafka_last_error()));
			return OBX_EIO;
		}
		for (;;) {
			rd_kafka_message_t *m;
			int64_t off;

			if (obx_mono_ms() >= deadline || (tick != NULL && tick(arg))) {
				if (keep != NULL)
					rd_kafka_message_destroy(keep);
				rd_kafka_consume_stop(rkt, p);
				snprintf(errbuf, errlen, "reading %s [%d] back did not finish in time%s",
				    cfg->progress_topic, (int)p,
				    newest ?
				        " (a transaction still open there, of "
				        "another producer, holds its last stable offset below its high watermark)" :
				        "");
				return OBX_EIO;
			}
			m = rd_kafka_consume(rkt, p, obx_kafka_slice(deadline));
			if (m == NULL)
				continue;
			if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
				int64_t wlo, whi;
				bool stable = !newest ||
				    rd_kafka_get_watermark_offsets(rk, cfg->progress_topic, p, &wlo, &whi) != 0 ||
				    m->offset >= whi;

				rd_kafka_message_destroy(m);
				if (stable)
					break;
				continue; /* an open transaction: its end lets the rest through */
			}
			if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
				snprintf(errbuf, errlen, "could not read %s [%d]: %s", cfg->progress_topic, (int)p,
				    rd_kafka_message_errstr(m));
				rd_kafka_message_destroy(m);
				if (keep != NULL)
					rd_kafka_message_destroy(keep);
				rd_kafka_consume_stop(rkt, p);
				return OBX_EIO;
			}
			if (!newest && m->offset >= end) {
				rd_kafka_message_destroy(m);
				break;
			}
			off = m->offset;
			if (m->key_len == strlen(key) && memcmp(m->key, key, m->key_len) == 0 && off > last) {
				if (keep != NULL)
					rd_kafka_message_destroy(keep);
				keep = m;
				last = off;
			} else {
				rd_kafka_message_destroy(m);
			}
			if (!newest && off >= end - 1)
				break;
		}
		rd_kafka_consume_stop(rkt, p);
		if (keep != NULL) {
			struct obx_progress pr;
			char bad[128];
			int rc = keep->payload == NULL ?
			    OBX_ENOENT :
			    obx_progress_parse(keep->payload, keep->len, cfg->slot, &pr, bad, sizeof(bad));

			if (rc == OBX_EINVAL) {
				snprintf(errbuf, errlen,
				    "%s [%d] offset %" PRId64 " is keyed %s but is not a progress "
				    "record: %s (a tombstone for the key resets the progress)",
				    cfg->progress_topic, (int)p, keep->offset, key, bad);
				rd_kafka_message_destroy(keep);
				return OBX_EIO;
			}
			if (rc == 0 && (!*have || obx_dd_mark_cmp(&pr.mark, &out->mark) > 0)) {
				*out = pr;
				*have = true;
			}
			rd_kafka_message_destroy(keep);
			return 1;
		}
		end = from;
		newest = false;
		window *= 4;
	} while (end > lo);
	return 0;
}

int
obx_kafka_progress_read(const struct obx_config *cfg, const char *key, int budget_ms, bool (*tick)(void *),
    void *arg, struct obx_progress *out, int32_t *nparts_out, char *errbuf, size_t errlen)
{
	int64_t deadline = obx_mono_ms() + budget_ms;
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
	rd_kafka_topic_t *rkt;
	int32_t nparts = 0, own;
	bool have = false;
	int rc = 0;
	rd_kafka_t *rk = obx_kafka_consumer_new(cfg, "outboxd-progress", errbuf, errlen);

	if (rk == NULL)
		return OBX_EIO;
	rkt = rd_kafka_topic_new(rk, cfg->progress_topic, NULL);
	if (rkt == NULL) {
		snprintf(errbuf, errlen, "%s", rd_kafka_err2str(rd_kafka_last_error()));
		rd_kafka_destroy(rk);
		return OBX_EIO;
	}
	while (obx_mono_ms() < deadline) {
		err = rd_kafka_metadata(rk, 0, rkt, &md,
		    obx_kafka_slice(deadline) > 0 ? obx_kafka_slice(deadline) : 1);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR || (tick != NULL && tick(arg)))
			break;
	}
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
		snprintf(errbuf, errlen, "could not read the metadata of %s: %s", cfg->progress_topic,
		    rd_kafka_err2str(err));
		rc = OBX_EIO;
	} else {
		err = md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
			nparts = md->topics[0].partition_cnt;
		else if (err != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART &&
		    err != RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC) {
			snprintf(errbuf, errlen, "the metadata of %s says %s", cfg->progress_topic,
			    rd_kafka_err2str(err));
			rc = OBX_EIO;
		}
		rd_kafka_metadata_destroy(md);
	}
	/*
	 * The key's own partition (murmur2, where outboxd writes it); only when it
	 * holds no record of the key, the others (a record written by a
	 * partitioner of the user's while the topic did not exist yet)
	 */
	*nparts_out = nparts;
	own = nparts > 0 ? obx_dd_partition(key, strlen(key), nparts) : 0;
	if (rc == 0 && nparts > 0)
		rc = progress_partition(cfg, key, rk, rkt, own, deadline, tick, arg, out, &have, errbuf, errlen);
	for (int32_t p = 0; p < nparts && rc == 0; p++) {
		int r = p == own ?
		    0 :
		    progress_partition(cfg, key, rk, rkt, p, deadline, tick, arg, out, &have, errbuf, errlen);

		if (r < 0)
			rc = r;
	}
	rd_kafka_topic_destroy(rkt);
	rd_kafka_destroy(rk);
	if (rc < 0)
		return rc;
	return have ? 1 : 0;
}
