/*
 * template.c - the topic template parser and the distinct-name list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/template.h"

static int
add_part(struct obx_template *t, bool is_column, const char *text, size_t len)
{
	struct obx_template_part *grown;
	char *copy;

	copy = strndup(text, len);
	if (copy == NULL)
		return OBX_ENOMEM;
	grown = reallocarray(t->parts, t->nparts + 1, sizeof(*grown));
	if (grown == NULL) {
		free(copy);
		return OBX_ENOMEM;
	}
	t->parts = grown;
	t->parts[t->nparts].is_column = is_column;
	t->parts[t->nparts].text = copy;
	t->nparts++;
	return 0;
}

/* Parses the reference at p ("${..."); on success *next is just past its '}'. */
static int
parse_reference(struct obx_template *t, const char *text, const char *p, const char **next, char *errbuf,
    size_t errlen)
{
	const char *close = strchr(p + 2, '}');

	if (close == NULL) {
		snprintf(errbuf, errlen, "unclosed '${' in topic template '%s'", text);
		return OBX_EINVAL;
	}
	if (close == p + 2) {
		snprintf(errbuf, errlen, "empty '${}' in topic template '%s'", text);
		return OBX_EINVAL;
	}
	*next = close + 1;
	return add_part(t, true, p + 2, (size_t)(close - (p + 2)));
}

int
obx_template_parse(struct obx_template *t, const char *text, char *errbuf, size_t errlen)
{
	const char *p = text;
	int r = 0;

	memset(t, 0, sizeof(*t));
	while (*p != '\0' && r == 0) {
		const char *open = strstr(p, "${");

		if (open == p) {
			r = parse_reference(t, text, p, &p, errbuf, errlen);
		} else {
			size_t n = open != NULL ? (size_t)(open - p) : strlen(p);

			r = add_part(t, false, p, n);
			p += n;
		}
	}
	if (r != 0)
		obx_template_reset(t);
	if (r == OBX_ENOMEM)
		snprintf(errbuf, errlen, "%s", obx_strerror(r));
	return r;
}

void
obx_template_reset(struct obx_template *t)
{
	for (size_t i = 0; i < t->nparts; i++)
		free(t->parts[i].text);
	free(t->parts);
	memset(t, 0, sizeof(*t));
}

int
obx_template_columns(const struct obx_template *t, struct obx_names *out)
{
	int r;

	for (size_t i = 0; i < t->nparts; i++) {
		if (!t->parts[i].is_column)
			continue;
		if ((r = obx_names_add(out, t->parts[i].text)) != 0)
			return r;
	}
	return 0;
}

bool
obx_names_has(const struct obx_names *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->v[i], name) == 0)
			return true;
	return false;
}

int
obx_names_add(struct obx_names *out, const char *name)
{
	char **grown;
	char *copy;

	if (obx_names_has(out, name))
		return 0;
	copy = strdup(name);
	if (copy == NULL)
		return OBX_ENOMEM;
	grown = reallocarray(out->v, out->n + 1, sizeof(*grown));
	if (grown == NULL) {
		free(copy);
		return OBX_ENOMEM;
	}
	out->v = grown;
	out->v[out->n++] = copy;
	return 0;
}

void
obx_names_reset(struct obx_names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	memset(l, 0, sizeof(*l));
}
