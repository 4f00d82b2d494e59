/*
 * relay.h - "outboxd run": the relay loop.  One thread; poll() over the
 * replication socket, the producer's wake-up pipe and the signal pipe.
 */
#ifndef OBX_RELAY_H
#define OBX_RELAY_H

#include <stdbool.h>

#include "obx/config.h"

struct obx_run_opts {
	bool recreate_slot;
	int signal_fd; /* readable when SIGTERM/SIGINT arrived (one byte per signal) */
};

/* Runs until stopped.  Returns the exit status: 0 clean stop, 1 failure. */
int obx_relay_run(const struct obx_config *cfg, const struct obx_run_opts *opts);

#endif
