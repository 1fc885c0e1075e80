/*
 * onednn.c -- the baseline: oneDNN's bf16 matmul doing the same GEMMs as libmxfp8, with no quantization at all.
 * Built with MXFP8_HAVE_DNNL (CMake finds Debian's libdnnl-dev); without it every function here reports failure
 * and the bench prints "oneDNN: absent".
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"

#ifdef MXFP8_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

static dnnl_engine_t g_eng;
static dnnl_stream_t g_strm;
static int g_ready = -1; /* -1 not tried, 0 failed, 1 ready */

static int ready(void) {
    if (g_ready < 0)
        g_ready = dnnl_engine_create(&g_eng, dnnl_cpu, 0) == dnnl_success &&
                  dnnl_stream_create(&g_strm, g_eng, dnnl_stream_default_flags) == dnnl_success;
    return g_ready;
}

int bench_dnnl_linked(void) { return 1; }

void bench_dnnl_describe(bench_ctx *b) {
    cJSON *j = cJSON_AddObjectToObject(b->root, "onednn");
    const dnnl_version_t *v = dnnl_version();
    char ver[64];
    snprintf(ver, sizeof ver, "%d.%d.%d", v->major, v->minor, v->patch);
    cJSON_AddStringToObject(j, "version", ver);
    cJSON_AddBoolToObject(j, "linked", 1);
    bench_say(b, "oneDNN %s linked: baseline = its bf16 matmul on the same GEMMs, no quantization\n", ver);
}

/* The primitive descriptor of C = A @ B (with C += when c_f32_acc); NULL on failure. */
static dnnl_primitive_desc_t make_pd(const dnnl_memory_desc_t *amd, const dnnl_memory_desc_t *bmd,
                                     const dnnl_memory_desc_t *cmd, int c_f32_acc) {
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, amd, bmd, NULL, cmd) != dnnl_success) return NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (c_f32_acc) {
        if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
        if (dnnl_post_ops_create(&po) != dnnl_success || dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success) {
            if (po) dnnl_post_ops_destroy(po);
            dnnl_primitive_attr_destroy(attr);
            return NULL;
        }
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &md, attr, g_eng, NULL);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st == dnnl_success ? pd : NULL;
}

int bench_gemm_init(bench_gemm *g, int64_t M, int64_t N, int64_t K, int a_t, int b_t, int c_f32_acc) {
    memset(g, 0, sizeof *g);
    if (!ready()) return -1;
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {a_t ? 1 : K, a_t ? M : 1}, bs = {b_t ? 1 : N, b_t ? K : 1}, cs = {N, 1};
    if (dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&cmd, 2, cd, c_f32_acc ? dnnl_f32 : dnnl_bf16, cs) != dnnl_success)
        return -1;
    dnnl_primitive_desc_t pd = make_pd(&amd, &bmd, &cmd, c_f32_acc);
    if (!pd) return -1;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(g->impl, sizeof g->impl, "%s", impl);
    dnnl_primitive_t prim = NULL;
    dnnl_status_t st = dnnl_primitive_create(&prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return -1;
    g->prim = prim;
    dnnl_memory_t a = NULL, bm = NULL, c = NULL;
    int ok = dnnl_memory_create(&a, &amd, g_eng, DNNL_MEMORY_NONE) == dnnl_success &&
             dnnl_memory_create(&bm, &bmd, g_eng, DNNL_MEMORY_NONE) == dnnl_success &&
             dnnl_memory_create(&c, &cmd, g_eng, DNNL_MEMORY_NONE) == dnnl_success;
    g->a = a;
    g->b = bm;
    g->c = c;
    return ok ? 0 : -1;
}

int bench_gemm_run(bench_gemm *g, void *a, void *b, void *c) {
    if (!g->prim) return -1;
    dnnl_memory_set_data_handle((dnnl_memory_t)g->a, a);
    dnnl_memory_set_data_handle((dnnl_memory_t)g->b, b);
    dnnl_memory_set_data_handle((dnnl_memory_t)g->c, c);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, (dnnl_memory_t)g->a},
                               {DNNL_ARG_WEIGHTS, (dnnl_memory_t)g->b},
                               {DNNL_ARG_DST, (dnnl_memory_t)g->c}};
    return dnnl_primitive_execute((dnnl_primitive_t)g->prim, g_strm, 3, args) == dnnl_success ? 0 : -1;
}

int bench_gemm_wait(void) { return g_ready == 1 && dnnl_stream_wait(g_strm) == dnnl_success ? 0 : -1; }

void bench_gemm_free(bench_gemm *g) {
    if (g->prim) dnnl_primitive_destroy((dnnl_primitive_t)g->prim);
    if (g->a) dnnl_memory_destroy((dnnl_memory_t)g->a);
    if (g->b) dnnl_memory_destroy((dnnl_memory_t)g->b);
    if (g->c) dnnl_memory_destroy((dnnl_memory_t)g->c);
    memset(g, 0, sizeof *g);
}

void bench_dnnl_shutdown(void) {
    if (g_ready == 1) {
        dnnl_stream_destroy(g_strm);
        dnnl_engine_destroy(g_eng);
    }
    g_ready = -1;
}

#else /* built without oneDNN */

int bench_dnnl_linked(void) { return 0; }

void bench_dnnl_describe(bench_ctx *b) {
    cJSON *j = cJSON_AddObjectToObject(b->root, "onednn");
    cJSON_AddBoolToObject(j, "linked", 0);
    bench_say(b, "oneDNN: absent (built without libdnnl-dev): no oneDNN baseline in this run\n");
}

int bench_gemm_init(bench_gemm *g, int64_t M, int64_t N, int64_t K, int a_t, int b_t, int c_f32_acc) {
    (void)M, (void)N, (void)K, (void)a_t, (void)b_t, (void)c_f32_acc;
    memset(g, 0, sizeof *g);
    snprintf(g->impl, sizeof g->impl, "absent");
    return -1;
}
int bench_gemm_run(bench_gemm *g, void *a, void *b, void *c) {
    (void)g, (void)a, (void)b, (void)c;
    return -1;
}
int bench_gemm_wait(void) { return -1; }
void bench_gemm_free(bench_gemm *g) { memset(g, 0, sizeof *g); }
void bench_dnnl_shutdown(void) {}

#endif /* MXFP8_HAVE_DNNL */
