/*
 * fuzz_moe.c -- libFuzzer target: MoE routing inputs from arbitrary bytes (token and expert ids are the untrusted
 * integers of the MoE API).
 *
 *  1. mxfp8_moe_route on arbitrary topk_ids: succeeds exactly when every id is in [0, E) and no row repeats one;
 *     then every (t, k) appears once, in a block of expert topk_ids[t, k], the remaining positions hold the padding
 *     id, block_to_expert is the expert of each block, and the affinities are the weights (0 elsewhere). On error
 *     nothing is written.
 *  2. mxfp8_moe_backward on arbitrary token_position_to_id / block_to_expert (and skip_token, single_expert_dense,
 *     num_valid_tokens): succeeds exactly when the ids are valid by the rules of include/mxfp8.h (token ids in
 *     [0, T) or the padding id -1 / T of skip_token, expert ids in [0, E); num_valid_tokens only with
 *     single_expert_dense, >= 0), then every gradient is finite; on error nothing is written.
 * Both through their _validate entries too: the same status and message as the call, nothing written.
 * The first bytes choose T (1..8), E (1..3), B (1..4), top-k, N (1..6) and the flags; the rest are the ids.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MXFP8_REFERENCE_API /* goldens and compare (the no-ABI-promise section of mxfp8.h) */
#include "mxfp8.h"
#include "fuzz_assert.h"


enum { H = 32, I = 32, MAXT = 8, MAXE = 3, MAXB = 4, MAXN = 6 };
#define SENT 0xA5

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    mxfp8_set_num_threads(1);
    return 0;
}

typedef struct rd {
    const uint8_t *d;
    size_t n, i;
} rd;
static uint8_t byte(rd *r) { return r->i < r->n ? r->d[r->i++] : 0; }
/* an id: mostly small signed values around the valid range, sometimes any int32 */
static int32_t id(rd *r, int32_t T) {
    uint8_t b = byte(r);
    if (b == 0xFF) {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) v = v << 8 | byte(r);
        return (int32_t)v;
    }
    if (b == 0xFE) return T;
    return (int32_t)(int8_t)b % (T + 3);
}

static int untouched(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != SENT) return 0;
    return 1;
}

static void fuzz_route(rd *r, int T, int E, int B, int K) {
    int32_t ids[MAXT * MAXE];
    float w[MAXT * MAXE];
    for (int i = 0; i < T * K; i++) ids[i] = id(r, E), w[i] = 0.25f * (float)(i % 5) + 0.125f;
    int valid = 1;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int32_t v = ids[t * K + k];
            if (v < 0 || v >= E) valid = 0;
            for (int j = 0; j < k; j++)
                if (ids[t * K + j] == v) valid = 0;
        }
    int32_t pad = (byte(r) & 1) ? -1 : T;
    int64_t N = 0;
    FUZZ_ASSERT(mxfp8_moe_num_blocks(T, K, E, B, &N) == MXFP8_OK, "num_blocks: %s", mxfp8_last_error_message());
    int32_t tok[64 * MAXB], b2e[64];
    float a[MAXT * MAXE];
    FUZZ_ASSERT(N <= 64, "N = %lld", (long long)N);
    memset(tok, SENT, sizeof tok), memset(b2e, SENT, sizeof b2e), memset(a, SENT, sizeof a);
    mxfp8_tensor ti = mxfp8_tensor_make(ids, MXFP8_DTYPE_I32, 2, (const int64_t[]){T, K});
    mxfp8_tensor tw = mxfp8_tensor_make(w, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, K});
    mxfp8_tensor tp = mxfp8_tensor_make(tok, MXFP8_DTYPE_I32, 1, (const int64_t[]){N * B});
    mxfp8_tensor be = mxfp8_tensor_make(b2e, MXFP8_DTYPE_I32, 1, (const int64_t[]){N});
    mxfp8_tensor af = mxfp8_tensor_make(a, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * E, 1});
    size_t vbytes = 1;
    const mxfp8_status vst = mxfp8_moe_route_validate(&ti, &tw, E, B, pad, &tp, &be, &af, &vbytes);
    char vmsg[512];
    snprintf(vmsg, sizeof vmsg, "%s", mxfp8_last_error_message());
    FUZZ_ASSERT(vbytes == 0, "route_validate sized %zu bytes", vbytes);
    FUZZ_ASSERT(untouched(tok, sizeof tok) && untouched(b2e, sizeof b2e) && untouched(a, sizeof a),
                "route_validate wrote outputs");
    mxfp8_status st = mxfp8_moe_route(&ti, &tw, E, B, pad, &tp, &be, &af);
    FUZZ_ASSERT(vst == st && (st == MXFP8_OK || !strcmp(vmsg, mxfp8_last_error_message())),
                "route_validate said %d '%s', the call %d '%s'", (int)vst, vmsg, (int)st, mxfp8_last_error_message());
    if (!valid) {
        FUZZ_ASSERT(st != MXFP8_OK, "route accepted invalid ids");
        FUZZ_ASSERT(untouched(tok, sizeof tok) && untouched(b2e, sizeof b2e) && untouched(a, sizeof a),
                    "route wrote outputs on error");
        return;
    }
    FUZZ_ASSERT(st == MXFP8_OK, "route failed on valid ids: %s", mxfp8_last_error_message());
    FUZZ_ASSERT(untouched(tok + N * B, sizeof tok - (size_t)(N * B) * 4), "route wrote past token_position_to_id");
    int seen[MAXT * MAXE] = {0};
    for (int64_t n = 0; n < N; n++) {
        FUZZ_ASSERT(b2e[n] >= 0 && b2e[n] < E, "block_to_expert[%lld] = %d", (long long)n, b2e[n]);
        for (int p = 0; p < B; p++) {
            int32_t t = tok[n * B + p];
            if (t == pad) continue;
            FUZZ_ASSERT(t >= 0 && t < T, "token id %d", t);
            int k = 0;
            while (k < K && ids[t * K + k] != b2e[n]) k++;
            FUZZ_ASSERT(k < K, "token %d in a block of expert %d it does not route to", t, b2e[n]);
            seen[t * K + k]++;
        }
    }
    for (int i = 0; i < T * K; i++) FUZZ_ASSERT(seen[i] == 1, "pair %d placed %d times", i, seen[i]);
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            float want = 0.0f;
            for (int k = 0; k < K; k++)
                if (ids[t * K + k] == e) want = w[t * K + k];
            FUZZ_ASSERT(a[t * E + e] == want, "affinity (%d, %d) = %g, want %g", t, e, a[t * E + e], want);
        }
}

static void fuzz_backward(rd *r, int T, int E, int B) {
    uint8_t fl = byte(r);
    const int skip_token = fl & 1, dense = (fl >> 1) & 1, use_nvt = (fl >> 2) & 1;
    const int N = 1 + byte(r) % MAXN;
    int32_t tok[MAXN * MAXB], b2e[MAXN], nvt = id(r, T);
    for (int i = 0; i < N * B; i++) tok[i] = id(r, T);
    for (int n = 0; n < N; n++) b2e[n] = id(r, E);
    const int Em = dense ? 1 : E;
    /* the rules of include/mxfp8.h */
    int valid = 1;
    if (dense) {
        if (use_nvt && nvt < 0) valid = 0;
    } else {
        if (use_nvt) valid = 0;
        for (int i = 0; i < N * B; i++) {
            int32_t v = tok[i];
            int ok = (v >= 0 && v < T) || (skip_token ? v == -1 : v == T);
            if (!ok) valid = 0;
        }
        for (int n = 0; n < N; n++)
            if (b2e[n] < 0 || b2e[n] >= Em) valid = 0;
    }
    static float x[MAXT * H], a[MAXT * MAXE], w1[MAXE * H * 2 * I], w2[MAXE * I * H], dy[MAXT * H];
    for (int i = 0; i < MAXT * H; i++) x[i] = (float)((i * 37) % 19 - 9) / 8.0f, dy[i] = (float)((i * 11) % 7 - 3) / 4.0f;
    for (int i = 0; i < MAXE * H * 2 * I; i++) w1[i] = (float)((i * 13) % 17 - 8) / 64.0f;
    for (int i = 0; i < MAXE * I * H; i++) w2[i] = (float)((i * 7) % 23 - 11) / 64.0f;
    for (int i = 0; i < T * Em; i++) a[i] = (float)(i % 3) / 4.0f;
    static float dx[MAXT * H], da[MAXT * MAXE], dw1[MAXE * H * 2 * I], dw2[MAXE * I * H];
    memset(dx, SENT, sizeof dx), memset(da, SENT, sizeof da), memset(dw1, SENT, sizeof dw1), memset(dw2, SENT, sizeof dw2);
    mxfp8_moe_config cfg;
    mxfp8_moe_config_init(&cfg);
    cfg.skip_token = skip_token;
    cfg.single_expert_dense = dense;
    mxfp8_moe_bwd_args args;
    mxfp8_moe_bwd_args_init(&args);
    args.hidden_states = mxfp8_tensor_make(x, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    args.expert_affinities_masked = mxfp8_tensor_make(a, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * Em, 1});
    args.gate_up_proj_weight = mxfp8_tensor_make(w1, MXFP8_DTYPE_F32, 4, (const int64_t[]){Em, H, 2, I});
    args.down_proj_weight = mxfp8_tensor_make(w2, MXFP8_DTYPE_F32, 3, (const int64_t[]){Em, I, H});
    if (!dense) {
        args.token_position_to_id = mxfp8_tensor_make(tok, MXFP8_DTYPE_I32, 1, (const int64_t[]){N * B});
        args.block_to_expert = mxfp8_tensor_make(b2e, MXFP8_DTYPE_I32, 1, (const int64_t[]){N});
    }
    if (use_nvt) args.num_valid_tokens = mxfp8_tensor_make(&nvt, MXFP8_DTYPE_I32, 1, (const int64_t[]){1});
    args.output_hidden_states_grad = mxfp8_tensor_make(dy, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    args.block_size = B;
    args.config = &cfg;
    mxfp8_moe_bwd_grads g;
    memset(&g, 0, sizeof g);
    g.hidden_states_grad = mxfp8_tensor_make(dx, MXFP8_DTYPE_F32, 2, (const int64_t[]){T, H});
    g.expert_affinities_masked_grad = mxfp8_tensor_make(da, MXFP8_DTYPE_F32, 2, (const int64_t[]){T * Em, 1});
    g.gate_up_proj_weight_grad = mxfp8_tensor_make(dw1, MXFP8_DTYPE_F32, 4, (const int64_t[]){Em, H, 2, I});
    g.down_proj_weight_grad = mxfp8_tensor_make(dw2, MXFP8_DTYPE_F32, 3, (const int64_t[]){Em, I, H});
    size_t vbytes = 0;
    const mxfp8_status vst = mxfp8_moe_backward_validate(&args, &g, &vbytes);
    char vmsg[512];
    snprintf(vmsg, sizeof vmsg, "%s", mxfp8_last_error_message());
    FUZZ_ASSERT(untouched(dx, sizeof dx) && untouched(da, sizeof da) && untouched(dw1, sizeof dw1) &&
                    untouched(dw2, sizeof dw2),
                "backward_validate wrote outputs");
    mxfp8_status st = mxfp8_moe_backward(&args, &g);
    FUZZ_ASSERT(vst == st && (st == MXFP8_OK ? vbytes > 0 : !strcmp(vmsg, mxfp8_last_error_message())),
                "backward_validate said %d '%s' (%zu bytes), the call %d '%s'", (int)vst, vmsg, vbytes, (int)st,
                mxfp8_last_error_message());
    if (!valid) {
        FUZZ_ASSERT(st != MXFP8_OK, "backward accepted invalid routing (skip_token %d dense %d nvt %d)", skip_token,
                    dense, use_nvt);
        FUZZ_ASSERT(mxfp8_last_error_message()[0] != 0, "an error without a message");
        FUZZ_ASSERT(untouched(dx, sizeof dx) && untouched(da, sizeof da) && untouched(dw1, sizeof dw1) &&
                        untouched(dw2, sizeof dw2),
                    "backward wrote outputs on error");
        return;
    }
    FUZZ_ASSERT(st == MXFP8_OK, "backward failed on valid routing: %s", mxfp8_last_error_message());
    for (int i = 0; i < T * H; i++) FUZZ_ASSERT(isfinite(dx[i]), "dX[%d] = %g", i, dx[i]);
    for (int i = 0; i < T * Em; i++) FUZZ_ASSERT(isfinite(da[i]), "da[%d] = %g", i, da[i]);
    for (int i = 0; i < Em * H * 2 * I; i++) FUZZ_ASSERT(isfinite(dw1[i]), "dW1[%d] = %g", i, dw1[i]);
    for (int i = 0; i < Em * I * H; i++) FUZZ_ASSERT(isfinite(dw2[i]), "dW2[%d] = %g", i, dw2[i]);
    FUZZ_ASSERT(untouched(dx + T * H, sizeof dx - (size_t)(T * H) * 4), "dX written past its view");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    rd r = {data, size, 0};
    const int T = 1 + byte(&r) % MAXT, E = 1 + byte(&r) % MAXE, B = 1 + byte(&r) % MAXB;
    const uint8_t which = byte(&r);
    if (which & 1) fuzz_route(&r, T, E, B, 1 + (which >> 1) % E);
    else fuzz_backward(&r, T, E, B);
    return 0;
}
