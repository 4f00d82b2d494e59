/*
 * procstat.h - the process's own numbers (CPU, memory, descriptors, start
 * time) read from /proc/self at scrape time, for the process_* metrics that
 * the Prometheus client libraries export under the same names.  I/O: the
 * HTTP thread calls it and hands the result to obx_metrics_render(), which
 * stays pure.
 */
#ifndef OBX_PROCSTAT_H
#define OBX_PROCSTAT_H

#include "obx/core/metrics.h"

/*
 * Fills p from /proc/self/stat, /proc/stat (the boot time), /proc/self/fd
 * and the RLIMIT_NOFILE soft limit.  A number that could not be read is -1
 * (and not rendered).  Returns 0 when every number was read, OBX_EIO
 * otherwise.  Thread-safe; no allocation that outlives the call.
 */
int obx_procstat_read(struct obx_process *p);

#endif
