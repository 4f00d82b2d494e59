#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "obx/core/err.h"
#include "obx/sys/http.h"
#include "obx/sys/log.h"
#include "obx/sys/procstat.h"

#define HEARTBEAT_STALE_MS 30000
#define PER_CLIENT 8     /* connections one source address may hold (http.h) */
#define REQUEST_MS 5000  /* a whole request within this of opening or of the last answer */
#define STALL_SECONDS 5u /* libmicrohttpd's own timeout: this long without any progress */

/* The deadline entry libmicrohttpd keeps for c (NULL when the table had none free). */
static struct obx_http_conn *
conn_entry(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci != NULL ? ci->socket_context : NULL;
}

/* A connection opened or closed: takes or frees its deadline entry. */
static void
on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
	struct obx_http *h = cls;
	struct obx_http_conn *e = *socket_context;
	const union MHD_ConnectionInfo *ci = NULL;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED)
		ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	pthread_mutex_lock(&h->mu);
	if (toe == MHD_CONNECTION_NOTIFY_STARTED && ci != NULL) {
		for (size_t i = 0; i < OBX_HTTP_CONNECTIONS; i++) {
			if (h->conns[i].fd < 0) {
				h->conns[i] = (struct obx_http_conn){ ci->connect_fd, obx_mono_ms(), false };
				*socket_context = &h->conns[i];
				break;
			}
		}
	} else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && e != NULL) {
		/* called before libmicrohttpd closes the socket: the reaper never sees a reused fd */
		e->fd = -1;
		*socket_context = NULL;
	}
	pthread_mutex_unlock(&h->mu);
}

/* A response went out (or the request ended otherwise): the deadline starts again. */
static void
on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct obx_http *h = cls;
	struct obx_http_conn *e = conn_entry(c);

	(void)con_cls;
	(void)toe;
	pthread_mutex_lock(&h->mu);
	if (e != NULL && e->fd >= 0) {
		e->since_ms = obx_mono_ms();
		e->answering = false;
	}
	pthread_mutex_unlock(&h->mu);
}

/* Fills ts with the CLOCK_REALTIME time ms from now, for pthread_cond_timedwait. */
static void
realtime_in(struct timespec *ts, int64_t ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += (time_t)(ms / 1000);
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/*
 * Shuts down each connection past its deadline; libmicrohttpd's thread then
 * reads the end of file and closes it.  Sleeps until the next deadline.
 */
static void *
reaper_main(void *arg)
{
	struct obx_http *h = arg;

	pthread_mutex_lock(&h->mu);
	while (!h->stopping) {
		int64_t now = obx_mono_ms(), wait = REQUEST_MS;
		struct timespec until;

		for (size_t i = 0; i < OBX_HTTP_CONNECTIONS; i++) {
			struct obx_http_conn *e = &h->conns[i];
			int64_t left;

			if (e->fd < 0 || e->answering)
				continue;
			left = e->since_ms + REQUEST_MS - now;
			if (left <= 0) {
				(void)shutdown(e->fd, SHUT_RDWR);
				e->since_ms = now; /* once; it is closed before it could be due again */
			} else if (left < wait) {
				wait = left;
			}
		}
		realtime_in(&until, wait < 10 ? 10 : wait);
		(void)pthread_cond_timedwait(&h->cv, &h->mu, &until);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

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
handle(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
    const char *upload, size_t *upload_size, void **con_cls)
{
	struct obx_http *h = cls;
	struct obx_http_conn *e;
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
	e = conn_entry(c);
	pthread_mutex_lock(&h->mu);
	m = h->snap;
	if (e != NULL && e->fd >= 0)
		e->answering = true; /* the request is whole: answered now, the deadline waits */
	pthread_mutex_unlock(&h->mu);
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(c, 405, "text/plain", "method not allowed\n", 19, false);
	if (strcmp(url, "/metrics") == 0) {
		struct obx_process proc;
		size_t len;
		char *body;

		(void)obx_procstat_read(&proc); /* what could not be read is left out */
		body = obx_metrics_render(&m, &proc, &len);

		if (body == NULL)
			return reply(c, 500, "text/plain", "out of memory\n", 14, false);
		return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", body, len, true);
	}
	if (strcmp(url, "/healthz") == 0) {
		/* alive and the loop turning; outages of PostgreSQL or the broker are ridden out */
		if (obx_mono_ms() - m.heartbeat_ms > HEARTBEAT_STALE_MS)
			return reply(c, 503, "text/plain", "stalled: the relay loop has not turned for 30 s\n", 48,
			    false);
		return reply(c, 200, "text/plain", "ok\n", 3, false);
	}
	if (strcmp(url, "/readyz") == 0) {
		const char *phrase, *detail;
		int n;

		if (m.kafka_login_refused && m.state != OBX_STATE_STANDBY)
			m.not_ready = OBX_NOT_READY_LOGIN; /* streaming in name only: nothing is acknowledged */
		else if (m.kafka_tls_refused && m.state != OBX_STATE_STANDBY)
			m.not_ready = OBX_NOT_READY_TLS;
		else if (m.state == OBX_STATE_STREAMING || m.state == OBX_STATE_BACKPRESSURED ||
		    m.state == OBX_STATE_STANDBY) {
			n = snprintf(buf, sizeof(buf), "ready: %s\n", obx_state_name(m.state));
			return reply(c, 200, "text/plain", buf, (size_t)n, false);
		}
		/* a fixed phrase for anyone; the error text (hosts, users, SQL) only when allowed */
		phrase = obx_not_ready_text(m.not_ready);
		detail = h->cfg->detailed_health ? m.state_reason : "";
		n = snprintf(buf, sizeof(buf), "not ready: %s%s%s%s%s\n", obx_state_name(m.state),
		    phrase[0] ? ": " : "", phrase, detail[0] ? ": " : "", detail);
		if (n < 0 || (size_t)n >= sizeof(buf)) {
			n = (int)sizeof(buf) - 1;
			buf[n - 1] = '\n';
		}
		return reply(c, 503, "text/plain", buf, (size_t)n, false);
	}
	return reply(c, 404, "text/plain", "not found\n", 10, false);
}

int
obx_http_start(struct obx_http *h, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	struct sockaddr_in6 a6;
	struct sockaddr_in a4;
	struct sockaddr *sa;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
	const union MHD_DaemonInfo *info;
	int r = OBX_ECONFIG;

	memset(h, 0, sizeof(*h));
	h->cfg = cfg;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	for (size_t i = 0; i < OBX_HTTP_CONNECTIONS; i++)
		h->conns[i].fd = -1;
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
		goto fail;
	}
	h->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, sa,
	    MHD_OPTION_CONNECTION_TIMEOUT, STALL_SECONDS, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned)OBX_HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PER_CLIENT,
	    MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
	    MHD_OPTION_END);
	if (h->daemon == NULL) {
		snprintf(errbuf, errlen, "could not listen on %s:%d for metrics", cfg->metrics_host,
		    cfg->metrics_port);
		r = OBX_EIO;
		goto fail;
	}
	if (pthread_create(&h->reaper, NULL, reaper_main, h) != 0) {
		snprintf(errbuf, errlen, "could not start the metrics server's connection reaper");
		MHD_stop_daemon(h->daemon);
		h->daemon = NULL;
		r = OBX_EIO;
		goto fail;
	}
	h->reaper_running = true;
	info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
	h->port = info != NULL ? info->port : cfg->metrics_port;
	return 0;
fail:
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	return r;
}

void
obx_http_publish(struct obx_http *h, const struct obx_metrics *m)
{
	pthread_mutex_lock(&h->mu);
	h->snap = *m;
	pthread_mutex_unlock(&h->mu);
}

void
obx_http_stop(struct obx_http *h)
{
	pthread_mutex_lock(&h->mu);
	h->stopping = true;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	/* the reaper first: it must not shut down a socket the daemon has closed */
	if (h->reaper_running) {
		pthread_join(h->reaper, NULL);
		h->reaper_running = false;
	}
	if (h->daemon != NULL)
		MHD_stop_daemon(h->daemon);
	h->daemon = NULL;
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
}
