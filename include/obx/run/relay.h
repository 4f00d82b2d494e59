/*
 * relay.h - "outboxd run": the relay loop.  One thread; poll() over the
 * replication socket, the producer's wake-up pipe and the signal pipe.
 * SIGTERM/SIGINT stop (the first drains), SIGHUP re-reads the configuration:
 * the log level and progress interval change at once, every other change is
 * logged as needing a restart.
 */
#ifndef OBX_RELAY_H
#define OBX_RELAY_H

#include <stdbool.h>

#include "obx/core/config.h"

struct obx_run_opts {
	bool recreate_slot;
	int signal_fd; /* readable when a signal arrived: one byte per signal, its number */
	/* SIGHUP: re-reads the configuration into out (the caller resets it).  Returns 0 or OBX_E*. */
	int (*reload)(void *ctx, struct obx_config *out, char *errbuf, size_t errlen);
	void *reload_ctx;
};

/* Runs until stopped.  Returns the exit status: 0 clean stop, 1 failure. */
int obx_relay_run(const struct obx_config *cfg, const struct obx_run_opts *opts);

#endif
