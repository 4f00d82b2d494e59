/*
 * template.h - the topic template (pure): literal text with ${column}
 * references, parsed once into parts.  The configuration, the event
 * builder, "outboxd check" and the publication checks all read a template
 * through this parser, so they cannot disagree about what it means.
 *
 * Syntax: a reference runs from "${" to the first "}" after it, and the
 * column name is everything in between (any character but '}', so a
 * quoted PostgreSQL name works).  Everything else is literal text: a '$'
 * not followed by '{', and a '}' outside a reference.  There is no escape
 * for a literal "${".
 *
 * A parsed template owns copies of its parts; the caller frees them with
 * obx_template_reset().  A name list owns copies of its names; the caller
 * frees them with obx_names_reset().  Both are zero-initialised before
 * first use, and resetting a zeroed one is a no-op.
 */
#ifndef OBX_TEMPLATE_H
#define OBX_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

struct obx_template_part {
	bool is_column;
	char *text; /* the literal text, or the column name; never empty */
};

struct obx_template {
	struct obx_template_part *parts; /* in template order */
	size_t nparts;                   /* 0 for the empty template */
};

/* Distinct names in the order they were first added. */
struct obx_names {
	char **v;
	size_t n;
};

/*
 * Parses text into t (zeroed or reset before).  Returns 0; OBX_EINVAL with
 * errbuf filled when a "${" has no closing "}" ("unclosed '${' in topic
 * template '...'") or a reference names no column ("empty '${}' in topic
 * template '...'"); OBX_ENOMEM.  On failure t holds nothing.  The empty
 * template parses to no parts: whether it is allowed is the caller's rule.
 */
int obx_template_parse(struct obx_template *t, const char *text, char *errbuf, size_t errlen);

/* Frees what t owns and zeroes it. */
void obx_template_reset(struct obx_template *t);

/*
 * Adds the template's column names to out, each once, in order of first
 * use, after the names out already holds.  Returns 0 or OBX_ENOMEM (out
 * then holds the names added so far).
 */
int obx_template_columns(const struct obx_template *t, struct obx_names *out);

/* Adds a copy of name unless out holds it already.  Returns 0 or OBX_ENOMEM. */
int obx_names_add(struct obx_names *out, const char *name);

/* True when l holds name. */
bool obx_names_has(const struct obx_names *l, const char *name);

/* Frees what l owns and zeroes it. */
void obx_names_reset(struct obx_names *l);

#endif
