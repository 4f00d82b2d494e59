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
 * Every call into librdkafka waits at most OBX_KAFKA_SLICE_MS, so a stop request or
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
#include "obx/kafka/consumer.h"
#include "obx/kafka/dedupe_lookup.h"

#define MAX_HEADERS 64

static bool
stopping(struct obx_lookup *l)
{
	bool stop;

	pthread_mutex_lock(&l->mu);
	stop = l->stop;
	pthread_mutex_unlock(&l->mu);
	return stop;
}

/* Reads the topic's partition count into s; false when the read-back is over. */
static bool
read_metadata(struct obx_lookup *l, rd_kafka_t *rk, rd_kafka_topic_t *rkt, struct obx_dd_scan *s, int64_t deadline)
{
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err;

	for (;;) {
		err = rd_kafka_metadata(rk, 0, rkt, &md,
		    obx_kafka_slice(deadline) > 0 ? obx_kafka_slice(deadline) : 1);
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
			err = rd_kafka_query_watermark_offsets(rk, s->topic, p, &lo, &hi,
			    obx_kafka_slice(deadline));
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
read_round(struct obx_lookup *l, rd_kafka_t *rk, rd_kafka_topic_t *rkt, struct obx_dd_scan *s, int64_t deadline)
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
		rd_kafka_message_t *m = rd_kafka_consume_queue(q, obx_kafka_slice(deadline));
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
	rk = obx_kafka_consumer_new(l->cfg, "outboxd-dedupe", errbuf, sizeof(errbuf));
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
obx_lookup_request(struct obx_lookup *l, const char *topic, const struct obx_dd_mark *floor, uint32_t tag)
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
