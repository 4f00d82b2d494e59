/*
 * cli.h - the commands behind "outboxd check" and "outboxd status".
 * Each takes a loaded configuration and returns the process exit status
 * (0 success, 1 runtime failure).
 */
#ifndef OBX_CLI_H
#define OBX_CLI_H

#include "obx/config.h"

enum obx_exit { OBX_EXIT_OK = 0, OBX_EXIT_FAILURE = 1, OBX_EXIT_USAGE = 2 };

int obx_cmd_check(const struct obx_config *cfg);
int obx_cmd_status(const struct obx_config *cfg, bool json);

#endif
