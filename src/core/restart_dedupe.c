/*
 * core/restart_dedupe.c - restart de-duplication (pure); see core/restart_dedupe.h and
 * docs/internals/design.md ("Restart de-duplication").
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/restart_dedupe.h"
#include "obx/core/err.h"

/* ---- marks ---- */

static uint64_t
fnv1a64(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h != 0 ? h : 1; /* 0 means "no id" */
}

static int
parse_seq(const char *s, size_t len, uint32_t *out)
{
	uint64_t v = 0;

	if (len == 0 || len > 10)
		return OBX_EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return OBX_EINVAL;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v > UINT32_MAX)
		return OBX_EINVAL;
	*out = (uint32_t)v;
	return 0;
}

int
obx_dd_mark_parse(const struct obx_header *hs, size_t n, struct obx_dd_mark *out)
{
	const struct obx_header *lsn = NULL, *seq = NULL, *id = NULL;
	char buf[OBX_LSN_STRLEN];

	for (size_t i = 0; i < n; i++) {
		if (lsn == NULL && strcmp(hs[i].name, "lsn") == 0)
			lsn = &hs[i];
		else if (seq == NULL && strcmp(hs[i].name, "seq") == 0)
			seq = &hs[i];
		else if (id == NULL && strcmp(hs[i].name, "id") == 0)
			id = &hs[i];
	}
	if (lsn == NULL || seq == NULL || lsn->value == NULL || seq->value == NULL || lsn->len >= sizeof(buf))
		return OBX_ENOENT;
	memcpy(buf, lsn->value, lsn->len);
	buf[lsn->len] = '\0';
	if (obx_lsn_parse(buf, &out->lsn) != 0 || parse_seq(seq->value, seq->len, &out->seq) != 0)
		return OBX_ENOENT;
	out->id_hash = id != NULL && id->value != NULL ? fnv1a64(id->value, id->len) : 0;
	return 0;
}

int
obx_dd_mark_cmp(const struct obx_dd_mark *a, const struct obx_dd_mark *b)
{
	if (a->lsn != b->lsn)
		return a->lsn < b->lsn ? -1 : 1;
	if (a->seq != b->seq)
		return a->seq < b->seq ? -1 : 1;
	return 0;
}

/* ---- partitions ---- */

uint32_t
obx_murmur2(const void *data, size_t len)
{
	const unsigned char *p = data;
	const uint32_t m = 0x5bd1e995;
	uint32_t h = 0x9747b28c ^ (uint32_t)len;
	size_t i;

	for (i = 0; i + 4 <= len; i += 4) {
		uint32_t k = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 |
		    (uint32_t)p[i + 3] << 24;

		k *= m;
		k ^= k >> 24;
		k *= m;
		h *= m;
		h ^= k;
	}
	switch (len - i) {
	case 3:
		h ^= (uint32_t)p[i + 2] << 16;
		/* fall through */
	case 2:
		h ^= (uint32_t)p[i + 1] << 8;
		/* fall through */
	case 1:
		h ^= (uint32_t)p[i];
		h *= m;
		break;
	default:
		break;
	}
	h ^= h >> 13;
	h *= m;
	h ^= h >> 15;
	return h;
}

int32_t
obx_dd_partition(const void *key, size_t keylen, int32_t nparts)
{
	if (key == NULL || nparts <= 0)
		return -1;
	return (int32_t)((obx_murmur2(key, keylen) & 0x7fffffff) % (uint32_t)nparts);
}

bool
obx_dd_partitioner_supported(const struct obx_config *cfg, const char **name)
{
	const char *p = obx_config_kafka_get(cfg, "partitioner");

	*name = p != NULL ? p : "murmur2_random";
	return strcmp(*name, "murmur2_random") == 0 || strcmp(*name, "murmur2") == 0;
}

/* ---- the read-back of one topic ---- */

struct obx_dd_scan *
obx_dd_scan_new(const char *topic, const struct obx_dd_mark *floor)
{
	struct obx_dd_scan *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->topic = strdup(topic);
	if (s->topic == NULL) {
		free(s);
		return NULL;
	}
	s->floor = *floor;
	s->nparts = -1;
	return s;
}

static void
part_drop_marks(struct obx_dd_scan *s, struct obx_dd_part *pt)
{
	if (s != NULL)
		s->nmarks -= pt->n;
	free(pt->marks);
	pt->marks = NULL;
	pt->n = pt->cap = 0;
}

void
obx_dd_scan_free(struct obx_dd_scan *s)
{
	if (s == NULL)
		return;
	for (int32_t p = 0; p < s->nparts; p++)
		free(s->parts[p].marks);
	free(s->parts);
	free(s->topic);
	free(s);
}

static void vfail(struct obx_dd_scan *s, int32_t p, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void
vfail(struct obx_dd_scan *s, int32_t p, const char *fmt, va_list ap)
{
	struct obx_dd_part *pt;

	if (p < 0 || p >= s->nparts) {
		if (!s->failed)
			vsnprintf(s->reason, sizeof(s->reason), fmt, ap);
		s->failed = true;
		return;
	}
	pt = &s->parts[p];
	if (pt->state == OBX_DD_FALLBACK)
		return;
	pt->state = OBX_DD_FALLBACK;
	pt->in_window = false;
	vsnprintf(pt->reason, sizeof(pt->reason), fmt, ap);
	part_drop_marks(s, pt);
}

void
obx_dd_scan_fail(struct obx_dd_scan *s, int32_t p, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(s, p, fmt, ap);
	va_end(ap);
}

int
obx_dd_scan_partitions(struct obx_dd_scan *s, int32_t nparts)
{
	if (nparts < 0)
		nparts = 0;
	s->parts = calloc(nparts > 0 ? (size_t)nparts : 1, sizeof(*s->parts));
	if (s->parts == NULL) {
		obx_dd_scan_fail(s, -1, "out of memory");
		return OBX_ENOMEM;
	}
	s->nparts = nparts;
	for (int32_t p = 0; p < nparts; p++) {
		s->parts[p].last_below = -1;
		s->parts[p].last_foreign = -1;
		s->parts[p].last_moved = -1;
	}
	return 0;
}

static bool
reading(const struct obx_dd_scan *s, int32_t p)
{
	return !s->failed && p >= 0 && p < s->nparts && s->parts[p].state == OBX_DD_CHECKING;
}

/* The size of the window after prev records, from the record sizes seen so far. */
static uint64_t
next_window(const struct obx_dd_part *pt, uint64_t prev)
{
	uint64_t avg = pt->records > 0 ? pt->bytes / pt->records + 1 : 1;
	uint64_t want = OBX_DD_WINDOW_BYTES / avg;

	if (want < prev * 2)
		want = prev * 2;
	return want < prev * 8 ? want : prev * 8;
}

void
obx_dd_scan_bounds(struct obx_dd_scan *s, int32_t p, int64_t lo, int64_t hi)
{
	struct obx_dd_part *pt;

	if (!reading(s, p))
		return;
	pt = &s->parts[p];
	pt->bounded = true;
	pt->lo = lo;
	pt->hi = pt->read_from = hi;
	if (hi <= lo)
		pt->reached = true; /* nothing there */
}

bool
obx_dd_scan_want(struct obx_dd_scan *s, int32_t p, struct obx_dd_window *w)
{
	struct obx_dd_part *pt;
	uint64_t n;

	if (!reading(s, p))
		return false;
	pt = &s->parts[p];
	if (!pt->bounded || pt->reached || pt->in_window)
		return false;
	n = pt->read_from == pt->hi ? OBX_DD_FIRST_WINDOW : next_window(pt, (uint64_t)(pt->win.to - pt->win.from));
	pt->win.to = pt->read_from;
	pt->win.from = pt->read_from - pt->lo > (int64_t)n ? pt->read_from - (int64_t)n : pt->lo;
	pt->in_window = true;
	*w = pt->win;
	return true;
}

void
obx_dd_scan_record(struct obx_dd_scan *s, int32_t p, int64_t offset, const void *key, size_t keylen, size_t len,
    const struct obx_header *hs, size_t nh)
{
	struct obx_dd_part *pt;
	struct obx_dd_mark m;
	int32_t q;

	if (!reading(s, p) || !s->parts[p].in_window)
		return;
	pt = &s->parts[p];
	if (offset < pt->win.from || offset >= pt->win.to)
		return;
	pt->records++;
	pt->bytes += len + keylen;
	for (size_t i = 0; i < nh; i++)
		pt->bytes += strlen(hs[i].name) + hs[i].len;
	if (obx_dd_mark_parse(hs, nh, &m) != 0) {
		if (offset > pt->last_foreign) {
			pt->last_foreign = offset;
			snprintf(pt->reason, sizeof(pt->reason),
			    "the record at offset %" PRId64 " has no lsn and "
			    "seq headers of outboxd (another writer)",
			    offset);
		}
		return;
	}
	if (!pt->has_last || offset > pt->last_off) {
		pt->has_last = true;
		pt->last = m;
		pt->last_off = offset;
	}
	q = obx_dd_partition(key, keylen, s->nparts);
	if (q >= 0 && q != p && offset > pt->last_moved) {
		pt->last_moved = offset;
		snprintf(s->reason, sizeof(s->reason),
		    "the record at offset %" PRId64 " of partition %" PRId32
		    " has a key that maps to partition %" PRId32 " of today's %" PRId32 ": the partition "
		    "count changed since it was written (or another partitioner placed it)",
		    offset, p, q, s->nparts);
	}
	if (obx_dd_mark_cmp(&m, &s->floor) < 0) {
		if (offset > pt->last_below)
			pt->last_below = offset;
		pt->reached = true;
		return;
	}
	if (key == NULL)
		return; /* placed at random: such a record is never looked for */
	if (s->nmarks >= OBX_DD_MAX_MARKS) {
		obx_dd_scan_fail(s, p, "more than %d records since the first event to check", OBX_DD_MAX_MARKS);
		return;
	}
	if (pt->n == pt->cap) {
		size_t cap = pt->cap ? pt->cap * 2 : 64;
		struct obx_dd_mark *grown = reallocarray(pt->marks, cap, sizeof(*grown));

		if (grown == NULL) {
			obx_dd_scan_fail(s, p, "out of memory");
			return;
		}
		pt->marks = grown;
		pt->cap = cap;
	}
	pt->marks[pt->n++] = m;
	s->nmarks++;
}

void
obx_dd_scan_window_done(struct obx_dd_scan *s, int32_t p)
{
	struct obx_dd_part *pt;
	char errbuf[sizeof(s->reason)];

	if (!reading(s, p) || !s->parts[p].in_window)
		return;
	pt = &s->parts[p];
	pt->in_window = false;
	/*
	 * Only what lies after the last record below the floor matters: a
	 * foreign record or a moved key further back is history.
	 */
	if (pt->last_moved > pt->last_below) {
		snprintf(errbuf, sizeof(errbuf), "%s", s->reason);
		obx_dd_scan_fail(s, -1, "%s", errbuf);
		return;
	}
	if (pt->last_foreign > pt->last_below) {
		snprintf(errbuf, sizeof(errbuf), "%s", pt->reason);
		obx_dd_scan_fail(s, p, "%s", errbuf);
		return;
	}
	pt->read_from = pt->win.from;
	if (pt->read_from <= pt->lo)
		pt->reached = true;
}

void
obx_dd_scan_finish(struct obx_dd_scan *s, const char *unfinished)
{
	if (s->nparts < 0)
		obx_dd_scan_fail(s, -1, "%s", unfinished);
	for (int32_t p = 0; p < s->nparts; p++)
		if (reading(s, p) && !s->parts[p].reached)
			obx_dd_scan_fail(s, p, "%s", unfinished);
}

/* ---- the session's state ---- */

static void note(struct obx_dedupe *d, enum obx_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
note(struct obx_dedupe *d, enum obx_log_level level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (d->note == NULL)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	d->note(d->ctx, level, line);
}

void
obx_dedupe_init(struct obx_dedupe *d, bool on, obx_dd_note_fn fn, void *ctx)
{
	memset(d, 0, sizeof(*d));
	d->on = on;
	d->note = fn;
	d->ctx = ctx;
}

void
obx_dedupe_reset(struct obx_dedupe *d)
{
	for (size_t i = 0; i < d->n; i++) {
		obx_dd_scan_free(d->topics[i].scan);
		free(d->topics[i].name);
	}
	free(d->topics);
	d->topics = NULL;
	d->n = d->cap = d->last = 0;
}

static struct obx_dd_topic *
find(struct obx_dedupe *d, const char *topic)
{
	if (d->last < d->n && strcmp(d->topics[d->last].name, topic) == 0)
		return &d->topics[d->last];
	for (size_t i = 0; i < d->n; i++)
		if (strcmp(d->topics[i].name, topic) == 0) {
			d->last = i;
			return &d->topics[i];
		}
	return NULL;
}

static struct obx_dd_topic *
add(struct obx_dedupe *d, const char *topic)
{
	struct obx_dd_topic *t;

	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 8;
		struct obx_dd_topic *grown = reallocarray(d->topics, cap, sizeof(*grown));

		if (grown == NULL)
			return NULL;
		d->topics = grown;
		d->cap = cap;
	}
	t = &d->topics[d->n];
	memset(t, 0, sizeof(*t));
	t->name = strdup(topic);
	if (t->name == NULL)
		return NULL;
	d->last = d->n++;
	return t;
}

static bool
found(const struct obx_dd_part *pt, const struct obx_dd_mark *m)
{
	size_t lo = 0, hi = pt->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (obx_dd_mark_cmp(&pt->marks[mid], m) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* the same mark may be there more than once (earlier re-sends) */
	for (; lo < pt->n && obx_dd_mark_cmp(&pt->marks[lo], m) == 0; lo++)
		if (pt->marks[lo].id_hash == m->id_hash)
			return true;
	return false;
}

static int
cmp_marks(const void *a, const void *b)
{
	return obx_dd_mark_cmp(a, b);
}

/*
 * Partition p of t is caught up: every further record is new.  m is the
 * record that showed it: past the partition's last record or not found
 * there, or (skipped) that last record itself.
 */
static void
caught_up(struct obx_dedupe *d, struct obx_dd_topic *t, int32_t p, const struct obx_dd_mark *m, bool skipped)
{
	struct obx_dd_part *pt = &t->scan->parts[p];
	char a[OBX_LSN_STRLEN];

	pt->state = OBX_DD_NEW;
	part_drop_marks(t->scan, pt);
	t->checking--;
	note(d, OBX_LOG_DEBUG,
	    "de-duplication: %s [%" PRId32 "] caught up after %" PRIu64 " event(s) "
	    "found in Kafka: publishing %s lsn %s seq %" PRIu32,
	    t->name, p, pt->skipped, skipped ? "after" : "from", obx_lsn_format(m->lsn, a, sizeof(a)), m->seq);
	if (t->checking == 0 && t->skipped > 0)
		note(d, OBX_LOG_INFO,
		    "de-duplication: %" PRIu64 " event(s) of topic %s were in Kafka "
		    "already and were not sent again",
		    t->skipped, t->name);
}

enum obx_dd_verdict
obx_dedupe_check(struct obx_dedupe *d, const char *topic, const void *key, size_t keylen,
    const struct obx_header *hs, size_t nh, struct obx_dd_mark *mark)
{
	struct obx_dd_topic *t;
	struct obx_dd_part *pt;
	struct obx_dd_mark m;
	int32_t p;

	if (!d->on)
		return OBX_DD_SEND;
	t = find(d, topic);
	if (t != NULL && t->scan != NULL && t->checking == 0)
		return OBX_DD_SEND; /* caught up, or not checked at all */
	if (key == NULL || obx_dd_mark_parse(hs, nh, &m) != 0)
		return OBX_DD_SEND;
	if (t == NULL) {
		if (add(d, topic) == NULL)
			return OBX_DD_SEND; /* out of memory: publishing is always safe */
		*mark = m;
		return OBX_DD_LOOKUP;
	}
	if (t->scan == NULL)
		return OBX_DD_WAIT;
	p = obx_dd_partition(key, keylen, t->scan->nparts);
	pt = &t->scan->parts[p];
	if (pt->state != OBX_DD_CHECKING)
		return OBX_DD_SEND;
	/*
	 * Past the partition's last record: new.  At or below it but not there:
	 * a gap an earlier session left (an event the broker rejected, say).
	 * Either way this record and every later one of the partition go out.
	 */
	if (obx_dd_mark_cmp(&m, &pt->last) > 0 || !found(pt, &m)) {
		caught_up(d, t, p, &m, false);
		return OBX_DD_SEND;
	}
	pt->skipped++;
	t->skipped++;
	d->skipped++;
	if (obx_dd_mark_cmp(&m, &pt->last) == 0)
		caught_up(d, t, p, &m, true); /* the last record: later ones are new */
	return OBX_DD_SKIP;
}

void
obx_dedupe_install(struct obx_dedupe *d, struct obx_dd_scan *s)
{
	struct obx_dd_topic *t = find(d, s->topic);
	size_t marks = 0;

	if (t == NULL || t->scan != NULL) {
		obx_dd_scan_free(s);
		return;
	}
	t->scan = s;
	t->checking = 0;
	if (s->failed || s->nparts < 0) {
		d->fallbacks++;
		note(d, OBX_LOG_WARN,
		    "de-duplication: topic %s: %s; publishing its events from the slot's "
		    "position (at-least-once)",
		    s->topic, s->failed ? s->reason : "not read back");
		for (int32_t p = 0; p < s->nparts; p++)
			part_drop_marks(s, &s->parts[p]);
		return;
	}
	for (int32_t p = 0; p < s->nparts; p++) {
		struct obx_dd_part *pt = &s->parts[p];

		if (pt->state == OBX_DD_FALLBACK) {
			d->fallbacks++;
			note(d, OBX_LOG_WARN,
			    "de-duplication: topic %s partition %" PRId32 ": %s; publishing "
			    "its events from the slot's position (at-least-once)",
			    s->topic, p, pt->reason);
			continue;
		}
		if (pt->n == 0 || !pt->has_last || obx_dd_mark_cmp(&pt->last, &s->floor) < 0) {
			pt->state = OBX_DD_NEW; /* nothing of this session there: everything is new */
			part_drop_marks(s, pt);
			continue;
		}
		qsort(pt->marks, pt->n, sizeof(pt->marks[0]), cmp_marks);
		marks += pt->n;
		t->checking++;
	}
	note(d, OBX_LOG_DEBUG,
	    "de-duplication: topic %s read back: %" PRId32 " partition(s), %zu of "
	    "them to check against %zu record(s)",
	    s->topic, s->nparts, t->checking, marks);
}

void
obx_dedupe_unavailable(struct obx_dedupe *d, const char *topic, const char *reason)
{
	static const struct obx_dd_mark none;
	struct obx_dd_scan *s = obx_dd_scan_new(topic, &none);
	struct obx_dd_topic *t;

	if (s != NULL) {
		obx_dd_scan_fail(s, -1, "%s", reason);
		obx_dedupe_install(d, s);
		return;
	}
	/* out of memory: an empty topic entry is not possible either; forget the topic */
	t = find(d, topic);
	if (t != NULL && t->scan == NULL) {
		free(t->name);
		*t = d->topics[--d->n];
		d->last = 0;
	}
}

bool
obx_dedupe_waiting(const struct obx_dedupe *d)
{
	for (size_t i = 0; i < d->n; i++)
		if (d->topics[i].scan == NULL)
			return true;
	return false;
}
