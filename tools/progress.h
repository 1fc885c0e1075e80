/*
 * progress.h -- one line of progress on stderr for the long commands (matmul-bwd, moe-bwd): the current phase, the
 * percentage done and the time left, redrawn in place a few times a second. Shown only when stderr is a terminal
 * and --quiet is not given; otherwise every call here is a no-op.
 *
 * A command first plans its phases (cli_progress_add: label, kind of work, FLOPs or bytes), then starts each in
 * order (cli_progress_next) and finally calls cli_progress_done. Each phase is one or a few library calls, so the
 * percentage moves inside a phase by the time it is expected to take: rates are learned per kind of work from the
 * finished phases (the first golden reference times the later ones), so the estimate firms up as the run goes.
 */
#ifndef MXFP8_TOOLS_PROGRESS_H
#define MXFP8_TOOLS_PROGRESS_H

typedef enum cli_work {
    CLI_WORK_IO = 0,     /**< reading, generating or writing tensors; units: bytes */
    CLI_WORK_KERNEL = 1, /**< libmxfp8's kernels; units: FLOPs */
    CLI_WORK_GOLDEN = 2, /**< the scalar FP64 golden references; units: FLOPs */
    CLI_WORK_KINDS = 3
} cli_work;

/** Start a run of command `cmd`; show = the line may be drawn (the caller checked --quiet; this checks isatty). */
void cli_progress_init(const char *cmd, int show);
/** Append a phase to the plan. */
void cli_progress_add(const char *label, cli_work kind, double units);
/** Finish the current phase (if any) and start the next planned one. */
void cli_progress_next(void);
/** Finish the current phase and erase the line. */
void cli_progress_done(void);
/** Seconds spent so far in finished phases of a kind. */
double cli_progress_seconds(cli_work kind);
/** Seconds since cli_progress_init. */
double cli_progress_elapsed(void);
/** Erase the line for good (before an error message; cli_error does this). */
void cli_progress_clear(void);

#endif
