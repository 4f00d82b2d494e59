/*
 * http.h - /metrics, /healthz and /readyz on [metrics] listen, served by
 * libmicrohttpd's own thread from a snapshot the relay publishes, so a
 * scrape (or a slow or malformed client) never blocks the relay loop (the
 * slot's numbers come from slotwatch.h through that snapshot).
 *
 * No client can starve the probes: one source address holds at most 8 of
 * the 128 connections (the kubelet probes from the node's address and
 * Prometheus from its pod's, so each keeps room whatever another client
 * holds), and a third thread drops a connection that has not sent a whole
 * request 5 s after it opened or after its last answer (a request dripped
 * byte by byte, or an idle keep-alive connection); one that stalls while
 * answered goes after 5 s without progress.  libmicrohttpd's one thread
 * polls every connection without blocking, so slow clients within those
 * limits do not delay the others.
 *
 * /readyz answers anyone, so it says the state and a fixed phrase for why
 * (obx_not_ready_text); the error text behind it, which names hosts and
 * users, only with [metrics] detailed_health = on.
 */
#ifndef OBX_HTTP_H
#define OBX_HTTP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "obx/core/config.h"
#include "obx/core/metrics.h"

struct MHD_Daemon;

#define OBX_HTTP_CONNECTIONS 128 /* connections in all */

/* A connection's request deadline (guarded by obx_http.mu). */
struct obx_http_conn {
	int fd;           /* -1: a free entry */
	int64_t since_ms; /* monotonic: opened, or its last answer completed */
	bool answering;   /* a response is queued: no deadline until it completes */
};

struct obx_http {
	struct MHD_Daemon *daemon;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct obx_metrics snap; /* guarded by mu */
	pthread_t reaper;        /* shuts down connections past their deadline */
	bool reaper_running;
	bool stopping;                                    /* guarded by mu */
	struct obx_http_conn conns[OBX_HTTP_CONNECTIONS]; /* guarded by mu */
	const struct obx_config *cfg;
	int port; /* the bound port (useful with listen = host:0) */
};

/*
 * Starts the server and the reaper.  Returns 0, or
 * OBX_ECONFIG / OBX_EIO with errbuf filled.  cfg is borrowed until
 * obx_http_stop().
 */
int obx_http_start(struct obx_http *h, const struct obx_config *cfg, char *errbuf, size_t errlen);

/* Publishes the relay's numbers for the next scrape. */
void obx_http_publish(struct obx_http *h, const struct obx_metrics *m);

/* Stops the server and the reaper, and frees everything. */
void obx_http_stop(struct obx_http *h);

#endif
