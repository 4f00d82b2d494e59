/*
 * poll.h - "outboxd run" in polling mode ([source] mode = poll;
 * docs/internals/design.md, "Polling mode"): claim pending outbox rows with FOR
 * UPDATE SKIP LOCKED, produce them with the same event builder and Kafka
 * sink as the log-based source, mark what the broker acknowledged
 * published in the transaction that holds the row locks, and record
 * failures with capped exponential backoff.  The SQL is pure
 * (core/pollsql.h), so are the decisions for a claimed batch
 * (core/pollcore.h); this is the loop (poll.c).
 */
#ifndef OBX_POLL_H
#define OBX_POLL_H

#include "obx/core/config.h"
#include "obx/core/pollcore.h"
#include "obx/core/pollsql.h"
#include "obx/run/relay.h"

/*
 * "outboxd run" in polling mode (I/O, poll.c): the same options, exit
 * status and signals as obx_relay_run().
 */
int obx_poll_run(const struct obx_config *cfg, const struct obx_run_opts *opts);

#endif
