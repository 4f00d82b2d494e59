/*
 * http.h - /metrics, /healthz and /readyz on [metrics] listen, served by
 * libmicrohttpd's own thread from a snapshot the relay publishes, so a
 * scrape (or a slow or malformed client) never blocks the relay loop.  A
 * second thread polls the slot's WAL retention over an ordinary connection
 * every 15 s.
 */
#ifndef OBX_HTTP_H
#define OBX_HTTP_H

#include <pthread.h>
#include <stdbool.h>

#include "obx/config.h"
#include "obx/metrics.h"

struct MHD_Daemon;

struct obx_http {
	struct MHD_Daemon *daemon;
	pthread_mutex_t mu;
	struct obx_metrics snap; /* guarded by mu */
	const struct obx_config *cfg;
	int port; /* the bound port (useful with listen = host:0) */
};

/* Starts the server.  Returns 0, or OBX_ECONFIG / OBX_EIO with errbuf filled. */
int obx_http_start(struct obx_http *h, const struct obx_config *cfg, char *errbuf, size_t errlen);

/* Publishes the relay's numbers for the next scrape. */
void obx_http_publish(struct obx_http *h, const struct obx_metrics *m);

/* Stops the server and frees everything. */
void obx_http_stop(struct obx_http *h);

#endif
