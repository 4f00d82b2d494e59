/*
 * kafka/dedupe_lookup.h - the read-back for restart de-duplication (I/O): a thread with
 * its own librdkafka consumer reads the end of a topic's partitions and
 * fills a scan (core/restart_dedupe.h) with what it finds, so the relay loop never
 * waits on the broker for it: status updates keep flowing while a topic
 * is read back.  docs/internals/design.md ("Restart de-duplication") says why.
 *
 * One per session: obx_lookup_init() when it opens (no thread yet),
 * obx_lookup_start() to have the consumer connect early (or the first
 * obx_lookup_request() starts it), obx_lookup_request() per topic,
 * obx_lookup_take() whenever obx_lookup_fd() is readable,
 * obx_lookup_close() when the session ends.  Each read-back ends within
 * OBX_LOOKUP_BUDGET_MS; what it could not read falls back to publishing.
 */
#ifndef OBX_LOOKUP_H
#define OBX_LOOKUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/restart_dedupe.h"
#include "obx/core/eos_progress.h"

/* How long one topic's read-back may take, metadata included. */
#define OBX_LOOKUP_BUDGET_MS 5000

/* One read-back: asked for with a topic, a floor and a tag; answered with a scan. */
struct obx_lookup_job {
	struct obx_lookup_job *next;
	char *topic;
	struct obx_dd_mark floor;
	uint32_t tag;
	struct obx_dd_scan *scan; /* the answer; NULL when out of memory */
};

struct obx_lookup {
	const struct obx_config *cfg; /* borrowed; outlives the lookup */
	bool started;                 /* the thread runs */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct obx_lookup_job *todo, *done; /* FIFO lists, guarded by mu */
	bool stop;
	int wake[2]; /* the thread writes a byte to wake[1] per answer */
};

/* Prepares l for cfg (borrowed); starts nothing. */
void obx_lookup_init(struct obx_lookup *l, const struct obx_config *cfg);

/*
 * Starts the thread, which creates its consumer at once (it connects while
 * the caller does other things).  Returns 0 (also when started already) or
 * OBX_EIO (no pipe or thread).
 */
int obx_lookup_start(struct obx_lookup *l);

/*
 * Asks for topic to be read back down to floor; the answer carries tag.
 * Returns 0, or OBX_ENOMEM / OBX_EIO (no pipe or thread) when it cannot be
 * started.
 */
int obx_lookup_request(struct obx_lookup *l, const char *topic, const struct obx_dd_mark *floor, uint32_t tag);

/* The fd that becomes readable when an answer is ready; -1 before the first request. */
int obx_lookup_fd(const struct obx_lookup *l);

/*
 * The next answer, or NULL.  The caller owns the job: it takes job->scan
 * (setting it NULL) and frees the rest with obx_lookup_job_free().
 */
struct obx_lookup_job *obx_lookup_take(struct obx_lookup *l);
void obx_lookup_job_free(struct obx_lookup_job *job);

/* Stops the thread (a read-back under way ends within a few hundred ms) and frees every job. */
void obx_lookup_close(struct obx_lookup *l);

#endif
