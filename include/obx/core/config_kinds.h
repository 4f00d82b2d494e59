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

/* [source] table ("schema.table", either part double-quoted) and [metrics] listen (host:port). */
extern const struct obx_cfg_custom obx_cfg_table_fns;
extern const struct obx_cfg_custom obx_cfg_listen_fns;

#endif
