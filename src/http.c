#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "obx/err.h"
#include "obx/http.h"
#include "obx/log.h"
#include "obx/pgutil.h"

#define HEARTBEAT_STALE_MS 30000
#define SLOT_POLL_SECONDS 15

static enum MHD_Result
reply(struct MHD_Connection *c, unsigned status, const char *ctype, char *body, size_t len, bool owned)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body,
	    owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ret;

	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", ctype);
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
    const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	struct obx_http *h = cls;
	struct obx_metrics m;
	char buf[256];

	(void)version;
	(void)upload;
	if (*con_cls == NULL) { /* first call: headers only */
		*con_cls = h;
		return MHD_YES;
	}
	if (*upload_size != 0) {
		*upload_size = 0; /* ignore any body */
		return MHD_YES;
	}
	pthread_mutex_lock(&h->mu);
	m = h->snap;
	pthread_mutex_unlock(&h->mu);
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(c, 405, "text/plain", "method not allowed\n", 19, false);
	if (strcmp(url, "/metrics") == 0) {
		size_t len;
		char *body = obx_metrics_render(&m, &len);

		if (body == NULL)
			return reply(c, 500, "text/plain", "out of memory\n", 14, false);
		return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", body, len, true);
	}
	if (strcmp(url, "/healthz") == 0) {
		/* alive and the loop turning; outages of PostgreSQL or the broker are ridden out */
		if (obx_mono_ms() - m.heartbeat_ms > HEARTBEAT_STALE_MS)
			return reply(c, 503, "text/plain", "stalled: the relay loop has not turned for 30 s\n", 48, false);
		return reply(c, 200, "text/plain", "ok\n", 3, false);
	}
	if (strcmp(url, "/readyz") == 0) {
		int n;

		if (m.state == OBX_STATE_STREAMING || m.state == OBX_STATE_BACKPRESSURED ||
		    m.state == OBX_STATE_STANDBY) {
			n = snprintf(buf, sizeof(buf), "ready: %s\n", obx_state_name(m.state));
			return reply(c, 200, "text/plain", buf, (size_t)n, false);
		}
		n = snprintf(buf, sizeof(buf), "not ready: %s%s%s\n", obx_state_name(m.state),
		    m.state_reason[0] ? ": " : "", m.state_reason);
		return reply(c, 503, "text/plain", buf, (size_t)n, false);
	}
	return reply(c, 404, "text/plain", "not found\n", 10, false);
}

/* Returns true when the slot was found (otherwise the poller retries sooner). */
static bool
poll_slot(struct obx_http *h, PGconn **conn)
{
	const char *params[1] = { h->cfg->slot };
	PGresult *r;
	int64_t retained = 0, safe = -1, keep = -1;
	int status = 0;
	bool found = false;

	if (*conn == NULL || PQstatus(*conn) != CONNECTION_OK) {
		char err[512];

		PQfinish(*conn);
		if (obx_pg_connect(h->cfg->conninfo, h->cfg->password, NULL, NULL, "outboxd metrics", conn, err,
		    sizeof(err)) != 0)
			return false;
	}
	r = PQexecParams(*conn,
	    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, safe_wal_size, wal_status, "
	    "(SELECT CASE WHEN setting::bigint < 0 THEN -1 ELSE setting::bigint * 1048576 END "
	    "FROM pg_settings WHERE name = 'max_slot_wal_keep_size') "
	    "FROM pg_replication_slots WHERE slot_name = $1", 1, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		found = true;
		retained = PQgetisnull(r, 0, 0) ? 0 : strtoll(PQgetvalue(r, 0, 0), NULL, 10);
		safe = PQgetisnull(r, 0, 1) ? -1 : strtoll(PQgetvalue(r, 0, 1), NULL, 10);
		status = PQgetisnull(r, 0, 2) ? 0 : obx_metrics_wal_status(PQgetvalue(r, 0, 2));
		keep = PQgetisnull(r, 0, 3) ? -1 : strtoll(PQgetvalue(r, 0, 3), NULL, 10);
	}
	PQclear(r);
	pthread_mutex_lock(&h->mu);
	h->snap.has_slot = found;
	h->snap.slot_retained_wal_bytes = retained;
	h->snap.slot_safe_wal_size_bytes = safe;
	h->snap.slot_wal_status = status;
	h->snap.slot_max_wal_keep_size_bytes = keep;
	pthread_mutex_unlock(&h->mu);
	return found;
}

static void *
poller_main(void *arg)
{
	struct obx_http *h = arg;
	PGconn *conn = NULL;

	pthread_mutex_lock(&h->mu);
	while (!h->stopping) {
		struct timespec until;
		bool found;

		pthread_mutex_unlock(&h->mu);
		found = poll_slot(h, &conn);
		pthread_mutex_lock(&h->mu);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += found ? SLOT_POLL_SECONDS : 2;
		while (!h->stopping && pthread_cond_timedwait(&h->cv, &h->mu, &until) == 0)
			;
	}
	pthread_mutex_unlock(&h->mu);
	PQfinish(conn);
	return NULL;
}

int
obx_http_start(struct obx_http *h, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	struct sockaddr_in6 a6;
	struct sockaddr_in a4;
	struct sockaddr *sa;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
	const union MHD_DaemonInfo *info;

	memset(h, 0, sizeof(*h));
	h->cfg = cfg;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	h->snap.heartbeat_ms = obx_mono_ms();
	memset(&a4, 0, sizeof(a4));
	memset(&a6, 0, sizeof(a6));
	if (inet_pton(AF_INET, cfg->metrics_host, &a4.sin_addr) == 1) {
		a4.sin_family = AF_INET;
		a4.sin_port = htons((uint16_t)cfg->metrics_port);
		sa = (struct sockaddr *)&a4;
	} else if (inet_pton(AF_INET6, cfg->metrics_host, &a6.sin6_addr) == 1) {
		a6.sin6_family = AF_INET6;
		a6.sin6_port = htons((uint16_t)cfg->metrics_port);
		sa = (struct sockaddr *)&a6;
		flags |= MHD_USE_IPv6;
	} else {
		snprintf(errbuf, errlen, "[metrics] listen: '%s' is not an IP address", cfg->metrics_host);
		return OBX_ECONFIG;
	}
	h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, h,
	    MHD_OPTION_SOCK_ADDR, sa,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
	    MHD_OPTION_END);
	if (h->daemon == NULL) {
		snprintf(errbuf, errlen, "could not listen on %s:%d for metrics", cfg->metrics_host,
		    cfg->metrics_port);
		return OBX_EIO;
	}
	info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
	h->port = info != NULL ? info->port : cfg->metrics_port;
	/* polling mode has no slot to watch (docs/design.md, "Polling mode") */
	if (cfg->mode != OBX_SOURCE_POLL && pthread_create(&h->poller, NULL, poller_main, h) == 0)
		h->poller_running = true;
	return 0;
}

void
obx_http_publish(struct obx_http *h, const struct obx_metrics *m)
{
	struct obx_metrics keep;

	pthread_mutex_lock(&h->mu);
	keep = h->snap;
	h->snap = *m;
	h->snap.has_slot = keep.has_slot;
	h->snap.slot_retained_wal_bytes = keep.slot_retained_wal_bytes;
	h->snap.slot_safe_wal_size_bytes = keep.slot_safe_wal_size_bytes;
	h->snap.slot_wal_status = keep.slot_wal_status;
	h->snap.slot_max_wal_keep_size_bytes = keep.slot_max_wal_keep_size_bytes;
	pthread_mutex_unlock(&h->mu);
}

void
obx_http_stop(struct obx_http *h)
{
	if (h->daemon != NULL)
		MHD_stop_daemon(h->daemon);
	h->daemon = NULL;
	if (h->poller_running) {
		pthread_mutex_lock(&h->mu);
		h->stopping = true;
		pthread_cond_signal(&h->cv);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->poller, NULL);
		h->poller_running = false;
	}
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
}
