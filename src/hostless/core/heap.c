/*
 * heap.c -- the shared heap and the device heaps: each a bitmap of granules
 * under one lock word that names its holder (layout and rules in
 * hostless_layout.h, "Buffers" and "Device heaps").  One code for all of
 * them, over a struct hle_pool.  A lock held by a dead participant is broken
 * and the bitmap rebuilt from the buffer slots; a free that finds the lock
 * kept by a live holder is deferred.
 */
#include "engine.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* the shared heap (layout and rules in hostless.h, "Buffers") */

/* Layout of a heap region able to hold `want` data bytes. */
void hle_heap_layout(uint64_t want, uint64_t *bitmap_off, uint64_t *granules, uint64_t *data_off,
                        uint64_t *region) {
    uint64_t g = ALIGN_UP(want, HL_PAGE) / HL_GRANULE;
    uint64_t bm_bytes = (g + 63) / 64 * 8;
    *bitmap_off = sizeof(struct hl_heap);
    *granules = g;
    *data_off = ALIGN_UP(sizeof(struct hl_heap) + bm_bytes, HL_PAGE);
    *region = *data_off + g * HL_GRANULE;
}

/* Heap-lock owner code of the recoverer of participant d (incarnation inc):
 * bit 32 set.  It is alive while d is RECOVERING in that incarnation and d's
 * liveness lock is held (by its one recoverer, joined or not). */
__thread int hle_tls_rec = -1;       /* participant this thread recovers, -1: none */
__thread uint32_t hle_tls_rec_inc;   /* its incarnation (24 bits) */

static void hle_pool_repair(hle_ctx *c, const struct hle_pool *p);

int hle_pool(hle_ctx *c, int p, struct hle_pool *out) {
    if (p == 0) {
        struct hl_heap *hp = heap(c);
        if (!hp) return 0;
        *out = (struct hle_pool){&hp->lock, &hp->used_granules, &hp->hint, &hp->repairs, &hp->allocs,
                                 c->dv.heap_bitmap, c->dv.heap_granules, HL_GRANULE, -1};
        return 1;
    }
    if (p < 0 || (uint32_t)(p - 1) >= c->dv.devheap_count) return 0;
    struct hl_devheap *dh = c->dv.devheap[p - 1];
    *out = (struct hle_pool){&dh->lock, &dh->used_granules, &dh->hint, &dh->repairs, &dh->allocs,
                             c->dv.devheap_bitmap[p - 1], c->dv.devheap_granules[p - 1], HL_DEVICE_GRANULE, p - 1};
    return 1;
}

/* Take the heap lock.  A lock held by a dead participant (or holding a
 * corrupt value) is broken, and the bitmap rebuilt from the slots. */
__thread int hle_tls_deferred;        /* a finalize of this thread could not free its block */

/* Take a pool's lock within timeout_ns.  Returns 1 when taken, 0 when a live
 * holder kept it (a participant stopped inside the critical section, or a
 * hostile lock word naming a live participant).  Never called with the GIL
 * held for more than HEAP_FREE_WAIT_NS. */
int hle_pool_lock_for(hle_ctx *c, const struct hle_pool *p, uint64_t timeout_ns) {
    /* during a recovery, this thread acts for the dead participant (it may
     * not have joined: a process joining a full table recovers first) */
    uint64_t me = hle_tls_rec >= 0 ? HL_HEAP_REC_FLAG | HL_OWNER(hle_tls_rec_inc, hle_tls_rec) : HL_OWNER(c->inc, c->me);
    uint64_t t0 = 0;
    for (unsigned n = 0;; n++) {
        uint64_t cur = 0;
        if (cas(p->lock, &cur, me)) return 1;
        if (n < 64) {
            cpu_relax();
            continue;
        }
        if ((n & 63) == 0) {
            if (!hle_owner_alive(c, cur)) {
                if (cas(p->lock, &cur, me)) {
                    hle_pool_repair(c, p);
                    return 1;
                }
            }
            uint64_t t = now_ns();
            if (!t0) t0 = t;
            if (t - t0 >= timeout_ns) return 0;
        }
        sched_yield();
    }
}

void hle_pool_unlock(const struct hle_pool *p) { st(p->lock, 0); }

static void hle_bits_set(uint64_t *bm, uint64_t g, uint64_t n, int on) {
    while (n) {
        uint64_t w = g / 64, b = g % 64;
        uint64_t k = 64 - b < n ? 64 - b : n;
        uint64_t m = (k == 64) ? ~0ull : (((1ull << k) - 1) << b);
        if (on)
            bm[w] |= m;
        else
            bm[w] &= ~m;
        g += k;
        n -= k;
    }
}

/* The extent slot f owns in pool p: 1 with *g, *n when it owns one that lies
 * inside the pool (an extent outside it is ignored: check() reports it).
 * Host heap: parents[0..1] (any block kind); device heap i: a buffer whose
 * placement names i, first granule word / granule, err[63:8] granules. */
static int hle_slot_extent(const struct hle_pool *p, struct hl_fence *f, uint64_t ctl, uint64_t *g, uint64_t *n) {
    if (!HAS_BLOCK(HL_CTL_KIND(ctl))) return 0;
    if (p->dev < 0) {
        *g = ld(&f->parents[0]);
        *n = ld(&f->parents[1]);
    } else {
        uint64_t e = ld(&f->err), w = ld(&f->word);
        if (HL_CTL_KIND(ctl) != HL_KIND_BUFFER || HL_PLACE_HEAP(e) != p->dev || w % p->granule) return 0;
        *g = w / p->granule;
        *n = HL_PLACE_GRANULES(e);
    }
    return *n && *g <= p->granules && *n <= p->granules - *g;
}

/* Rebuild a pool's bitmap from the buffer slots (lock held). */
static void hle_pool_repair(hle_ctx *c, const struct hle_pool *p) {
    memset(p->bm, 0, (p->granules + 63) / 64 * 8);
    uint64_t used = 0, g, n;
    for (uint32_t i = 0; i < c->cap; i++) {
        struct hl_fence *f = slot(c, i);
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) == HL_SLOT_FREE || !hle_slot_extent(p, f, ctl, &g, &n)) continue;
        hle_bits_set(p->bm, g, n, 1);
        used += n;
    }
    *p->used = used; /* counters: plain accesses under the lock, as the bitmap */
    *p->repairs += 1;
}

/* First fit of n granules starting at a multiple of `align` granules, from
 * the hint, wrapping once.  Returns the first granule or UINT64_MAX. */
static uint64_t hle_pool_find(const struct hle_pool *p, uint64_t n, uint64_t align) {
    uint64_t G = p->granules;
    const uint64_t *bm = p->bm;
    if (n > G) return UINT64_MAX;
    uint64_t hint = __atomic_load_n(p->hint, __ATOMIC_RELAXED); /* read once: checked, then used */
    if (hint >= G) hint = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t g = pass == 0 ? hint : 0;
        uint64_t end = pass == 0 ? G : hint + n;
        if (end > G) end = G;
        g = ALIGN_UP(g, align);
        while (g + n <= end) {
            /* skip full words quickly */
            if (g % 64 == 0 && bm[g / 64] == ~0ull) {
                g = ALIGN_UP(g + 64, align);
                continue;
            }
            uint64_t run = 0;
            while (run < n) {
                uint64_t x = g + run;
                if (x % 64 == 0 && n - run >= 64 && bm[x / 64] == 0) {
                    run += 64;
                    continue;
                }
                if (bm[x / 64] & (1ull << (x % 64))) break;
                run++;
            }
            if (run >= n) return g;
            g = ALIGN_UP(g + run + 1, align);
        }
    }
    return UINT64_MAX;
}

/* Highest set bit of the bitmap in [lo, hi), or UINT64_MAX when all are clear. */
static uint64_t hle_last_set(const uint64_t *bm, uint64_t lo, uint64_t hi) {
    uint64_t x = hi;
    while (x > lo) {
        uint64_t w = (x - 1) / 64;
        uint64_t wlo = w * 64 < lo ? lo : w * 64;
        uint64_t hi_bit = x - w * 64, lo_bit = wlo - w * 64; /* 1..64, 0..63 */
        uint64_t mask = (hi_bit == 64 ? ~0ull : ((1ull << hi_bit) - 1)) & ~((1ull << lo_bit) - 1);
        uint64_t m = bm[w] & mask;
        if (m) return w * 64 + 63 - (uint64_t)__builtin_clzll(m);
        x = wlo;
    }
    return UINT64_MAX;
}

/* Last fit: the highest aligned free run of n granules.  Large blocks are
 * placed from the top of the heap down, small ones from the bottom up, so
 * that the two kinds do not cut each other's free space into pieces. */
static uint64_t hle_pool_find_down(const struct hle_pool *p, uint64_t n, uint64_t align) {
    uint64_t G = p->granules;
    if (n == 0 || n > G) return UINT64_MAX;
    uint64_t g = (G - n) / align * align;
    for (;;) {
        uint64_t ls = hle_last_set(p->bm, g, g + n);
        if (ls == UINT64_MAX) return g;
        if (ls < n) return UINT64_MAX;
        g = (ls - n) / align * align; /* the run must end at or before the set bit */
    }
}

/* Largest free run and free total, for stats (lock held). */
static void hle_pool_scan(const struct hle_pool *p, uint64_t *free_g, uint64_t *largest, uint64_t *runs) {
    uint64_t cur = 0, fr = 0, lg = 0, nr = 0, G = p->granules;
    const uint64_t *bm = p->bm;
    for (uint64_t g = 0; g < G; g++) {
        if (g % 64 == 0 && G - g >= 64 && (bm[g / 64] == 0 || bm[g / 64] == ~0ull)) {
            if (bm[g / 64] == 0) {
                if (cur == 0) nr++;
                cur += 64;
                fr += 64;
            } else {
                if (cur > lg) lg = cur;
                cur = 0;
            }
            g += 63;
            continue;
        }
        if (bm[g / 64] & (1ull << (g % 64))) {
            if (cur > lg) lg = cur;
            cur = 0;
        } else {
            if (cur == 0) nr++;
            cur++;
            fr++;
        }
    }
    if (cur > lg) lg = cur;
    *free_g = fr;
    *largest = lg;
    *runs = nr;
}

/* Free slot idx's extent in pool p, whose lock we hold (idempotent: the
 * extent's length is zeroed together with the bits). */
static void hle_pool_free_locked(hle_ctx *c, const struct hle_pool *p, uint32_t idx) {
    struct hl_fence *f = slot(c, idx);
    uint64_t g, n, ctl = ld(&f->ctl);
    if (hle_slot_extent(p, f, ctl, &g, &n)) {
        hle_bits_set(p->bm, g, n, 0);
        *p->used -= n <= *p->used ? n : *p->used;
        if (g < *p->hint) *p->hint = g;
    }
    if (p->dev < 0)
        st(&f->parents[1], 0);
    else
        st(&f->err, HL_PLACE(p->dev, 0));
}

/* The same, taking the lock for at most HEAP_FREE_WAIT_NS: 1 done, 0 the lock was kept. */
static int hle_pool_free(hle_ctx *c, const struct hle_pool *p, uint32_t idx) {
    if (!hle_pool_lock_for(c, p, HEAP_FREE_WAIT_NS)) return 0;
    hle_pool_free_locked(c, p, idx);
    hle_pool_unlock(p);
    return 1;
}

/* Free the extents of block slot idx: the device extent of a device buffer
 * first, then the heap block (contract in engine.h). */
int hle_heap_free_block(hle_ctx *c, uint32_t idx) {
    struct hle_pool p;
    int dev = HL_PLACE_HEAP(ld(&slot(c, idx)->err));
    if (HL_CTL_KIND(ld(&slot(c, idx)->ctl)) == HL_KIND_BUFFER && dev >= 0 && hle_pool(c, dev + 1, &p) &&
        !hle_pool_free(c, &p, idx))
        return 0;
    if (!hle_pool(c, 0, &p)) return 1;
    return hle_pool_free(c, &p, idx);
}

/* The error for a pool lock that a live participant keeps. */
int hle_pool_lock_error(hle_ctx *c, const struct hle_pool *p) {
    uint64_t l = ld(p->lock);
    int i = HL_OWNER_INDEX((uint32_t)l);
    unsigned pid = (i >= 0 && (uint32_t)i < c->pcap) ? c->parts[i].pid : 0;
    char what[40];
    if (p->dev < 0)
        snprintf(what, sizeof what, "the shared heap");
    else
        snprintf(what, sizeof what, "the device heap cuda:%u", c->dv.devheap_ordinal[p->dev]);
    return hle_fail(HL_E_LOCKED,
           "%s is locked by participant %d (pid %u, lock word 0x%llx) for more than %.1f s: "
           "it is stopped inside an allocation, or the lock word was overwritten",
           what, i, pid, (unsigned long long)l, HEAP_LOCK_WAIT_NS / 1e9);
}

/* A block whose free found the heap lock held by a live participant: its
 * slot stays DYING (ours) until hle_retry_deferred() frees it (the watchdog, the
 * next allocation).  If we die first, our recovery finishes it. */
void hle_defer_free(hle_ctx *c, uint32_t idx, uint64_t dying) {
    pthread_mutex_lock(&c->defer_mu);
    if (c->ndefer < DEFER_MAX) {
        c->defer_idx[c->ndefer] = idx;
        c->defer_ctl[c->ndefer] = dying;
        c->ndefer++;
    } /* else: it stays DYING until our recovery (check() shows it) */
    pthread_mutex_unlock(&c->defer_mu);
}

void hle_retry_deferred(hle_ctx *c) {
    if (!__atomic_load_n(&c->ndefer, __ATOMIC_RELAXED)) return;
    uint32_t idx[DEFER_MAX];
    uint64_t ctl[DEFER_MAX];
    pthread_mutex_lock(&c->defer_mu);
    int n = c->ndefer;
    memcpy(idx, c->defer_idx, sizeof(uint32_t) * (size_t)n);
    memcpy(ctl, c->defer_ctl, sizeof(uint64_t) * (size_t)n);
    c->ndefer = 0;
    pthread_mutex_unlock(&c->defer_mu);
    for (int i = 0; i < n; i++)
        if (ld(&slot(c, idx[i])->ctl) == ctl[i]) hle_finalize(c, idx[i], ctl[i]); /* may defer again */
}

/* Take pool p's lock for an allocation (GIL released while waiting). */
static int hle_pool_lock_unlocked(hle_ctx *c, const struct hle_pool *p) {
    BUSY_ENTER(c);
    void *tok = hle_unlock(c); /* a lock wait never holds the GIL */
    int locked = hle_pool_lock_for(c, p, HEAP_LOCK_WAIT_NS);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    return locked;
}

/* Allocate n granules (aligned to `align`; large: from the top down) in pool
 * p for ALLOC slot f and record the extent in it, all under the pool's lock.
 * Returns the first granule, UINT64_MAX when no run is free (*used: the used
 * granules then), or HL_E_LOCKED as a negative int64 in *err. */
static uint64_t hle_pool_alloc(hle_ctx *c, const struct hle_pool *p, struct hl_fence *f, uint64_t n, uint64_t align,
                               int large, uint64_t head, uint64_t nbytes, uint64_t *used, int *err) {
    *err = 0;
    if (!hle_pool_lock_unlocked(c, p)) {
        *err = hle_pool_lock_error(c, p);
        return UINT64_MAX;
    }
    uint64_t g = large ? hle_pool_find_down(p, n, align) : hle_pool_find(p, n, align);
    if (g != UINT64_MAX) {
        hle_bits_set(p->bm, g, n, 1);
        *p->used += n;
        *p->allocs += 1;
        if (!large) *p->hint = g + n < p->granules ? g + n : 0;
        st(&f->word, g * p->granule + head);
        st(&f->aux, nbytes);
        if (p->dev < 0) {
            st(&f->parents[0], g);
            st(&f->parents[1], n);
        } else {
            st(&f->err, HL_PLACE(p->dev, n)); /* after word: a repair reads the extent from both */
        }
    }
    *used = *p->used;
    hle_pool_unlock(p);
    return g;
}

static int hle_oom(int code, const char *where, uint64_t nbytes, uint64_t free, uint64_t size, const char *why) {
    return hle_fail(code, "cannot allocate %llu bytes from %s: %llu of %llu bytes free%s", (unsigned long long)nbytes,
                    where, (unsigned long long)free, (unsigned long long)size, why);
}

/* Allocate a buffer of nbytes with its metadata; returns HL_OK with the handle
 * and the data's offset in the mapping (contract in engine.h). */
int hle_block_new(hle_ctx *c, uint32_t kind, uint64_t nbytes, const void *meta, uint32_t qcap, uint64_t *handle,
                  uint64_t *abs_off) {
    struct hle_pool p;
    if (!hle_pool(c, 0, &p) || c->meta_heap)
        return hle_fail(HL_E_OOM, "this domain has no heap (create it with heap=...)%s",
                        c->meta_heap ? "; its small heap holds only the device buffers' metadata" : "");
    if (nbytes == 0) return hle_fail(HL_E_VALUE, "a buffer needs at least one byte");
    uint64_t size = c->dv.heap_data_size;
    if (nbytes > size)
        return hle_oom(HL_E_OOM, "the shared heap", nbytes, (p.granules - ld(p.used)) * HL_GRANULE, size, "");
    int large = nbytes >= HL_LARGE_BUFFER;
    uint64_t head = large ? HL_PAGE : HL_BUFFER_META_SIZE;
    uint64_t body = large ? ALIGN_UP(nbytes, HL_PAGE) : ALIGN_UP(nbytes, HL_GRANULE);
    uint64_t n = (head + body) / HL_GRANULE;
    uint32_t gen;
    int idx = hle_alloc_begin(c, kind, 0, 0, &gen);
    if (idx < 0) return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots; buffers use slots too)", c->cap);
    struct hl_fence *f = slot(c, (uint32_t)idx);
    st(&f->err, 0); /* placement: host (ALLOC: the slot is ours alone) */
    hle_retry_deferred(c);
    uint64_t used;
    int err;
    uint64_t g = hle_pool_alloc(c, &p, f, n, large ? HL_PAGE / HL_GRANULE : 1, large, head, nbytes, &used, &err);
    if (g == UINT64_MAX) {
        hle_alloc_abort(c, (uint32_t)idx, kind, gen);
        if (err) return err;
        return hle_oom(HL_E_OOM, "the shared heap", nbytes, (p.granules - used) * HL_GRANULE, size,
                       " (no free run large enough)");
    }
    uint64_t data = (uint64_t)(c->dv.heap_data - c->base) + g * HL_GRANULE + head;
    if (meta) memcpy(c->base + data - HL_BUFFER_META_SIZE, meta, HL_BUFFER_META_SIZE);
    if (kind == HL_KIND_QUEUE) hle_queue_init((struct hl_queue *)(c->base + data), qcap);
    *handle = hle_alloc_publish(c, (uint32_t)idx, kind, gen);
    *abs_off = data;
    return HL_OK;
}

/* Contract in engine.h.  The metadata block first (host heap), then the
 * device extent; a failure gives both back.  A participant killed between
 * the steps leaves an ALLOC slot whose recovery frees what it recorded. */
static int hle_device_buffer_new_(hle_ctx *c, int dev, uint64_t nbytes, const void *meta, uint64_t *handle,
                                  uint64_t *dev_off, int stop);
int hle_device_buffer_new(hle_ctx *c, int dev, uint64_t nbytes, const void *meta, uint64_t *handle,
                          uint64_t *dev_off) {
    return hle_device_buffer_new_(c, dev, nbytes, meta, handle, dev_off, 0);
}
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */

/* Test hook: stop a device allocation after `stage` (1: the metadata block,
 * 2: the device extent) with its slot left ALLOC, as a participant killed
 * there would.  HL_OK; the codes of hle_device_buffer_new. */
int hle_device_buffer_stuck(hle_ctx *c, int dev, uint64_t nbytes, int stage) {
    uint64_t h, off;
    return hle_device_buffer_new_(c, dev, nbytes, NULL, &h, &off, stage);
}
#endif

static int hle_device_buffer_new_(hle_ctx *c, int dev, uint64_t nbytes, const void *meta, uint64_t *handle,
                                  uint64_t *dev_off, int stop) {
    struct hle_pool hp, dp;
    if (dev < 0 || !hle_pool(c, dev + 1, &dp))
        return hle_fail(HL_E_RANGE, "this domain has no device heap %d (it has %u)", dev, c->dv.devheap_count);
    if (!hle_pool(c, 0, &hp)) return hle_fail(HL_E_OOM, "this domain has no heap for the buffers' metadata");
    if (nbytes == 0) return hle_fail(HL_E_VALUE, "a buffer needs at least one byte");
    char where[48];
    snprintf(where, sizeof where, "the device heap cuda:%u", c->dv.devheap_ordinal[dev]);
    uint64_t size = dp.granules * dp.granule;
    if (nbytes > size) return hle_oom(HL_E_DEVICE_FULL, where, nbytes, (dp.granules - ld(dp.used)) * dp.granule, size, "");
    int large = nbytes >= HL_LARGE_BUFFER;
    uint64_t n = ALIGN_UP(nbytes, dp.granule) / dp.granule;
    uint32_t gen;
    int idx = hle_alloc_begin(c, HL_KIND_BUFFER, 0, 0, &gen);
    if (idx < 0) return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots; buffers use slots too)", c->cap);
    struct hl_fence *f = slot(c, (uint32_t)idx);
    st(&f->err, 0);
    hle_retry_deferred(c);
    uint64_t used;
    int err;
    uint64_t mg = hle_pool_alloc(c, &hp, f, HL_BUFFER_META_SIZE / HL_GRANULE, 1, 0, 0, nbytes, &used, &err);
    if (mg == UINT64_MAX) {
        hle_alloc_abort(c, (uint32_t)idx, HL_KIND_BUFFER, gen);
        if (err) return err;
        return hle_oom(HL_E_OOM, "the shared heap (a device buffer's metadata)", HL_BUFFER_META_SIZE,
                       (hp.granules - used) * HL_GRANULE, c->dv.heap_data_size, "");
    }
    if (stop == 1) return HL_OK;
    uint64_t g = hle_pool_alloc(c, &dp, f, n, 1, large, 0, nbytes, &used, &err);
    if (g == UINT64_MAX) {
        if (hle_pool_lock_unlocked(c, &hp)) { /* our own block back */
            hle_pool_free_locked(c, &hp, (uint32_t)idx);
            hle_pool_unlock(&hp);
        } /* else (the lock kept 2 s by a live holder) it leaks until the next repair; check() shows it */
        hle_alloc_abort(c, (uint32_t)idx, HL_KIND_BUFFER, gen);
        if (err) return err;
        return hle_oom(HL_E_DEVICE_FULL, where, nbytes, (dp.granules - used) * dp.granule, size,
                       " (no free run large enough)");
    }
    if (stop) return HL_OK;
    if (meta) memcpy(c->dv.heap_data + mg * HL_GRANULE, meta, HL_BUFFER_META_SIZE);
    *handle = hle_alloc_publish(c, (uint32_t)idx, HL_KIND_BUFFER, gen);
    *dev_off = g * dp.granule;
    return HL_OK;
}

int hle_pool_stats(hle_ctx *c, int pi, struct hle_heap_stats *s) {
    struct hle_pool p;
    memset(s, 0, sizeof *s);
    if (!hle_pool(c, pi, &p)) return HL_OK;
    uint64_t fr = 0, lg = 0, runs = 0, used = 0, repairs = 0, allocs = 0;
    int locked;
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    locked = hle_pool_lock_for(c, &p, HEAP_LOCK_WAIT_NS);
    if (locked) {
        hle_pool_scan(&p, &fr, &lg, &runs);
        used = *p.used;
        repairs = *p.repairs;
        allocs = *p.allocs;
        hle_pool_unlock(&p);
    }
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (!locked) return hle_pool_lock_error(c, &p);
    s->size = p.granules * p.granule;
    s->used = used * p.granule;
    s->free = fr * p.granule;
    s->largest_free = lg * p.granule;
    s->free_runs = runs;
    s->repairs = repairs;
    s->allocs = allocs;
    s->data_offset = p.dev < 0 ? (uint64_t)(c->dv.heap_data - c->base) : 0;
    s->granule = p.granule;
    return HL_OK;
}

uint64_t hle_pool_bitmap_bytes(hle_ctx *c, int pi) {
    struct hle_pool p;
    return hle_pool(c, pi, &p) ? (p.granules + 63) / 64 * 8 : 0;
}

int hle_pool_snapshot(hle_ctx *c, int pi, void *bits, void *slots, uint64_t *used) {
    struct hle_pool p;
    if (!hle_pool(c, pi, &p)) return hle_fail(HL_E_RANGE, "no heap %d", pi);
    int locked;
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    locked = hle_pool_lock_for(c, &p, HEAP_LOCK_WAIT_NS);
    if (locked) {
        memcpy(bits, p.bm, (p.granules + 63) / 64 * 8);
        memcpy(slots, c->fences, (size_t)c->cap * HL_FENCE_SIZE);
        *used = *p.used;
        hle_pool_unlock(&p);
    }
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (!locked) return hle_pool_lock_error(c, &p);
    return HL_OK;
}
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */

int hle_pool_lock_forever(hle_ctx *c, int pi) {
    struct hle_pool p;
    if (!hle_pool(c, pi, &p)) return pi == 0 ? HL_OK : hle_fail(HL_E_RANGE, "no heap %d", pi);
    if (!hle_pool_lock_for(c, &p, HEAP_LOCK_WAIT_NS)) return hle_pool_lock_error(c, &p);
    return HL_OK;
}
#endif
