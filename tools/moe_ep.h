/*
 * moe_ep.h -- the MoE problem of `mxfp8 moe-bwd --expert-parallel` (tools/cmd_moe_ep.c) and the helpers it shares
 * with `mxfp8 bench moe --expert-parallel` (bench/bench_moe_ep.c). Built when CMake finds MPI (MXFP8_HAVE_MPI).
 *
 * The problem is the GATHERED one (every rank holds all of it; each takes its slice): generated exactly as
 * `mxfp8 moe-bwd` generates its default problem (same options, same seed, same values), or read from a bundle.
 */
#ifndef MXFP8_TOOLS_MOE_EP_H
#define MXFP8_TOOLS_MOE_EP_H

#include <stdint.h>

#include "cli.h"
#include "io/tensorfile.h"
#include "mxfp8_mpi.h"

typedef struct moe_ep_problem {
    tf_set in, work;
    tf_tensor *x, *w1, *w2, *dy, *b1, *b2; /* hidden_states, weights (float), dY, biases (or NULL) */
    tf_tensor *w1c, *w2c, *w1s, *w2s;      /* pre-quantized weights of the backward's axes (or NULL); then w1, w2
                                              are their exact F32 values, for the forward */
    tf_tensor *ids, *wts;                  /* topk routing [T, K] (or NULL) */
    tf_tensor *ea;                         /* routing by affinities [T*E(, 1)] (or NULL) */
    int64_t T, H, E, I, K, B;              /* K = -1 when routed by affinities */
    int skip_token;                        /* the padding convention of the bundle's routing */
    int ignored_checkpoints;               /* the bundle had checkpoints (the forward makes its own) */
} moe_ep_problem;

/** `mxfp8 moe-bwd`'s default problem: W ~ U(-0.1, 0.1), X ~ U(0, 1), dY ~ U(-1, 1) (BF16), top-K distinct experts
 *  per token without replacement, affinities U(0, 1) rounded to BF16, biases U(-0.1, 0.1) when bias. */
int moe_ep_generate(moe_ep_problem *p, int64_t H, int64_t T, int64_t E, int64_t B, int64_t K, int64_t I,
                    uint64_t seed, int bias, char *err, size_t errlen);
/** A bundle (the names of `mxfp8 moe-bwd --inputs`); block_size 0 = from the bundle. */
int moe_ep_load(moe_ep_problem *p, const char *path, int64_t block_size, char *err, size_t errlen);
void moe_ep_free(moe_ep_problem *p);

/** MPI for a command: initialized here (MPI_THREAD_FUNNELED) unless the caller already did; *rank and *size of
 *  MPI_COMM_WORLD. Returns 1 when this call initialized MPI (the command then calls MPI_Finalize), else 0. */
int moe_ep_mpi_begin(int *argc, char ***argv, int *rank, int *size);

/** Threads per rank when the user set none: the cores the library sees, shared by the ranks of this node. */
void moe_ep_default_threads(MPI_Comm comm);

#endif /* MXFP8_TOOLS_MOE_EP_H */
