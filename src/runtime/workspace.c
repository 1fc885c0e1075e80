/* workspace.c -- mxfp8_workspace and the per-thread scratch scope (workspace.h). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "workspace.h"

struct mxfp8_workspace {
    atomic_int busy;                   /* 1 while a call uses it */
    void *p[MXFP8I_WS_NSLOTS];
    size_t n[MXFP8I_WS_NSLOTS];
    void *kp[MXFP8I_WS_KEYED];         /* keyed panels: buffer, bytes, the key and kernel they hold (key 0: none) */
    size_t kn[MXFP8I_WS_KEYED];
    uint64_t key[MXFP8I_WS_KEYED];
    const void *kuk[MXFP8I_WS_KEYED];
    int next_slot;                     /* the pending key for the next GEMM */
    uint64_t next_key;
    const void *next_bdata;
    unsigned char *blk;                /* mxfp8_workspace_reserve's block: slots are carved from its tail */
    size_t blk_n, blk_used;
    int sizing;                        /* 1: a sizing arena (mxfp8i_ws_plan): records sizes, allocates nothing */
};

static _Alignas(64) unsigned char g_dummy[64]; /* the buffer a sizing arena hands out (never dereferenced) */

static _Thread_local mxfp8_workspace *g_cur; /* the arena of the innermost open scope */
static _Thread_local int g_depth;

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* A slot's buffer: from the reserved block while it has room, else the heap (counted). */
static void *alloc64(mxfp8_workspace *w, size_t n) {
    n = round64(n);
    if (w->sizing) return g_dummy;
    if (w->blk && w->blk_n - w->blk_used >= n) {
        void *p = w->blk + w->blk_used;
        w->blk_used += n;
        return p;
    }
    return aligned_alloc(64, n ? n : 64);
}

static void free64(mxfp8_workspace *w, void *p) {
    if (w->sizing || (w->blk && (unsigned char *)p >= w->blk && (unsigned char *)p < w->blk + w->blk_n)) return;
    free(p);
}

static void release_slots(mxfp8_workspace *w) {
    for (int i = 0; i < MXFP8I_WS_NSLOTS; i++) free64(w, w->p[i]);
    for (int i = 0; i < MXFP8I_WS_KEYED; i++) free64(w, w->kp[i]);
}

static void release(mxfp8_workspace *w) {
    release_slots(w);
    free(w->blk);
}

mxfp8_status mxfp8_workspace_create(mxfp8_workspace **workspace) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!workspace, MXFP8_ERR_NULL_POINTER, "mxfp8_workspace_create: workspace is NULL");
    *workspace = calloc(1, sizeof **workspace);
    MXFP8I_RETURN_ERROR_IF(!*workspace, MXFP8_ERR_OUT_OF_MEMORY, "mxfp8_workspace_create: out of memory");
    return MXFP8_OK;
}

void mxfp8_workspace_destroy(mxfp8_workspace *workspace) {
    if (!workspace) return;
    release(workspace);
    free(workspace);
}

size_t mxfp8_workspace_bytes(const mxfp8_workspace *workspace) {
    if (!workspace) return 0;
    size_t s = 0;
    for (int i = 0; i < MXFP8I_WS_NSLOTS; i++) s += workspace->n[i];
    for (int i = 0; i < MXFP8I_WS_KEYED; i++) s += workspace->kn[i];
    return s + (workspace->blk_n - workspace->blk_used);
}

mxfp8_status mxfp8_workspace_reserve(mxfp8_workspace *workspace, size_t bytes) {
    mxfp8i_clear_error();
    MXFP8I_RETURN_ERROR_IF(!workspace, MXFP8_ERR_NULL_POINTER, "mxfp8_workspace_reserve: workspace is NULL");
    MXFP8I_RETURN_ERROR_IF(atomic_exchange(&workspace->busy, 1) != 0, MXFP8_ERR_INVALID_ARGUMENT,
                           "mxfp8_workspace_reserve: the workspace is in use by a call");
    release(workspace);
    memset(workspace->p, 0, sizeof workspace->p);
    memset(workspace->n, 0, sizeof workspace->n);
    memset(workspace->kp, 0, sizeof workspace->kp);
    memset(workspace->kn, 0, sizeof workspace->kn);
    memset(workspace->key, 0, sizeof workspace->key);
    workspace->blk = NULL;
    workspace->blk_n = workspace->blk_used = 0;
    mxfp8_status st = MXFP8_OK;
    if (bytes > 0) {
        size_t n = round64(bytes);
        if (n < bytes || !(workspace->blk = aligned_alloc(64, n)))
            st = mxfp8i_error(MXFP8_ERR_OUT_OF_MEMORY, "mxfp8_workspace_reserve: out of memory for %zu bytes", bytes);
        else workspace->blk_n = n;
    }
    atomic_store(&workspace->busy, 0);
    return st;
}

mxfp8_status mxfp8i_scope_begin(mxfp8i_scope *s, mxfp8_workspace *user) {
    memset(s, 0, sizeof *s);
    s->prev = g_cur;
    if (g_depth++ > 0) { /* nested: the outer call's arena */
        s->ws = g_cur;
        return MXFP8_OK;
    }
    if (user && atomic_exchange(&user->busy, 1) == 0) {
        s->ws = user;
        s->user = 1;
    } else {
        s->ws = calloc(1, sizeof *s->ws);
        s->owned = 1;
        if (!s->ws) {
            g_depth--;
            return MXFP8_ERR_OUT_OF_MEMORY;
        }
    }
    /* a new call: weights may have changed since the last one, so no keyed panels carry over */
    for (int i = 0; i < MXFP8I_WS_KEYED; i++) s->ws->key[i] = 0;
    s->ws->next_key = 0;
    g_cur = s->ws;
    return MXFP8_OK;
}

void mxfp8i_scope_end(mxfp8i_scope *s) {
    if (!s->ws) return;
    g_depth--;
    g_cur = s->prev;
    if (s->owned) {
        release(s->ws);
        free(s->ws);
    } else if (s->user) {
        atomic_store(&s->ws->busy, 0);
    } else if (s->sub) {
        release_slots(s->ws); /* only what came from the heap: the rest is the caller's memory */
    }
    s->ws = NULL;
}

size_t mxfp8i_ws_sub_bytes(size_t inner) { return round64(sizeof(mxfp8_workspace)) + round64(inner); }

void mxfp8i_scope_begin_sub(mxfp8i_scope *s, void *mem, size_t bytes) {
    memset(s, 0, sizeof *s);
    mxfp8_workspace *w = (mxfp8_workspace *)mem;
    const size_t head = round64(sizeof *w);
    memset(w, 0, sizeof *w);
    atomic_init(&w->busy, 0);
    w->blk = (unsigned char *)mem + head;
    w->blk_n = bytes > head ? bytes - head : 0;
    s->prev = g_cur;
    s->ws = w;
    s->sub = 1;
    g_depth++;
    g_cur = w;
}

void *mxfp8i_ws_get(int slot, size_t bytes) {
    mxfp8_workspace *w = g_cur;
    if (!w || slot < 0 || slot >= MXFP8I_WS_NSLOTS) return NULL;
    if (w->p[slot] && w->n[slot] >= bytes) return w->p[slot];
    free64(w, w->p[slot]);
    w->p[slot] = alloc64(w, bytes);
    w->n[slot] = w->p[slot] ? round64(bytes) : 0;
    return w->p[slot];
}

void mxfp8i_ws_bkey(int slot, uint64_t key, const void *b_data) {
    mxfp8_workspace *w = g_cur;
    if (!w || slot < 0 || slot >= MXFP8I_WS_KEYED) return;
    w->next_slot = slot;
    w->next_key = key;
    w->next_bdata = b_data;
}

int mxfp8i_ws_take_bkey(const void *b_data, uint64_t *key) {
    mxfp8_workspace *w = g_cur;
    if (!w) return -1;
    int slot = -1;
    if (w->next_key && w->next_bdata == b_data) {
        slot = w->next_slot;
        *key = w->next_key;
    }
    w->next_key = 0;
    w->next_bdata = NULL;
    return slot;
}

void *mxfp8i_ws_keyed(int slot, uint64_t key, const void *uk, size_t bytes, int *ready) {
    mxfp8_workspace *w = g_cur;
    *ready = w->key[slot] == key && w->kuk[slot] == uk && w->kn[slot] >= bytes && w->kp[slot];
    if (*ready) return w->kp[slot];
    w->key[slot] = 0;
    if (!w->kp[slot] || w->kn[slot] < bytes) {
        free64(w, w->kp[slot]);
        w->kp[slot] = alloc64(w, bytes);
        w->kn[slot] = w->kp[slot] ? round64(bytes) : 0;
    }
    return w->kp[slot];
}

void mxfp8i_ws_keyed_done(int slot, uint64_t key, const void *uk) {
    g_cur->key[slot] = key;
    g_cur->kuk[slot] = uk;
}

mxfp8_status mxfp8i_ws_plan(const char *fn, mxfp8_status (*reserve)(const void *ctx), const void *ctx,
                            size_t *bytes) {
    /* 1. the reservation on a sizing arena: every slot's largest request, nothing allocated */
    mxfp8_workspace sz;
    memset(&sz, 0, sizeof sz);
    sz.sizing = 1;
    mxfp8_workspace *prev = g_cur;
    g_cur = &sz;
    mxfp8_status st = reserve(ctx);
    g_cur = prev;
    if (st) return st;
    if (bytes) {
        *bytes = mxfp8_workspace_bytes(&sz);
        return MXFP8_OK;
    }
    /* 2. each slot of the scope's arena grown once, in slot order, to that size */
    mxfp8_workspace *w = g_cur;
    MXFP8I_RETURN_ERROR_IF(!w, MXFP8_ERR_INTERNAL, "%s: no workspace scope is open", fn);
    for (int i = 0; i < MXFP8I_WS_NSLOTS; i++)
        MXFP8I_RETURN_ERROR_IF(sz.n[i] && !mxfp8i_ws_get(i, sz.n[i]), MXFP8_ERR_OUT_OF_MEMORY,
                               "%s: out of memory for the workspace (%zu bytes)", fn, sz.n[i]);
    for (int i = 0; i < MXFP8I_WS_KEYED; i++)
        if (sz.kn[i] && (!w->kp[i] || w->kn[i] < sz.kn[i])) {
            free64(w, w->kp[i]);
            w->key[i] = 0;
            w->kp[i] = alloc64(w, sz.kn[i]);
            w->kn[i] = w->kp[i] ? sz.kn[i] : 0;
            MXFP8I_RETURN_ERROR_IF(!w->kp[i], MXFP8_ERR_OUT_OF_MEMORY,
                                   "%s: out of memory for the workspace (%zu bytes)", fn, sz.kn[i]);
        }
    return MXFP8_OK;
}
