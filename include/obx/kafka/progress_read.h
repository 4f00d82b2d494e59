/*
 * kafka/progress_read.h - exactly-once's progress record, read back from
 * the progress topic at a session's start (docs/internals/design.md,
 * "Exactly-once").
 */
#ifndef OBX_KAFKA_PROGRESS_READ_H
#define OBX_KAFKA_PROGRESS_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/eos_progress.h"

/*
 * Exactly-once: reads the progress topic ([delivery] progress_topic) back
 * with a read_committed consumer of its own and finds the latest progress
 * record keyed key (the transactional.id) for cfg's slot: the newest record
 * of the key in its own partition (murmur2 of the key, where outboxd
 * writes it; a tombstone resets the progress), else the highest mark of
 * the newest ones in the others (core/eos_progress.h).  *nparts gets the topic's
 * partition count (0: no such topic).  Waits at most budget_ms, calling tick(arg)
 * between slices (true gives up).  Returns 1 with *out filled, 0 when there
 * is none (no topic, or no such record), or OBX_EIO with errbuf filled (it
 * could not be read: the caller must not guess).
 */
int obx_kafka_progress_read(const struct obx_config *cfg, const char *key, int budget_ms, bool (*tick)(void *),
    void *arg, struct obx_progress *out, int32_t *nparts, char *errbuf, size_t errlen);

#endif
