/* libcorewise_budget: how many CPUs may this process use?
 * affinity ∩ every cpuset ∩ ceil(CFS quota), for the process's cgroup and
 * every parent, cgroup v1 and v2. Link with -lcorewise_budget. */
#ifndef COREWISE_BUDGET_H
#define COREWISE_BUDGET_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU count of the calling process (at least 1), or -1 on error. */
int corewise_budget_cores(void);

/* Writes every limit and the one that set the count as a NUL-terminated
 * JSON object into buf (len bytes) and returns its length without the NUL,
 * like snprintf: a return value >= len means it did not fit (nothing is
 * written then; retry with a larger buffer). buf may be NULL when len is 0.
 * Returns -1 on error. */
long corewise_budget_json(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
