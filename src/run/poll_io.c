/*
 * poll_io.c - what a polling cycle asks of its connection and its records:
 * a statement run without stopping the loop (signals read, the heartbeat
 * published, a stop cancels it), the claim's columns as a relation, a
 * polled row's headers, and the state /readyz reports.  poll.c and
 * poll_session.c use them (poll_int.h).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/pg/util.h"
#include "obx/run/poll_int.h"

/* Sets the state, /readyz's phrase for it and the full reason (logged by the caller). */
void
obx_poll_set_state(struct poller *p, enum obx_state s, enum obx_not_ready not_ready, const char *reason)
{
	p->m.state = s;
	p->m.not_ready = not_ready;
	snprintf(p->m.state_reason, sizeof(p->m.state_reason), "%.*s", (int)sizeof(p->m.state_reason) - 1,
	    reason != NULL ? reason : "");
	obx_runner_publish(&p->run);
}

/* ---- statements that may take long ---- */

#define CANCEL_WAIT_MS 5000 /* how long a cancelled claim may take to end */

/* Asks the server to cancel the statement under way (best effort: its result says how it ended). */
static void
cancel(struct poller *p)
{
	PGcancel *cn = PQgetCancel(p->pg);
	char errbuf[256];

	if (cn != NULL && PQcancel(cn, errbuf, sizeof(errbuf)) == 0)
		obx_log_debug("could not cancel the statement: %s", errbuf);
	PQfreeCancel(cn);
}

PGresult *
obx_poll_exec(struct poller *p, const char *sql)
{
	PGresult *res, *last = NULL;
	int64_t cancelled_ms = 0;
	char err[512];

	if (PQsendQuery(p->pg, sql) == 0) {
		snprintf(p->reason, sizeof(p->reason), "could not send a statement: %s",
		    obx_pg_error_line(p->pg, err, sizeof(err)));
		return NULL;
	}
	while (PQisBusy(p->pg)) {
		struct pollfd fds[2] = { { PQsocket(p->pg), POLLIN, 0 }, { p->opts->signal_fd, POLLIN, 0 } };

		if (poll(fds, 2, 1000) < 0 && errno != EINTR)
			break;
		if (fds[1].revents & POLLIN)
			obx_runner_read_signals(&p->run);
		if (p->signals > 0 && cancelled_ms == 0) {
			cancel(p); /* nothing is claimed yet: nothing to finish */
			cancelled_ms = obx_mono_ms();
		}
		/* a server that does not answer the cancel (or a second signal): the session ends, and
		 * closing the connection rolls the claim back */
		if (cancelled_ms != 0 && (p->signals > 1 || obx_mono_ms() - cancelled_ms >= CANCEL_WAIT_MS)) {
			snprintf(p->reason, sizeof(p->reason), "stopped");
			return NULL;
		}
		if ((fds[0].revents & (POLLIN | POLLERR | POLLHUP)) && PQconsumeInput(p->pg) == 0)
			break;               /* the connection failed: PQgetResult() says how */
		obx_runner_publish(&p->run); /* the loop is turning: /healthz stays green */
	}
	while ((res = PQgetResult(p->pg)) != NULL) {
		PQclear(last);
		last = res;
	}
	if (cancelled_ms != 0) {
		PQclear(last);
		snprintf(p->reason, sizeof(p->reason), "stopped");
		return NULL;
	}
	return last;
}

/* ---- between cycles ---- */

/* The claim's result columns as a relation the event builder resolves by name. */
int
obx_poll_build_rel(struct poller *p, const PGresult *res)
{
	int n = PQnfields(res);

	obx_rel_free(&p->rel);
	free(p->datums);
	p->datums = NULL;
	p->rel.cols = calloc((size_t)n, sizeof(*p->rel.cols));
	p->rel.nspname = strdup(p->cfg->table_schema);
	p->rel.relname = strdup(p->cfg->table_name);
	p->datums = calloc((size_t)n, sizeof(*p->datums));
	if (p->rel.cols == NULL || p->rel.nspname == NULL || p->rel.relname == NULL || p->datums == NULL)
		return OBX_ENOMEM;
	p->rel.natts = (uint16_t)n;
	for (int i = 0; i < n; i++) {
		if ((p->rel.cols[i].name = strdup(PQfname(res, i))) == NULL)
			return OBX_ENOMEM;
		p->rel.cols[i].type_oid = PQftype(res, i);
	}
	p->rel.version = ++p->rel_version;
	obx_event_builder_forget(&p->eb);
	p->rel_built = true;
	return 0;
}

/*
 * Copies the builder's headers, keeping id and type and the [outbox]
 * header.* and headers-column ones; lsn, xid and commit_ts do not exist
 * here, and seq becomes the ordering column's value.
 */
int
obx_poll_headers(struct poller *p, const struct obx_event *ev, const char *seq, size_t *n)
{
	size_t o = 0;

	if (ev->nheaders > p->hdr_cap) {
		struct obx_header *h = reallocarray(p->hdrs, ev->nheaders, sizeof(*h));

		if (h == NULL)
			return OBX_ENOMEM;
		p->hdrs = h;
		p->hdr_cap = ev->nheaders;
	}
	for (size_t i = 0; i < ev->nheaders; i++) {
		const struct obx_header *h = &ev->headers[i];

		/* the builder's first six are id, type, lsn, seq, xid, commit_ts (event.c) */
		if (i < 6 &&
		    (strcmp(h->name, "lsn") == 0 || strcmp(h->name, "xid") == 0 ||
		        strcmp(h->name, "commit_ts") == 0))
			continue;
		p->hdrs[o] = *h;
		if (i < 6 && strcmp(h->name, "seq") == 0) {
			p->hdrs[o].value = seq;
			p->hdrs[o].len = strlen(seq);
		}
		o++;
	}
	*n = o;
	return 0;
}
