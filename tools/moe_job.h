/* moe_job.h -- the state of one `mxfp8 moe-bwd` run, shared by cmd_moe.c (the flow, the checks) and moe_inputs.c
 * (the bundle reader and the random problem). */
#ifndef MXFP8_TOOLS_MOE_JOB_H
#define MXFP8_TOOLS_MOE_JOB_H

#include "cli.h"
#include "io/tensorfile.h"

typedef struct moe_job {
    const char *cmd;
    /* problem and options */
    int64_t H, T, E, B, TOPK, I, seed, repeat, block_size, N;
    int act, aff, gdt, check, quiet;
    int stats;           /**< --stats: the warm-up call collects the operands' statistics */
    int routed_topk;     /**< routing came from top-k ids (random problem or bundle) */
    int x_f64;           /**< the bundle's hidden_states were F64 (rounded to F32) */
    int f8_given;        /**< --float8-dtype was given */
    int allow_mem;       /**< --no-memory-check */
    const char *in_path, *out_path, *save_path;
    mxfp8_moe_config cfg;
    mxfp8_moe_bwd_args ba;
    /* tensors */
    tf_set in, work, grads, gold, qref;
    tf_tensor *x, *w1, *w2, *dy, *ea, *tpi, *b2e;
    double t_fwd, best; /* seconds; t_fwd < 0: no forward ran */
} moe_job;

/** The tensor names a bundle may hold (moe_inputs.c). */
extern const char *const k_moe_bundle_names[];
extern const int k_moe_bundle_count;

/** Read --inputs into the job: the tensors, the routing (explicit or from top-k ids), the optional tensors. */
int moe_load_bundle(moe_job *j);
/** The random upstream-style problem (routing through mxfp8_moe_route), and --save-inputs. */
int moe_make_problem(moe_job *j);

#endif
