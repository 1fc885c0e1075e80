/*
 * memcheck.h -- the memory estimate of matmul-bwd and moe-bwd before they allocate: a problem that needs more than
 * the machine has available is refused with both numbers instead of growing for minutes (Linux overcommits: an
 * allocation that exceeds the memory succeeds and the process is killed, or swaps, when the pages are touched).
 */
#ifndef MXFP8_TOOLS_MEMCHECK_H
#define MXFP8_TOOLS_MEMCHECK_H

/** Bytes available for a new process now: MemAvailable of /proc/meminfo, else free physical pages; 0 if unknown. */
double cli_mem_available(void);

/** The check: CLI_OK when need_bytes fits in what is available (or that is unknown, or allow != 0), else the error
 *  of command cmd (needed, of which the golden references take check_bytes, and available; the flags that help)
 *  and CLI_USAGE. */
int cli_mem_check(const char *cmd, double need_bytes, double check_bytes, int allow);

#endif
