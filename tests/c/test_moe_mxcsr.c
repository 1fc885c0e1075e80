/*
 * test_moe_mxcsr.c -- a caller's MXCSR (flush-to-zero and denormals-are-zero, each directed rounding mode) must not
 * change any bit of the blockwise MoE forward (output and every checkpoint) or backward (every gradient, given the
 * checkpoints and recomputing them), on 1 and 2 threads, whether the mode is set on the calling thread only (what
 * torch.set_flush_denormal does) or on every thread of the OpenMP pool; and the caller's MXCSR must be restored.
 * The layer's elementwise work (clamps, the activation and its derivative, inter = act * u, the affinity scaling,
 * the weighted scatter, the affinity and bias sums) runs outside the GEMMs, partly on the calling thread.
 * Oracle: the same calls under the IEEE default MXCSR, whose gradients (AFFINITY_ON_I) are checked against the
 * tests' independent FP64 oracle (tests/c/oracle/moe.c). The data is scaled so that the elementwise products are FP32
 * subnormals (the test counts them in the default run's intermediate checkpoint: FTZ would flush them) while every
 * gradient stays a normal value, and every directed rounding mode changes the sums of ordinary values.
 */
#include "moe_util.h"

#if defined(__x86_64__)
#include <xmmintrin.h>

#define DEFAULT_CSR 0x1F80u
static const unsigned k_modes[] = {0x8040u, 0x6000u, 0x4000u, 0x2000u, 0x8040u | 0x2000u};
static const char *k_mode_name[] = {"FTZ+DAZ", "round toward zero", "round up", "round down", "FTZ+DAZ, round down"};

/* MXCSR's control bits on every thread of a 2-thread pool (all = 1) or only on the calling thread. */
static void set_mode(unsigned mode, int all) {
    const unsigned csr = DEFAULT_CSR | mode;
    if (all) {
#pragma omp parallel num_threads(2)
        _mm_setcsr(csr);
    }
    _mm_setcsr(csr);
}

/* One forward (F32 output and all five checkpoints) and one backward (from those checkpoints when ck, else
 * recomputing them) into out[0..6] and G. */
typedef struct run_out {
    float *o[6];
    size_t n[6];
    grads G;
} run_out;

static void run(const prob *P, const mxfp8_moe_config *cfg, int ck, run_out *r) {
    const int64_t T = P->T, H = P->H, I = P->I, N = P->N, B = P->B;
    const size_t n[6] = {(size_t)(T * H),     (size_t)(N * 2 * I * B), (size_t)(N * I * B),
                         (size_t)(N * I * B), (size_t)(N * I * B),     (size_t)(N * B * H)};
    for (int k = 0; k < 6; k++) r->n[k] = n[k], r->o[k] = xc(n[k] * sizeof(float));
    mxfp8_moe_fwd_args fa;
    fwd_args(P, cfg, &fa);
    mxfp8_moe_fwd_outputs fo = {0};
    fo.output = v2(r->o[0], MXFP8_DTYPE_F32, T, H);
    fo.gate_up_proj_act_checkpoint_T = v4(r->o[1], MXFP8_DTYPE_F32, N, 2, I, B);
    fo.gate_act_checkpoint_T = v3(r->o[2], MXFP8_DTYPE_F32, N, I, B);
    fo.intermediate_checkpoint_T = v3(r->o[3], MXFP8_DTYPE_F32, N, I, B);
    fo.scaled_intermediate_checkpoint_T = v3(r->o[4], MXFP8_DTYPE_F32, N, I, B);
    fo.down_proj_output_checkpoint = v3(r->o[5], MXFP8_DTYPE_F32, N, B, H);
    CHECK(mxfp8_moe_forward(&fa, &fo) == MXFP8_OK, "forward: %s", mxfp8_last_error_message());
    mxfp8_moe_bwd_args ba;
    bwd_args(P, cfg, &ba);
    if (ck) {
        ba.gate_up_proj_act_checkpoint_T = fo.gate_up_proj_act_checkpoint_T;
        ba.gate_act_checkpoint_T = fo.gate_act_checkpoint_T;
        ba.intermediate_checkpoint_T = fo.intermediate_checkpoint_T;
        ba.scaled_intermediate_checkpoint_T = fo.scaled_intermediate_checkpoint_T;
        ba.down_proj_output_checkpoint = fo.down_proj_output_checkpoint;
    }
    grads_make(&r->G, P, MXFP8_DTYPE_F32, cfg->bias);
    CHECK(mxfp8_moe_backward(&ba, &r->G.g) == MXFP8_OK, "backward: %s", mxfp8_last_error_message());
}
static void run_free(run_out *r) {
    for (int k = 0; k < 6; k++) free(r->o[k]);
    grads_free(&r->G);
}

static int64_t subnormals(const float *x, size_t n) {
    int64_t c = 0;
    for (size_t i = 0; i < n; i++) c += x[i] != 0.0f && fabsf(x[i]) < 0x1p-126f;
    return c;
}

static void test_modes(int ck, mxfp8_affinity_option aff, int64_t *sub_seen) {
    static const char *ONAME[6] = {"output",
                                   "gate_up_proj_act_checkpoint_T",
                                   "gate_act_checkpoint_T",
                                   "intermediate_checkpoint_T",
                                   "scaled_intermediate_checkpoint_T",
                                   "down_proj_output_checkpoint"};
    prob P;
    prob_make(&P, 256, 128, 256, 4, 2, 128, 1, NULL); /* full blocks: their elementwise work splits between threads */
    /* X ~ 2^-62: g, u ~ 2^-64, inter = act(g) * u mostly below 2^-126 (subnormal); dY ~ 2^60, so that every
       gradient is a normal FP32 value (the oracle's comparison holds) */
    for (int64_t i = 0; i < P.T * P.H; i++) P.X[i] = ldexpf(P.X[i], -62), P.dY[i] = ldexpf(P.dY[i], 60);
    for (int64_t i = 0; i < P.E * 2 * P.I; i++) P.b1[i] = ldexpf(P.b1[i], -64);
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.bias = 1;
    cfg.skip_token = 1;
    cfg.affinity_option = aff;
    for (int nt = 1; nt <= 2; nt++) {
        mxfp8_set_num_threads(nt);
        set_mode(0, 1);
        run_out ref;
        run(&P, &cfg, ck, &ref);
        *sub_seen += subnormals(ref.o[3], ref.n[3]);
        if (nt == 2 && aff == MXFP8_AFFINITY_ON_I) /* (ON_H's dW2 contracts the subnormal inter itself, whose lost
                                                       low bits exceed the oracle's FP64 bound) */
            check_vs_oracle(&ref.G, &P, &cfg, "default MXCSR");
        for (size_t m = 0; m < sizeof k_modes / sizeof k_modes[0]; m++)
            for (int all = 0; all < 2; all++) {
                set_mode(k_modes[m], all);
                run_out got;
                run(&P, &cfg, ck, &got);
                const unsigned after = _mm_getcsr() & 0xFFC0u;
                set_mode(0, 1);
                char what[160];
                snprintf(what, sizeof what, "%s on %s, %d thread(s), %s, %s", k_mode_name[m],
                         all ? "every thread" : "the calling thread", nt, ck ? "checkpoints given" : "recomputed",
                         aff == MXFP8_AFFINITY_ON_H ? "ON_H" : "ON_I");
                CHECK(after == ((DEFAULT_CSR | k_modes[m]) & 0xFFC0u),
                      "%s: the caller's MXCSR was not restored "
                      "(0x%04x)",
                      what, after);
                for (int k = 0; k < 6; k++)
                    CHECK(!memcmp(got.o[k], ref.o[k], ref.n[k] * sizeof(float)), "%s: forward %s differs", what,
                          ONAME[k]);
                grads_bitwise(&got.G, &ref.G, cfg.bias, what);
                run_free(&got);
            }
        run_free(&ref);
    }
    mxfp8_set_num_threads(0);
    prob_free(&P);
}

int main(void) {
    int64_t sub = 0;
    test_modes(1, MXFP8_AFFINITY_ON_I, &sub);
    test_modes(0, MXFP8_AFFINITY_ON_I, &sub);
    test_modes(1, MXFP8_AFFINITY_ON_H, &sub);
    /* the data's sensitivity: FTZ would have flushed these intermediate values */
    CHECK(sub > 100, "the data gives only %lld subnormal intermediate values", (long long)sub);
    if (g_fail) {
        printf("test_moe_mxcsr: %d failure(s)\n", g_fail);
        return 1;
    }
    printf("test_moe_mxcsr: all tests passed (%lld subnormal intermediate values in the default runs)\n",
           (long long)sub);
    return 0;
}
#else
int main(void) {
    printf("test_moe_mxcsr: SKIP: MXCSR is x86 only\n");
    return 77;
}
#endif
