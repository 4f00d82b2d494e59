/*
 * pollcore.c - polling mode's decisions for one claimed batch (pure).
 * include/obx/core/pollcore.h gives the contract; docs/internals/design.md, "Polling
 * mode", the cycle it serves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/delivery.h"
#include "obx/core/err.h"
#include "obx/core/pollcore.h"
#include "obx/core/relaycore.h"
#include "obx/core/runpolicy.h"

#define OPAQUE_GEN_MASK 0xffffU /* the generation bits of the one opaque layout (delivery.h) */

long long
obx_poll_claim_rows(const struct obx_config *cfg)
{
	return cfg->poll_batch < cfg->max_inflight ? cfg->poll_batch : cfg->max_inflight;
}

enum obx_poll_action
obx_poll_row_action(const struct obx_config *cfg, long long attempts, bool held, bool buildable)
{
	if (held)
		return OBX_POLL_HOLD;
	if (attempts >= cfg->poll_max_attempts)
		return cfg->poll_exhausted == OBX_POLL_EXHAUSTED_MARK ? OBX_POLL_GIVE_UP : OBX_POLL_DEAD_LETTER;
	return buildable ? OBX_POLL_SEND : OBX_POLL_FAIL;
}

int
obx_poll_hold_add(struct obx_poll_holds *h, const char *key, size_t len)
{
	if (key == NULL)
		return 0;
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 16;
		const char **keys = reallocarray(h->keys, cap, sizeof(*keys));
		size_t *lens;

		if (keys == NULL)
			return OBX_ENOMEM;
		h->keys = keys;
		if ((lens = reallocarray(h->lens, cap, sizeof(*lens))) == NULL)
			return OBX_ENOMEM;
		h->lens = lens;
		h->cap = cap;
	}
	h->keys[h->n] = key;
	h->lens[h->n++] = len;
	return 0;
}

bool
obx_poll_held(const struct obx_poll_holds *h, const char *key, size_t len)
{
	if (key == NULL)
		return false;
	for (size_t i = 0; i < h->n; i++)
		if (h->lens[i] == len && memcmp(h->keys[i], key, len) == 0)
			return true;
	return false;
}

void
obx_poll_holds_reset(struct obx_poll_holds *h)
{
	free(h->keys);
	free(h->lens);
	memset(h, 0, sizeof(*h));
}

/* ---- one batch ---- */

/* Replaces row's error with a copy of text (NULL when out of memory: "unknown" then). */
static void
set_error(struct obx_prow *row, const char *text)
{
	free(row->error);
	row->error = strdup(text);
}

static const char *
error_or_unknown(const struct obx_prow *row)
{
	return row->error != NULL ? row->error : "unknown";
}

int
obx_pollcore_begin(struct obx_pollcore *pc, const struct obx_config *cfg, size_t n)
{
	obx_pollcore_end(pc);
	pc->cfg = cfg;
	pc->gen++;
	if (n > pc->cap) {
		struct obx_prow *r = reallocarray(pc->rows, n, sizeof(*r));

		if (r == NULL)
			return OBX_ENOMEM;
		pc->rows = r;
		pc->cap = n;
	}
	return 0;
}

int
obx_pollcore_add(struct obx_pollcore *pc, int64_t seq, long long attempts, const char *key, size_t keylen,
    const char *last_error)
{
	struct obx_prow *row;

	if (pc->nrows == pc->cap) {
		size_t cap = pc->cap ? pc->cap * 2 : 16;
		struct obx_prow *r = reallocarray(pc->rows, cap, sizeof(*r));

		if (r == NULL)
			return OBX_ENOMEM;
		pc->rows = r;
		pc->cap = cap;
	}
	row = &pc->rows[pc->nrows];
	*row = (struct obx_prow){ seq, attempts, OBX_PROW_SKIPPED, false, false, NULL, key,
		key != NULL ? keylen : 0 };
	if (last_error != NULL && (row->error = strdup(last_error)) == NULL)
		return OBX_ENOMEM;
	pc->nrows++;
	return 0;
}

const struct obx_prow *
obx_pollcore_row(const struct obx_pollcore *pc, size_t i)
{
	return &pc->rows[i];
}

bool
obx_pollcore_next(struct obx_pollcore *pc, size_t *i)
{
	while (pc->next < pc->nrows) {
		const struct obx_prow *row = &pc->rows[pc->next];

		if (obx_poll_held(&pc->holds, row->key, row->keylen)) {
			pc->next++;
			continue; /* behind an earlier row of its key that failed in this batch */
		}
		if (pc->signals > 0)
			return false; /* stopping: the rest of the claim stays pending, unsent */
		*i = pc->next++;
		return true;
	}
	return false;
}

enum obx_poll_action
obx_pollcore_decide(const struct obx_pollcore *pc, size_t i, bool buildable)
{
	return obx_poll_row_action(pc->cfg, pc->rows[i].attempts, false, buildable);
}

uint64_t
obx_pollcore_opaque(const struct obx_pollcore *pc, size_t i, bool dead_letter)
{
	return obx_dlv_opaque(&(struct obx_dlv_tag){ OBX_DLV_POLL, pc->gen, i, dead_letter, false });
}

void
obx_pollcore_sent(struct obx_pollcore *pc, size_t i, bool dead_letter)
{
	pc->rows[i].dead_letter = dead_letter;
	pc->rows[i].state = OBX_PROW_INFLIGHT;
	pc->outstanding++;
}

int
obx_pollcore_failed(struct obx_pollcore *pc, size_t i, enum obx_poll_failure what, const char *reason)
{
	struct obx_prow *row = &pc->rows[i];

	set_error(row, reason);
	row->state = OBX_PROW_FAILED;
	if (what == OBX_POLL_FAILED_DEAD_LETTER)
		return 0;
	return obx_poll_hold_add(&pc->holds, row->key, row->keylen);
}

int
obx_pollcore_wait_topic(struct obx_pollcore *pc, size_t i)
{
	struct obx_prow *row = &pc->rows[i];

	if (row->state == OBX_PROW_INFLIGHT)
		pc->outstanding--;
	row->state = OBX_PROW_SKIPPED;
	row->dead_letter = false;
	return obx_poll_hold_add(&pc->holds, row->key, row->keylen);
}

void
obx_pollcore_give_up(struct obx_pollcore *pc, size_t i)
{
	struct obx_prow *row = &pc->rows[i];
	char text[640];

	snprintf(text, sizeof(text), "given up after %lld attempt(s): %s", row->attempts, error_or_unknown(row));
	set_error(row, text);
	row->state = OBX_PROW_GIVEN_UP;
}

enum obx_poll_report
obx_pollcore_report(struct obx_pollcore *pc, uint64_t opaque, const char *err_name, const char *err_text)
{
	struct obx_dlv_tag t;
	size_t i;
	struct obx_prow *row;
	char text[640], errbuf[512];

	if (!obx_dlv_untag(opaque, &t) || t.src != OBX_DLV_POLL)
		return OBX_POLL_REPORT_STALE;
	i = (size_t)t.ticket;
	if (t.gen != (pc->gen & OPAQUE_GEN_MASK) || i >= pc->nrows || pc->rows[i].state != OBX_PROW_INFLIGHT)
		return OBX_POLL_REPORT_STALE; /* an abandoned batch's report */
	row = &pc->rows[i];
	pc->outstanding--;
	if (err_name == NULL && row->dead_letter) {
		snprintf(text, sizeof(text), "dead-lettered to %s after %lld attempt(s): %s",
		    pc->cfg->dead_letter_topic, row->attempts, error_or_unknown(row));
		set_error(row, text);
		row->state = OBX_PROW_GIVEN_UP;
		return OBX_POLL_REPORT_DEAD_LETTERED;
	}
	if (err_name == NULL) {
		row->state = OBX_PROW_ACKED;
		return OBX_POLL_REPORT_ACKED;
	}
	if (err_text != NULL && err_text[0] != '\0' && err_name[0] != '\0')
		snprintf(errbuf, sizeof(errbuf), "%s%s: %s", row->dead_letter ? "dead-letter copy: " : "",
		    err_name, err_text);
	else
		snprintf(errbuf, sizeof(errbuf), "%s%s", row->dead_letter ? "dead-letter copy: " : "",
		    err_text != NULL && err_text[0] != '\0' ? err_text : err_name);
	set_error(row, errbuf);
	row->state = OBX_PROW_FAILED;
	/* the later rows of its key not yet with the broker wait for it (obx_pollcore_key_held()) */
	if (!row->dead_letter)
		(void)obx_poll_hold_add(&pc->holds, row->key, row->keylen);
	return OBX_POLL_REPORT_FAILED;
}

bool
obx_pollcore_key_held(const struct obx_pollcore *pc, size_t i)
{
	return i < pc->nrows && obx_poll_held(&pc->holds, pc->rows[i].key, pc->rows[i].keylen);
}

void
obx_pollcore_unsent(struct obx_pollcore *pc, size_t i)
{
	struct obx_prow *row = &pc->rows[i];

	if (row->state == OBX_PROW_INFLIGHT)
		pc->outstanding--;
	row->state = OBX_PROW_SKIPPED;
	row->dead_letter = false;
}

void
obx_pollcore_stop(struct obx_pollcore *pc, int signals, int64_t first_ms)
{
	pc->signals = signals;
	pc->stop_ms = first_ms;
}

bool
obx_pollcore_finished(const struct obx_pollcore *pc)
{
	return pc->outstanding == 0;
}

enum obx_poll_drain
obx_pollcore_drain(const struct obx_pollcore *pc, int64_t now_ms)
{
	struct obx_stops st = { pc->signals, pc->stop_ms };

	/* the runner's rule (runpolicy.h); a second signal drops the batch, the deadline marks it */
	if (!obx_stops_abandoned(&st, now_ms, OBX_CORE_DRAIN_TIMEOUT_MS))
		return OBX_POLL_DRAIN_WAIT;
	return pc->signals > 1 ? OBX_POLL_DRAIN_ABANDON : OBX_POLL_DRAIN_DEADLINE;
}

bool
obx_pollcore_mark_early(const struct obx_pollcore *pc)
{
	size_t acked = 0;

	for (size_t i = 0; i < pc->nrows; i++)
		if (pc->rows[i].state == OBX_PROW_ACKED && !pc->rows[i].marked)
			acked++;
	return acked >= OBX_POLLCORE_MARK_EARLY_MIN;
}

bool
obx_pollcore_take_mark(struct obx_pollcore *pc, size_t i)
{
	struct obx_prow *row = &pc->rows[i];

	if (row->state != OBX_PROW_ACKED || row->marked)
		return false;
	row->marked = true;
	return true;
}

int64_t
obx_pollcore_backoff_ms(const struct obx_pollcore *pc, size_t i, uint32_t rnd)
{
	return obx_poll_backoff_ms(pc->rows[i].attempts + 1, pc->cfg->poll_backoff_min_ms,
	    pc->cfg->poll_backoff_max_ms, rnd);
}

void
obx_pollcore_count(const struct obx_pollcore *pc, size_t count[OBX_PROW_NSTATES])
{
	for (int s = 0; s < OBX_PROW_NSTATES; s++)
		count[s] = 0;
	for (size_t i = 0; i < pc->nrows; i++)
		count[pc->rows[i].state]++;
}

void
obx_pollcore_end(struct obx_pollcore *pc)
{
	for (size_t i = 0; i < pc->nrows; i++)
		free(pc->rows[i].error);
	pc->nrows = 0;
	pc->next = 0;
	pc->outstanding = 0;
	obx_poll_holds_reset(&pc->holds);
}

void
obx_pollcore_reset(struct obx_pollcore *pc)
{
	obx_pollcore_end(pc);
	free(pc->rows);
	memset(pc, 0, sizeof(*pc));
}

int64_t
obx_poll_backoff_ms(long long attempts, int min_ms, int max_ms, uint32_t rnd)
{
	int64_t d = min_ms > 0 ? min_ms : 1;
	int64_t half;

	if (max_ms < d)
		max_ms = (int)d;
	for (long long i = 1; i < attempts && d < max_ms; i++)
		d *= 2;
	if (d > max_ms)
		d = max_ms;
	half = d / 2;
	d = half + (int64_t)(rnd % (uint64_t)(d - half + 1));
	return d > 0 ? d : 1;
}

/* ---- several tables, in turn ---- */

void
obx_poll_round_init(struct obx_poll_round *r, size_t n)
{
	*r = (struct obx_poll_round){ 0, n, 0 };
}

bool
obx_poll_round_next(struct obx_poll_round *r, int rows, bool *round_end)
{
	bool idle;

	if (rows > 0)
		r->claimed += (uint64_t)rows;
	if (++r->cur < r->n) {
		*round_end = false;
		return false;
	}
	*round_end = true;
	idle = r->claimed == 0;
	r->cur = 0;
	r->claimed = 0;
	return idle;
}
