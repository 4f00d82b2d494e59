/*
 * config_kinds.h - the functions the configuration table names for a key
 * beyond its common kind (config_kinds.c): each check returns 0,
 * OBX_ENOMEM, or OBX_ECONFIG with one line in errbuf that never holds a
 * secret's value.
 */
#ifndef OBX_CONFIG_KINDS_H
#define OBX_CONFIG_KINDS_H

#include <stddef.h>

#include "obx/core/config.h"
#include "obx/core/config_table.h"

int obx_cfg_check_conninfo(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen);
int obx_cfg_check_password(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen);
int obx_cfg_check_snapshot_filter(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen);
int obx_cfg_check_topic(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen);
int obx_cfg_check_header(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
    size_t errlen);
int obx_cfg_check_kafka(const struct obx_config *cfg, const char *key, const char *value, char *errbuf,
    size_t errlen);

/*
 * Parses one [schema.]table entry of [source] table (s holds nothing else)
 * into out, which the caller resets with obx_table_pat_reset().  Returns 0,
 * OBX_EINVAL, OBX_ERANGE or OBX_ENOMEM; out is zeroed on failure.
 */
int obx_table_pat_parse(const char *s, struct obx_table_pat *out);
void obx_table_pat_reset(struct obx_table_pat *p);

/*
 * [source] table ("schema.table", a part double-quoted or a '*' pattern, several separated by
 * commas) and [metrics] listen (host:port).
 */
extern const struct obx_cfg_custom obx_cfg_table_fns;
extern const struct obx_cfg_custom obx_cfg_listen_fns;

#endif
