/*
 * heap.c -- the shared heap: a bitmap of granules under one lock word that
 * names its holder (layout and rules in hostless.h, "Buffers").  A lock held
 * by a dead participant is broken and the bitmap rebuilt from the buffer
 * slots; a free that finds the lock kept by a live holder is deferred.
 */
#include "engine.h"

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

static void hle_heap_repair(hle_ctx *c, struct hl_heap *hp);

/* Take the heap lock.  A lock held by a dead participant (or holding a
 * corrupt value) is broken, and the bitmap rebuilt from the slots. */
__thread int hle_tls_deferred;        /* a finalize of this thread could not free its block */

/* Take the heap lock within timeout_ns.  Returns 1 when taken, 0 when a live
 * holder kept it (a participant stopped inside the critical section, or a
 * hostile lock word naming a live participant).  Never called with the GIL
 * held for more than HEAP_FREE_WAIT_NS. */
int hle_heap_lock_for(hle_ctx *c, struct hl_heap *hp, uint64_t timeout_ns) {
    /* during a recovery, this thread acts for the dead participant (it may
     * not have joined: a process joining a full table recovers first) */
    uint64_t me = hle_tls_rec >= 0 ? HL_HEAP_REC_FLAG | HL_OWNER(hle_tls_rec_inc, hle_tls_rec) : HL_OWNER(c->inc, c->me);
    uint64_t t0 = 0;
    for (unsigned n = 0;; n++) {
        uint64_t cur = 0;
        if (cas(&hp->lock, &cur, me)) return 1;
        if (n < 64) {
            cpu_relax();
            continue;
        }
        if ((n & 63) == 0) {
            if (!hle_owner_alive(c, cur)) {
                if (cas(&hp->lock, &cur, me)) {
                    hle_heap_repair(c, hp);
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

void hle_heap_unlock(struct hl_heap *hp) { st(&hp->lock, 0); }

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

/* Rebuild the bitmap from the buffer slots (lock held). */
static void hle_heap_repair(hle_ctx *c, struct hl_heap *hp) {
    uint64_t *bm = c->dv.heap_bitmap;
    memset(bm, 0, (c->dv.heap_granules + 63) / 64 * 8);
    uint64_t used = 0;
    for (uint32_t i = 0; i < c->cap; i++) {
        struct hl_fence *f = slot(c, i);
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) == HL_SLOT_FREE || !HAS_BLOCK(HL_CTL_KIND(ctl))) continue;
        uint64_t g = ld(&f->parents[0]), n = ld(&f->parents[1]);
        if (n == 0 || g > c->dv.heap_granules || n > c->dv.heap_granules - g) continue; /* check() reports bad extents */
        hle_bits_set(bm, g, n, 1);
        used += n;
    }
    hp->used_granules = used;
    hp->repairs++;
}

/* First fit of n granules starting at a multiple of `align` granules, from
 * the hint, wrapping once.  Returns the first granule or UINT64_MAX. */
static uint64_t hle_heap_find(hle_ctx *c, struct hl_heap *hp, const uint64_t *bm, uint64_t n, uint64_t align) {
    uint64_t G = c->dv.heap_granules;
    if (n > G) return UINT64_MAX;
    uint64_t hint = __atomic_load_n(&hp->hint, __ATOMIC_RELAXED); /* read once: checked, then used */
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
static uint64_t hle_heap_find_down(hle_ctx *c, const uint64_t *bm, uint64_t n, uint64_t align) {
    uint64_t G = c->dv.heap_granules;
    if (n == 0 || n > G) return UINT64_MAX;
    uint64_t g = (G - n) / align * align;
    for (;;) {
        uint64_t ls = hle_last_set(bm, g, g + n);
        if (ls == UINT64_MAX) return g;
        if (ls < n) return UINT64_MAX;
        g = (ls - n) / align * align; /* the run must end at or before the set bit */
    }
}

/* Largest free run and free total, for stats (lock held). */
static void hle_heap_scan(hle_ctx *c, const uint64_t *bm, uint64_t *free_g, uint64_t *largest, uint64_t *runs) {
    uint64_t cur = 0, fr = 0, lg = 0, nr = 0;
    for (uint64_t g = 0; g < c->dv.heap_granules; g++) {
        if (g % 64 == 0 && c->dv.heap_granules - g >= 64 && (bm[g / 64] == 0 || bm[g / 64] == ~0ull)) {
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

/* Free the block of buffer slot idx (idempotent: the extent is zeroed under
 * the lock together with the bits). */
int hle_heap_free_block(hle_ctx *c, uint32_t idx) {
    struct hl_heap *hp = heap(c);
    if (!hp) return 1;
    struct hl_fence *f = slot(c, idx);
    if (!hle_heap_lock_for(c, hp, HEAP_FREE_WAIT_NS)) return 0;
    uint64_t g = ld(&f->parents[0]), n = ld(&f->parents[1]);
    if (n && g <= c->dv.heap_granules && n <= c->dv.heap_granules - g) {
        hle_bits_set(c->dv.heap_bitmap, g, n, 0);
        hp->used_granules -= n <= hp->used_granules ? n : hp->used_granules;
        if (g < hp->hint) hp->hint = g;
    }
    st(&f->parents[1], 0);
    hle_heap_unlock(hp);
    return 1;
}

/* The error for a heap lock that a live participant keeps. */
int hle_heap_lock_error(hle_ctx *c, struct hl_heap *hp) {
    uint64_t l = ld(&hp->lock);
    int i = HL_OWNER_INDEX((uint32_t)l);
    unsigned pid = (i >= 0 && (uint32_t)i < c->pcap) ? c->parts[i].pid : 0;
    return hle_fail(HL_E_LOCKED,
           "the shared heap is locked by participant %d (pid %u, lock word 0x%llx) for more than %.1f s: "
           "it is stopped inside an allocation, or the lock word was overwritten",
           i, pid, (unsigned long long)l, HEAP_LOCK_WAIT_NS / 1e9);
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

/* Allocate a buffer of nbytes with its metadata; returns HL_OK with the handle
 * and the data's offset in the mapping (contract in engine.h). */
int hle_block_new(hle_ctx *c, uint32_t kind, uint64_t nbytes, const void *meta, uint32_t qcap, uint64_t *handle,
                  uint64_t *abs_off) {
    struct hl_heap *hp = heap(c);
    if (!hp) return hle_fail(HL_E_OOM, "this domain has no heap (create it with heap=...)");
    if (nbytes == 0) return hle_fail(HL_E_VALUE, "a buffer needs at least one byte");
    if (nbytes > c->dv.heap_data_size)
        return hle_fail(HL_E_OOM, "cannot allocate %llu bytes from the shared heap: %llu of %llu bytes free",
                        (unsigned long long)nbytes,
                        (unsigned long long)((c->dv.heap_granules - ld(&hp->used_granules)) * HL_GRANULE),
                        (unsigned long long)c->dv.heap_data_size);
    int large = nbytes >= HL_LARGE_BUFFER;
    uint64_t head = large ? HL_PAGE : HL_BUFFER_META_SIZE;
    uint64_t body = large ? ALIGN_UP(nbytes, HL_PAGE) : ALIGN_UP(nbytes, HL_GRANULE);
    uint64_t n = (head + body) / HL_GRANULE;
    uint64_t align = large ? HL_PAGE / HL_GRANULE : 1;
    uint32_t gen;
    int idx = hle_alloc_begin(c, kind, 0, 0, &gen);
    if (idx < 0) return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots; buffers use slots too)", c->cap);
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t g, used;
    int locked;
    hle_retry_deferred(c);
    BUSY_ENTER(c);
    void *tok = hle_unlock(c); /* a lock wait never holds the GIL */
    locked = hle_heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (!locked) {
        hle_alloc_abort(c, (uint32_t)idx, kind, gen);
        return hle_heap_lock_error(c, hp);
    }
    uint64_t *bm = c->dv.heap_bitmap;
    g = large ? hle_heap_find_down(c, bm, n, align) : hle_heap_find(c, hp, bm, n, align);
    if (g != UINT64_MAX) {
        hle_bits_set(bm, g, n, 1);
        hp->used_granules += n;
        hp->allocs++;
        if (!large) hp->hint = g + n < c->dv.heap_granules ? g + n : 0;
        st(&f->parents[0], g);
        st(&f->parents[1], n);
        st(&f->word, g * HL_GRANULE + head);
        st(&f->aux, nbytes);
    }
    used = hp->used_granules;
    hle_heap_unlock(hp);
    if (g == UINT64_MAX) {
        hle_alloc_abort(c, (uint32_t)idx, kind, gen);
        return hle_fail(HL_E_OOM,
                        "cannot allocate %llu bytes from the shared heap: %llu of %llu bytes free (no free run large "
                        "enough)",
                        (unsigned long long)nbytes, (unsigned long long)((c->dv.heap_granules - used) * HL_GRANULE),
                        (unsigned long long)c->dv.heap_data_size);
    }
    uint64_t data = (uint64_t)(c->dv.heap_data - c->base) + g * HL_GRANULE + head;
    if (meta) memcpy(c->base + data - HL_BUFFER_META_SIZE, meta, HL_BUFFER_META_SIZE);
    if (kind == HL_KIND_QUEUE) hle_queue_init((struct hl_queue *)(c->base + data), qcap);
    *handle = hle_alloc_publish(c, (uint32_t)idx, kind, gen);
    *abs_off = data;
    return HL_OK;
}

int hle_heap_stats(hle_ctx *c, struct hle_heap_stats *s) {
    struct hl_heap *hp = heap(c);
    memset(s, 0, sizeof *s);
    if (!hp) return HL_OK;
    uint64_t fr = 0, lg = 0, runs = 0, used = 0, repairs = 0, allocs = 0;
    int locked;
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    locked = hle_heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS);
    if (locked) {
        hle_heap_scan(c, c->dv.heap_bitmap, &fr, &lg, &runs);
        used = hp->used_granules;
        repairs = hp->repairs;
        allocs = hp->allocs;
        hle_heap_unlock(hp);
    }
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (!locked) return hle_heap_lock_error(c, hp);
    s->size = c->dv.heap_data_size;
    s->used = used * HL_GRANULE;
    s->free = fr * HL_GRANULE;
    s->largest_free = lg * HL_GRANULE;
    s->free_runs = runs;
    s->repairs = repairs;
    s->allocs = allocs;
    s->data_offset = (uint64_t)(c->dv.heap_data - c->base);
    return HL_OK;
}

uint64_t hle_heap_bitmap_bytes(hle_ctx *c) { return (c->dv.heap_granules + 63) / 64 * 8; }

int hle_heap_snapshot(hle_ctx *c, void *bits, void *slots, uint64_t *used, int *has_heap) {
    struct hl_heap *hp = heap(c);
    *has_heap = hp != NULL;
    if (!hp) return HL_OK;
    int locked;
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    locked = hle_heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS);
    if (locked) {
        memcpy(bits, c->dv.heap_bitmap, hle_heap_bitmap_bytes(c));
        memcpy(slots, c->fences, (size_t)c->cap * HL_FENCE_SIZE);
        *used = hp->used_granules;
        hle_heap_unlock(hp);
    }
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (!locked) return hle_heap_lock_error(c, hp);
    return HL_OK;
}

int hle_heap_lock_forever(hle_ctx *c) {
    struct hl_heap *hp = heap(c);
    if (!hp) return HL_OK;
    if (!hle_heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS)) return hle_heap_lock_error(c, hp);
    return HL_OK;
}
