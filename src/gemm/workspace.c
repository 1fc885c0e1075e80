/* workspace.c -- the GEMM driver's buffers and the per-thread workspace scope (workspace.h, gemm.h). */
#include <stdlib.h>
#include <string.h>

#include "../runtime/tensor.h"
#include "gemm.h"
#include "workspace.h"

#define WS_KSLOTS 2
typedef struct ws_cache {
    int depth;
    int cap;
    void **p;
    int64_t *n;
    /* keyed B panels (mxfp8i_gemm_ws_bkey): buffer, bytes, the key and kernel they hold (key 0 = none) */
    void *kp[WS_KSLOTS];
    int64_t kn[WS_KSLOTS];
    uint64_t key[WS_KSLOTS];
    const void *kuk[WS_KSLOTS];
    /* the pending key for the next GEMM */
    int next_slot;
    uint64_t next_key;
    const void *next_bdata;
} ws_cache;
static _Thread_local ws_cache g_wsc;

void *mxfp8i_ws_alloc(int64_t n) {
    if (n < 0) return NULL;
    n = mxfp8i_round_up(n > 0 ? n : 1, 64);
    return aligned_alloc(64, (size_t)n);
}

void mxfp8i_gemm_ws_begin(void) { g_wsc.depth++; }
void mxfp8i_gemm_ws_end(void) {
    if (g_wsc.depth <= 0 || --g_wsc.depth > 0) return;
    for (int i = 0; i < g_wsc.cap; i++) free(g_wsc.p[i]);
    for (int i = 0; i < WS_KSLOTS; i++) free(g_wsc.kp[i]);
    free(g_wsc.p);
    free(g_wsc.n);
    memset(&g_wsc, 0, sizeof g_wsc);
}
void mxfp8i_gemm_ws_bkey(int slot, uint64_t key, const void *b_data) {
    if (g_wsc.depth <= 0 || slot < 0 || slot >= WS_KSLOTS) return;
    g_wsc.next_slot = slot;
    g_wsc.next_key = key;
    g_wsc.next_bdata = b_data;
}

void *mxfp8i_ws_get(int s, int64_t n) {
    ws_cache *w = &g_wsc;
    if (w->depth <= 0) return mxfp8i_ws_alloc(n);
    if (s >= w->cap) {
        int cap = s + 16;
        void **p = realloc(w->p, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        w->p = p;
        int64_t *nn = realloc(w->n, (size_t)cap * sizeof *nn);
        if (!nn) return NULL;
        w->n = nn;
        for (int i = w->cap; i < cap; i++) w->p[i] = NULL, w->n[i] = 0;
        w->cap = cap;
    }
    if (w->p[s] && w->n[s] >= n) return w->p[s];
    free(w->p[s]);
    w->p[s] = mxfp8i_ws_alloc(n);
    w->n[s] = w->p[s] ? n : 0;
    return w->p[s];
}

void mxfp8i_ws_put(void *p) {
    if (g_wsc.depth <= 0) free(p);
}

int mxfp8i_ws_take_bkey(const void *b_data, uint64_t *key) {
    int slot = -1;
    if (g_wsc.next_key && g_wsc.depth > 0 && g_wsc.next_bdata == b_data) {
        slot = g_wsc.next_slot;
        *key = g_wsc.next_key;
    }
    g_wsc.next_key = 0;
    g_wsc.next_bdata = NULL;
    return slot;
}

void *mxfp8i_ws_keyed(int slot, uint64_t key, const void *uk, int64_t nbytes, int *ready) {
    ws_cache *w = &g_wsc;
    *ready = w->key[slot] == key && w->kuk[slot] == uk && w->kn[slot] == nbytes && w->kp[slot];
    if (*ready) return w->kp[slot];
    w->key[slot] = 0;
    if (!w->kp[slot] || w->kn[slot] != nbytes) {
        free(w->kp[slot]);
        w->kp[slot] = mxfp8i_ws_alloc(nbytes);
        w->kn[slot] = w->kp[slot] ? nbytes : 0;
    }
    return w->kp[slot];
}

void mxfp8i_ws_keyed_done(int slot, uint64_t key, const void *uk) {
    g_wsc.key[slot] = key;
    g_wsc.kuk[slot] = uk;
}
