/*
 * _core.c -- the small C core of hostless: everything that needs atomics,
 * futexes or speed.  The shared layout and the single-word operations come
 * from hostless.h; this file adds what needs the whole table: allocation,
 * references, merged fences, waits with futex sleeps, liveness and recovery.
 *
 * Every index read from shared memory is bounds-checked before use.
 * Nothing here takes a lock in shared memory: every shared update is one
 * atomic operation, so a participant killed at any instruction leaves a state
 * that recovery (recover_participant) finishes or rolls back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hostless.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
struct hl_futex_waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};
#define HL_FUTEX2_SIZE_U32 0x02
#define HL_FUTEX2_PRIVATE 128

#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define HL_KIND_SYNC 255u
#define HAS_BLOCK(k) ((k) == HL_KIND_BUFFER || (k) == HL_KIND_QUEUE) /* check_handle: any fence, merged fence or timeline */

static PyObject *E_OOM, *E_QueueFull, *E_Closed;
static PyObject *E_Hostless, *E_Corrupt, *E_Full, *E_Handle, *E_Already, *E_Invalid;

/* PyErr_Format lacks %llx on older Pythons: format with vsnprintf. */
__attribute__((format(printf, 2, 3))) static void hl_err(PyObject *exc, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PyErr_SetString(exc, buf);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline int cas(uint64_t *p, uint64_t *e, uint64_t d) {
    return __atomic_compare_exchange_n(p, e, d, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    char *base;
    size_t size;
    int fd;
    struct hl_header *h;
    struct hl_participant *parts;
    struct hl_fence *fences;
    uint32_t cap, pcap, tag;
    int me;          /* participant index, -1 when not joined */
    uint64_t mybit;
    uint32_t inc;    /* incarnation of our participant slot */
    uint32_t *lrefs; /* local reference counts per slot */
    uint32_t *lgen;  /* generation the local count belongs to */
    /* watchdog */
    pthread_t wd;
    int wd_running;
    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
    int wd_stop;
    uint64_t wd_interval_ns;
    uint32_t kick; /* private futex word for wait_any */
    long long spin_ns; /* default spin of waits through Handle */
    uint64_t poll_ns;  /* hl_header.poll_ns, validated at attach (private copy) */
    struct hl_dom dv;       /* the layout, validated once at attach (hostless.h): never re-read */
    struct hl_trace *trace; /* NULL when the domain has no trace ring */
    uint64_t trace_cap;     /* its capacity in events, validated at attach (private copy) */
    int closing;            /* leave() in progress: GIL-free loops bail out */
    int busy;               /* threads inside GIL-free sections */
    pthread_mutex_t reap_mu; /* one recovery at a time in this process */
#define DEFER_MAX 64
    pthread_mutex_t defer_mu; /* deferred block frees (heap lock held by a stopped participant) */
    int ndefer;
    uint32_t defer_idx[DEFER_MAX];
    uint64_t defer_ctl[DEFER_MAX];
    int truncated;            /* set by the SIGBUS guard: the file shrank under the mapping */
    int rec_busy;             /* participant whose liveness lock this process holds to recover it, -1: none.
                               * OFD locks of one open file description do not conflict with each other,
                               * so F_OFD_GETLK cannot show our own recovery to our other threads: this does */
} Core;

#define BUSY_ENTER(c) __atomic_add_fetch(&(c)->busy, 1, __ATOMIC_SEQ_CST)
#define BUSY_LEAVE(c) __atomic_sub_fetch(&(c)->busy, 1, __ATOMIC_SEQ_CST)
/* leave() in progress, or the file was truncated under us: loops without the GIL bail out */
#define CLOSING(c) (__atomic_load_n(&(c)->closing, __ATOMIC_SEQ_CST) || __atomic_load_n(&(c)->truncated, __ATOMIC_SEQ_CST))
#define CLOSED_ERROR(c, msg)                                                                           \
    PyErr_SetString(__atomic_load_n(&(c)->truncated, __ATOMIC_SEQ_CST) ? E_Corrupt : E_Closed,            \
                    __atomic_load_n(&(c)->truncated, __ATOMIC_SEQ_CST)                                    \
                        ? "the domain file was truncated while mapped (by another process?); "            \
                          "this domain is unusable: close it"                                             \
                        : msg)

static int part_lock_held(Core *c, int i);
static void trace_emit(Core *c, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d, uint64_t e);
static void propagate(Core *c, uint32_t idx, int depth);
static int recover_participant(Core *c, int d, uint64_t pctl);

/* ---- small helpers ---- */
static inline struct hl_fence *slot(Core *c, uint32_t idx) { return &c->fences[idx]; }

/* Wake the host sleepers of slot f (whose word we just changed): timelines
 * sleep on their wake sequence, fences and merged fences on the word. */
static void wake(struct hl_fence *f) {
    if (HL_CTL_KIND(ld(&f->ctl)) == HL_KIND_TIMELINE)
        hl_wake_timeline(f);
    else
        hl_wake_fence(f);
}

/* Two reads of ctl name the same object (generation and kind) in a state
 * where its fields belong to it (LIVE, or DYING while its last holder frees
 * it): the seqlock test of the write rule. */
static inline int same_object(uint64_t a, uint64_t b) {
    uint32_t s = HL_CTL_STATE(b);
    return (s == HL_SLOT_LIVE || s == HL_SLOT_DYING) && HL_CTL_GEN(a) == HL_CTL_GEN(b) &&
           HL_CTL_KIND(a) == HL_CTL_KIND(b);
}

/* Validate a handle against this domain; returns the index or -1 with an
 * exception set.  want_kind 0 accepts any kind. */
static int64_t check_handle(Core *c, uint64_t h, uint32_t want_kind, int need_held) {
    int64_t idx = HL_HANDLE_INDEX(h);
    if (HL_HANDLE_TAG(h) != c->tag || idx < 0 || (uint64_t)idx >= c->cap) {
        hl_err(E_Handle, "handle 0x%llx does not belong to this domain", (unsigned long long)h);
        return -1;
    }
    uint32_t k = HL_HANDLE_KIND(h);
    if (k < HL_KIND_FENCE || k > HL_KIND_QUEUE) {
        hl_err(E_Handle, "handle 0x%llx has an unknown kind %u", (unsigned long long)h, k);
        return -1;
    }
    static const char *names[] = {"?", "fence", "timeline", "merged fence", "buffer", "queue"};
    int ok = want_kind == 0 || k == want_kind || (want_kind == HL_KIND_FENCE && k == HL_KIND_MERGED) ||
             (want_kind == HL_KIND_SYNC && !HAS_BLOCK(k));
    if (!ok) {
        hl_err(E_Handle, "handle 0x%llx is a %s, not a %s", (unsigned long long)h, names[k],
               want_kind == HL_KIND_SYNC ? "fence or timeline" : names[want_kind]);
        return -1;
    }
    uint64_t ctl = ld(&slot(c, (uint32_t)idx)->ctl);
    if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE || (HL_CTL_GEN(ctl) & 0xffffffu) != HL_HANDLE_GEN(h) ||
        HL_CTL_KIND(ctl) != k) {
        hl_err(E_Handle, "handle 0x%llx is stale or forged (slot %lld is not that object)",
                     (unsigned long long)h, (long long)idx);
        return -1;
    }
    if (need_held && (c->lrefs[idx] == 0 || c->lgen[idx] != HL_HANDLE_GEN(h))) {
        hl_err(E_Handle, "handle 0x%llx is not held by this participant (released?)", (unsigned long long)h);
        return -1;
    }
    return idx;
}

/* ------------------------------------------------------------------ */
/* merged fences */

/* Record the first failure of a child in the merged parent named by `link`,
 * and upward in every merge above it that has none yet, so that the first
 * failure wins across a tree of merges too. */
static void record_failure(Core *c, uint64_t link, uint32_t status, int depth) {
    int64_t pidx = HL_LINK_INDEX(link);
    if (depth > 64 || pidx < 0 || (uint64_t)pidx >= c->cap) return;
    struct hl_fence *p = slot(c, (uint32_t)pidx);
    uint32_t gen = HL_LINK_GEN(link);
    uint64_t ctl = ld(&p->ctl);
    if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE || HL_CTL_KIND(ctl) != HL_KIND_MERGED ||
        (HL_CTL_GEN(ctl) & 0xffffffu) != gen || ld(&p->word))
        return;
    uint64_t e = ld(&p->err);
    while (((e >> 32) & 0xffffffu) == gen && (uint32_t)e == 0) {
        /* err carries the generation: this CAS cannot touch another object */
        if (cas(&p->err, &e, ((uint64_t)gen << 32) | status)) {
            uint64_t l[HL_MAX_PARENTS];
            for (int k = 0; k < HL_MAX_PARENTS; k++) l[k] = ld(&p->parents[k]);
            if (!same_object(ctl, ld(&p->ctl))) return; /* freed meanwhile: its links are not ours */
            for (int k = 0; k < HL_MAX_PARENTS; k++)
                if (l[k]) record_failure(c, l[k], status, depth + 1);
            return;
        }
    }
}

/* Complete merged slot pidx, read as LIVE `ctl`, when no child is pending:
 * first failure, else SUCCESS.  The completion is one 16-byte CAS over
 * {word, ctl}, so it lands only on that object (write rule (c)), however
 * stale the caller's view.  Returns 1 when this call completed it. */
static int resolve_merged(Core *c, uint32_t pidx, uint64_t ctl, int depth) {
    struct hl_fence *p = slot(c, pidx);
    uint32_t gen = HL_CTL_GEN(ctl) & 0xffffffu;
    if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE || HL_CTL_KIND(ctl) != HL_KIND_MERGED) return 0;
    uint64_t a = ld(&p->aux);
    if (((a >> 32) & 0xffffffu) != gen || (uint32_t)a != 0) return 0;
    uint64_t e = ld(&p->err);
    uint32_t fin = (((e >> 32) & 0xffffffu) == gen && (uint32_t)e) ? (uint32_t)e : HL_STATUS_SUCCESS;
    if (!hl_cas_word_ctl(p, 0, ctl, fin)) return 0;
    hl_wake_fence(p);
    if (depth < 64) propagate(c, pidx, depth + 1);
    return 1;
}

/* Clear child position `pos` in parent's pending mask; resolve the parent
 * when it reaches zero.  Idempotent. */
static void propagate_link(Core *c, uint64_t link, uint32_t status, int depth) {
    int64_t pidx = HL_LINK_INDEX(link);
    if (pidx < 0 || (uint64_t)pidx >= c->cap) return; /* corrupt link: ignored, check() reports it */
    struct hl_fence *p = slot(c, (uint32_t)pidx);
    uint32_t gen = HL_LINK_GEN(link);
    uint64_t ctl = ld(&p->ctl);
    if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE || HL_CTL_KIND(ctl) != HL_KIND_MERGED ||
        (HL_CTL_GEN(ctl) & 0xffffffu) != gen)
        return;
    uint32_t pos = HL_LINK_POS(link);
    if (pos >= HL_MERGE_MAX_CHILDREN) return;
    /* the failure is recorded before the bit is cleared: whoever clears the
     * last bit sees every failure */
    if (status != HL_STATUS_SUCCESS) record_failure(c, link, status, depth);
    uint64_t a = ld(&p->aux);
    for (;;) {
        if (((a >> 32) & 0xffffffu) != gen) return; /* aux carries the generation */
        if (!(a & (1ull << pos))) break;
        if (cas(&p->aux, &a, a & ~(1ull << pos))) {
            a &= ~(1ull << pos);
            break;
        }
    }
    if ((uint32_t)a != 0) return;
    resolve_merged(c, (uint32_t)pidx, ctl, depth);
}

/* 1 when `link` names a merged fence that still exists (same generation). */
static int link_live(Core *c, uint64_t link) {
    if (!link) return 0;
    int64_t pidx = HL_LINK_INDEX(link);
    if (pidx < 0 || (uint64_t)pidx >= c->cap) return 0;
    uint64_t ctl = ld(&slot(c, (uint32_t)pidx)->ctl);
    return HL_CTL_STATE(ctl) != HL_SLOT_FREE && HL_CTL_KIND(ctl) == HL_KIND_MERGED &&
           (HL_CTL_GEN(ctl) & 0xffffffu) == HL_LINK_GEN(link);
}

/* Tell the merged parents of completed slot idx.  Any participant may call
 * it (holder or not): the word and the links are read between two reads of
 * ctl, so a status never reaches the links of a later object in the slot. */
static void propagate(Core *c, uint32_t idx, int depth) {
    struct hl_fence *f = slot(c, idx);
    uint64_t c1 = ld(&f->ctl);
    uint32_t k = HL_CTL_KIND(c1);
    if (k != HL_KIND_FENCE && k != HL_KIND_MERGED) return;
    uint64_t w = ld(&f->word);
    if (w == 0) return;
    uint64_t l[HL_MAX_PARENTS];
    for (int i = 0; i < HL_MAX_PARENTS; i++) l[i] = ld(&f->parents[i]);
    if (!same_object(c1, ld(&f->ctl))) return;
    for (int i = 0; i < HL_MAX_PARENTS; i++)
        if (l[i]) propagate_link(c, l[i], (uint32_t)w, depth);
}

/* Finish what signals by plain stores (devices, firmware) left undone:
 * propagate signaled children to their parents and resolve merged fences
 * whose pending mask is empty. */
static void sweep(Core *c) {
    for (uint32_t i = 0; i < c->cap; i++) {
        struct hl_fence *f = slot(c, i);
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE) continue;
        uint32_t k = HL_CTL_KIND(ctl);
        if (k == HL_KIND_TIMELINE) continue;
        if ((ld(&f->parents[0]) || ld(&f->parents[1])) && ld(&f->word)) propagate(c, i, 0);
        if (k == HL_KIND_MERGED && ld(&f->word) == 0) resolve_merged(c, i, ctl, 0);
    }
}

/* ------------------------------------------------------------------ */
/* the shared heap (layout and rules in hostless.h, "Buffers") */

/* The heap of the private view (hl_attach validated its header once; its
 * layout values are never re-read from shared memory), or NULL. */
static struct hl_heap *heap(Core *c) { return c->dv.heap; }

/* Layout of a heap region able to hold `want` data bytes. */
static void heap_layout(uint64_t want, uint64_t *bitmap_off, uint64_t *granules, uint64_t *data_off,
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
#define HL_HEAP_REC_FLAG (1ull << 32)
static __thread int tls_rec = -1;       /* participant this thread recovers, -1: none */
static __thread uint32_t tls_rec_inc;   /* its incarnation (24 bits) */

static int owner_alive(Core *c, uint64_t o) {
    int i = HL_OWNER_INDEX((uint32_t)o);
    if ((o >> 32) & ~1ull || i < 0 || (uint32_t)i >= c->pcap) return 0;
    uint64_t pc = ld(&c->parts[i].ctl);
    uint32_t want = (o & HL_HEAP_REC_FLAG) ? HL_PART_RECOVERING : HL_PART_ALIVE;
    if (HL_PCTL_STATE(pc) != want || (HL_PCTL_INC(pc) & 0xffffffu) != HL_OWNER_INC((uint32_t)o)) return 0;
    if (i == tls_rec) return 0; /* we recover i: a holder naming i is a dead recoverer of i */
    return i == c->me || i == __atomic_load_n(&c->rec_busy, __ATOMIC_SEQ_CST) || part_lock_held(c, i);
}

static void heap_repair(Core *c, struct hl_heap *hp);
static void defer_free(Core *c, uint32_t idx, uint64_t dying);
static void retry_deferred(Core *c);

/* Take the heap lock.  A lock held by a dead participant (or holding a
 * corrupt value) is broken, and the bitmap rebuilt from the slots. */
#define HEAP_LOCK_WAIT_NS 2000000000ull /* the longest a heap-lock wait lasts (a holder is live but stuck) */
#define HEAP_FREE_WAIT_NS 2000000ull    /* a free waits this long, then is deferred (see finalize) */
static __thread int tls_deferred;        /* a finalize of this thread could not free its block */

/* Take the heap lock within timeout_ns.  Returns 1 when taken, 0 when a live
 * holder kept it (a participant stopped inside the critical section, or a
 * hostile lock word naming a live participant).  Never called with the GIL
 * held for more than HEAP_FREE_WAIT_NS. */
static int heap_lock_for(Core *c, struct hl_heap *hp, uint64_t timeout_ns) {
    /* during a recovery, this thread acts for the dead participant (it may
     * not have joined: a process joining a full table recovers first) */
    uint64_t me = tls_rec >= 0 ? HL_HEAP_REC_FLAG | HL_OWNER(tls_rec_inc, tls_rec) : HL_OWNER(c->inc, c->me);
    uint64_t t0 = 0;
    for (unsigned n = 0;; n++) {
        uint64_t cur = 0;
        if (cas(&hp->lock, &cur, me)) return 1;
        if (n < 64) {
            cpu_relax();
            continue;
        }
        if ((n & 63) == 0) {
            if (!owner_alive(c, cur)) {
                if (cas(&hp->lock, &cur, me)) {
                    heap_repair(c, hp);
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

static void heap_unlock(struct hl_heap *hp) { st(&hp->lock, 0); }

static void bits_set(uint64_t *bm, uint64_t g, uint64_t n, int on) {
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
static void heap_repair(Core *c, struct hl_heap *hp) {
    uint64_t *bm = c->dv.heap_bitmap;
    memset(bm, 0, (c->dv.heap_granules + 63) / 64 * 8);
    uint64_t used = 0;
    for (uint32_t i = 0; i < c->cap; i++) {
        struct hl_fence *f = slot(c, i);
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) == HL_SLOT_FREE || !HAS_BLOCK(HL_CTL_KIND(ctl))) continue;
        uint64_t g = ld(&f->parents[0]), n = ld(&f->parents[1]);
        if (n == 0 || g > c->dv.heap_granules || n > c->dv.heap_granules - g) continue; /* check() reports bad extents */
        bits_set(bm, g, n, 1);
        used += n;
    }
    hp->used_granules = used;
    hp->repairs++;
}

/* First fit of n granules starting at a multiple of `align` granules, from
 * the hint, wrapping once.  Returns the first granule or UINT64_MAX. */
static uint64_t heap_find(Core *c, struct hl_heap *hp, const uint64_t *bm, uint64_t n, uint64_t align) {
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
static uint64_t last_set(const uint64_t *bm, uint64_t lo, uint64_t hi) {
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
static uint64_t heap_find_down(Core *c, const uint64_t *bm, uint64_t n, uint64_t align) {
    uint64_t G = c->dv.heap_granules;
    if (n == 0 || n > G) return UINT64_MAX;
    uint64_t g = (G - n) / align * align;
    for (;;) {
        uint64_t ls = last_set(bm, g, g + n);
        if (ls == UINT64_MAX) return g;
        if (ls < n) return UINT64_MAX;
        g = (ls - n) / align * align; /* the run must end at or before the set bit */
    }
}

/* Largest free run and free total, for stats (lock held). */
static void heap_scan(Core *c, const uint64_t *bm, uint64_t *free_g, uint64_t *largest, uint64_t *runs) {
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
static int heap_free_block(Core *c, uint32_t idx) {
    struct hl_heap *hp = heap(c);
    if (!hp) return 1;
    struct hl_fence *f = slot(c, idx);
    if (!heap_lock_for(c, hp, HEAP_FREE_WAIT_NS)) return 0;
    uint64_t g = ld(&f->parents[0]), n = ld(&f->parents[1]);
    if (n && g <= c->dv.heap_granules && n <= c->dv.heap_granules - g) {
        bits_set(c->dv.heap_bitmap, g, n, 0);
        hp->used_granules -= n <= hp->used_granules ? n : hp->used_granules;
        if (g < hp->hint) hp->hint = g;
    }
    st(&f->parents[1], 0);
    heap_unlock(hp);
    return 1;
}

/* ------------------------------------------------------------------ */
/* slot life cycle */

/* Free a DYING slot (mask already zero; the caller is the one releaser, or
 * the dead releaser's recoverer).  Idempotent.  The pending mask and the
 * links are cleared before the slot is FREE, so nothing of this object is
 * left for a stale reader; alloc_hint is not moved here: a freed slot is
 * reused round-robin, not by the next allocation. */
static void finalize(Core *c, uint32_t idx, uint64_t dying) {
    struct hl_fence *f = slot(c, idx);
    uint32_t k = HL_CTL_KIND(dying);
    if (HAS_BLOCK(k)) {
        if (!heap_free_block(c, idx)) {
            /* the heap lock is held by a live participant that does not let
             * go: the slot stays DYING (ours) with its block, and the free
             * is retried later (a recovery retries at its next pass) */
            if (tls_rec >= 0)
                tls_deferred = 1;
            else
                defer_free(c, idx, dying);
            return;
        }
    } else {
        if (k != HL_KIND_TIMELINE) {
            uint64_t z = 0;
            if (cas(&f->word, &z, HL_STATUS_CANCEL)) hl_wake_fence(f);
            propagate(c, idx, 0);
            st(&f->parents[0], 0);
            st(&f->parents[1], 0);
            st(&f->aux, 0);
        }
        wake(f);
    }
    uint64_t e = dying;
    cas(&f->ctl, &e, HL_CTL(HL_CTL_GEN(dying), k, 0, HL_SLOT_FREE));
}

/* Drop participant bit `bit` from slot idx (on our behalf or, in recovery,
 * on a dead participant's).  The one whose drop empties the mask of a LIVE
 * slot frees it.  `actor` is recorded in the DYING ctl. */
static void drop_ref(Core *c, uint32_t idx, uint64_t bit, uint32_t actor) {
    struct hl_fence *f = slot(c, idx);
    for (;;) {
        /* refs read between two reads of ctl: a mask read before another
         * object's initialisation must not meet that object's LIVE ctl (the
         * protocol model found a leak that way: tests/protocol_model.py) */
        uint64_t ctl = ld(&f->ctl);
        uint64_t m = ld(&f->refs);
        if (ld(&f->ctl) != ctl) continue;
        if (!(m & bit)) return;
        if (m & ~bit) {
            if (cas(&f->refs, &m, m & ~bit)) return;
            continue;
        }
        if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE) {
            /* a stale bit on a slot that is being freed or initialised */
            if (cas(&f->refs, &m, 0)) return;
            continue;
        }
        uint64_t dying = HL_CTL(HL_CTL_GEN(ctl), HL_CTL_KIND(ctl), actor, HL_SLOT_DYING);
        uint64_t e = ctl;
        if (!cas(&f->ctl, &e, dying)) continue;
        uint64_t mm = bit;
        if (cas(&f->refs, &mm, 0)) {
            finalize(c, idx, dying);
            return;
        }
        /* someone took a reference meanwhile: back to LIVE and retry.  A
         * merged fence whose last child completed while it was DYING could
         * not be resolved then (resolve_merged wants LIVE): do it now. */
        e = dying;
        if (cas(&f->ctl, &e, ctl) && HL_CTL_KIND(ctl) == HL_KIND_MERGED) resolve_merged(c, idx, ctl, 0);
    }
}

/* Claim a FREE slot: it is left in ALLOC state with every field initialised
 * (a merged slot's pending mask `mask` included) and our reference bit set;
 * alloc_publish() makes it LIVE.  Returns the index or -1. */
static int alloc_begin(Core *c, uint32_t kind, uint32_t owner, uint32_t mask, uint32_t *gen_out) {
    uint32_t start = __atomic_load_n(&c->h->alloc_hint, __ATOMIC_RELAXED);
    if (start >= c->cap) start = 0;
    for (uint32_t n = 0; n < c->cap; n++) {
        uint32_t idx = start + n;
        if (idx >= c->cap) idx -= c->cap;
        struct hl_fence *f = slot(c, idx);
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) != HL_SLOT_FREE) continue;
        uint32_t gen = HL_CTL_GEN(ctl) + 1;
        if ((gen & 0xffffffu) == 0) gen++; /* keep handle gen nonzero after wrap */
        if (!cas(&f->ctl, &ctl, HL_CTL(gen, kind, (uint32_t)c->me, HL_SLOT_ALLOC))) continue;
        st(&f->word, 0);
        __atomic_store_n(&f->waiters, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&f->owner, owner, __ATOMIC_SEQ_CST);
        st(&f->aux, kind == HL_KIND_MERGED ? ((uint64_t)(gen & 0xffffffu) << 32) | mask : 0);
        st(&f->err, (uint64_t)(gen & 0xffffffu) << 32);
        st(&f->parents[0], 0);
        st(&f->parents[1], 0);
        st(&f->refs, c->mybit);
        *gen_out = gen;
        return (int)idx;
    }
    return -1;
}

static uint64_t alloc_publish(Core *c, uint32_t idx, uint32_t kind, uint32_t gen) {
    st(&slot(c, idx)->ctl, HL_CTL(gen, kind, 0, HL_SLOT_LIVE));
    __atomic_store_n(&c->h->alloc_hint, idx + 1 < c->cap ? idx + 1 : 0, __ATOMIC_RELAXED);
    c->lrefs[idx] = 1;
    c->lgen[idx] = gen & 0xffffffu;
    return HL_HANDLE(c->tag, kind, gen, idx);
}

/* Give back a slot we hold in ALLOC state (nothing was published). */
static void alloc_abort(Core *c, uint32_t idx, uint32_t kind, uint32_t gen) {
    struct hl_fence *f = slot(c, idx);
    st(&f->refs, 0);
    st(&f->ctl, HL_CTL(gen, kind, 0, HL_SLOT_FREE));
}

static int alloc_slot(Core *c, uint32_t kind, uint32_t owner, uint32_t mask, uint64_t *handle_out) {
    uint32_t gen;
    int idx = alloc_begin(c, kind, owner, mask, &gen);
    if (idx < 0) return -1;
    *handle_out = alloc_publish(c, (uint32_t)idx, kind, gen);
    return idx;
}

/* Complete slot idx with OWNER_DIED when it is still ACTIVE: a fence's word
 * CAS 0 -> OWNER_DIED (then its merged parents are told), a timeline fails.
 * The caller holds the slot (its own bit, or the dead participant's bit that
 * its recovery pinned): write rule (a). */
static void fail_owned(Core *c, uint32_t idx) {
    struct hl_fence *f = slot(c, idx);
    uint32_t k = HL_CTL_KIND(ld(&f->ctl));
    if (k == HL_KIND_TIMELINE) {
        hl_timeline_fail(f, HL_STATUS_OWNER_DIED, NULL);
    } else if (k == HL_KIND_FENCE) {
        uint64_t z = 0;
        if (cas(&f->word, &z, HL_STATUS_OWNER_DIED)) hl_wake_fence(f);
        propagate(c, idx, 0);
    }
}

/* After creating a fence owned by another participant: if that owner is no
 * longer the live incarnation we named, its recovery may have missed the
 * fence, so signal OWNER_DIED ourselves. */
static void owner_recheck(Core *c, uint32_t idx, uint32_t owner) {
    int oi = HL_OWNER_INDEX(owner);
    if (oi < 0 || (uint32_t)oi >= c->pcap || oi == c->me) return;
    uint64_t pc = ld(&c->parts[oi].ctl);
    if (HL_PCTL_STATE(pc) == HL_PART_ALIVE && (HL_PCTL_INC(pc) & 0xffffffu) == HL_OWNER_INC(owner)) return;
    /* we hold the slot (we just created it): write rule (a) */
    fail_owned(c, idx);
}

/* ------------------------------------------------------------------ */
/* liveness and recovery */

static int part_lock_held(Core *c, int i) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(HL_LOCK_BASE + (uint64_t)i);
    fl.l_len = 1;
    if (fcntl(c->fd, F_OFD_GETLK, &fl) != 0) return 1; /* unknown: assume alive */
    return fl.l_type != F_UNLCK;
}

static int take_lock(int fd, int i) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(HL_LOCK_BASE + (uint64_t)i);
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

static void drop_lock(int fd, int i) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(HL_LOCK_BASE + (uint64_t)i);
    fl.l_len = 1;
    (void)fcntl(fd, F_OFD_SETLK, &fl);
}

/* Pin slot idx, read as LIVE `ctl`, with participant bit `bit` (the dead
 * participant's, during its recovery): the object cannot be freed until that
 * bit is dropped, so the recoverer may then write it as a holder.  Returns 1
 * when pinned (drop it with drop_ref), 0 when the slot is no longer that
 * object (nothing is held then), -1 when it stayed DYING too long (its
 * releaser is itself dead: recover again later). */
#define RECOVERY_WAIT_NS 200000000ull /* the longest one recovery pass waits for slots to settle, in all */
static __thread uint64_t tls_waited;    /* time this recovery pass has waited so far */

/* One bounded wait step of a recovery pass for a slot to settle; 0 once the
 * pass's budget is spent (then the pass is retried at the next reap). */
static int settle_wait(uint64_t *t0) {
    uint64_t t = now_ns();
    if (*t0) tls_waited += t - *t0;
    *t0 = t;
    if (tls_waited >= RECOVERY_WAIT_NS) return 0;
    sched_yield();
    return 1;
}

static int pin(Core *c, uint32_t idx, uint64_t ctl, uint64_t bit, uint32_t actor) {
    struct hl_fence *f = slot(c, idx);
    uint64_t old = __atomic_fetch_or(&f->refs, bit, __ATOMIC_SEQ_CST);
    uint64_t t0 = 0;
    for (;;) {
        uint64_t c2 = ld(&f->ctl);
        if (HL_CTL_STATE(c2) == HL_SLOT_LIVE && HL_CTL_GEN(c2) == HL_CTL_GEN(ctl) && HL_CTL_KIND(c2) == HL_CTL_KIND(ctl))
            return 1;
        if (HL_CTL_STATE(c2) == HL_SLOT_DYING && HL_CTL_GEN(c2) == HL_CTL_GEN(ctl)) {
            /* its last holder is releasing it: our bit makes it roll back to
             * LIVE, or it had emptied refs first and frees it */
            if (settle_wait(&t0)) continue;
            if (!(old & bit)) drop_ref(c, idx, bit, actor);
            return -1;
        }
        if (!(old & bit)) drop_ref(c, idx, bit, actor); /* a stale bit on another object: take it back */
        return 0;
    }
}

/* Cells a dead producer reserved become SKIP (their signal fence, when it is
 * a valid one, gets OWNER_DIED); a dead consumer is unbound.  The queue slot
 * is pinned by the caller. */
static void recover_queue(Core *c, uint32_t idx, uint64_t ctl, int d, uint32_t dinc) {
    uint64_t qh = HL_HANDLE(c->tag, HL_KIND_QUEUE, HL_CTL_GEN(ctl), idx);
    struct hl_qview v;
    uint64_t dbit = 1ull << d;
    if (hl_queue_open(&c->dv, qh, &v) != HL_OK) return; /* corrupt: check() reports it */
    struct hl_queue *q = v.q;
    uint64_t *cells = v.cells;
    struct hl_packet *pk = v.packets;
    int skipped = 0;
    for (uint64_t k = 0; k < v.capacity; k++) {
        uint64_t cl = ld(&cells[k]);
        if (HL_CELL_STATE(cl) != HL_CELL_RESERVED || HL_CELL_PRODUCER(cl) != (uint32_t)d) continue;
        uint64_t sig = pk[k].signal;
        struct hl_fence *sf = sig ? hl_fence_slot(&c->dv, sig, 0) : NULL;
        uint32_t sk = HL_HANDLE_KIND(sig);
        if (sf && (sk == HL_KIND_TIMELINE || sk == HL_KIND_FENCE)) {
            uint32_t si = (uint32_t)HL_HANDLE_INDEX(sig);
            uint64_t sctl = ld(&sf->ctl);
            /* the packet's signal fence is not ours: pin it with d's bit first */
            if (hl_fence_matches(sf, sig) && pin(c, si, sctl, dbit, (uint32_t)d) == 1) {
                fail_owned(c, si);
                drop_ref(c, si, dbit, (uint32_t)d);
            }
        }
        uint64_t e = cl;
        if (cas(&cells[k], &e, HL_CELL(HL_CELL_SEQ(cl), (uint32_t)d, HL_CELL_SKIP))) skipped = 1;
    }
    if (skipped) {
        __atomic_add_fetch(&q->doorbell, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, (uint32_t *)&q->doorbell, FUTEX_WAKE, 0x7fffffff, 0, 0, 0);
    }
    uint32_t cons = __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST);
    if (cons && HL_OWNER_INDEX(cons) == d && HL_OWNER_INC(cons) == dinc)
        __atomic_compare_exchange_n(&q->consumer, &cons, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&q->space_waiters, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, (uint32_t *)&q->read_index, FUTEX_WAKE, 0x7fffffff, 0, 0, 0);
}

/* Recover participant d, whose ctl we already moved to RECOVERING(us) while
 * holding d's liveness lock (so we are d's only recoverer: d's bit is ours
 * to use).  Idempotent: a recoverer that dies releases the lock and the next
 * one repeats everything.  Returns 1 when d's slot is FREE again, 0 when
 * something must be retried later (the slot stays RECOVERING). */
static int recover_participant_(Core *c, int d, uint64_t pctl);
static int recover_participant(Core *c, int d, uint64_t pctl) {
    tls_rec = d;
    tls_deferred = 0;
    tls_waited = 0;
    tls_rec_inc = HL_PCTL_INC(pctl) & 0xffffffu;
    int r = recover_participant_(c, d, pctl);
    tls_rec = -1;
    return r;
}

static int recover_participant_(Core *c, int d, uint64_t pctl) {
    uint64_t dbit = 1ull << d;
    uint32_t dinc = HL_PCTL_INC(pctl) & 0xffffffu;
    uint32_t actor = (uint32_t)d; /* the dead participant's releases are finished in its name */
    int complete = 1;
    for (uint32_t i = 0; i < c->cap; i++) {
        uint64_t t0 = 0;
    again:
        if (ld(&c->parts[d].ctl) != pctl) return 0;
        struct hl_fence *f = slot(c, i);
        uint64_t ctl = ld(&f->ctl);
        uint32_t s = HL_CTL_STATE(ctl);
        if (s == HL_SLOT_ALLOC && HL_CTL_PIDX(ctl) == (uint32_t)d) {
            /* died while initialising: nobody else can hold it (rule (b)) */
            if (HAS_BLOCK(HL_CTL_KIND(ctl)) && !heap_free_block(c, i)) {
                complete = 0; /* heap lock held by a live participant: next pass */
                continue;
            }
            st(&f->refs, 0);
            uint64_t e = ctl;
            cas(&f->ctl, &e, HL_CTL(HL_CTL_GEN(ctl), HL_CTL_KIND(ctl), 0, HL_SLOT_FREE));
            continue;
        }
        if (s == HL_SLOT_DYING && HL_CTL_PIDX(ctl) == (uint32_t)d) {
            /* died while freeing it: finish the free, or roll back when others hold it */
            uint64_t m = ld(&f->refs);
            if ((m & ~dbit) == 0) {
                if (m) cas(&f->refs, &m, 0);
                if (ld(&f->refs) == 0) {
                    finalize(c, i, ctl);
                    continue;
                }
            }
            uint64_t e = ctl;
            uint64_t live = HL_CTL(HL_CTL_GEN(ctl), HL_CTL_KIND(ctl), 0, HL_SLOT_LIVE);
            if (cas(&f->ctl, &e, live) && HL_CTL_KIND(ctl) == HL_KIND_MERGED) resolve_merged(c, i, live, 0);
            ctl = ld(&f->ctl);
            s = HL_CTL_STATE(ctl);
        }
        if (s == HL_SLOT_DYING) {
            /* DYING by someone else: its releaser frees it, or rolls it back
             * to LIVE when a reference came in; in that case it may be d's to
             * fail, so look again once it settles (the protocol model found a
             * fence of d left ACTIVE when such a slot was skipped) */
            if (settle_wait(&t0)) goto again;
            complete = 0; /* its releaser is stuck or dead (or the table is garbage): retry at the next reap */
            continue;
        }
        if (s != HL_SLOT_LIVE) continue;
        uint32_t k = HL_CTL_KIND(ctl);
        uint32_t o = __atomic_load_n(&f->owner, __ATOMIC_SEQ_CST);
        int owned = o && HL_OWNER_INDEX(o) == d && HL_OWNER_INC(o) == dinc && (k == HL_KIND_FENCE || k == HL_KIND_TIMELINE);
        if (owned || k == HL_KIND_QUEUE) {
            int r = pin(c, i, ctl, dbit, actor);
            if (r < 0) complete = 0;
            if (r <= 0) continue; /* another object now, or retry later */
            /* pinned: owner and queue now belong to this object for sure */
            o = __atomic_load_n(&f->owner, __ATOMIC_SEQ_CST);
            if (owned && o && HL_OWNER_INDEX(o) == d && HL_OWNER_INC(o) == dinc) fail_owned(c, i);
            if (k == HL_KIND_QUEUE) recover_queue(c, i, ctl, d, dinc);
            drop_ref(c, i, dbit, actor); /* our pin, and d's own reference if it had one */
        } else if (ld(&f->refs) & dbit) {
            drop_ref(c, i, dbit, actor);
        }
    }
    if (tls_deferred) complete = 0;
    if (!complete) return 0;
    struct hl_heap *hp = heap(c);
    if (hp) {
        uint64_t l = ld(&hp->lock);
        if (l && HL_OWNER_INDEX((uint32_t)l) == d && !owner_alive(c, l)) {
            if (heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS)) /* breaks it and rebuilds the bitmap */
                heap_unlock(hp);
            else
                return 0;
        }
    }
    /* the slot's pid/label are left as they are: a joiner overwrites them */
    struct hl_participant *p = &c->parts[d];
    uint64_t e = pctl;
    if (cas(&p->ctl, &e, HL_PCTL(HL_PCTL_INC(pctl), 0, HL_PART_FREE))) return 1;
    return 0;
}

/* Check every participant; recover the dead ones.  Writes recovered
 * participant ids into out (up to outcap); returns their count.
 *
 * Claim: a recoverer first takes d's liveness lock (the OFD lock on d's
 * byte).  The kernel grants it only when d is dead and no other live process
 * holds it, i.e. no other recovery of d is running; a recoverer that dies
 * releases it.  Then it CASes d's ctl (ALIVE, or RECOVERING by a dead
 * recoverer) to RECOVERING(me), recovers, frees the slot and drops the lock.
 * So at most one recovery of d runs at a time, whether the recoverer has
 * joined the domain or not (a process joining a full table recovers before
 * it has a slot of its own). */
static int reap_all_locked(Core *c, uint64_t *out, int outcap);
static int reap_all(Core *c, uint64_t *out, int outcap) {
    pthread_mutex_lock(&c->reap_mu);
    int n = reap_all_locked(c, out, outcap);
    pthread_mutex_unlock(&c->reap_mu);
    return n;
}

static int reap_all_locked(Core *c, uint64_t *out, int outcap) {
    int n = 0;
    for (int i = 0; i < (int)c->pcap; i++) {
        if (i == c->me) continue;
        uint64_t pc = ld(&c->parts[i].ctl);
        uint32_t s = HL_PCTL_STATE(pc);
        if (s != HL_PART_ALIVE && s != HL_PART_RECOVERING) continue; /* FREE, or unknown: check() reports it */
        if (part_lock_held(c, i)) continue; /* alive, or a live recoverer is on it */
        if (take_lock(c->fd, i) != 0) continue; /* lost the race for it */
        __atomic_store_n(&c->rec_busy, i, __ATOMIC_SEQ_CST);
        pc = ld(&c->parts[i].ctl); /* re-read under the lock: a recovery may have just finished */
        s = HL_PCTL_STATE(pc);
        if (s == HL_PART_ALIVE || s == HL_PART_RECOVERING) {
            /* recoverer field: who recovers (255: a process that has not joined yet) */
            uint64_t claimed = HL_PCTL(HL_PCTL_INC(pc), (uint32_t)(c->me >= 0 ? c->me : 255), HL_PART_RECOVERING);
            uint64_t e = pc;
            if ((pc == claimed || cas(&c->parts[i].ctl, &e, claimed)) && recover_participant(c, i, claimed)) {
                /* counted here, not in recover_participant: a clean leave is no recovery */
                __atomic_add_fetch(&c->h->epoch, 1, __ATOMIC_SEQ_CST);
                __atomic_add_fetch(&c->h->stats_recovered, 1, __ATOMIC_SEQ_CST);
                if (n < outcap) out[n++] = ((uint64_t)HL_PCTL_INC(pc) << 8) | (uint64_t)i;
            }
        }
        __atomic_store_n(&c->rec_busy, -1, __ATOMIC_SEQ_CST);
        drop_lock(c->fd, i);
    }
    return n;
}

/* ------------------------------------------------------------------ */
/* watchdog thread: periodic liveness check, recovery and merge sweep */

static void *watchdog_main(void *arg) {
    Core *c = (Core *)arg;
    pthread_mutex_lock(&c->wd_mu);
    while (!c->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t t = (uint64_t)ts.tv_nsec + c->wd_interval_ns;
        ts.tv_sec += (time_t)(t / 1000000000ull);
        ts.tv_nsec = (long)(t % 1000000000ull);
        pthread_cond_timedwait(&c->wd_cv, &c->wd_mu, &ts);
        if (c->wd_stop) break;
        pthread_mutex_unlock(&c->wd_mu);
        uint64_t ids[HL_MAX_PARTICIPANTS];
        if (!__atomic_load_n(&c->truncated, __ATOMIC_SEQ_CST)) {
            reap_all(c, ids, HL_MAX_PARTICIPANTS);
            sweep(c);
            retry_deferred(c);
        }
        pthread_mutex_lock(&c->wd_mu);
    }
    pthread_mutex_unlock(&c->wd_mu);
    return NULL;
}

static void stop_watchdog(Core *c) {
    if (!c->wd_running) return;
    pthread_mutex_lock(&c->wd_mu);
    c->wd_stop = 1;
    pthread_cond_signal(&c->wd_cv);
    pthread_mutex_unlock(&c->wd_mu);
    Py_BEGIN_ALLOW_THREADS pthread_join(c->wd, NULL);
    Py_END_ALLOW_THREADS c->wd_running = 0;
}

/* ------------------------------------------------------------------ */
/* Python type */

/* ---- SIGBUS guard ----
 * Another process can truncate the domain file while we have it mapped;
 * touching a page past the new end raises SIGBUS.  The guard turns that into
 * an error: the handler maps a private zero page over the faulting page of a
 * registered domain mapping (so the access completes, reading zeros), marks
 * the domain truncated, and every later operation on it raises CorruptDomain
 * (waits and the watchdog stop).  A SIGBUS elsewhere goes to the previous
 * handler, or kills the process as it would have. */
#define GUARD_MAX 256
static struct {
    uintptr_t lo, hi;
    int *flag;
} g_guard[GUARD_MAX];
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_prev_bus;
static int g_guard_installed;

static void bus_handler(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_MAX; i++) {
        uintptr_t lo = __atomic_load_n(&g_guard[i].lo, __ATOMIC_ACQUIRE);
        uintptr_t hi = __atomic_load_n(&g_guard[i].hi, __ATOMIC_ACQUIRE);
        if (!lo || a < lo || a >= hi) continue;
        void *pg = (void *)(a & ~(uintptr_t)(HL_PAGE - 1));
        if (mmap(pg, HL_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
            int *flag = __atomic_load_n(&g_guard[i].flag, __ATOMIC_ACQUIRE);
            if (flag) __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
            return; /* the faulting access is retried on the zero page */
        }
    }
    if (g_prev_bus.sa_flags & SA_SIGINFO) {
        if (g_prev_bus.sa_sigaction) {
            g_prev_bus.sa_sigaction(sig, si, uc);
            return;
        }
    } else if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN && g_prev_bus.sa_handler) {
        g_prev_bus.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL); /* not ours: the access faults again and ends the process as before */
}

static void guard_add_region(Core *c, uintptr_t lo, uintptr_t hi) {
    pthread_mutex_lock(&g_guard_mu);
    if (!g_guard_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = bus_handler;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &g_prev_bus) == 0) g_guard_installed = 1;
    }
    for (int i = 0; i < GUARD_MAX; i++) {
        if (g_guard[i].lo) continue;
        __atomic_store_n(&g_guard[i].flag, &c->truncated, __ATOMIC_RELEASE);
        __atomic_store_n(&g_guard[i].hi, hi, __ATOMIC_RELEASE);
        __atomic_store_n(&g_guard[i].lo, lo, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&g_guard_mu);
}

static void guard_add(Core *c) { guard_add_region(c, (uintptr_t)c->base, (uintptr_t)c->base + c->size); }

static void guard_remove(Core *c) {
    pthread_mutex_lock(&g_guard_mu);
    for (int i = 0; i < GUARD_MAX; i++) {
        if (g_guard[i].flag != &c->truncated) continue; /* the core's mapping and the regions it added */
        __atomic_store_n(&g_guard[i].lo, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&g_guard[i].hi, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&g_guard[i].flag, NULL, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_guard_mu);
}

#define TRUNCATED(c) __atomic_load_n(&(c)->truncated, __ATOMIC_SEQ_CST)

static void core_unmap(Core *c) {
    stop_watchdog(c);
    if (c->base) guard_remove(c);
    if (c->base) munmap(c->base, c->size);
    c->base = NULL;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    PyMem_Free(c->lrefs);
    PyMem_Free(c->lgen);
    c->lrefs = c->lgen = NULL;
    c->me = -1;
}

static void Core_dealloc(Core *c) {
    core_unmap(c);
    pthread_mutex_destroy(&c->wd_mu);
    pthread_mutex_destroy(&c->reap_mu);
    pthread_mutex_destroy(&c->defer_mu);
    pthread_cond_destroy(&c->wd_cv);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Core_new(PyTypeObject *t, PyObject *a, PyObject *k) {
    Core *c = (Core *)t->tp_alloc(t, 0);
    if (!c) return NULL;
    c->fd = -1;
    c->me = -1;
    c->rec_busy = -1;
    pthread_mutex_init(&c->wd_mu, NULL);
    pthread_mutex_init(&c->reap_mu, NULL);
    pthread_mutex_init(&c->defer_mu, NULL);
    pthread_cond_init(&c->wd_cv, NULL);
    return (PyObject *)c;
}


/* _core.layout(fences, participants, queues_size, trace_size, heap_size) -> dict of offsets */
static int compute_layout(uint64_t fences, uint64_t parts, uint64_t qsize, uint64_t tsize, uint64_t hsize,
                          struct hl_header *h) {
    memset(h, 0, sizeof *h);
    h->magic = HL_MAGIC;
    h->abi_version = HL_ABI_VERSION;
    h->header_size = HL_HEADER_SIZE;
    h->participant_size = HL_PARTICIPANT_SIZE;
    h->participant_capacity = (uint32_t)parts;
    h->fence_size = HL_FENCE_SIZE;
    h->fence_capacity = (uint32_t)fences;
    uint64_t off = HL_HEADER_SIZE;
    h->participants_offset = off;
    off = ALIGN_UP(off + parts * HL_PARTICIPANT_SIZE, HL_PAGE);
    h->fences_offset = off;
    off = ALIGN_UP(off + fences * HL_FENCE_SIZE, HL_PAGE);
    h->queues_offset = off;
    h->queues_size = ALIGN_UP(qsize, HL_PAGE);
    off += h->queues_size;
    h->trace_offset = off;
    h->trace_size = ALIGN_UP(tsize, HL_PAGE);
    off += h->trace_size;
    h->heap_offset = off;
    if (hsize) {
        uint64_t bo, g, dof, region;
        heap_layout(hsize, &bo, &g, &dof, &region);
        h->heap_size = region;
    } else {
        h->heap_size = 0;
    }
    off += h->heap_size;
    h->total_size = off;
    return 0;
}

static PyObject *py_layout(PyObject *m, PyObject *args) {
    unsigned long long f, p, q, t, hs;
    if (!PyArg_ParseTuple(args, "KKKKK", &f, &p, &q, &t, &hs)) return NULL;
    struct hl_header h;
    compute_layout(f, p, q, t, hs, &h);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "total_size", (unsigned long long)h.total_size,
                         "participants_offset", (unsigned long long)h.participants_offset, "fences_offset",
                         (unsigned long long)h.fences_offset, "queues_offset", (unsigned long long)h.queues_offset,
                         "queues_size", (unsigned long long)h.queues_size, "trace_offset",
                         (unsigned long long)h.trace_offset, "trace_size", (unsigned long long)h.trace_size,
                         "heap_offset", (unsigned long long)h.heap_offset, "heap_size",
                         (unsigned long long)h.heap_size);
}

static uint64_t proc_start_time(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* field 3 starts at p+2; start_time is field 22 */
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

/* Core.attach(fd, init: dict|None, label, kind, watchdog_ns) -- map the domain
 * (initialising it when init is given), validate, join. */
static PyObject *Core_attach(Core *c, PyObject *args) {
    int fd;
    PyObject *init;
    const char *label, *kind;
    unsigned long long wd_ns;
    if (!PyArg_ParseTuple(args, "iOssK", &fd, &init, &label, &kind, &wd_ns)) return NULL;
    if (c->base) {
        PyErr_SetString(E_Invalid, "core already attached");
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    size_t size = (size_t)sb.st_size;
    if (init != Py_None) {
        unsigned long long f, p, q, t, hs, tag, poll;
        if (!PyArg_ParseTuple(init, "KKKKKKK", &f, &p, &q, &t, &hs, &tag, &poll)) return NULL;
        struct hl_header hh;
        compute_layout(f, p, q, t, hs, &hh);
        if (hh.total_size != size) {
            hl_err(E_Corrupt, "file size %zu does not match layout size %llu", size,
                         (unsigned long long)hh.total_size);
            return NULL;
        }
        void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (b == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
        hh.tag = (uint32_t)tag;
        hh.poll_ns = poll;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        hh.created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        hh.ready = 0;
        memcpy(b, &hh, sizeof hh); /* tables are zero (fresh file): FREE everywhere */
        if (hh.trace_size >= 128) {
            struct hl_trace *tr = (struct hl_trace *)((char *)b + hh.trace_offset);
            tr->capacity = (hh.trace_size - 64) / 64;
            tr->magic = HL_TRACE_MAGIC;
        }
        if (hs) {
            struct hl_heap *hp = (struct hl_heap *)((char *)b + hh.heap_offset);
            uint64_t region;
            heap_layout(hs, &hp->bitmap_offset, &hp->granules, &hp->data_offset, &region);
            hp->data_size = hp->granules * HL_GRANULE;
            hp->magic = HL_HEAP_MAGIC;
        }
        __atomic_store_n(&((struct hl_header *)b)->ready, 1, __ATOMIC_SEQ_CST);
        c->base = (char *)b;
    } else {
        if (size < HL_HEADER_SIZE) {
            hl_err(E_Corrupt, "domain file is %zu bytes, smaller than a header", size);
            return NULL;
        }
        void *b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (b == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
        c->base = (char *)b;
    }
    c->size = size;
    c->fd = fd;
    c->truncated = 0;
    guard_add(c); /* from the first read of the mapping on */
    c->h = (struct hl_header *)c->base;
    /* validate once; from here on only the private view c->dv is used */
    if (__atomic_load_n(&c->h->ready, __ATOMIC_ACQUIRE) != 1 || hl_attach(&c->dv, c->base, size) != HL_OK) {
        const struct hl_header *h = c->h;
        char why[160];
        if (h->magic != HL_MAGIC)
            snprintf(why, sizeof why, "bad magic 0x%llx", (unsigned long long)h->magic);
        else if (h->abi_version != HL_ABI_VERSION)
            snprintf(why, sizeof why, "ABI version %u, this library speaks %u", h->abi_version, HL_ABI_VERSION);
        else if (h->ready != 1)
            snprintf(why, sizeof why, "creator has not finished initialising it");
        else if (hl_domain_validate(c->base, size) == HL_OK)
            snprintf(why, sizeof why, "the heap header is inconsistent");
        else
            snprintf(why, sizeof why, "header sizes or offsets do not match a %zu-byte domain", size);
        guard_remove(c);
        munmap(c->base, size);
        c->base = NULL;
        c->fd = -1;
        hl_err(E_Corrupt, "not a valid hostless domain: %s", why);
        return NULL;
    }
    c->parts = c->dv.parts;
    c->fences = c->dv.fences;
    c->cap = c->dv.fence_capacity;
    c->pcap = c->dv.participant_capacity;
    c->tag = c->dv.tag;
    c->poll_ns = c->dv.poll_ns; /* within [HL_POLL_MIN_NS, HL_POLL_MAX_NS] */
    c->trace = c->dv.trace;
    c->trace_cap = c->dv.trace_capacity;
    c->lrefs = PyMem_Calloc(c->cap, sizeof(uint32_t));
    c->lgen = PyMem_Calloc(c->cap, sizeof(uint32_t));
    if (!c->lrefs || !c->lgen) {
        core_unmap(c);
        return PyErr_NoMemory();
    }
    /* join: lock byte i first, then claim slot i; the lock is our liveness */
    pid_t pid = getpid();
    for (int round = 0; round < 2 && c->me < 0; round++) {
        for (uint32_t i = 0; i < c->pcap; i++) {
            uint64_t pc = ld(&c->parts[i].ctl);
            if (HL_PCTL_STATE(pc) != HL_PART_FREE) continue;
            if (take_lock(fd, (int)i) != 0) continue;
            uint32_t inc = HL_PCTL_INC(pc) + 1;
            if (!cas(&c->parts[i].ctl, &pc, HL_PCTL(inc, 0, HL_PART_ALIVE))) {
                drop_lock(fd, (int)i);
                continue;
            }
            struct hl_participant *p = &c->parts[i];
            p->pid = (uint32_t)pid;
            p->start_time = proc_start_time(pid);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            p->joined_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
            memset(p->label, 0, sizeof p->label);
            strncpy(p->label, label, sizeof p->label - 1);
            memset(p->kind, 0, sizeof p->kind);
            strncpy(p->kind, kind, sizeof p->kind - 1);
            c->me = (int)i;
            c->mybit = 1ull << i;
            c->inc = inc;
            break;
        }
        if (c->me < 0 && round == 0) {
            /* full: maybe some participants are dead */
            uint64_t ids[HL_MAX_PARTICIPANTS];
            Py_BEGIN_ALLOW_THREADS reap_all(c, ids, HL_MAX_PARTICIPANTS);
            Py_END_ALLOW_THREADS
        }
    }
    if (c->me < 0) {
        guard_remove(c);
        munmap(c->base, c->size);
        c->base = NULL;
        c->fd = -1;
        PyMem_Free(c->lrefs);
        PyMem_Free(c->lgen);
        c->lrefs = c->lgen = NULL;
        hl_err(E_Full, "domain has no free participant slot (capacity %u)", c->pcap);
        return NULL;
    }
    if (wd_ns) {
        c->wd_interval_ns = wd_ns;
        c->wd_stop = 0;
        if (pthread_create(&c->wd, NULL, watchdog_main, c) == 0) c->wd_running = 1;
    }
    Py_RETURN_NONE;
}

#define NEED_ATTACHED(c)                                                                          \
    do {                                                                                          \
        if (!(c)->base || (c)->me < 0) {                                                          \
            PyErr_SetString(E_Closed, "domain is closed");                                        \
            return NULL;                                                                          \
        }                                                                                         \
        if (TRUNCATED(c)) {                                                                       \
            PyErr_SetString(E_Corrupt, "the domain file was truncated while mapped (by another "  \
                                       "process?); this domain is unusable: close it");          \
            return NULL;                                                                          \
        }                                                                                         \
    } while (0)

/* leave: recover ourselves (drops every reference, owned ACTIVE fences become
 * OWNER_DIED), free our slot, unlock, unmap. */
static PyObject *Core_leave(Core *c, PyObject *noargs) {
    if (!c->base) Py_RETURN_NONE;
    __atomic_store_n(&c->closing, 1, __ATOMIC_SEQ_CST);
    Py_BEGIN_ALLOW_THREADS;
    /* threads of this process inside GIL-free loops notice `closing` within
     * one bounded sleep; the mapping must outlive them */
    while (__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST)) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    Py_END_ALLOW_THREADS;
    stop_watchdog(c);
    if (c->me >= 0 && !__atomic_load_n(&c->truncated, __ATOMIC_SEQ_CST)) {
        int me = c->me;
        uint64_t pc = ld(&c->parts[me].ctl);
        uint64_t claimed = HL_PCTL(HL_PCTL_INC(pc), (uint32_t)me, HL_PART_RECOVERING);
        if (cas(&c->parts[me].ctl, &pc, claimed)) {
            Py_BEGIN_ALLOW_THREADS recover_participant(c, me, claimed);
            Py_END_ALLOW_THREADS
        }
        drop_lock(c->fd, me);
    }
    core_unmap(c);
    Py_RETURN_NONE;
}

/* forget the mapping without touching shared state (after fork, in the child) */
static PyObject *Core_abandon(Core *c, PyObject *noargs) {
    c->wd_running = 0; /* the thread does not exist in a forked child */
    if (c->base) guard_remove(c);
    if (c->base) munmap(c->base, c->size);
    c->base = NULL;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->me = -1;
    Py_RETURN_NONE;
}

static PyObject *Core_create(Core *c, PyObject *args) {
    unsigned int kind, owner;
    NEED_ATTACHED(c);
    if (!PyArg_ParseTuple(args, "II", &kind, &owner)) return NULL;
    if (kind != HL_KIND_FENCE && kind != HL_KIND_TIMELINE) {
        PyErr_SetString(PyExc_ValueError, "kind must be FENCE or TIMELINE");
        return NULL;
    }
    if (owner) {
        int oi = HL_OWNER_INDEX(owner);
        if (oi < 0 || (uint32_t)oi >= c->pcap) {
            hl_err(PyExc_ValueError, "owner id %u names no participant slot", owner);
            return NULL;
        }
        uint64_t pc = ld(&c->parts[oi].ctl);
        if (HL_PCTL_STATE(pc) != HL_PART_ALIVE || (HL_PCTL_INC(pc) & 0xffffffu) != HL_OWNER_INC(owner)) {
            hl_err(PyExc_ValueError, "owner participant %u is not alive", owner);
            return NULL;
        }
    } else {
        owner = HL_OWNER(c->inc, c->me);
    }
    uint64_t h;
    int idx = alloc_slot(c, kind, owner, 0, &h);
    if (idx < 0) {
        hl_err(E_Full, "fence table full (%u slots)", c->cap);
        return NULL;
    }
    owner_recheck(c, (uint32_t)idx, owner);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *Core_merge(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    PyObject *seq = PySequence_Fast(arg, "merge expects a sequence of handles");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > HL_MERGE_MAX_CHILDREN) {
        Py_DECREF(seq);
        hl_err(PyExc_ValueError, "merge takes 1..%d handles per node, got %zd", HL_MERGE_MAX_CHILDREN, n);
        return NULL;
    }
    int64_t idxs[HL_MERGE_MAX_CHILDREN];
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        idxs[i] = check_handle(c, h, HL_KIND_FENCE, 1);
        if (idxs[i] < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < i; j++)
            if (idxs[j] == idxs[i]) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_ValueError, "the same fence appears twice in a merge");
                return NULL;
            }
        struct hl_fence *f = slot(c, (uint32_t)idxs[i]);
        if (link_live(c, ld(&f->parents[0])) && link_live(c, ld(&f->parents[1]))) {
            Py_DECREF(seq);
            hl_err(E_Invalid, "fence 0x%llx is already part of %d merged fences (the most a fence can join)",
                         (unsigned long long)h, HL_MAX_PARENTS);
            return NULL;
        }
    }
    Py_DECREF(seq);
    uint64_t ph;
    uint32_t mask = (n == 32) ? 0xffffffffu : (uint32_t)((1ull << n) - 1);
    int pidx = alloc_slot(c, HL_KIND_MERGED, 0, mask, &ph); /* the mask is set before it is LIVE */
    if (pidx < 0) {
        hl_err(E_Full, "fence table full (%u slots)", c->cap);
        return NULL;
    }
    uint32_t pgen = HL_HANDLE_GEN(ph);
    for (Py_ssize_t i = 0; i < n; i++) {
        struct hl_fence *f = slot(c, (uint32_t)idxs[i]);
        uint64_t link = HL_LINK((uint32_t)i, pgen, (uint32_t)pidx);
        int done = 0;
        for (int k = 0; k < HL_MAX_PARENTS && !done; k++) {
            uint64_t old = ld(&f->parents[k]);
            if (link_live(c, old)) continue;
            /* an empty link, or one whose parent was freed: reuse it */
            if (cas(&f->parents[k], &old, link)) done = 1;
        }
        if (!done) {
            /* lost a race for the last link: count this child as failed */
            propagate_link(c, link, HL_STATUS_ERROR, 0);
            continue;
        }
        if (ld(&f->word)) propagate_link(c, link, (uint32_t)ld(&f->word), 0);
    }
    return PyLong_FromUnsignedLongLong(ph);
}

/* ---- the operations behind both the Core methods and the Handle type ---- */

static int do_import(Core *c, uint64_t h, uint32_t want_kind) {
    int64_t idx = check_handle(c, h, want_kind, 0);
    if (idx < 0) return -1;
    if (c->lrefs[idx] && c->lgen[idx] == HL_HANDLE_GEN(h)) {
        c->lrefs[idx]++;
        return 0;
    }
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t t0 = 0;
    for (;;) {
        uint64_t ctl = ld(&f->ctl);
        if ((HL_CTL_GEN(ctl) & 0xffffffu) != HL_HANDLE_GEN(h) || HL_CTL_KIND(ctl) != HL_HANDLE_KIND(h) ||
            (HL_CTL_STATE(ctl) != HL_SLOT_LIVE && HL_CTL_STATE(ctl) != HL_SLOT_DYING))
            goto stale;
        if (HL_CTL_STATE(ctl) == HL_SLOT_LIVE) {
            uint64_t old = __atomic_fetch_or(&f->refs, c->mybit, __ATOMIC_SEQ_CST);
            uint64_t c2 = ld(&f->ctl);
            if (c2 == ctl) break;
            if (!(old & c->mybit)) drop_ref(c, (uint32_t)idx, c->mybit, (uint32_t)c->me);
            if ((HL_CTL_GEN(c2) & 0xffffffu) != HL_HANDLE_GEN(h)) goto stale;
        }
        /* DYING: its last holder is releasing it; wait for LIVE (revert) or
         * FREE, bounded, without the GIL */
        if (!t0) t0 = now_ns();
        if (now_ns() - t0 > 2000000000ull) goto stale;
        PyThreadState *ts = PyEval_SaveThread();
        sched_yield();
        PyEval_RestoreThread(ts);
    }
    c->lrefs[idx] = 1;
    c->lgen[idx] = HL_HANDLE_GEN(h);
    return 0;
stale:
    hl_err(E_Handle, "handle 0x%llx is stale (the object was released)", (unsigned long long)h);
    return -1;
}

static int do_release(Core *c, uint64_t h) {
    int64_t idx = HL_HANDLE_INDEX(h);
    if (HL_HANDLE_TAG(h) != c->tag || idx < 0 || (uint64_t)idx >= c->cap || c->lrefs[idx] == 0 ||
        c->lgen[idx] != HL_HANDLE_GEN(h)) {
        hl_err(E_Handle, "handle 0x%llx is not held by this participant", (unsigned long long)h);
        return -1;
    }
    if (--c->lrefs[idx] == 0) drop_ref(c, (uint32_t)idx, c->mybit, (uint32_t)c->me);
    return 0;
}

static int status_ok(unsigned long long s) { return hl_status_valid(s); }

static int do_signal(Core *c, uint64_t h, unsigned long long s) {
    int64_t idx = check_handle(c, h, HL_KIND_FENCE, 1);
    if (idx < 0) return -1;
    if (HL_HANDLE_KIND(h) == HL_KIND_MERGED) {
        PyErr_SetString(E_Invalid, "a merged fence completes from its children and cannot be signaled directly");
        return -1;
    }
    if (!status_ok(s)) {
        hl_err(PyExc_ValueError, "invalid status %llu (SUCCESS, ERROR, CANCEL, OWNER_DIED or 64..2^32-1)", s);
        return -1;
    }
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t z = 0;
    if (!cas(&f->word, &z, s)) {
        if (!hl_status_valid(z))
            hl_err(E_Corrupt, "fence 0x%llx holds an invalid completion word 0x%llx (written by a buggy or hostile "
                   "participant)", (unsigned long long)h, (unsigned long long)z);
        else
            hl_err(E_Already, "fence 0x%llx was already signaled with status %llu", (unsigned long long)h,
                   (unsigned long long)z);
        return -1;
    }
    hl_wake_fence(f);
    if (ld(&f->parents[0]) || ld(&f->parents[1])) propagate(c, (uint32_t)idx, 0);
    if (c->trace) trace_emit(c, HL_EV_SIGNAL, h, s, 0, 0, 0);
    return 0;
}

static int do_tl_signal(Core *c, uint64_t h, unsigned long long v) {
    int64_t idx = check_handle(c, h, HL_KIND_TIMELINE, 1);
    if (idx < 0) return -1;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    if (v > HL_TIMELINE_MAX) {
        hl_err(PyExc_ValueError, "timeline value %llu exceeds the maximum 2^62-1", v);
        return -1;
    }
    uint64_t cur;
    int r = hl_timeline_advance(f, v, &cur); /* wakes sleepers through the wake sequence */
    if (r == HL_E_FAILED) {
        hl_err(E_Already, "timeline failed with status %llu; it cannot be signaled",
               (unsigned long long)(cur & 0xffffffffull));
        return -1;
    }
    if (r != HL_OK) {
        hl_err(PyExc_ValueError, "timeline value must grow: current %llu, asked %llu", (unsigned long long)cur, v);
        return -1;
    }
    if (c->trace) trace_emit(c, HL_EV_SIGNAL, h, v, 0, 0, 0);
    return 0;
}

/* Wait until word >= threshold.  Spins (first with the GIL, then without)
 * for spin_ns, then sleeps on the futex in slices of at most poll_ns.
 * timeout_ns < 0: forever.  Returns 0 with *out = word, 1 on timeout, -1 on error. */
static int do_wait(Core *c, uint64_t h, uint64_t thr, long long timeout, long long spin, uint64_t *out) {
    int64_t idx = check_handle(c, h, 0, 1);
    if (idx < 0) return -1;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t w = ld(&f->word);
    if (w >= thr) {
        *out = w;
        return 0;
    }
    /* short spin with the GIL: the fast cross-process round trip */
    uint64_t t0 = now_ns();
    uint64_t gil_spin = spin > 2000 ? 2000 : (spin > 0 ? (uint64_t)spin : 0);
    if (gil_spin) {
        for (unsigned it = 0;; it++) {
            w = __atomic_load_n(&f->word, __ATOMIC_ACQUIRE);
            if (w >= thr) {
                *out = w;
                return 0;
            }
            cpu_relax();
            if ((it & 63) == 63 && now_ns() - t0 >= gil_spin) break;
        }
    }
    int is_merged = HL_HANDLE_KIND(h) == HL_KIND_MERGED;
    /* the futex: a timeline's wake sequence, else the word's low half (hostless.h) */
    uint32_t *fw = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE ? &f->wake : (uint32_t *)&f->word;
    uint64_t poll = c->poll_ns;
    uint64_t deadline = timeout < 0 ? UINT64_MAX : t0 + (uint64_t)timeout;
    int timed_out = 0;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS;
    for (unsigned it = 0;; it++) {
        w = __atomic_load_n(&f->word, __ATOMIC_ACQUIRE);
        if (w >= thr) break;
        if (CLOSING(c)) {
            timed_out = 2;
            break;
        }
        if ((it & 63) != 63 && spin > 0) {
            cpu_relax();
            continue;
        }
        uint64_t t = now_ns();
        if (t >= deadline) {
            timed_out = 1;
            break;
        }
        if (spin > 0 && t - t0 < (uint64_t)spin) continue;
        /* sleep phase (at once when spin <= 0) */
        if (is_merged) sweep(c);
        __atomic_add_fetch(&f->waiters, 1, __ATOMIC_SEQ_CST);
        uint32_t seen = __atomic_load_n(fw, __ATOMIC_SEQ_CST); /* before the word: see hostless.h */
        w = ld(&f->word);
        if (w < thr) {
            uint64_t left = deadline - t;
            uint64_t nap = left < poll ? left : poll;
            struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
            syscall(SYS_futex, fw, FUTEX_WAIT, seen, &ts, 0, 0);
        }
        __atomic_sub_fetch(&f->waiters, 1, __ATOMIC_SEQ_CST);
    }
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (timed_out == 2) {
        CLOSED_ERROR(c, "the domain was closed during the wait");
        return -1;
    }
    *out = w;
    return timed_out;
}

static int get_handle_arg(PyObject *o, uint64_t *h) {
    *h = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(E_Handle, "a handle is a non-negative 64-bit integer");
        return -1;
    }
    return 0;
}

static PyObject *Core_import(Core *c, PyObject *arg) {
    uint64_t h;
    NEED_ATTACHED(c);
    if (get_handle_arg(arg, &h) < 0 || do_import(c, h, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_release(Core *c, PyObject *arg) {
    uint64_t h;
    NEED_ATTACHED(c);
    if (get_handle_arg(arg, &h) < 0 || do_release(c, h) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_signal(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "signal(handle, status)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long s = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (do_signal(c, h, s) < 0) return NULL;
    Py_RETURN_NONE;
}

/* word(handle) -> current completion word (any kind, must be held) */
static PyObject *Core_word(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int64_t idx = check_handle(c, h, HL_KIND_SYNC, 1);
    if (idx < 0) return NULL;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t w = ld(&f->word);
    if (w == 0 && HL_HANDLE_KIND(h) == HL_KIND_MERGED) {
        sweep(c);
        w = ld(&f->word);
    }
    return PyLong_FromUnsignedLongLong(w);
}

/* aux(handle) -> aux word (timeline: value before failure) */
static PyObject *Core_aux(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int64_t idx = check_handle(c, h, HL_KIND_SYNC, 1);
    if (idx < 0) return NULL;
    return PyLong_FromUnsignedLongLong(ld(&slot(c, (uint32_t)idx)->aux));
}

static PyObject *Core_tl_signal(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tl_signal(handle, value)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "timeline values are integers in 0..2^62-1");
        return NULL;
    }
    if (do_tl_signal(c, h, v) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_tl_fail(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tl_fail(handle, status)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    unsigned long long s = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "a failure status is an int: ERROR, CANCEL, OWNER_DIED or 64..2^32-1");
        return NULL;
    }
    int64_t idx = check_handle(c, h, HL_KIND_TIMELINE, 1);
    if (idx < 0) return NULL;
    if (!status_ok(s) || s == HL_STATUS_SUCCESS) {
        hl_err(PyExc_ValueError, "invalid failure status %llu (ERROR, CANCEL, OWNER_DIED or 64..2^32-1)", s);
        return NULL;
    }
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t cur;
    if (hl_timeline_fail(f, (hl_u32)s, &cur) == HL_E_FAILED) {
        hl_err(E_Already, "timeline already failed with status %llu", (unsigned long long)(cur & 0xffffffffull));
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_wait(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "wait(handle, threshold, timeout_ns, spin_ns)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    uint64_t thr = PyLong_AsUnsignedLongLong(args[1]);
    long long timeout = PyLong_AsLongLong(args[2]);
    long long spin = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    uint64_t w;
    int r = do_wait(c, h, thr, timeout, spin, &w);
    if (r < 0) return NULL;
    if (r == 1) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(w);
}

/* wait_any([(handle, threshold), ...], timeout_ns) -> list of ready positions.
 * Sleeps with futex_waitv on all words plus the private kick word. */
static PyObject *Core_wait_any(Core *c, PyObject *args) {
    PyObject *lst;
    long long timeout;
    unsigned int kick_seen;
    NEED_ATTACHED(c);
    if (!PyArg_ParseTuple(args, "OLI", &lst, &timeout, &kick_seen)) return NULL;
    PyObject *seq = PySequence_Fast(lst, "wait_any expects a list");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 127) n = 127;
    struct hl_futex_waitv wv[128];
    uint64_t thr[128];
    struct hl_fence *fs[128];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        unsigned long long h, th;
        if (!PyArg_ParseTuple(t, "KK", &h, &th)) {
            Py_DECREF(seq);
            return NULL;
        }
        int64_t idx = check_handle(c, h, 0, 0);
        if (idx < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        fs[i] = slot(c, (uint32_t)idx);
        thr[i] = th;
    }
    Py_DECREF(seq);
    uint64_t poll = c->poll_ns;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    int any = 0;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS;
    uint64_t t0 = now_ns();
    for (;;) {
        for (Py_ssize_t i = 0; i < n; i++)
            if (ld(&fs[i]->word) >= thr[i]) any = 1;
        if (any || __atomic_load_n(&c->kick, __ATOMIC_SEQ_CST) != kick_seen || CLOSING(c)) break;
        uint64_t t = now_ns();
        if (timeout >= 0 && t - t0 >= (uint64_t)timeout) break;
        for (Py_ssize_t i = 0; i < n; i++) __atomic_add_fetch(&fs[i]->waiters, 1, __ATOMIC_SEQ_CST);
        int ready = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int tl = HL_CTL_KIND(ld(&fs[i]->ctl)) == HL_KIND_TIMELINE;
            uint32_t *fw = tl ? &fs[i]->wake : (uint32_t *)&fs[i]->word;
            uint32_t seen = __atomic_load_n(fw, __ATOMIC_SEQ_CST); /* before the word: see hostless.h */
            uint64_t w = ld(&fs[i]->word);
            if (w >= thr[i]) ready = 1;
            wv[i].val = seen;
            wv[i].uaddr = (uint64_t)(uintptr_t)fw;
            wv[i].flags = HL_FUTEX2_SIZE_U32;
            wv[i].reserved = 0;
        }
        wv[n].val = kick_seen;
        wv[n].uaddr = (uint64_t)(uintptr_t)&c->kick;
        wv[n].flags = HL_FUTEX2_SIZE_U32 | HL_FUTEX2_PRIVATE;
        wv[n].reserved = 0;
        if (!ready && __atomic_load_n(&c->kick, __ATOMIC_SEQ_CST) == kick_seen) {
            uint64_t nap = poll;
            if (timeout >= 0) {
                uint64_t left = (uint64_t)timeout - (t - t0);
                if (left < nap) nap = left;
            }
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t abs_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + nap;
            ts.tv_sec = (time_t)(abs_ns / 1000000000ull);
            ts.tv_nsec = (long)(abs_ns % 1000000000ull);
            long r = syscall(SYS_futex_waitv, wv, (unsigned)(n + 1), 0, &ts, CLOCK_MONOTONIC);
            if (r < 0 && errno == ENOSYS) {
                struct timespec s2 = {0, (long)(nap < 200000 ? nap : 200000)};
                nanosleep(&s2, NULL);
            }
        }
        for (Py_ssize_t i = 0; i < n; i++) __atomic_sub_fetch(&fs[i]->waiters, 1, __ATOMIC_SEQ_CST);
    }
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (CLOSING(c)) {
        Py_DECREF(out);
        CLOSED_ERROR(c, "the domain was closed during the wait");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ld(&fs[i]->word) >= thr[i]) {
            PyObject *v = PyLong_FromSsize_t(i);
            PyList_Append(out, v);
            Py_DECREF(v);
        }
    }
    return out;
}

static PyObject *Core_kick(Core *c, PyObject *noargs) {
    __atomic_add_fetch(&c->kick, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &c->kick, FUTEX_WAKE_PRIVATE, 0x7fffffff, 0, 0, 0);
    Py_RETURN_NONE;
}

static PyObject *Core_kick_value(Core *c, PyObject *noargs) {
    return PyLong_FromUnsignedLong(__atomic_load_n(&c->kick, __ATOMIC_SEQ_CST));
}

static PyObject *Core_reap(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    uint64_t ids[HL_MAX_PARTICIPANTS];
    int n;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS n = reap_all(c, ids, HL_MAX_PARTICIPANTS);
    sweep(c);
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS PyObject *out = PyList_New(n);
    for (int i = 0; i < n; i++) PyList_SET_ITEM(out, i, PyLong_FromUnsignedLongLong(ids[i]));
    return out;
}

/* participants() -> [(index, incarnation, state, recoverer, pid, start_time, joined_ns, label, kind, lock_held)] */
static PyObject *Core_participants(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    PyObject *out = PyList_New(0);
    for (uint32_t i = 0; i < c->pcap; i++) {
        struct hl_participant *p = &c->parts[i];
        uint64_t pc = ld(&p->ctl);
        if (HL_PCTL_STATE(pc) == HL_PART_FREE) continue;
        char label[33], kind[17];
        memcpy(label, p->label, 32);
        label[32] = 0;
        memcpy(kind, p->kind, 16);
        kind[16] = 0;
        int held = ((int)i == c->me || (int)i == __atomic_load_n(&c->rec_busy, __ATOMIC_SEQ_CST))
                       ? 1
                       : part_lock_held(c, (int)i);
        PyObject *t = Py_BuildValue("(IIIIIKKyyi)", i, HL_PCTL_INC(pc), HL_PCTL_STATE(pc), HL_PCTL_RECOVERER(pc),
                                    p->pid, (unsigned long long)p->start_time, (unsigned long long)p->joined_ns,
                                    label, kind, held);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_Append(out, t);
        Py_DECREF(t);
    }
    return out;
}

static PyObject *Core_lock_held(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    long i = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (i < 0 || (unsigned long)i >= c->pcap) {
        PyErr_SetString(PyExc_IndexError, "participant index out of range");
        return NULL;
    }
    return PyBool_FromLong(i == c->me || i == __atomic_load_n(&c->rec_busy, __ATOMIC_SEQ_CST) ? 1
                                                                                          : part_lock_held(c, (int)i));
}

static PyObject *Core_info(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    return Py_BuildValue("{s:i,s:I,s:K,s:I,s:I,s:I,s:K}", "me", c->me, "incarnation", c->inc, "size",
                         (unsigned long long)c->size, "fences", c->cap, "participants", c->pcap, "tag", c->tag,
                         "poll_ns", (unsigned long long)c->poll_ns);
}

static PyObject *Core_local_count(Core *c, PyObject *arg) {
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int64_t idx = HL_HANDLE_INDEX(h);
    if (!c->lrefs || idx < 0 || (uint64_t)idx >= c->cap || c->lgen[idx] != HL_HANDLE_GEN(h))
        return PyLong_FromLong(0);
    return PyLong_FromUnsignedLong(c->lrefs[idx]);
}

/* Test hook: store a word like a device would (one plain 64-bit store, no wake, no propagation). */
static PyObject *Core_device_store(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "device_store(handle, word)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    uint64_t v = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    int64_t idx = check_handle(c, h, 0, 1);
    if (idx < 0) return NULL;
    __atomic_store_n(&slot(c, (uint32_t)idx)->word, v, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* view() -> the private layout of this domain (struct hl_dom), validated at
 * attach: offsets from the start of the mapping (0 = absent) and capacities.
 * Tools use it instead of re-reading the shared header. */
static PyObject *Core_view(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    const struct hl_dom *d = &c->dv;
    return Py_BuildValue("{s:K,s:K,s:I,s:K,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "size", (unsigned long long)d->size,
                         "participants_offset", (unsigned long long)((char *)d->parts - d->base),
                         "participant_capacity", d->participant_capacity, "fences_offset",
                         (unsigned long long)((char *)d->fences - d->base), "fence_capacity", d->fence_capacity,
                         "poll_ns", (unsigned long long)d->poll_ns, "heap_offset",
                         (unsigned long long)(d->heap ? (char *)d->heap - d->base : 0), "heap_data_offset",
                         (unsigned long long)(d->heap ? d->heap_data - d->base : 0), "heap_granules",
                         (unsigned long long)d->heap_granules, "heap_data_size", (unsigned long long)d->heap_data_size,
                         "trace_offset", (unsigned long long)(d->trace ? (char *)d->trace - d->base : 0),
                         "trace_capacity", (unsigned long long)d->trace_capacity);
}

/* guard_map(obj): put the memory of a buffer-protocol object (another
 * mapping of this domain's file, e.g. Domain.raw()) under the SIGBUS guard:
 * a truncation seen through it marks this domain truncated too. */
static PyObject *Core_guard_map(Core *c, PyObject *obj) {
    NEED_ATTACHED(c);
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) return NULL;
    guard_add_region(c, (uintptr_t)v.buf, (uintptr_t)v.buf + (uintptr_t)v.len);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyObject *Core_address(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    return PyLong_FromVoidPtr(c->base);
}


/* ------------------------------------------------------------------ */
/* queues (layout and protocol in hostless.h, "Command queues") */

static uint64_t queue_bytes(uint32_t cap) {
    return HL_QUEUE_HEADER_SIZE + ALIGN_UP(8ull * cap, 64) + (uint64_t)HL_PACKET_SIZE * cap;
}

static void queue_init(struct hl_queue *q, uint32_t cap) {
    memset(q, 0, HL_QUEUE_HEADER_SIZE);
    q->capacity = cap;
    q->packet_size = HL_PACKET_SIZE;
    q->cells_offset = HL_QUEUE_HEADER_SIZE;
    q->packets_offset = HL_QUEUE_HEADER_SIZE + ALIGN_UP(8ull * cap, 64);
    uint64_t *cells = (uint64_t *)((char *)q + q->cells_offset);
    for (uint32_t i = 0; i < cap; i++) cells[i] = HL_CELL(i, 0, HL_CELL_FREE);
    memset((char *)q + q->packets_offset, 0, (size_t)HL_PACKET_SIZE * cap);
    st(&q->magic, HL_QUEUE_MAGIC);
}

/* ---- trace ring ---- */
static void trace_emit_at(Core *c, uint64_t ts, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d,
                          uint64_t e) {
    struct hl_trace *t = c->trace;
    if (!t) return;
    uint64_t i = __atomic_fetch_add(&t->write, 1, __ATOMIC_RELAXED);
    struct hl_trace_event *ev = (struct hl_trace_event *)((char *)t + 64) + (i % c->trace_cap);
    __atomic_store_n(&ev->seq, 0, __ATOMIC_RELAXED);
    ev->ts_ns = ts;
    ev->type = type;
    ev->participant = (uint32_t)c->me;
    ev->a = a;
    ev->b = b;
    ev->c = cc;
    ev->d = d;
    ev->e = e;
    __atomic_store_n(&ev->seq, i + 1, __ATOMIC_RELEASE);
}

static void trace_emit(Core *c, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d, uint64_t e) {
    if (c->trace) trace_emit_at(c, now_ns(), type, a, b, cc, d, e);
}

/* The error for a heap lock that a live participant keeps (NULL, exception set). */
static PyObject *heap_lock_error(Core *c, struct hl_heap *hp) {
    uint64_t l = ld(&hp->lock);
    int i = HL_OWNER_INDEX((uint32_t)l);
    unsigned pid = (i >= 0 && (uint32_t)i < c->pcap) ? c->parts[i].pid : 0;
    hl_err(E_Hostless,
           "the shared heap is locked by participant %d (pid %u, lock word 0x%llx) for more than %.1f s: "
           "it is stopped inside an allocation, or the lock word was overwritten",
           i, pid, (unsigned long long)l, HEAP_LOCK_WAIT_NS / 1e9);
    return NULL;
}

/* A block whose free found the heap lock held by a live participant: its
 * slot stays DYING (ours) until retry_deferred() frees it (the watchdog, the
 * next allocation).  If we die first, our recovery finishes it. */
static void defer_free(Core *c, uint32_t idx, uint64_t dying) {
    pthread_mutex_lock(&c->defer_mu);
    if (c->ndefer < DEFER_MAX) {
        c->defer_idx[c->ndefer] = idx;
        c->defer_ctl[c->ndefer] = dying;
        c->ndefer++;
    } /* else: it stays DYING until our recovery (check() shows it) */
    pthread_mutex_unlock(&c->defer_mu);
}

static void retry_deferred(Core *c) {
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
        if (ld(&slot(c, idx[i])->ctl) == ctl[i]) finalize(c, idx[i], ctl[i]); /* may defer again */
}

/* Allocate a buffer of nbytes with its metadata; returns 0 and the handle
 * and the data's offset in the mapping, or -1 with an exception. */
static int do_block_new(Core *c, uint32_t kind, uint64_t nbytes, const void *meta, uint32_t qcap, uint64_t *handle,
                        uint64_t *abs_off) {
    struct hl_heap *hp = heap(c);
    if (!hp) {
        PyErr_SetString(E_OOM, "this domain has no heap (create it with heap=...)");
        return -1;
    }
    if (nbytes == 0) {
        PyErr_SetString(PyExc_ValueError, "a buffer needs at least one byte");
        return -1;
    }
    if (nbytes > c->dv.heap_data_size) {
        hl_err(E_OOM, "cannot allocate %llu bytes from the shared heap: %llu of %llu bytes free",
               (unsigned long long)nbytes,
               (unsigned long long)((c->dv.heap_granules - ld(&hp->used_granules)) * HL_GRANULE),
               (unsigned long long)c->dv.heap_data_size);
        return -1;
    }
    int large = nbytes >= HL_LARGE_BUFFER;
    uint64_t head = large ? HL_PAGE : HL_BUFFER_META_SIZE;
    uint64_t body = large ? ALIGN_UP(nbytes, HL_PAGE) : ALIGN_UP(nbytes, HL_GRANULE);
    uint64_t n = (head + body) / HL_GRANULE;
    uint64_t align = large ? HL_PAGE / HL_GRANULE : 1;
    uint32_t gen;
    int idx = alloc_begin(c, kind, 0, 0, &gen);
    if (idx < 0) {
        hl_err(E_Full, "fence table full (%u slots; buffers use slots too)", c->cap);
        return -1;
    }
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t g, used;
    int locked;
    retry_deferred(c);
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS; /* a lock wait never holds the GIL */
    locked = heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS);
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (!locked) {
        alloc_abort(c, (uint32_t)idx, kind, gen);
        heap_lock_error(c, hp);
        return -1;
    }
    uint64_t *bm = c->dv.heap_bitmap;
    g = large ? heap_find_down(c, bm, n, align) : heap_find(c, hp, bm, n, align);
    if (g != UINT64_MAX) {
        bits_set(bm, g, n, 1);
        hp->used_granules += n;
        hp->allocs++;
        if (!large) hp->hint = g + n < c->dv.heap_granules ? g + n : 0;
        st(&f->parents[0], g);
        st(&f->parents[1], n);
        st(&f->word, g * HL_GRANULE + head);
        st(&f->aux, nbytes);
    }
    used = hp->used_granules;
    heap_unlock(hp);
    if (g == UINT64_MAX) {
        alloc_abort(c, (uint32_t)idx, kind, gen);
        hl_err(E_OOM,
               "cannot allocate %llu bytes from the shared heap: %llu of %llu bytes free (no free run large enough)",
               (unsigned long long)nbytes, (unsigned long long)((c->dv.heap_granules - used) * HL_GRANULE),
               (unsigned long long)c->dv.heap_data_size);
        return -1;
    }
    uint64_t data = (uint64_t)(c->dv.heap_data - c->base) + g * HL_GRANULE + head;
    if (meta) memcpy(c->base + data - HL_BUFFER_META_SIZE, meta, HL_BUFFER_META_SIZE);
    if (kind == HL_KIND_QUEUE) queue_init((struct hl_queue *)(c->base + data), qcap);
    *handle = alloc_publish(c, (uint32_t)idx, kind, gen);
    *abs_off = data;
    return 0;
}

/* buffer_new(nbytes, meta) -> handle */
static PyObject *Core_buffer_new(Core *c, PyObject *args) {
    unsigned long long nbytes;
    Py_buffer meta;
    NEED_ATTACHED(c);
    if (!PyArg_ParseTuple(args, "Ky*", &nbytes, &meta)) return NULL;
    if (meta.len != HL_BUFFER_META_SIZE) {
        PyBuffer_Release(&meta);
        PyErr_SetString(PyExc_ValueError, "buffer metadata must be 128 bytes");
        return NULL;
    }
    uint64_t h, off;
    int r = do_block_new(c, HL_KIND_BUFFER, nbytes, meta.buf, 0, &h, &off);
    PyBuffer_Release(&meta);
    if (r < 0) return NULL;
    return PyLong_FromUnsignedLongLong(h);
}

/* buffer_info(handle) -> (absolute data offset in the mapping, nbytes, meta bytes) */
static PyObject *Core_buffer_info(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int64_t idx = check_handle(c, h, HL_KIND_BUFFER, 1);
    if (idx < 0) return NULL;
    uint64_t nbytes = 0;
    char *p = (char *)hl_buffer_data(&c->dv, h, &nbytes);
    if (!p || (uint64_t)(p - c->base) < HL_BUFFER_META_SIZE) {
        hl_err(E_Corrupt, "buffer 0x%llx has an extent outside the heap", (unsigned long long)h);
        return NULL;
    }
    return Py_BuildValue("(KKy#)", (unsigned long long)(p - c->base), (unsigned long long)nbytes,
                         p - HL_BUFFER_META_SIZE, (Py_ssize_t)HL_BUFFER_META_SIZE);
}

static PyObject *Core_heap_stats(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    struct hl_heap *hp = heap(c);
    if (!hp) return Py_BuildValue("{s:K}", "size", 0ull);
    uint64_t fr, lg, runs, used, repairs, allocs;
    int locked;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS;
    locked = heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS);
    if (locked) {
        heap_scan(c, c->dv.heap_bitmap, &fr, &lg, &runs);
        used = hp->used_granules;
        repairs = hp->repairs;
        allocs = hp->allocs;
        heap_unlock(hp);
    }
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (!locked) return heap_lock_error(c, hp);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "size", (unsigned long long)c->dv.heap_data_size,
                         "used", (unsigned long long)(used * HL_GRANULE), "free", (unsigned long long)(fr * HL_GRANULE),
                         "largest_free", (unsigned long long)(lg * HL_GRANULE), "free_runs",
                         (unsigned long long)runs, "repairs", (unsigned long long)repairs, "allocs",
                         (unsigned long long)allocs, "data_offset",
                         (unsigned long long)(c->dv.heap_data - c->base));
}

/* heap_bitmap_copy() -> bytes of the bitmap (under the lock), for check() */
static PyObject *Core_heap_snapshot(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    struct hl_heap *hp = heap(c);
    if (!hp) Py_RETURN_NONE;
    uint64_t nb = (c->dv.heap_granules + 63) / 64 * 8;
    PyObject *bits = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)nb);
    if (!bits) return NULL;
    PyObject *slots = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((uint64_t)c->cap * HL_FENCE_SIZE));
    if (!slots) {
        Py_DECREF(bits);
        return NULL;
    }
    uint64_t used = 0;
    int locked;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS;
    locked = heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS);
    if (locked) {
        memcpy(PyBytes_AS_STRING(bits), c->dv.heap_bitmap, nb);
        memcpy(PyBytes_AS_STRING(slots), c->fences, (size_t)c->cap * HL_FENCE_SIZE);
        used = hp->used_granules;
        heap_unlock(hp);
    }
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (!locked) {
        Py_DECREF(bits);
        Py_DECREF(slots);
        return heap_lock_error(c, hp);
    }
    return Py_BuildValue("(NNKK)", bits, slots, (unsigned long long)used, (unsigned long long)c->dv.heap_granules);
}

/* Test hook: take the heap lock and never give it back (as a holder killed
 * inside the critical section would). */
static PyObject *Core_heap_lock_forever(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    struct hl_heap *hp = heap(c);
    if (!hp) Py_RETURN_NONE;
    if (!heap_lock_for(c, hp, HEAP_LOCK_WAIT_NS)) return heap_lock_error(c, hp);
    Py_RETURN_NONE;
}


/* ---- queue methods ---- */

/* Validate a queue we hold and fill *v (hl_queue_open); NULL with an exception. */
static struct hl_queue *get_qview(Core *c, uint64_t h, struct hl_qview *v) {
    if (check_handle(c, h, HL_KIND_QUEUE, 1) < 0) return NULL;
    if (hl_queue_open(&c->dv, h, v) != HL_OK) {
        hl_err(E_Corrupt, "queue 0x%llx has a corrupt header or lies outside the heap", (unsigned long long)h);
        return NULL;
    }
    return v->q;
}

static struct hl_queue *get_queue(Core *c, uint64_t h) {
    struct hl_qview v;
    return get_qview(c, h, &v);
}

/* queue_new(capacity) -> handle */
static PyObject *Core_queue_new(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    long cap = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (cap < 2 || cap > (1L << 20) || (cap & (cap - 1))) {
        PyErr_SetString(PyExc_ValueError, "queue capacity must be a power of two in 2..2^20");
        return NULL;
    }
    uint64_t h, off;
    if (do_block_new(c, HL_KIND_QUEUE, queue_bytes((uint32_t)cap), NULL, (uint32_t)cap, &h, &off) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(h);
}

/* queue_bind(handle): become the queue's consumer (free, or its consumer is dead) */
static PyObject *Core_queue_bind(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    struct hl_queue *q = get_queue(c, h);
    if (!q) return NULL;
    uint32_t me = HL_OWNER(c->inc, c->me);
    uint32_t cur = __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST);
    for (;;) {
        if (cur == me) Py_RETURN_NONE;
        if (cur && owner_alive(c, cur)) {
            hl_err(E_Invalid, "queue 0x%llx already has a live consumer (participant %u)", (unsigned long long)h, cur);
            return NULL;
        }
        if (__atomic_compare_exchange_n(&q->consumer, &cur, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) break;
    }
    __atomic_or_fetch(&q->flags, HL_QUEUE_WAS_BOUND, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static int parse_packet(PyObject *o, struct hl_packet *p) {
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0) return -1;
    if (b.len != HL_PACKET_SIZE) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "a packet is 64 bytes");
        return -1;
    }
    memcpy(p, b.buf, HL_PACKET_SIZE);
    PyBuffer_Release(&b);
    return 0;
}

/* queue_push(handle, packet: 64 bytes, timeout_ns) -> write index.  Blocks
 * while the queue is full (QueueFull after timeout_ns; <0 = forever, 0 = try). */
static PyObject *Core_queue_push(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_push(handle, packet, timeout_ns)");
        return NULL;
    }
    uint64_t h;
    struct hl_packet p;
    if (get_handle_arg(args[0], &h) < 0 || parse_packet(args[1], &p) < 0) return NULL;
    long long timeout = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    struct hl_qview v;
    struct hl_queue *q = get_qview(c, h, &v);
    if (!q) return NULL;
    uint64_t idx = 0, t0 = 0, t_pushed = 0;
    int r, dead = 0;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS;
    for (unsigned it = 0;; it++) {
        r = hl_queue_push(&v, &p, (uint32_t)c->me, &idx);
        if (r != HL_E_FULL || CLOSING(c)) break;
        uint64_t t = now_ns();
        if (!t0) t0 = t;
        uint32_t cons = __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST);
        if ((it & 255) == 255 && (cons ? !owner_alive(c, cons)
                                       : (__atomic_load_n(&q->flags, __ATOMIC_SEQ_CST) & HL_QUEUE_WAS_BOUND))) {
            dead = 1; /* its consumer died (recovery may already have unbound it) */
            break;
        }
        if (timeout >= 0 && t - t0 >= (uint64_t)timeout) break;
        if (it < 200) {
            cpu_relax();
            continue;
        }
        /* sleep until the consumer frees a cell (it wakes us), bounded */
        uint64_t ri = ld(&q->read_index);
        __atomic_add_fetch(&q->space_waiters, 1, __ATOMIC_SEQ_CST);
        r = hl_queue_push(&v, &p, (uint32_t)c->me, &idx);
        if (r != HL_E_FULL) {
            __atomic_sub_fetch(&q->space_waiters, 1, __ATOMIC_SEQ_CST);
            break;
        }
        uint64_t nap = c->poll_ns;
        if (timeout >= 0 && (uint64_t)timeout - (t - t0) < nap) nap = (uint64_t)timeout - (t - t0);
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        syscall(SYS_futex, (uint32_t *)&q->read_index, FUTEX_WAIT, (uint32_t)ri, &ts, 0, 0);
        __atomic_sub_fetch(&q->space_waiters, 1, __ATOMIC_SEQ_CST);
    }
    t_pushed = now_ns(); /* stamped before the GIL is taken back */
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (r == HL_E_FULL && CLOSING(c)) {
        CLOSED_ERROR(c, "the domain was closed while the queue was full");
        return NULL;
    }
    if (dead) {
        hl_err(E_Invalid, "queue 0x%llx: its consumer died; respawn the agent", (unsigned long long)h);
        return NULL;
    }
    if (r == HL_E_FULL) {
        hl_err(E_QueueFull, "queue 0x%llx is full (%llu packets)", (unsigned long long)h,
               (unsigned long long)v.capacity);
        return NULL;
    }
    if (r != HL_OK) {
        hl_err(E_Corrupt, "queue 0x%llx: its cells contradict its write index (corrupt queue)",
               (unsigned long long)h);
        return NULL;
    }
    trace_emit_at(c, t_pushed, HL_EV_ENQUEUE, h, idx, p.signal, p.kernel, p.type);
    return PyLong_FromUnsignedLongLong(idx);
}

/* queue_pop(handle, timeout_ns, spin_ns) -> (index, packet bytes) or None on
 * timeout.  Consumer only.  Skips cells abandoned by dead producers. */
static PyObject *Core_queue_pop(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_pop(handle, timeout_ns, spin_ns)");
        return NULL;
    }
    uint64_t h;
    if (get_handle_arg(args[0], &h) < 0) return NULL;
    long long timeout = PyLong_AsLongLong(args[1]);
    long long spin = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    struct hl_qview v;
    struct hl_queue *q = get_qview(c, h, &v);
    if (!q) return NULL;
    if (__atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST) != HL_OWNER(c->inc, c->me)) {
        hl_err(E_Invalid, "queue 0x%llx: only its bound consumer may pop (call queue_bind)", (unsigned long long)h);
        return NULL;
    }
    uint64_t *cells = v.cells;
    struct hl_packet *pk = v.packets;
    uint64_t mask = v.capacity - 1;
    struct hl_packet out;
    uint64_t r = 0, t0 = now_ns();
    int got = 0;
    uint64_t poll = c->poll_ns;
    BUSY_ENTER(c);
    Py_BEGIN_ALLOW_THREADS;
    for (unsigned it = 0;; it++) {
        if (CLOSING(c)) break;
        r = ld(&q->read_index);
        uint64_t cl = __atomic_load_n(&cells[r & mask], __ATOMIC_ACQUIRE);
        uint32_t stt = HL_CELL_STATE(cl);
        if (HL_CELL_SEQ(cl) == (r & 0xffffffffffffULL) && (stt == HL_CELL_READY || stt == HL_CELL_SKIP)) {
            if (stt == HL_CELL_READY) memcpy(&out, &pk[r & mask], sizeof out);
            st(&cells[r & mask], HL_CELL(r + v.capacity, 0, HL_CELL_FREE));
            st(&q->read_index, r + 1);
            if (__atomic_load_n(&q->space_waiters, __ATOMIC_SEQ_CST))
                syscall(SYS_futex, (uint32_t *)&q->read_index, FUTEX_WAKE, 0x7fffffff, 0, 0, 0);
            if (stt == HL_CELL_READY) {
                got = 1;
                break;
            }
            /* a SKIP cell: go on, but a queue full of them (or rewritten ones) still honours the timeout */
            if ((it & 63) == 63 && timeout >= 0 && now_ns() - t0 >= (uint64_t)timeout) break;
            continue;
        }
        if ((it & 63) != 63) {
            cpu_relax();
            continue;
        }
        uint64_t t = now_ns();
        if (timeout >= 0 && t - t0 >= (uint64_t)timeout) break;
        if (t - t0 < (uint64_t)(spin > 0 ? spin : 0)) {
            /* polling: give the CPU away now and then, so that a consumer spinning
             * on a machine with fewer cores than busy processes does not starve
             * the producer it is waiting for */
            if ((it & 1023) == 1023) sched_yield();
            continue;
        }
        /* idle: sleep on the doorbell, bounded (devices ring it without a wake-up) */
        uint64_t db = ld(&q->doorbell);
        __atomic_add_fetch(&q->doorbell_waiters, 1, __ATOMIC_SEQ_CST);
        cl = ld(&cells[r & mask]);
        if (!(HL_CELL_SEQ(cl) == (r & 0xffffffffffffULL) &&
              (HL_CELL_STATE(cl) == HL_CELL_READY || HL_CELL_STATE(cl) == HL_CELL_SKIP))) {
            uint64_t nap = poll;
            if (timeout >= 0 && (uint64_t)timeout - (t - t0) < nap) nap = (uint64_t)timeout - (t - t0);
            struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
            syscall(SYS_futex, (uint32_t *)&q->doorbell, FUTEX_WAIT, (uint32_t)db, &ts, 0, 0);
        }
        __atomic_sub_fetch(&q->doorbell_waiters, 1, __ATOMIC_SEQ_CST);
    }
    BUSY_LEAVE(c);
    Py_END_ALLOW_THREADS;
    if (!got && CLOSING(c)) {
        CLOSED_ERROR(c, "the domain was closed during the wait");
        return NULL;
    }
    if (!got) Py_RETURN_NONE;
    return Py_BuildValue("(Ky#)", (unsigned long long)r, (const char *)&out, (Py_ssize_t)sizeof out);
}

/* queue_info(handle) -> dict */
static PyObject *Core_queue_info(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    if (get_handle_arg(arg, &h) < 0) return NULL;
    struct hl_qview v;
    struct hl_queue *q = get_qview(c, h, &v);
    if (!q) return NULL;
    return Py_BuildValue("{s:K,s:K,s:K,s:I,s:K,s:K}", "capacity", (unsigned long long)v.capacity, "write_index",
                         (unsigned long long)ld(&q->write_index), "read_index", (unsigned long long)ld(&q->read_index),
                         "consumer", __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST), "completed",
                         (unsigned long long)ld(&q->completed), "doorbell", (unsigned long long)ld(&q->doorbell));
}

/* queue_view(handle) -> (queue, cells, packets) host addresses and capacity,
 * validated once (struct hl_qview): what a device producer is handed */
static PyObject *Core_queue_view(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    struct hl_qview v;
    if (get_handle_arg(arg, &h) < 0 || !get_qview(c, h, &v)) return NULL;
    return Py_BuildValue("(KKKK)", (unsigned long long)(uintptr_t)v.q, (unsigned long long)(uintptr_t)v.cells,
                         (unsigned long long)(uintptr_t)v.packets, (unsigned long long)v.capacity);
}

/* queue_doorbell_addr(handle) -> host address of the queue's doorbell word */
static PyObject *Core_queue_doorbell_addr(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    if (get_handle_arg(arg, &h) < 0) return NULL;
    struct hl_queue *q = get_queue(c, h);
    if (!q) return NULL;
    return PyLong_FromVoidPtr((void *)&q->doorbell);
}

static PyObject *Core_queue_completed(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h;
    if (get_handle_arg(arg, &h) < 0) return NULL;
    struct hl_queue *q = get_queue(c, h);
    if (!q) return NULL;
    __atomic_add_fetch(&q->completed, 1, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* Test hook: reserve a cell, write only its signal handle, and stop (as a
 * producer killed while filling would). */
static PyObject *Core_queue_reserve_stuck(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    uint64_t h, sig;
    if (nargs != 2 || get_handle_arg(args[0], &h) < 0 || get_handle_arg(args[1], &sig) < 0) return NULL;
    struct hl_qview v;
    struct hl_queue *q = get_qview(c, h, &v);
    if (!q) return NULL;
    uint64_t *cells = v.cells;
    uint64_t mask = v.capacity - 1;
    for (;;) {
        uint64_t w = ld(&q->write_index), cl = ld(&cells[w & mask]);
        if (HL_CELL_STATE(cl) == HL_CELL_FREE && HL_CELL_SEQ(cl) == (w & 0xffffffffffffULL)) {
            if (cas(&cells[w & mask], &cl, HL_CELL(w, (uint32_t)c->me, HL_CELL_RESERVED))) {
                uint64_t ww = w;
                cas(&q->write_index, &ww, w + 1);
                v.packets[w & mask].signal = sig;
                return PyLong_FromUnsignedLongLong(w);
            }
        } else {
            PyErr_SetString(E_QueueFull, "queue full");
            return NULL;
        }
    }
}

/* trace(type, a, b, c, d, e) -- append an event to the domain's trace ring */
static PyObject *Core_trace(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "trace(type, a, b, c, d, e)");
        return NULL;
    }
    if (!c->trace) Py_RETURN_NONE;
    unsigned long long v[6];
    for (int i = 0; i < 6; i++) {
        v[i] = PyLong_AsUnsignedLongLongMask(args[i]);
        if (PyErr_Occurred()) return NULL;
    }
    trace_emit(c, (uint32_t)v[0], v[1], v[2], v[3], v[4], v[5]);
    Py_RETURN_NONE;
}

static PyObject *Core_trace_enabled(Core *c, PyObject *noargs) { return PyBool_FromLong(c->base && c->trace); }

static PyObject *Core_now_ns(PyObject *m, PyObject *noargs) { return PyLong_FromUnsignedLongLong(now_ns()); }

/* A host function for cuLaunchHostFunc: wakes the host threads asleep on the
 * futex word at `addr` (a completion word or a queue doorbell) after a GPU
 * stored to it.  Runs in CUDA's callback thread: no Python, one syscall. */
/* Host function a CUDA stream runs after a device store to a slot's word
 * (addr = the slot): wakes its host sleepers as a host signaler would. */
static void hl_host_wake(void *addr) {
    struct hl_fence *f = (struct hl_fence *)addr;
    if (HL_CTL_KIND(__atomic_load_n(&f->ctl, __ATOMIC_SEQ_CST)) == HL_KIND_TIMELINE)
        hl_wake_timeline(f);
    else
        syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 0x7fffffff, 0, 0, 0);
}

static PyObject *py_host_wake_fn(PyObject *m, PyObject *noargs) {
    return PyLong_FromVoidPtr((void *)(uintptr_t)&hl_host_wake);
}

static PyObject *Core_new_obj(Core *c, PyObject *const *args, Py_ssize_t nargs);
static PyObject *Core_adopt(Core *c, PyObject *const *args, Py_ssize_t nargs);
static PyObject *Core_wrap(Core *c, PyObject *const *args, Py_ssize_t nargs);
static PyObject *Core_new_buffer(Core *c, PyObject *const *args, Py_ssize_t nargs);

static PyObject *Core_set_spin(Core *c, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    c->spin_ns = v < 0 ? 0 : v;
    Py_RETURN_NONE;
}

static PyMethodDef Core_methods[] = {
    {"set_spin", (PyCFunction)Core_set_spin, METH_O, NULL},
    {"queue_new", (PyCFunction)Core_queue_new, METH_O, NULL},
    {"queue_bind", (PyCFunction)Core_queue_bind, METH_O, NULL},
    {"queue_push", (PyCFunction)(void (*)(void))Core_queue_push, METH_FASTCALL, NULL},
    {"queue_pop", (PyCFunction)(void (*)(void))Core_queue_pop, METH_FASTCALL, NULL},
    {"queue_info", (PyCFunction)Core_queue_info, METH_O, NULL},
    {"queue_completed", (PyCFunction)Core_queue_completed, METH_O, NULL},
    {"queue_doorbell_addr", (PyCFunction)Core_queue_doorbell_addr, METH_O, NULL},
    {"queue_view", (PyCFunction)Core_queue_view, METH_O, NULL},
    {"queue_reserve_stuck", (PyCFunction)(void (*)(void))Core_queue_reserve_stuck, METH_FASTCALL, NULL},
    {"trace", (PyCFunction)(void (*)(void))Core_trace, METH_FASTCALL, NULL},
    {"trace_enabled", (PyCFunction)Core_trace_enabled, METH_NOARGS, NULL},
    {"new", (PyCFunction)(void (*)(void))Core_new_obj, METH_FASTCALL, NULL},
    {"adopt", (PyCFunction)(void (*)(void))Core_adopt, METH_FASTCALL, NULL},
    {"wrap", (PyCFunction)(void (*)(void))Core_wrap, METH_FASTCALL, NULL},
    {"new_buffer", (PyCFunction)(void (*)(void))Core_new_buffer, METH_FASTCALL, NULL},
    {"buffer_new", (PyCFunction)Core_buffer_new, METH_VARARGS, NULL},
    {"buffer_info", (PyCFunction)Core_buffer_info, METH_O, NULL},
    {"heap_stats", (PyCFunction)Core_heap_stats, METH_NOARGS, NULL},
    {"heap_snapshot", (PyCFunction)Core_heap_snapshot, METH_NOARGS, NULL},
    {"heap_lock_forever", (PyCFunction)Core_heap_lock_forever, METH_NOARGS, NULL},
    {"attach", (PyCFunction)Core_attach, METH_VARARGS, NULL},
    {"leave", (PyCFunction)Core_leave, METH_NOARGS, NULL},
    {"abandon", (PyCFunction)Core_abandon, METH_NOARGS, NULL},
    {"create", (PyCFunction)Core_create, METH_VARARGS, NULL},
    {"merge", (PyCFunction)Core_merge, METH_O, NULL},
    {"import_", (PyCFunction)Core_import, METH_O, NULL},
    {"release", (PyCFunction)Core_release, METH_O, NULL},
    {"signal", (PyCFunction)(void (*)(void))Core_signal, METH_FASTCALL, NULL},
    {"word", (PyCFunction)Core_word, METH_O, NULL},
    {"aux", (PyCFunction)Core_aux, METH_O, NULL},
    {"tl_signal", (PyCFunction)(void (*)(void))Core_tl_signal, METH_FASTCALL, NULL},
    {"tl_fail", (PyCFunction)(void (*)(void))Core_tl_fail, METH_FASTCALL, NULL},
    {"wait", (PyCFunction)(void (*)(void))Core_wait, METH_FASTCALL, NULL},
    {"wait_any", (PyCFunction)Core_wait_any, METH_VARARGS, NULL},
    {"kick", (PyCFunction)Core_kick, METH_NOARGS, NULL},
    {"kick_value", (PyCFunction)Core_kick_value, METH_NOARGS, NULL},
    {"reap", (PyCFunction)Core_reap, METH_NOARGS, NULL},
    {"participants", (PyCFunction)Core_participants, METH_NOARGS, NULL},
    {"lock_held", (PyCFunction)Core_lock_held, METH_O, NULL},
    {"info", (PyCFunction)Core_info, METH_NOARGS, NULL},
    {"local_count", (PyCFunction)Core_local_count, METH_O, NULL},
    {"device_store", (PyCFunction)(void (*)(void))Core_device_store, METH_FASTCALL, NULL},
    {"address", (PyCFunction)Core_address, METH_NOARGS, NULL},
    {"view", (PyCFunction)Core_view, METH_NOARGS, "the private layout validated at attach"},
    {"guard_map", (PyCFunction)Core_guard_map, METH_O, "put another mapping of the domain under the SIGBUS guard"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostless._core.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Core_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
};

/* ------------------------------------------------------------------ */
/* Handle: the C base of hostless.Fence, Timeline and Buffer.  It holds one
 * local reference (a count in Core.lrefs) and gives the hot operations
 * (signal, wait, release) without a Python frame.  For buffers it also
 * exports the buffer protocol over a window of a Python mmap object; each
 * export pins the mmap, so the mapping cannot be closed under a live view. */

static PyObject *StatusCls, *StatusMap;

typedef struct {
    PyObject_HEAD
    Core *core;
    PyObject *dom;
    uint64_t handle;
    int held;
    PyObject *bb_map;
    Py_ssize_t bb_off;
    Py_ssize_t bb_len;
    int bb_readonly;
    int bb_ndim;                        /* 0: plain bytes */
    Py_ssize_t bb_itemsize;
    Py_ssize_t bb_shape[HL_BUFFER_MAX_DIMS];
    char bb_fmt[16];                    /* PEP 3118 format of one item */
    PyObject *weakreflist;
} Handle;

struct export {
    Py_buffer inner;                    /* pins the mmap */
    Py_ssize_t shape[HL_BUFFER_MAX_DIMS];
    Py_ssize_t strides[HL_BUFFER_MAX_DIMS];
};

static PyTypeObject HandleType;

static PyObject *status_obj(uint64_t s) {
    if (!hl_status_valid(s)) {
        /* a completion word no conforming participant writes (a timeline's
         * word >= 2^62 without a valid status, a fence word of 1, 5, ...) */
        hl_err(E_Corrupt,
               "the object completed with an invalid status word 0x%llx (written by a buggy or hostile "
               "participant)",
               (unsigned long long)s);
        return NULL;
    }
    PyObject *k = PyLong_FromUnsignedLongLong(s);
    if (!k) return NULL;
    PyObject *m = StatusMap ? PyDict_GetItemWithError(StatusMap, k) : NULL;
    if (m) {
        Py_DECREF(k);
        return Py_NewRef(m);
    }
    if (PyErr_Occurred() || !StatusCls) {
        Py_DECREF(k);
        return NULL;
    }
    PyObject *r = PyObject_CallOneArg(StatusCls, k);
    Py_DECREF(k);
    return r;
}

static int handle_live(Handle *o) {
    if (!o->held) {
        hl_err(E_Handle, "object 0x%llx was released", (unsigned long long)o->handle);
        return 0;
    }
    if (!o->core || !o->core->base || o->core->me < 0) {
        PyErr_SetString(E_Closed, "the object's domain is closed");
        return 0;
    }
    return 1;
}

static Handle *handle_make(PyTypeObject *cls, Core *c, PyObject *dom, uint64_t h) {
    if (!PyType_IsSubtype(cls, &HandleType)) {
        PyErr_SetString(PyExc_TypeError, "class must derive from hostless._core.Handle");
        return NULL;
    }
    Handle *o = (Handle *)cls->tp_alloc(cls, 0);
    if (!o) return NULL;
    o->core = (Core *)Py_NewRef((PyObject *)c);
    o->dom = Py_NewRef(dom);
    o->handle = h;
    o->held = 1;
    return o;
}

static PyObject *Handle_release(Handle *o, PyObject *noargs) {
    if (!o->held) {
        hl_err(E_Handle, "object 0x%llx was already released", (unsigned long long)o->handle);
        return NULL;
    }
    o->held = 0;
    Py_CLEAR(o->bb_map);
    o->bb_len = 0;
    if (o->core && o->core->base && o->core->me >= 0 && do_release(o->core, o->handle) < 0) return NULL;
    Py_RETURN_NONE;
}

static int parse_timeout(PyObject *t, long long *ns) {
    if (!t || t == Py_None) {
        *ns = -1;
        return 0;
    }
    double d = PyFloat_AsDouble(t);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (d < 0 || d != d) {
        PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 or None");
        return -1;
    }
    *ns = d > 9e9 ? (long long)9e18 : (long long)(d * 1e9);
    return 0;
}

/* parse (pos..., *, spin=None) where pos names are given; returns 0 */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names, int npos,
                      PyObject **out, int nout) {
    for (int i = 0; i < nout; i++) out[i] = NULL;
    if (nargs > npos) {
        PyErr_Format(PyExc_TypeError, "takes at most %d positional arguments", npos);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            const char *kn = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
            if (!kn) return -1;
            int found = 0;
            for (int i = 0; i < nout; i++) {
                if (strcmp(kn, names[i]) == 0) {
                    if (out[i]) {
                        PyErr_Format(PyExc_TypeError, "got multiple values for argument '%s'", kn);
                        return -1;
                    }
                    out[i] = args[nargs + k];
                    found = 1;
                }
            }
            if (!found) {
                PyErr_Format(PyExc_TypeError, "unexpected keyword argument '%s'", kn);
                return -1;
            }
        }
    }
    return 0;
}

static int parse_spin(Core *c, PyObject *sp, long long *ns) {
    if (!sp || sp == Py_None) {
        *ns = c->spin_ns;
        return 0;
    }
    double d = PyFloat_AsDouble(sp);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (d < 0 || d != d) {
        PyErr_SetString(PyExc_ValueError, "spin must be >= 0");
        return -1;
    }
    *ns = (long long)(d * 1e9);
    return 0;
}

/* Fence.signal(status=SUCCESS) */
static PyObject *Handle_fence_signal(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"status"};
    PyObject *a[1];
    if (parse_args(args, nargs, kwnames, names, 1, a, 1) < 0) return NULL;
    unsigned long long s = HL_STATUS_SUCCESS;
    if (a[0]) {
        s = PyLong_AsUnsignedLongLong(a[0]);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "a status is an int: SUCCESS, ERROR, CANCEL, OWNER_DIED or 64..2^32-1");
            return NULL;
        }
    }
    if (!handle_live(o) || do_signal(o->core, o->handle, s) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Fence.wait(timeout=None, *, spin=None) -> Status */
static PyObject *Handle_fence_wait(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"timeout", "spin"};
    PyObject *a[2];
    long long tmo, spin;
    uint64_t w;
    if (parse_args(args, nargs, kwnames, names, 1, a, 2) < 0) return NULL;
    if (!handle_live(o) || parse_timeout(a[0], &tmo) < 0 || parse_spin(o->core, a[1], &spin) < 0) return NULL;
    int r = do_wait(o->core, o->handle, 1, tmo, spin, &w);
    if (r < 0) return NULL;
    if (r == 1) {
        hl_err(PyExc_TimeoutError, "fence 0x%llx not signaled within the timeout", (unsigned long long)o->handle);
        return NULL;
    }
    return status_obj(w);
}

/* Timeline.signal(value) */
static PyObject *Handle_timeline_signal(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"value"};
    PyObject *a[1];
    if (parse_args(args, nargs, kwnames, names, 1, a, 1) < 0) return NULL;
    if (!a[0]) {
        PyErr_SetString(PyExc_TypeError, "signal() needs a value");
        return NULL;
    }
    if (!PyLong_Check(a[0]) || PyBool_Check(a[0])) {
        PyErr_SetString(PyExc_TypeError, "timeline values are ints");
        return NULL;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(a[0]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "timeline values are integers in 0..2^62-1");
        return NULL;
    }
    if (!handle_live(o) || do_tl_signal(o->core, o->handle, v) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Timeline.wait(value, timeout=None, *, spin=None) -> Status (SUCCESS or the failure) */
static PyObject *Handle_timeline_wait(Handle *o, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    static const char *const names[] = {"value", "timeout", "spin"};
    PyObject *a[3];
    long long tmo, spin;
    uint64_t w;
    if (parse_args(args, nargs, kwnames, names, 2, a, 3) < 0) return NULL;
    if (!a[0]) {
        PyErr_SetString(PyExc_TypeError, "wait() needs a value");
        return NULL;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(a[0]);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > HL_TIMELINE_MAX) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "timeline values are integers in 0..2^62-1");
        return NULL;
    }
    if (!handle_live(o) || parse_timeout(a[1], &tmo) < 0 || parse_spin(o->core, a[2], &spin) < 0) return NULL;
    int r = do_wait(o->core, o->handle, v, tmo, spin, &w);
    if (r < 0) return NULL;
    if (r == 1) {
        hl_err(PyExc_TimeoutError, "timeline 0x%llx did not reach %llu within the timeout",
               (unsigned long long)o->handle, v);
        return NULL;
    }
    if ((w & HL_TIMELINE_FAILED) ? (w & ~HL_TIMELINE_FAILED) > 0xffffffffull || (w & 0xffffffffull) == HL_STATUS_SUCCESS
                                 : w > HL_TIMELINE_MAX) {
        hl_err(E_Corrupt, "timeline 0x%llx holds an invalid word 0x%llx (written by a buggy or hostile participant)",
               (unsigned long long)o->handle, (unsigned long long)w);
        return NULL;
    }
    return status_obj(w & HL_TIMELINE_FAILED ? (w & 0xffffffffull) : HL_STATUS_SUCCESS);
}

static int Handle_getbuffer(Handle *b, Py_buffer *view, int flags) {
    if (!b->bb_map) {
        PyErr_SetString(PyExc_BufferError, b->held ? "this object has no memory" : "buffer was released");
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) && b->bb_readonly) {
        PyErr_SetString(PyExc_BufferError, "buffer is read-only");
        return -1;
    }
    struct export *ex = PyMem_Malloc(sizeof(struct export));
    if (!ex) {
        PyErr_NoMemory();
        return -1;
    }
    Py_buffer *inner = &ex->inner;
    if (PyObject_GetBuffer(b->bb_map, inner, PyBUF_SIMPLE) < 0) {
        PyMem_Free(ex);
        return -1;
    }
    if (b->bb_off < 0 || b->bb_len < 0 || b->bb_off > inner->len || b->bb_len > inner->len - b->bb_off) {
        PyBuffer_Release(inner);
        PyMem_Free(ex);
        PyErr_SetString(PyExc_BufferError, "buffer window lies outside the mapping");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)b, (char *)inner->buf + b->bb_off, b->bb_len, b->bb_readonly, flags) < 0) {
        PyBuffer_Release(inner);
        PyMem_Free(ex);
        return -1;
    }
    /* typed, shaped export (C-contiguous) when the layout is known and asked for */
    if (b->bb_ndim > 0 && (flags & PyBUF_ND) == PyBUF_ND) {
        Py_ssize_t st = b->bb_itemsize;
        for (int i = b->bb_ndim - 1; i >= 0; i--) {
            ex->shape[i] = b->bb_shape[i];
            ex->strides[i] = st;
            st *= b->bb_shape[i];
        }
        view->itemsize = b->bb_itemsize;
        view->format = (flags & PyBUF_FORMAT) ? b->bb_fmt : NULL;
        view->ndim = b->bb_ndim;
        view->shape = ex->shape;
        view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? ex->strides : NULL;
    }
    view->internal = ex;
    return 0;
}

static void Handle_releasebuffer(Handle *b, Py_buffer *view) {
    struct export *ex = (struct export *)view->internal;
    if (ex) {
        PyBuffer_Release(&ex->inner);
        PyMem_Free(ex);
    }
}

static PyBufferProcs Handle_as_buffer = {
    (getbufferproc)Handle_getbuffer,
    (releasebufferproc)Handle_releasebuffer,
};

/* Set the typed layout of a window (0 dims: plain bytes). */
static int set_layout(Handle *b, const char *fmt, Py_ssize_t itemsize, PyObject *shape, Py_ssize_t len) {
    b->bb_ndim = 0;
    if (fmt && shape && shape != Py_None) {
        PyObject *seq = PySequence_Fast(shape, "shape must be a sequence");
        if (!seq) return -1;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
        Py_ssize_t total = itemsize;
        if (nd == 0) { /* a 0-d buffer exports plain bytes */
            Py_DECREF(seq);
            return 0;
        }
        if (nd < 1 || nd > HL_BUFFER_MAX_DIMS || strlen(fmt) >= sizeof b->bb_fmt || itemsize <= 0) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bad window layout");
            return -1;
        }
        for (Py_ssize_t i = 0; i < nd; i++) {
            b->bb_shape[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
            total *= b->bb_shape[i];
        }
        Py_DECREF(seq);
        if (PyErr_Occurred()) return -1;
        if (total != len) {
            PyErr_SetString(PyExc_ValueError, "window layout does not match its length");
            return -1;
        }
        strcpy(b->bb_fmt, fmt);
        b->bb_itemsize = itemsize;
        b->bb_ndim = (int)nd;
    }
    return 0;
}

static PyObject *Handle_set_window(Handle *b, PyObject *args) {
    PyObject *map, *shape = NULL;
    Py_ssize_t off, len;
    int ro;
    const char *fmt = NULL;
    Py_ssize_t itemsize = 0;
    if (!PyArg_ParseTuple(args, "Onnp|snO", &map, &off, &len, &ro, &fmt, &itemsize, &shape)) return NULL;
    if (set_layout(b, fmt, itemsize, shape, len) < 0) return NULL;
    if (map == Py_None)
        Py_CLEAR(b->bb_map);
    else
        Py_XSETREF(b->bb_map, Py_NewRef(map));
    b->bb_off = off;
    b->bb_len = len;
    b->bb_readonly = ro;
    Py_RETURN_NONE;
}

static int Handle_traverse(Handle *b, visitproc visit, void *arg) {
    Py_VISIT(b->bb_map);
    Py_VISIT(b->dom);
    Py_VISIT((PyObject *)b->core);
    return 0;
}

static int Handle_clear(Handle *b) {
    Py_CLEAR(b->bb_map);
    Py_CLEAR(b->dom);
    Py_CLEAR(b->core);
    return 0;
}

/* Dropping the last Python reference drops the domain reference too (as
 * release() would), unless the domain is closed. */
static void Handle_finalize(Handle *o) {
    if (o->held && o->core && o->core->base && o->core->me >= 0) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        o->held = 0;
        if (do_release(o->core, o->handle) < 0) PyErr_Clear();
        PyErr_Restore(et, ev, tb);
    }
}

static void Handle_dealloc(Handle *o) {
    PyTypeObject *tp = Py_TYPE(o);
    if (PyObject_CallFinalizerFromDealloc((PyObject *)o) < 0) return;
    PyObject_GC_UnTrack(o);
    if (o->weakreflist) PyObject_ClearWeakRefs((PyObject *)o);
    Handle_clear(o);
    tp->tp_free((PyObject *)o); /* a heap subtype's reference is dropped by subtype_dealloc */
}

static PyObject *Handle_get_held(Handle *o, void *closure) { return PyBool_FromLong(o->held); }
static PyObject *Handle_get_handle(Handle *o, void *closure) { return PyLong_FromUnsignedLongLong(o->handle); }
static PyObject *Handle_get_dom(Handle *o, void *closure) { return Py_NewRef(o->dom ? o->dom : Py_None); }
static PyObject *Handle_get_core(Handle *o, void *closure) {
    return Py_NewRef(o->core ? (PyObject *)o->core : Py_None);
}
static PyObject *Handle_get_nbytes(Handle *o, void *closure) { return PyLong_FromSsize_t(o->bb_len); }
static PyObject *Handle_get_offset(Handle *o, void *closure) { return PyLong_FromSsize_t(o->bb_off); }

static PyGetSetDef Handle_getset[] = {
    {"handle", (getter)Handle_get_handle, NULL, "global 64-bit handle, valid in every participant", NULL},
    {"_held", (getter)Handle_get_held, NULL, NULL, NULL},
    {"_dom", (getter)Handle_get_dom, NULL, NULL, NULL},
    {"_core", (getter)Handle_get_core, NULL, NULL, NULL},
    {"_window_len", (getter)Handle_get_nbytes, NULL, NULL, NULL},
    {"_window_off", (getter)Handle_get_offset, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *Handle_enter(Handle *o, PyObject *noargs) { return Py_NewRef((PyObject *)o); }

/* __exit__: release the reference if it is still held (a `with` block owns it) */
static PyObject *Handle_exit(Handle *o, PyObject *args) {
    if (o->held) return Handle_release(o, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef Handle_methods[] = {
    {"release", (PyCFunction)Handle_release, METH_NOARGS,
     "Drop this reference (InvalidHandle if already released)."},
    {"__enter__", (PyCFunction)Handle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Handle_exit, METH_VARARGS, "Release the reference if still held."},
    {"_fence_signal", (PyCFunction)(void (*)(void))Handle_fence_signal, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_fence_wait", (PyCFunction)(void (*)(void))Handle_fence_wait, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_timeline_signal", (PyCFunction)(void (*)(void))Handle_timeline_signal, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_timeline_wait", (PyCFunction)(void (*)(void))Handle_timeline_wait, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"_set_window", (PyCFunction)Handle_set_window, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hostless._core.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_finalize = (destructor)Handle_finalize,
    .tp_traverse = (traverseproc)Handle_traverse,
    .tp_clear = (inquiry)Handle_clear,
    .tp_as_buffer = &Handle_as_buffer,
    .tp_methods = Handle_methods,
    .tp_getset = Handle_getset,
    .tp_weaklistoffset = offsetof(Handle, weakreflist),
};

/* Core.new(cls, dom, kind, owner) -> instance holding a new fence or timeline */
static PyObject *Core_new_obj(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "new(cls, dom, kind, owner)");
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, args[2], args[3]);
    if (!t) return NULL;
    PyObject *hobj = Core_create(c, t);
    Py_DECREF(t);
    if (!hobj) return NULL;
    uint64_t h = PyLong_AsUnsignedLongLong(hobj);
    Py_DECREF(hobj);
    Handle *o = handle_make((PyTypeObject *)args[0], c, args[1], h);
    if (!o) do_release(c, h);
    return (PyObject *)o;
}

/* Core.adopt(cls, dom, handle, want_kind) -> instance after taking a reference */
static PyObject *Core_adopt(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "adopt(cls, dom, handle, want_kind)");
        return NULL;
    }
    uint64_t h;
    if (get_handle_arg(args[2], &h) < 0) return NULL;
    unsigned long want = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (do_import(c, h, (uint32_t)want) < 0) return NULL;
    Handle *o = handle_make((PyTypeObject *)args[0], c, args[1], h);
    if (!o) do_release(c, h);
    return (PyObject *)o;
}

/* Core.new_buffer(cls, dom, nbytes, meta, mmap) -> instance with its window set */
static PyObject *Core_new_buffer(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if ((nargs != 5 && nargs != 8) || !PyType_Check(args[0]) || !PyBytes_Check(args[3]) ||
        PyBytes_GET_SIZE(args[3]) != HL_BUFFER_META_SIZE) {
        PyErr_SetString(PyExc_TypeError, "new_buffer(cls, dom, nbytes, meta: 128 bytes, mmap[, fmt, itemsize, shape])");
        return NULL;
    }
    unsigned long long nbytes = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    uint64_t h, off;
    if (do_block_new(c, HL_KIND_BUFFER, nbytes, PyBytes_AS_STRING(args[3]), 0, &h, &off) < 0) return NULL;
    Handle *o = handle_make((PyTypeObject *)args[0], c, args[1], h);
    if (!o) {
        do_release(c, h);
        return NULL;
    }
    o->bb_map = Py_NewRef(args[4]);
    o->bb_off = (Py_ssize_t)off;
    o->bb_len = (Py_ssize_t)nbytes;
    o->bb_readonly = 0;
    if (nargs == 8) {
        const char *fmt = PyUnicode_AsUTF8(args[5]);
        Py_ssize_t itemsize = PyLong_AsSsize_t(args[6]);
        if (!fmt || PyErr_Occurred() || set_layout(o, fmt, itemsize, args[7], (Py_ssize_t)nbytes) < 0) {
            Py_DECREF(o); /* the finalizer drops the reference */
            return NULL;
        }
    }
    return (PyObject *)o;
}

/* Core.wrap(cls, dom, handle) -> instance for a handle we already hold one count of */
static PyObject *Core_wrap(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "wrap(cls, dom, handle)");
        return NULL;
    }
    uint64_t h;
    if (get_handle_arg(args[2], &h) < 0) return NULL;
    return (PyObject *)handle_make((PyTypeObject *)args[0], c, args[1], h);
}

static PyObject *py_set_exceptions(PyObject *m, PyObject *args) {
    PyObject *a, *b, *cc, *d, *e, *f, *g, *qf, *cl;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &a, &b, &cc, &d, &e, &f, &g, &qf, &cl)) return NULL;
    Py_XSETREF(E_Closed, Py_NewRef(cl));
    Py_XSETREF(E_QueueFull, Py_NewRef(qf));
    Py_XSETREF(E_OOM, Py_NewRef(g));
    Py_XSETREF(E_Hostless, Py_NewRef(a));
    Py_XSETREF(E_Corrupt, Py_NewRef(b));
    Py_XSETREF(E_Full, Py_NewRef(cc));
    Py_XSETREF(E_Handle, Py_NewRef(d));
    Py_XSETREF(E_Already, Py_NewRef(e));
    Py_XSETREF(E_Invalid, Py_NewRef(f));
    Py_RETURN_NONE;
}

/* status_valid(s) -> bool: hl_status_valid, for the Python checker */
static PyObject *py_status_valid(PyObject *m, PyObject *arg) {
    unsigned long long s = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(hl_status_valid(s));
}

static PyObject *py_set_status(PyObject *m, PyObject *args) {
    PyObject *cls, *map;
    if (!PyArg_ParseTuple(args, "OO!", &cls, &PyDict_Type, &map)) return NULL;
    Py_XSETREF(StatusCls, Py_NewRef(cls));
    Py_XSETREF(StatusMap, Py_NewRef(map));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"now_ns", Core_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the trace clock)"},
    {"host_wake_fn", py_host_wake_fn, METH_NOARGS, "address of void hl_host_wake(void *futex_word)"},
    {"set_status", py_set_status, METH_VARARGS, NULL},
    {"status_valid", py_status_valid, METH_O, "hl_status_valid(s): a status a fence can complete with"},
    {"layout", py_layout, METH_VARARGS, "layout(fences, participants, queues, trace, heap) -> offsets"},
    {"set_exceptions", py_set_exceptions, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef coremodule = {PyModuleDef_HEAD_INIT, "hostless._core", "hostless C core", -1,
                                        module_methods};

#define OFF(name, type, field) ADD_INT(m, name, offsetof(struct type, field))
#define ADD_INT(m, name, v) PyModule_AddObject(m, name, PyLong_FromUnsignedLongLong((unsigned long long)(v)))

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    if (PyType_Ready(&HandleType) < 0) return NULL;
    PyObject *m = PyModule_Create(&coremodule);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    PyModule_AddObject(m, "Core", (PyObject *)&CoreType);
    Py_INCREF(&HandleType);
    PyModule_AddObject(m, "Handle", (PyObject *)&HandleType);
    E_Hostless = Py_NewRef(PyExc_RuntimeError);
    E_Corrupt = Py_NewRef(PyExc_RuntimeError);
    E_Full = Py_NewRef(PyExc_RuntimeError);
    E_Handle = Py_NewRef(PyExc_ValueError);
    E_Already = Py_NewRef(PyExc_RuntimeError);
    E_Invalid = Py_NewRef(PyExc_RuntimeError);
    E_OOM = Py_NewRef(PyExc_MemoryError);
    E_QueueFull = Py_NewRef(PyExc_RuntimeError);
    E_Closed = Py_NewRef(PyExc_RuntimeError);
    /* the ABI, exported so that Python reads the layout from the header */
    ADD_INT(m, "MAGIC", HL_MAGIC);
    ADD_INT(m, "ABI_VERSION", HL_ABI_VERSION);
    ADD_INT(m, "HEADER_SIZE", HL_HEADER_SIZE);
    ADD_INT(m, "PARTICIPANT_SIZE", HL_PARTICIPANT_SIZE);
    ADD_INT(m, "FENCE_SIZE", HL_FENCE_SIZE);
    ADD_INT(m, "MAX_PARTICIPANTS", HL_MAX_PARTICIPANTS);
    ADD_INT(m, "MAX_FENCES", HL_MAX_FENCES);
    ADD_INT(m, "TIMELINE_FAILED", HL_TIMELINE_FAILED);
    ADD_INT(m, "POLL_MIN_NS", HL_POLL_MIN_NS);
    ADD_INT(m, "POLL_MAX_NS", HL_POLL_MAX_NS);
    ADD_INT(m, "TIMELINE_MAX", HL_TIMELINE_MAX);
    ADD_INT(m, "KIND_FENCE", HL_KIND_FENCE);
    ADD_INT(m, "KIND_TIMELINE", HL_KIND_TIMELINE);
    ADD_INT(m, "KIND_MERGED", HL_KIND_MERGED);
    ADD_INT(m, "KIND_BUFFER", HL_KIND_BUFFER);
    ADD_INT(m, "KIND_QUEUE", HL_KIND_QUEUE);
    ADD_INT(m, "PACKET_SIZE", HL_PACKET_SIZE);
    ADD_INT(m, "QUEUE_HEADER_SIZE", HL_QUEUE_HEADER_SIZE);
    ADD_INT(m, "PKT_KERNEL", HL_PKT_KERNEL);
    ADD_INT(m, "PKT_ERT", HL_PKT_ERT);
    ADD_INT(m, "PKT_BARRIER", HL_PKT_BARRIER);
    ADD_INT(m, "PKT_STOP", HL_PKT_STOP);
    ADD_INT(m, "KERNARG_MAGIC", HL_KERNARG_MAGIC);
    ADD_INT(m, "TRACE_MAGIC", HL_TRACE_MAGIC);
    ADD_INT(m, "EV_ENQUEUE", HL_EV_ENQUEUE);
    ADD_INT(m, "EV_START", HL_EV_START);
    ADD_INT(m, "EV_END", HL_EV_END);
    ADD_INT(m, "EV_SIGNAL", HL_EV_SIGNAL);
    ADD_INT(m, "EV_WAIT", HL_EV_WAIT);
    ADD_INT(m, "EV_USER", HL_EV_USER);
    OFF("PK_TYPE", hl_packet, type);
    OFF("PK_KERNEL", hl_packet, kernel);
    OFF("PK_ARGS", hl_packet, args);
    OFF("PK_SIGNAL", hl_packet, signal);
    OFF("PK_SIGNAL_VALUE", hl_packet, signal_value);
    OFF("PK_WAIT", hl_packet, wait);
    OFF("PK_WAIT_VALUE", hl_packet, wait_value);
    ADD_INT(m, "GRANULE", HL_GRANULE);
    ADD_INT(m, "LARGE_BUFFER", HL_LARGE_BUFFER);
    ADD_INT(m, "BUFFER_META_SIZE", HL_BUFFER_META_SIZE);
    ADD_INT(m, "BUFFER_MAX_DIMS", HL_BUFFER_MAX_DIMS);
    OFF("BM_NBYTES", hl_buffer_meta, nbytes);
    OFF("BM_NDIM", hl_buffer_meta, ndim);
    OFF("BM_ITEMSIZE", hl_buffer_meta, itemsize);
    OFF("BM_DTYPE", hl_buffer_meta, dtype);
    OFF("BM_SHAPE", hl_buffer_meta, shape);
    ADD_INT(m, "SLOT_FREE", HL_SLOT_FREE);
    ADD_INT(m, "SLOT_ALLOC", HL_SLOT_ALLOC);
    ADD_INT(m, "SLOT_LIVE", HL_SLOT_LIVE);
    ADD_INT(m, "SLOT_DYING", HL_SLOT_DYING);
    ADD_INT(m, "PART_FREE", HL_PART_FREE);
    ADD_INT(m, "PART_ALIVE", HL_PART_ALIVE);
    ADD_INT(m, "PART_RECOVERING", HL_PART_RECOVERING);
    ADD_INT(m, "MERGE_MAX_CHILDREN", HL_MERGE_MAX_CHILDREN);
    ADD_INT(m, "MAX_PARENTS", HL_MAX_PARENTS);
    ADD_INT(m, "LOCK_BASE", HL_LOCK_BASE);
    OFF("H_MAGIC", hl_header, magic);
    OFF("H_ABI_VERSION", hl_header, abi_version);
    OFF("H_HEADER_SIZE", hl_header, header_size);
    OFF("H_TOTAL_SIZE", hl_header, total_size);
    OFF("H_PARTICIPANT_CAPACITY", hl_header, participant_capacity);
    OFF("H_FENCE_CAPACITY", hl_header, fence_capacity);
    OFF("H_PARTICIPANTS_OFFSET", hl_header, participants_offset);
    OFF("H_FENCES_OFFSET", hl_header, fences_offset);
    OFF("H_QUEUES_OFFSET", hl_header, queues_offset);
    OFF("H_QUEUES_SIZE", hl_header, queues_size);
    OFF("H_TRACE_OFFSET", hl_header, trace_offset);
    OFF("H_TRACE_SIZE", hl_header, trace_size);
    OFF("H_HEAP_OFFSET", hl_header, heap_offset);
    OFF("H_HEAP_SIZE", hl_header, heap_size);
    OFF("H_TAG", hl_header, tag);
    OFF("H_POLL_NS", hl_header, poll_ns);
    OFF("H_EPOCH", hl_header, epoch);
    OFF("H_READY", hl_header, ready);
    OFF("H_STATS_RECOVERED", hl_header, stats_recovered);
    OFF("H_CREATED_NS", hl_header, created_ns);
    OFF("P_CTL", hl_participant, ctl);
    OFF("P_PID", hl_participant, pid);
    OFF("P_START_TIME", hl_participant, start_time);
    OFF("P_LABEL", hl_participant, label);
    OFF("P_KIND", hl_participant, kind);
    OFF("F_WORD", hl_fence, word);
    OFF("F_CTL", hl_fence, ctl);
    OFF("F_REFS", hl_fence, refs);
    OFF("F_WAITERS", hl_fence, waiters);
    OFF("F_OWNER", hl_fence, owner);
    OFF("F_AUX", hl_fence, aux);
    OFF("F_PARENTS", hl_fence, parents);
    OFF("F_ERR", hl_fence, err);
    OFF("F_WAKE", hl_fence, wake);
    OFF("HP_LOCK", hl_heap, lock);
    OFF("HP_BITMAP_OFFSET", hl_heap, bitmap_offset);
    OFF("HP_GRANULES", hl_heap, granules);
    OFF("HP_DATA_OFFSET", hl_heap, data_offset);
    OFF("HP_DATA_SIZE", hl_heap, data_size);
    OFF("HP_USED_GRANULES", hl_heap, used_granules);
    OFF("HP_HINT", hl_heap, hint);
    OFF("Q_CAPACITY", hl_queue, capacity);
    OFF("Q_CONSUMER", hl_queue, consumer);
    OFF("Q_CELLS_OFFSET", hl_queue, cells_offset);
    OFF("Q_PACKETS_OFFSET", hl_queue, packets_offset);
    OFF("Q_WRITE_INDEX", hl_queue, write_index);
    OFF("Q_READ_INDEX", hl_queue, read_index);
    OFF("Q_DOORBELL", hl_queue, doorbell);
    OFF("TR_CAPACITY", hl_trace, capacity);
    OFF("TR_WRITE", hl_trace, write);
    return m;
}
