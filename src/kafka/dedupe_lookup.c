/*
 * kafka/dedupe_lookup.c - the read-back for restart de-duplication (I/O); see kafka/dedupe_lookup.h.
 *
 * The thread owns a consumer without a group (nothing is committed): per
 * topic it reads the metadata and each partition's watermarks, then windows
 * of each partition from its end backwards, as the scan asks (core/restart_dedupe.h),
 * with the legacy per-partition consumer so that each partition starts and
 * stops on its own.  A window starts at an explicit offset and ends with
 * its last offset: no offset query for "the last n", no waiting for the end
 * of the partition (both cost a round trip and a broker-held fetch each).
 * Every call into librdkafka waits at most SLICE_MS, so a stop request or
 * the budget ends a read-back promptly.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/kafka/dedupe_lookup.h"

#define SLICE_MS 200
#define MAX_HEADERS 64

static void
log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *msg)
{
	(void)rk;
	(void)level;
	/* the producer's properties that a consumer ignores, and connection trouble the
	 * producer reports too: nothing here is news */
	obx_log_debug("kafka (dedupe read-back) %s: %s", fac, msg);
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	(void)rk;
	(void)opaque;
	obx_log_debug("kafka (dedupe read-back): %s: %s", rd_kafka_err2name((rd_kafka_resp_err_t)err),
	    reason);
}

/* A consumer with the producer's connection settings; NULL with errbuf filled. */
static rd_kafka_t *
consumer_new(const struct obx_config *cfg, const char *client_id, char *errbuf, size_t errlen)
{
	static const char *const own[][2] = {
		/* what a transaction that was aborted or is still open wrote is not read (progress) */
		{ "isolation.level", "read_committed" },
		{ "enable.partition.eof", "true" },
		{ "enable.auto.commit", "false" },
		{ "enable.auto.offset.store", "false" },
		{ "auto.offset.reset", "earliest" }, /* a window below the first offset starts there */
		/* a fetch at the end of a partition is answered at once, not held: it would delay
		 * every request behind it on the connection (metadata, watermarks) */
		{ "fetch.wait.max.ms", "0" },
		{ "fetch.max.bytes", "4194304" },
		{ "max.partition.fetch.bytes", "1048576" },
		{ "queued.max.messages.kbytes", "8192" },
	};
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char err[512];
	rd_kafka_t *rk;

	if (conf == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < cfg->n_kafka; i++)
		if (rd_kafka_conf_set(conf, cfg->kafka[i].key, cfg->kafka[i].value, err, sizeof(err)) !=
		    RD_KAFKA_CONF_OK) {
			snprintf(errbuf, errlen, "kafka property %s: %.300s", cfg->kafka[i].key,
			    obx_kafka_prop_is_secret(cfg->kafka[i].key) ? "invalid value" : err);
			goto fail;
		}
	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
		if (rd_kafka_conf_set(conf, own[i][0], own[i][1], err, sizeof(err)) != RD_KAFKA_CONF_OK) {
			snprintf(errbuf, errlen, "kafka property %s: %.300s", own[i][0], err);
			goto fail;
		}
	if (rd_kafka_conf_set(conf, "client.id", client_id, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
		snprintf(errbuf, errlen, "kafka property client.id: %.300s", err);
		goto fail;
	}
	rd_kafka_conf_set_log_cb(conf, log_cb);
	rd_kafka_conf_set_error_cb(conf, error_cb);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL) {
		snprintf(errbuf, errlen, "could not create a consumer: %.300s", err);
		goto fail;
	}
	return rk;
fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}

static bool
stopping(struct obx_lookup *l)
{
	bool stop;

	pthread_mutex_lock(&l->mu);
	stop = l->stop;
	pthread_mutex_unlock(&l->mu);
	return stop;
}

static int
slice(int64_t deadline)
{
	int64_t left = deadline - obx_mono_ms();

	return left <= 0 ? 0 : left < SLICE_MS ? (int)left : SLICE_MS;
}

/* Reads the topic's partition count into s; false when the read-back is over. */
static bool
read_metadata(struct obx_lookup *l, rd_kafka_t *rk, rd_kafka_topic_t *rkt, struct obx_dd_scan *s,
    int64_t deadline)
{
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err;

	for (;;) {
		err = rd_kafka_metadata(rk, 0, rkt, &md, slice(deadline) > 0 ? slice(deadline) : 1);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
			break;
		if (stopping(l) || obx_mono_ms() >= deadline) {
			obx_dd_scan_fail(s, -1, "could not read its metadata: %s", rd_kafka_err2str(err));
			return false;
		}
	}
	err = md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
	if (err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART || err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC)
		obx_dd_scan_partitions(s, 0); /* no such topic: nothing of ours is in it */
	else if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		obx_dd_scan_fail(s, -1, "its metadata says %s", rd_kafka_err2str(err));
	else
		obx_dd_scan_partitions(s, md->topics[0].partition_cnt);
	rd_kafka_metadata_destroy(md);
	return s->nparts > 0 && !s->failed;
}

/* The watermarks of every partition: where each read-back starts and how far back it may go. */
static void
read_bounds(struct obx_lookup *l, rd_kafka_t *rk, struct obx_dd_scan *s, int64_t deadline)
{
	for (int32_t p = 0; p < s->nparts; p++) {
		int64_t lo, hi;
		rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;

		while (!stopping(l) && obx_mono_ms() < deadline) {
			err = rd_kafka_query_watermark_offsets(rk, s->topic, p, &lo, &hi, slice(deadline));
			if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
				break;
		}
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
			obx_dd_scan_bounds(s, p, lo, hi);
		else
			obx_dd_scan_fail(s, p, "could not read its watermarks: %s", rd_kafka_err2str(err));
	}
}

static void
feed(struct obx_dd_scan *s, rd_kafka_message_t *m)
{
	struct obx_header hs[MAX_HEADERS];
	rd_kafka_headers_t *h = NULL;
	const char *name;
	const void *v;
	size_t sz, n = 0;

	if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR)
		for (size_t i = 0; n < MAX_HEADERS && rd_kafka_header_get_all(h, i, &name, &v, &sz) == 0; i++)
			hs[n++] = (struct obx_header){ name, v, sz };
	obx_dd_scan_record(s, m->partition, m->offset, m->key, m->key_len, m->len, hs, n);
}

/*
 * One round: every partition that wants a window reads it, all at once
 * through one queue.  Returns false when no partition wanted one.
 */
static bool
read_round(struct obx_lookup *l, rd_kafka_t *rk, rd_kafka_topic_t *rkt, struct obx_dd_scan *s,
    int64_t deadline)
{
	rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
	int64_t *to = calloc((size_t)s->nparts, sizeof(*to));
	bool *active = calloc((size_t)s->nparts, sizeof(*active));
	bool *started = calloc((size_t)s->nparts, sizeof(*started));
	int nactive = 0;

	if (q == NULL || to == NULL || active == NULL || started == NULL) {
		obx_dd_scan_fail(s, -1, "out of memory");
		goto out;
	}
	for (int32_t p = 0; p < s->nparts; p++) {
		struct obx_dd_window w;

		if (!obx_dd_scan_want(s, p, &w))
			continue;
		if (rd_kafka_consume_start_queue(rkt, p, w.from, q) != 0) {
			obx_dd_scan_fail(s, p, "could not start reading it: %s",
			    rd_kafka_err2str(rd_kafka_last_error()));
			continue;
		}
		started[p] = active[p] = true;
		to[p] = w.to;
		nactive++;
	}
	while (nactive > 0 && !stopping(l) && obx_mono_ms() < deadline) {
		rd_kafka_message_t *m = rd_kafka_consume_queue(q, slice(deadline));
		int32_t p;

		if (m == NULL)
			continue;
		p = m->partition;
		if (p < 0 || p >= s->nparts || !active[p]) {
			rd_kafka_message_destroy(m);
			continue;
		}
		if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF ||
		    (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && m->offset >= to[p])) {
			obx_dd_scan_window_done(s, p);
			active[p] = false;
		} else if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
			obx_dd_scan_fail(s, p, "could not read it: %s", rd_kafka_message_errstr(m));
			active[p] = false;
		} else {
			feed(s, m);
			if (m->offset >= to[p] - 1) {
				obx_dd_scan_window_done(s, p);
				active[p] = false;
			}
		}
		if (!active[p])
			nactive--;
		rd_kafka_message_destroy(m);
	}
out:
	for (int32_t p = 0; started != NULL && p < s->nparts; p++)
		if (started[p])
			rd_kafka_consume_stop(rkt, p);
	if (q != NULL)
		rd_kafka_queue_destroy(q);
	free(to);
	free(active);
	if (started == NULL)
		return false;
	for (int32_t p = 0; p < s->nparts; p++)
		if (started[p]) {
			free(started);
			return true;
		}
	free(started);
	return false;
}

/* Reads topic back for job; rk NULL: the consumer could not be made (errbuf says so). */
static struct obx_dd_scan *
read_topic(struct obx_lookup *l, rd_kafka_t *rk, const char *reason, const struct obx_lookup_job *job)
{
	int64_t deadline = obx_mono_ms() + OBX_LOOKUP_BUDGET_MS;
	struct obx_dd_scan *s = obx_dd_scan_new(job->topic, &job->floor);
	rd_kafka_topic_t *rkt;
	char unfinished[128];
	int rounds = 0;

	if (s == NULL)
		return NULL;
	if (rk == NULL) {
		obx_dd_scan_fail(s, -1, "%s", reason);
		return s;
	}
	rkt = rd_kafka_topic_new(rk, job->topic, NULL);
	if (rkt == NULL) {
		obx_dd_scan_fail(s, -1, "%s", rd_kafka_err2str(rd_kafka_last_error()));
		return s;
	}
	if (read_metadata(l, rk, rkt, s, deadline)) {
		read_bounds(l, rk, s, deadline);
		while (!stopping(l) && obx_mono_ms() < deadline && read_round(l, rk, rkt, s, deadline))
			rounds++;
	}
	obx_log_debug("de-duplication: read topic %s back in %lld ms, %d window(s) per partition at most",
	    job->topic, (long long)(obx_mono_ms() - (deadline - OBX_LOOKUP_BUDGET_MS)), rounds);
	if (stopping(l))
		snprintf(unfinished, sizeof(unfinished), "the session ended during its read-back");
	else
		snprintf(unfinished, sizeof(unfinished), "its read-back did not finish within %d ms",
		    OBX_LOOKUP_BUDGET_MS);
	obx_dd_scan_finish(s, unfinished);
	rd_kafka_topic_destroy(rkt);
	return s;
}

static void *
worker(void *arg)
{
	struct obx_lookup *l = arg;
	char errbuf[512] = "";
	rd_kafka_t *rk;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the relay loop's */
	rk = consumer_new(l->cfg, "outboxd-dedupe", errbuf, sizeof(errbuf));
	for (;;) {
		struct obx_lookup_job *job, **tail;

		pthread_mutex_lock(&l->mu);
		while (!l->stop && l->todo == NULL)
			pthread_cond_wait(&l->cv, &l->mu);
		job = l->stop ? NULL : l->todo;
		if (job != NULL)
			l->todo = job->next;
		pthread_mutex_unlock(&l->mu);
		if (job == NULL)
			break;
		job->next = NULL;
		job->scan = read_topic(l, rk, errbuf, job);
		pthread_mutex_lock(&l->mu);
		for (tail = &l->done; *tail != NULL; tail = &(*tail)->next)
			;
		*tail = job;
		pthread_mutex_unlock(&l->mu);
		if (write(l->wake[1], "1", 1) < 0 && errno != EAGAIN)
			obx_log_debug("could not wake the relay loop: %s", strerror(errno));
	}
	if (rk != NULL)
		rd_kafka_destroy(rk);
	return NULL;
}

void
obx_lookup_init(struct obx_lookup *l, const struct obx_config *cfg)
{
	memset(l, 0, sizeof(*l));
	l->cfg = cfg;
	l->wake[0] = l->wake[1] = -1;
}

int
obx_lookup_start(struct obx_lookup *l)
{
	if (l->started)
		return 0;
	if (pipe2(l->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
		l->wake[0] = l->wake[1] = -1;
		return OBX_EIO;
	}
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	if (pthread_create(&l->thread, NULL, worker, l) != 0) {
		pthread_mutex_destroy(&l->mu);
		pthread_cond_destroy(&l->cv);
		close(l->wake[0]);
		close(l->wake[1]);
		l->wake[0] = l->wake[1] = -1;
		return OBX_EIO;
	}
	l->started = true;
	return 0;
}

int
obx_lookup_request(struct obx_lookup *l, const char *topic, const struct obx_dd_mark *floor,
    uint32_t tag)
{
	struct obx_lookup_job *job = calloc(1, sizeof(*job)), **tail;
	int r;

	if (job == NULL || (job->topic = strdup(topic)) == NULL) {
		free(job);
		return OBX_ENOMEM;
	}
	job->floor = *floor;
	job->tag = tag;
	if ((r = obx_lookup_start(l)) != 0) {
		obx_lookup_job_free(job);
		return r;
	}
	pthread_mutex_lock(&l->mu);
	for (tail = &l->todo; *tail != NULL; tail = &(*tail)->next)
		;
	*tail = job;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int
obx_lookup_fd(const struct obx_lookup *l)
{
	return l->wake[0];
}

struct obx_lookup_job *
obx_lookup_take(struct obx_lookup *l)
{
	struct obx_lookup_job *job;
	char buf[64];

	if (!l->started)
		return NULL;
	while (read(l->wake[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&l->mu);
	job = l->done;
	if (job != NULL)
		l->done = job->next;
	pthread_mutex_unlock(&l->mu);
	if (job != NULL)
		job->next = NULL;
	return job;
}

void
obx_lookup_job_free(struct obx_lookup_job *job)
{
	if (job == NULL)
		return;
	obx_dd_scan_free(job->scan);
	free(job->topic);
	free(job);
}

static void
free_list(struct obx_lookup_job *job)
{
	while (job != NULL) {
		struct obx_lookup_job *next = job->next;

		obx_lookup_job_free(job);
		job = next;
	}
}

void
obx_lookup_close(struct obx_lookup *l)
{
	if (l->started) {
		pthread_mutex_lock(&l->mu);
		l->stop = true;
		pthread_cond_signal(&l->cv);
		pthread_mutex_unlock(&l->mu);
		pthread_join(l->thread, NULL);
		free_list(l->todo);
		free_list(l->done);
		pthread_mutex_destroy(&l->mu);
		pthread_cond_destroy(&l->cv);
		close(l->wake[0]);
		close(l->wake[1]);
	}
	obx_lookup_init(l, l->cfg);
}

/* ---- exactly-once: the progress record ---- */

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
progress_partition(const struct obx_config *cfg, const char *key, rd_kafka_t *rk,
    rd_kafka_topic_t *rkt, int32_t p, int64_t deadline, bool (*tick)(void *), void *arg,
    struct obx_progress *out, bool *have, char *errbuf, size_t errlen)
{
	int64_t lo, hi, from, end;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
	int64_t window = PROGRESS_WINDOW;
	bool newest = true;

	while (obx_mono_ms() < deadline) {
		err = rd_kafka_query_watermark_offsets(rk, cfg->progress_topic, p, &lo, &hi, slice(deadline));
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
				    cfg->progress_topic, (int)p, newest ? " (a transaction still open there, of "
				    "another producer, holds its last stable offset below its high watermark)" : "");
				return OBX_EIO;
			}
			m = rd_kafka_consume(rkt, p, slice(deadline));
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
			int rc = keep->payload == NULL ? OBX_ENOENT :
			    obx_progress_parse(keep->payload, keep->len, cfg->slot, &pr, bad, sizeof(bad));

			if (rc == OBX_EINVAL) {
				snprintf(errbuf, errlen, "%s [%d] offset %" PRId64 " is keyed %s but is not a progress "
				    "record: %s (a tombstone for the key resets the progress)", cfg->progress_topic,
				    (int)p, keep->offset, key, bad);
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
obx_lookup_progress(const struct obx_config *cfg, const char *key, int budget_ms,
    bool (*tick)(void *), void *arg, struct obx_progress *out, int32_t *nparts_out, char *errbuf,
    size_t errlen)
{
	int64_t deadline = obx_mono_ms() + budget_ms;
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
	rd_kafka_topic_t *rkt;
	int32_t nparts = 0, own;
	bool have = false;
	int rc = 0;
	rd_kafka_t *rk = consumer_new(cfg, "outboxd-progress", errbuf, errlen);

	if (rk == NULL)
		return OBX_EIO;
	rkt = rd_kafka_topic_new(rk, cfg->progress_topic, NULL);
	if (rkt == NULL) {
		snprintf(errbuf, errlen, "%s", rd_kafka_err2str(rd_kafka_last_error()));
		rd_kafka_destroy(rk);
		return OBX_EIO;
	}
	while (obx_mono_ms() < deadline) {
		err = rd_kafka_metadata(rk, 0, rkt, &md, slice(deadline) > 0 ? slice(deadline) : 1);
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
		int r = p == own ? 0 : progress_partition(cfg, key, rk, rkt, p, deadline, tick, arg, out, &have,
		    errbuf, errlen);

		if (r < 0)
			rc = r;
	}
	rd_kafka_topic_destroy(rkt);
	rd_kafka_destroy(rk);
	if (rc < 0)
		return rc;
	return have ? 1 : 0;
}
