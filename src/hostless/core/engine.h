/*
 * engine.h -- the internal header of the hostless engine (src/hostless/core):
 * everything that needs atomics, futexes or speed.  The shared layout and the
 * single-word operations come from hostless.h; the engine adds what needs the
 * whole table: allocation, references, merged fences, waits with futex
 * sleeps, liveness and recovery, the shared heap, queues, the trace ring and
 * the SIGBUS guard.  Plain C (gnu11); it never includes Python.h.  The CPython
 * binding (src/hostless/binding) and C programs (libhostless.a, public calls
 * in hostless_engine.h) sit on top.
 *
 * Every index read from shared memory is bounds-checked before use.
 * Nothing here takes a lock in shared memory: every shared update is one
 * atomic operation, so a participant killed at any instruction leaves a state
 * that recovery (hle_recover_participant) finishes or rolls back.  The one
 * exception, the heap lock, is broken and its bitmap rebuilt when its holder
 * is dead.
 *
 * The write rule (hostless.h, "THE WRITE RULE"; explored by
 * tests/model/protocol_model.py): a participant writes a slot's fields only
 *   (a) while it holds a reference to that object (its bit in refs; during
 *       recovery of a dead participant d, d's bit, which only d's one
 *       recoverer may use: it holds d's liveness lock while it recovers), or
 *   (b) while the slot is ALLOC or DYING by itself (nobody else may hold it), or
 *   (c) with one atomic operation that checks the object's generation and
 *       state in the same step (the generation-tagged aux / err CASes of a
 *       merged slot, hl_cas_word_ctl's 16-byte CAS over {word, ctl}).
 *
 * Error convention: functions that can fail return HL_OK or a negative code
 * (hostless.h's HL_E_* and the engine codes of hostless_engine.h) and put the
 * message into the thread's detail buffer (hle_fail).  Internal helpers that
 * cannot fail return void or a count, as documented.
 */
#ifndef HOSTLESS_CORE_ENGINE_H
#define HOSTLESS_CORE_ENGINE_H

/* Internal: compiled into the engine and the binding only (they define
 * HOSTLESS_INTERNAL).  C programs include <hostless/hostless_engine.h>. */
#ifndef HOSTLESS_INTERNAL
#error "core/engine.h is internal to the hostless engine: include <hostless/hostless_engine.h> (hostless.get_include())"
#endif

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "hostless/hostless.h"
#include "hostless/hostless_engine.h"

#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define HLE_DYING_WAIT_NS 2000000000ull /* hle_import waits this long for a DYING slot to settle */
#define HL_KIND_SYNC 255u /* hle_check_handle: any fence, merged fence or timeline */
#define HAS_BLOCK(k) ((k) == HL_KIND_BUFFER || (k) == HL_KIND_QUEUE)
#define DEFER_MAX 64
#define HEAP_LOCK_WAIT_NS 2000000000ull /* the longest a heap-lock wait lasts (a holder is live but stuck) */
#define HEAP_FREE_WAIT_NS 2000000ull    /* a free waits this long, then is deferred (see hle_finalize) */
#define HL_HEAP_REC_FLAG (1ull << 32)   /* heap-lock owner code of a recoverer (see heap.c) */
#define HLE_INTR_SLICE_NS 2000000ull    /* an interruptible wait checks the interrupt hook this often */
/* A spinning wait spins this long, then calls sched_yield at every look at the clock until
 * its spin ends.  When the scheduler puts the waiter and the process it waits for on one
 * CPU, a spin that never yields holds that CPU for the whole spin phase, and that process
 * runs only once the waiter sleeps: a 64x64 copy stage took 70-83 us a frame with the host
 * and its agent pinned to one CPU of the 2-core VM (about 31 us with this), about 6 us on
 * two CPUs either way (benchmarks/colocated.py).  Waits shorter than this never yield. */
#define HLE_SPIN_PURE_NS 10000ull
/* A wait spins at most this long before it gives the binding's lock (the GIL) away: a
 * cross-process round trip within it costs no unlock and relock (hle_wait, frame programs:
 * hle_spin_locked polls *word until it reaches thr, for that much of spin from t0; 1: *w). */
#define HLE_LOCKED_SPIN_NS 2000ull
int hle_spin_locked(const uint64_t *word, uint64_t thr, int64_t spin, uint64_t t0, uint64_t *w);

/* What a blocking call does around its GIL-free sections, supplied by the
 * binding (all NULL for C programs: nothing to release, no interrupts).
 * unlock() releases the caller's lock (the GIL) and returns a token that
 * relock() takes back.  interruptible() (called locked, before a wait) says
 * whether this thread may be interrupted; interrupted(&token) is then called
 * unlocked every HLE_INTR_SLICE_NS of a blocking wait and returns nonzero to
 * stop it with HL_E_INTR (it may relock and unlock again through token). */
struct hle_hooks {
    void *(*unlock)(void);
    void (*relock)(void *token);
    int (*interruptible)(void);
    int (*interrupted)(void **token);
};

/* The engine context: what a joined (or merely mapped) domain is to this
 * process.  The Python Core object embeds one. */
#define HLE_BOUND_MAX 8 /* queue bindings remembered per process (hle_queue_stale_below) */

struct hle_ctx {
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
    uint32_t kick;     /* private futex word for wait_any */
    long long spin_ns; /* default spin of waits through Handle */
    uint64_t poll_ns;  /* hl_header.poll_ns, validated at attach (private copy) */
    struct hl_dom dv;       /* the layout, validated once at attach (hostless.h): never re-read */
    struct hl_trace *trace; /* NULL when the domain has no trace ring */
    uint64_t trace_cap;     /* its capacity in events, validated at attach (private copy) */
    int meta_heap;          /* HL_FLAG_META_HEAP at attach: the heap holds device buffers' metadata only */
    int closing;            /* leave() in progress: GIL-free loops bail out */
    int busy;               /* threads inside GIL-free sections */
    pthread_mutex_t reap_mu; /* one recovery at a time in this process */
    pthread_mutex_t defer_mu; /* deferred block frees (heap lock held by a stopped participant) */
    int ndefer;
    uint32_t defer_idx[DEFER_MAX];
    uint64_t defer_ctl[DEFER_MAX];
    int truncated;            /* set by the SIGBUS guard: the file shrank under the mapping */
    int rec_busy;             /* participant whose liveness lock this process holds to recover it, -1: none.
                               * OFD locks of one open file description do not conflict with each other,
                               * so F_OFD_GETLK cannot show our own recovery to our other threads: this does */
    struct hle_hooks hooks;
    /* queues this process took over from a dead consumer, with the write index at
     * that moment: packets below it were queued for the dead one (hle_queue_stale_below) */
    uint64_t bound_q[HLE_BOUND_MAX], bound_floor[HLE_BOUND_MAX];
    uint32_t bound_next;
};

#define BUSY_ENTER(c) __atomic_add_fetch(&(c)->busy, 1, __ATOMIC_SEQ_CST)
#define BUSY_LEAVE(c) __atomic_sub_fetch(&(c)->busy, 1, __ATOMIC_SEQ_CST)
#define TRUNCATED(c) __atomic_load_n(&(c)->truncated, __ATOMIC_SEQ_CST)
/* leave() in progress, or the file was truncated under us: loops without the GIL bail out */
#define CLOSING(c) (__atomic_load_n(&(c)->closing, __ATOMIC_SEQ_CST) || TRUNCATED(c))
#define TRUNCATED_MSG                                                                                    \
    "the domain file was truncated while mapped (by another process?); this domain is unusable: close it"

/* ---- small inline helpers ---- */
static inline uint64_t now_ns(void) {
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
static inline struct hl_fence *slot(hle_ctx *c, uint32_t idx) { return &c->fences[idx]; }
/* The heap of the private view (hl_attach validated its header once; its
 * layout values are never re-read from shared memory), or NULL. */
static inline struct hl_heap *heap(hle_ctx *c) { return c->dv.heap; }

/* Wake the host sleepers of slot f (whose word we just changed): timelines
 * sleep on their wake sequence, fences and merged fences on the word. */
static inline void wake(struct hl_fence *f) {
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

/* The GIL-free sections: unlock / relock through the binding's hooks. */
static inline void *hle_unlock(hle_ctx *c) { return c->hooks.unlock ? c->hooks.unlock() : NULL; }
static inline void hle_relock(hle_ctx *c, void *token) {
    if (c->hooks.relock) c->hooks.relock(token);
}

/* ---- errors (ctx.c) ---- */
/* Record a message for the calling thread and return `code`. */
__attribute__((format(printf, 2, 3))) int hle_fail(int code, const char *fmt, ...);
/* HL_E_OS with errno saved and strerror as the message. */
int hle_fail_errno(int err);
/* HL_E_VERSION: `path` holds a domain of ABI version `found`, not HL_ABI_VERSION;
 * the message says which is older and what to do.  The one home of that message
 * (hle_open, hle_attach, and Python's read-only view through the binding). */
int hle_version_fail(const char *path, unsigned found);
/* The error of a GIL-free loop that bailed out: HL_E_CORRUPT when the file was
 * truncated, else HL_E_CLOSED with msg. */
int hle_closed_error(hle_ctx *c, const char *msg);
/* HL_E_CLOSED ("domain is closed") when detached, HL_E_CORRUPT when truncated, else HL_OK. */
int hle_need_attached(hle_ctx *c);

/* ---- context (ctx.c) ---- */
/* Initialise / destroy a detached context in place (mutexes, fd = -1, ...). */
void hle_ctx_init(hle_ctx *c);
void hle_ctx_destroy(hle_ctx *c);
/* Compute the layout of a domain of these sizes into *h (a zeroed header with
 * magic, version, sizes and offsets).  Always 0. */
int hle_layout(uint64_t fences, uint64_t parts, uint64_t qsize, uint64_t tsize, uint64_t hsize, struct hl_header *h);
/* The same for a whole struct hle_init (device heaps included; the bitmap
 * offset of device heap i into dev_bitmap[i] when it is not NULL). */
int hle_layout_init(const struct hle_init *in, struct hl_header *h, uint64_t *dev_bitmap);
/* Unmap and close without touching shared state (stops the watchdog). */
void hle_unmap(hle_ctx *c);
/* Forget the mapping without touching shared state or the watchdog thread
 * (after fork, in the child, where that thread does not exist). */
void hle_abandon(hle_ctx *c);
/* Start-time of pid from /proc (0 when unknown). */
uint64_t hle_proc_start_time(int pid);

/* ---- handles and objects (objects.c) ---- */
/* Validate a handle against this domain: tag, index, kind (want_kind 0: any;
 * HL_KIND_FENCE accepts merged; HL_KIND_SYNC: any non-block kind), the slot
 * LIVE with that generation, and (need_held) one of our local references.
 * Returns the index (>= 0) or HL_E_HANDLE. */
int64_t hle_check_handle(hle_ctx *c, uint64_t h, uint32_t want_kind, int need_held);
/* Free a DYING slot (mask already zero; the caller is its one releaser or the
 * dead releaser's recoverer).  Idempotent.  A block whose heap lock is kept
 * is deferred (hle_defer_free) and the slot stays DYING. */
void hle_finalize(hle_ctx *c, uint32_t idx, uint64_t dying);
/* Drop participant bit `bit` from slot idx; the drop that empties the mask of
 * a LIVE slot frees it (`actor` recorded in the DYING ctl). */
void hle_drop_ref(hle_ctx *c, uint32_t idx, uint64_t bit, uint32_t actor);
/* 1 when a participant other than us holds held handle h (its slot's mask
 * has another bit): one load of the slot's line, no write. */
int hle_held_by_others(hle_ctx *c, uint64_t h);
/* Claim a FREE slot round-robin from alloc_hint into ALLOC state, every field
 * initialised and our bit set.  Returns the index (gen in *gen_out) or -1. */
int hle_alloc_begin(hle_ctx *c, uint32_t kind, uint32_t owner, uint32_t mask, uint32_t *gen_out);
/* Make an ALLOC slot LIVE with one local reference; returns its handle. */
uint64_t hle_alloc_publish(hle_ctx *c, uint32_t idx, uint32_t kind, uint32_t gen);
/* Give back a slot we hold in ALLOC state (nothing was published). */
void hle_alloc_abort(hle_ctx *c, uint32_t idx, uint32_t kind, uint32_t gen);
/* begin + publish; returns the index or -1 (table full). */
int hle_alloc_slot(hle_ctx *c, uint32_t kind, uint32_t owner, uint32_t mask, uint64_t *handle_out);
/* Complete a slot we hold with `status` (OWNER_DIED after a death, OWNER_LEFT
 * after a clean leave) when still ACTIVE (write rule (a)). */
void hle_fail_owned(hle_ctx *c, uint32_t idx, uint32_t status);
/* Fail a new object whose named owner is no longer that live incarnation. */
void hle_owner_recheck(hle_ctx *c, uint32_t idx, uint32_t owner);
/* Fail a timeline we hold with a failure status.  HL_OK; HL_E_CLOSED;
 * HL_E_HANDLE; HL_E_VALUE (not a failure status); HL_E_ALREADY (failed before). */
int hle_timeline_fail(hle_ctx *c, uint64_t h, uint64_t status);
/* The completion word (aux word) of a fence or timeline we hold: HL_OK with
 * *out; HL_E_CLOSED; HL_E_HANDLE.  hle_word sweeps merges when a merged
 * fence still reads 0. */
int hle_word(hle_ctx *c, uint64_t h, uint64_t *out);
int hle_aux(hle_ctx *c, uint64_t h, uint64_t *out);
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */
/* Store `word` into an object's word as a device would (one plain release
 * store: no wake, no propagation).  A test hook.  HL_OK; HL_E_HANDLE. */
int hle_device_store(hle_ctx *c, uint64_t h, uint64_t word);
#endif

/* ---- merged fences (merge.c) ---- */
/* Tell the merged parents of completed slot idx (any participant may call it). */
void hle_propagate(hle_ctx *c, uint32_t idx, int depth);
/* Clear child position of `link` in its parent; resolve the parent at zero. */
void hle_propagate_link(hle_ctx *c, uint64_t link, uint32_t status, int depth);
/* Complete merged slot pidx, read as LIVE ctl, when no child is pending.
 * Returns 1 when this call completed it. */
int hle_resolve_merged(hle_ctx *c, uint32_t pidx, uint64_t ctl, int depth);
/* 1 when `link` names a merged fence that still exists (same generation). */
int hle_link_live(hle_ctx *c, uint64_t link);
/* Finish what signals by plain stores left undone (propagate, resolve). */
void hle_sweep(hle_ctx *c);

/* Watch nodes and lists (hostless_layout.h, docs/abi.md 5a).  hle_watch_eval:
 * complete watch node idx if its watched object has reached its threshold
 * (or is gone: CANCEL), then propagate it; any participant, holder or not
 * (the completion is hl_cas_word_ctl on the node as read).  hle_watch_notify:
 * for slot idx just signaled (or failed, or being freed), evaluate the nodes
 * of its watch list (the table, hle_watch_scan, when the list is broken).
 * hle_watch_scan: evaluate every live watch node that watches slot idx.
 * hle_watch_unlink: watch node idx (DYING, by the caller) leaves its
 * target's list (marked, then unlinked: generation-checked CASes). */
void hle_watch_eval(hle_ctx *c, uint32_t idx);
void hle_watch_scan(hle_ctx *c, uint32_t idx);
void hle_watch_notify(hle_ctx *c, uint32_t idx);
void hle_watch_unlink(hle_ctx *c, uint32_t idx);

/* hle_merge over fences and timeline points: child i is handles[i] (a fence,
 * merged fence or timeline, each held by the caller) with threshold
 * values[i] (a timeline's point; ignored for fences).  A timeline child, and
 * a fence child whose HL_MAX_PARENTS links are taken, becomes a watch node
 * that this participant holds: their handles go to watch_out (room for n),
 * their count to *nwatch; the caller keeps them as long as the composite and
 * then releases them (a node released first is CANCELed, so the composite
 * fails with CANCEL).  Errors as hle_merge, and HL_E_TABLE_FULL (nothing is
 * left allocated). */
int hle_merge_points(hle_ctx *c, const uint64_t *handles, const uint64_t *values, int n, uint64_t *out,
                     uint64_t *watch_out, int *nwatch);
/* Create a merged fence over n (1..32) fences we hold, completing with the
 * first failure or SUCCESS.  HL_OK with *out; HL_E_CLOSED; HL_E_VALUE (count,
 * duplicates); HL_E_HANDLE; HL_E_INVALID (a child already in HL_MAX_PARENTS
 * merges); HL_E_TABLE_FULL. */
int hle_merge(hle_ctx *c, const uint64_t *handles, int n, uint64_t *out);

/* ---- liveness (liveness.c) ---- */
/* 1 when participant i is alive: its liveness write lock is held by some
 * process (or unknown), or, where a read lock hides the byte or i joined
 * without its lock, its process still runs.  Read locks never mean alive. */
int hle_part_lock_held(hle_ctx *c, int i);
/* F_WRLCK, F_RDLCK or F_UNLCK: what F_OFD_GETLK finds on byte i; -1 unknown. */
int hle_lock_state(int fd, int i);
/* part_lock_held, but 1 for ourselves and for the participant we recover. */
int hle_lock_held(hle_ctx *c, int i);
/* Take (0 on success) / drop the OFD liveness lock of participant i. */
int hle_take_lock(int fd, int i);
void hle_drop_lock(int fd, int i);
/* 1 when owner code o (heap-lock or consumer code) names a live participant. */
int hle_owner_alive(hle_ctx *c, uint64_t o);

/* ---- recovery (recovery.c) ---- */
/* Recover participant d whose ctl we moved to RECOVERING(us) holding d's
 * liveness lock; what d owned fails with `status` (OWNER_DIED; OWNER_LEFT when
 * d is ourselves, leaving).  Returns 1 when d's slot is FREE again, 0 to retry
 * later (a later reap then finishes it with OWNER_DIED). */
int hle_recover_participant(hle_ctx *c, int d, uint64_t pctl, uint32_t status);
/* Check every participant and recover the dead ones (see hostless_engine.h
 * hle_reap, which adds the sweep); returns the count written into out. */
int hle_reap_all(hle_ctx *c, uint64_t *out, int outcap);
/* Start / stop the watchdog thread. */
void hle_start_watchdog(hle_ctx *c, uint64_t interval_ns);
void hle_stop_watchdog(hle_ctx *c);
/* Skip the cells a dead producer d reserved (failing their signal fences) and
 * unbind d as consumer of queue slot idx (pinned by the caller). */
void hle_recover_queue(hle_ctx *c, uint32_t idx, uint64_t ctl, int d, uint32_t dinc, uint32_t status);
/* Pin slot idx (read as LIVE ctl) with bit: 1 pinned, 0 another object, -1 retry later. */
int hle_pin(hle_ctx *c, uint32_t idx, uint64_t ctl, uint64_t bit, uint32_t actor);

/* ---- the shared heap (heap.c) ---- */
extern __thread int hle_tls_rec;          /* participant this thread recovers, -1: none */
extern __thread uint32_t hle_tls_rec_inc; /* its incarnation (24 bits) */
extern __thread int hle_tls_deferred;     /* a finalize of this thread could not free its block */
/* Layout of a heap region able to hold `want` data bytes. */
void hle_heap_layout(uint64_t want, uint64_t *bitmap_off, uint64_t *granules, uint64_t *data_off, uint64_t *region);
/* One allocator of granule extents: the host heap (pool 0) or device heap i
 * (pool i + 1).  Built from the private view (granules, bitmap address); the
 * shared words (lock, counters) are reached through pointers, so the host
 * heap and the device heaps share the lock, search, repair and free code. */
#define HLE_POOLS (1 + HL_MAX_DEVICE_HEAPS)
struct hle_pool {
    uint64_t *lock, *used, *hint, *repairs, *allocs; /* shared words */
    uint64_t *bm;                                     /* shared bitmap */
    uint64_t granules, granule;                       /* private (validated at attach) */
    int dev;                                          /* -1: the host heap, else the device heap index */
};
/* Pool p of c into *out: 1 when the domain has it, else 0. */
int hle_pool(hle_ctx *c, int p, struct hle_pool *out);
/* Take a pool's lock within timeout_ns: 1 taken, 0 a live holder kept it.
 * A dead (or corrupt) holder's lock is broken and the bitmap rebuilt. */
int hle_pool_lock_for(hle_ctx *c, const struct hle_pool *p, uint64_t timeout_ns);
void hle_pool_unlock(const struct hle_pool *p);
/* HL_E_LOCKED with the message naming the holder of a kept pool lock. */
int hle_pool_lock_error(hle_ctx *c, const struct hle_pool *p);
/* Free the extents of block slot idx (its heap block and, for a device
 * buffer, its device extent; each idempotent): 1 done, 0 a lock was kept. */
int hle_heap_free_block(hle_ctx *c, uint32_t idx);
void hle_defer_free(hle_ctx *c, uint32_t idx, uint64_t dying);
void hle_retry_deferred(hle_ctx *c);
/* Allocate a buffer (or a queue of qcap cells) of nbytes with its 128-byte
 * metadata (may be NULL) from the heap.  HL_OK with *handle and the data's
 * offset in the mapping; HL_E_OOM (no heap, too large, no free run);
 * HL_E_VALUE (0 bytes); HL_E_TABLE_FULL; HL_E_LOCKED. */
int hle_block_new(hle_ctx *c, uint32_t kind, uint64_t nbytes, const void *meta, uint32_t qcap, uint64_t *handle,
                  uint64_t *abs_off);
/* Allocate a buffer of nbytes in device heap dev: its data extent there and
 * a heap block holding its 128-byte metadata.  HL_OK with *handle and the
 * data's byte offset in the device heap; HL_E_RANGE (no such device heap);
 * HL_E_DEVICE_FULL (no free run there); the codes of hle_block_new. */
int hle_device_buffer_new(hle_ctx *c, int dev, uint64_t nbytes, const void *meta, uint64_t *handle,
                          uint64_t *dev_off);
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */
/* Test hook: a device allocation stopped after stage 1 (metadata block) or 2
 * (device extent), its slot left ALLOC.  HL_OK; the codes above. */
int hle_device_buffer_stuck(hle_ctx *c, int dev, uint64_t nbytes, int stage);
#endif
struct hle_heap_stats {
    uint64_t size, used, free, largest_free, free_runs, repairs, allocs, data_offset, granule;
};
/* Statistics of pool p under its lock.  HL_OK (size 0 without that pool); HL_E_LOCKED. */
int hle_pool_stats(hle_ctx *c, int p, struct hle_heap_stats *s);
/* Copy pool p's bitmap (hle_pool_bitmap_bytes) and the fence table (cap *
 * HL_FENCE_SIZE) under its lock.  HL_OK; HL_E_LOCKED; HL_E_RANGE (no such pool). */
int hle_pool_snapshot(hle_ctx *c, int p, void *bits, void *slots, uint64_t *used);
uint64_t hle_pool_bitmap_bytes(hle_ctx *c, int p);
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */
/* Test hook: take pool p's lock and never give it back.  HL_OK; HL_E_LOCKED; HL_E_RANGE. */
int hle_pool_lock_forever(hle_ctx *c, int p);
#endif

/* ---- waits (wait.c) ---- */
/* One blocking wait, written once: poll() is called every iteration (1:
 * done, 0: not yet, < 0: stop with that code); spins (cpu_relax) for spin_ns
 * from t0 (yielding the CPU past HLE_SPIN_PURE_NS), then calls sleep(arg, nap)
 * (which arms, re-checks and sleeps on its futex for at most nap ns; nonzero:
 * done) in slices bounded by poll_ns
 * and, when the thread is interruptible, HLE_INTR_SLICE_NS.  check() (may be
 * NULL) runs every 256 iterations (< 0: stop with that code).  Bails out with
 * hle_closed_error-style codes when the domain closes.  Called unlocked
 * (token: what hle_unlock returned, for the interrupt hook).
 * Returns HL_OK; HL_E_TIMEOUT; HL_E_CLOSED (closing: the caller reports it);
 * HL_E_INTR; or a code from poll / check. */
struct hle_waiter {
    int (*poll)(void *arg);
    int (*sleep)(void *arg, uint64_t nap_ns);
    int (*check)(void *arg);
    void *arg;
    uint64_t t0;          /* start of the wait (now_ns) */
    int64_t timeout_ns;   /* < 0: forever */
    uint64_t spin_ns;     /* spin phase; 0: sleep at once */
    int interruptible;    /* hooks.interrupted is called every slice */
    uint64_t nap_ns;      /* longest sleep before polling again; 0: the domain's poll_ns */
};
int hle_wait_loop(hle_ctx *c, struct hle_waiter *w, void **token);
/* The context whose interrupt hook this thread is running, and how many
 * waits of it are inside the hook (leave() from a signal handler does not
 * wait for them: they bail out after the hook). */
extern __thread hle_ctx *hle_tls_hook_ctx;
extern __thread int hle_tls_hook_depth;
/* Call fn(arg) in a busy section of c, lock held (the interrupt hook, a frame program's): what
 * it runs may close c, and leave() must not wait for this busy thread.  Returns fn's value;
 * the caller checks CLOSING(c) (the mapping may be gone) before touching the domain again. */
int hle_hook_call(hle_ctx *c, int (*fn)(void *), void *arg);
/* Is the calling thread interruptible (the hooks say so; called locked)? */
int hle_interruptible(hle_ctx *c);
/* Wait for any of n (<= 127) objects' words to reach their thresholds or for
 * the private kick word to move from kick_seen.  ready[i] = 1 for the ready
 * ones.  HL_OK (ready, kicked or timeout: see ready); HL_E_CLOSED /
 * HL_E_CORRUPT; HL_E_HANDLE; HL_E_INTR. */
/* wait_any over n (1..HLE_WAIT_MANY_MAX) fences, merged fences and timelines
 * of this domain that we hold, in one call: handles[i] with values[i] (a
 * timeline's point; ignored for fences, whose threshold is 1).  Handles are
 * validated once; already complete: the first such index at once (no clock,
 * no unlock).  Else spins for spin ns (the first 2 us of it locked, as
 * hle_wait), then sleeps with futex_waitv on all
 * words and the private kick word (a kick wakes it to look again), the
 * hooks' unlock / interrupt as hle_wait.  HL_OK with *index (the first ready
 * in list order) and *word; HL_E_TIMEOUT; HL_E_INTR; HL_E_CLOSED;
 * HL_E_HANDLE / HL_E_VALUE for bad input. */
#define HLE_WAIT_MANY_MAX 127
int hle_wait_many(hle_ctx *c, const uint64_t *handles, const uint64_t *values, int n, int64_t timeout,
                  int64_t spin, int *index, uint64_t *word);
int hle_wait_any(hle_ctx *c, const uint64_t *handles, const uint64_t *thr, int n, int64_t timeout_ns,
                 uint32_t kick_seen, char *ready);
/* hle_wait for a caller inside a GIL-free section: BUSY_ENTER done, its lock
 * released (hle_unlock's token in *tok, for the interrupt hook), the thread's
 * interruptibility asked before unlocking (hle_interruptible).  No locked
 * spin.  Codes of hle_wait. */
int hle_wait_unlocked(hle_ctx *c, uint64_t h, uint64_t thr, int64_t timeout_ns, int64_t spin_ns, uint64_t *word,
                      int interruptible, void **tok);
/* The same, calling not_yet(arg) once where the word is not there at the first look,
 * before any spin or sleep (frame.c); a domain closed by what it ran ends the wait with
 * HL_E_CLOSED before the slot is read again.  since: when the caller began to wait (its
 * locked spin), from which the spin, its yielding and the timeout count; 0: now. */
int hle_wait_unlocked_hooked(hle_ctx *c, uint64_t h, uint64_t thr, int64_t timeout_ns, int64_t spin_ns,
                             uint64_t *word, int interruptible, void **tok, void (*not_yet)(void *), void *arg,
                             uint64_t since);
/* Move the private kick word and wake wait_any sleepers of this process. */
void hle_kick(hle_ctx *c);

/* ---- queues (queue.c) ---- */
uint64_t hle_queue_bytes(uint32_t cap);
void hle_queue_init(struct hl_queue *q, uint32_t cap);
/* Create a queue of cap (a power of two, 2..2^20) packets.  Codes of hle_block_new, HL_E_VALUE. */
int hle_queue_new(hle_ctx *c, uint64_t cap, uint64_t *handle);
/* Validate a queue we hold into *v.  HL_OK; HL_E_HANDLE; HL_E_CORRUPT. */
int hle_queue_view(hle_ctx *c, uint64_t h, struct hl_qview *v);
/* hle_queue_bind: public (hostless_engine.h). */
/* Push a packet to a queue we hold; blocks (unlocked) while it is full.
 * timeout_ns < 0: forever, 0: try once.  Emits an ENQUEUE trace event.
 * HL_OK with *idx; HL_E_HANDLE / HL_E_CORRUPT (the queue); HL_E_QUEUE_FULL;
 * HL_E_INVALID (its consumer died); HL_E_CLOSED / HL_E_CORRUPT (closed or
 * truncated during the wait); HL_E_INTR. */
int hle_queue_push(hle_ctx *c, uint64_t h, const struct hl_packet *p, int64_t timeout_ns, uint64_t *idx);
/* hle_queue_push for a caller inside a GIL-free section (as hle_wait_unlocked); with
 * timeout_ns 0 (a try: it neither waits nor calls the interrupt hook) also with the lock held. */
int hle_queue_push_unlocked(hle_ctx *c, uint64_t h, const struct hl_packet *p, int64_t timeout_ns, uint64_t *idx,
                            int interruptible, void **tok);
/* Pop the next packet (bound consumer only; skips cells of dead producers);
 * blocks (unlocked) for timeout_ns (< 0: forever), spinning spin_ns first.
 * HL_OK with *idx and *out; HL_E_TIMEOUT; HL_E_HANDLE / HL_E_CORRUPT;
 * HL_E_INVALID (not its consumer); HL_E_CLOSED / HL_E_CORRUPT; HL_E_INTR. */
int hle_queue_pop(hle_ctx *c, uint64_t h, int64_t timeout_ns, int64_t spin_ns, uint64_t *idx, struct hl_packet *out);
/* hle_queue_pop with its sleeps bounded by nap_ns instead of the domain's
 * poll_ns (0: poll_ns): a doorbell rung by a plain store (a device) is then
 * seen within nap_ns; a host push wakes the sleeper at once either way.
 * *producer (may be NULL): the cell's producer of the packet taken (a
 * participant index, or HL_PRODUCER_DEVICE). */
int hle_queue_pop_nap(hle_ctx *c, uint64_t h, int64_t timeout_ns, int64_t spin_ns, uint64_t nap_ns, uint64_t *idx,
                      struct hl_packet *out, uint32_t *producer);
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */
/* Test hook: reserve a cell, write only its signal handle and stop (a
 * producer killed while filling).  HL_OK with *w; HL_E_QUEUE_FULL. */
int hle_queue_reserve_stuck(hle_ctx *c, uint64_t h, uint64_t sig, uint64_t *w);
#endif

/* ---- trace ring (trace.c) ---- */
void hle_trace_emit_at(hle_ctx *c, uint64_t ts, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d,
                       uint64_t e);
void hle_trace_emit(hle_ctx *c, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d, uint64_t e);
/* ---- host functions a CUDA stream runs (hostfn.c) ---- */
/* Wakes the sleepers of the slot at addr. */
void hle_host_wake(void *addr);
/* A follow-up push made on the host for a stream (cuLaunchHostFunc): the GPU's atomics on
 * host memory are not atomic against the host's where the device lacks host-native atomics
 * (PCIe: 46% of updates lost, benchmarks/results/gpu-atomics-*), so a queue that host
 * producers share is pushed into by the host only.  The stream copies the stage's gate into
 * `gate` before the function runs. */
struct hle_push_rec {
    uint64_t q, cells, packets, capacity; /* the queue's view, validated by hl_queue_open */
    uint64_t packet;                      /* host address of the prepared packet (a heap buffer) */
    uint64_t doorbell;                    /* host address of the queue's doorbell word */
    uint64_t timeout_ns;                  /* how long a full queue is waited for */
    uint32_t producer;
    int32_t gate;   /* 0: every input succeeded; else the packet is not pushed */
    int32_t result; /* HL_OK pushed, 1 gated, else the push's error (HL_E_FULL after timeout_ns) */
    int32_t done;   /* 1 once the function ran (release store) */
};
void hle_host_push(void *rec);

/* ---- the GPU command processor's host forwarder (cpfwd.c) ---- */
struct hle_cpfwd;
/* Start the thread that pushes the follow-ups a GPU command processor serving `own_queue`
 * hands over in `outbox` (struct hl_cp_outbox, hostless_gpucp.h: 8-byte aligned memory the
 * GPU reaches, which it initializes: every slot free, no hops).  The outbox must outlive
 * hle_cpfwd_stop; the context's hle_leave waits for the thread (it leaves on `closing`).
 * HL_OK with *out; HL_E_CLOSED; HL_E_VALUE (misaligned); HL_E_NOMEM; HL_E_OS. */
int hle_cpfwd_start(hle_ctx *c, void *outbox, uint64_t own_queue, struct hle_cpfwd **out);
/* Stop it (after forwarding what the outbox holds, unless the context is closing), join it,
 * free it; *pushed and *failed (optional): its follow-ups pushed and failed. */
void hle_cpfwd_stop(struct hle_cpfwd *f, uint64_t *pushed, uint64_t *failed);
/* Fail packet p's signal, and those of its follow-ups nested in its argument block (bounded
 * as an agent's: HLE_AGENT_FAIL_DEPTH, HLE_AGENT_FAIL_BUDGET), with `status`: a follow-up
 * that could not be pushed on its producer's behalf (agent.c). */
void hle_agent_fail_packet(hle_ctx *c, const struct hl_packet *p, uint64_t status);


/* ---- C kernels (kernels.c) ----
 * A buffer as a kernel sees it: data, size, and the metadata checked against
 * the size (dtype code, itemsize, ndim, shape). */
struct hle_kbuf {
    char *data;
    uint64_t nbytes, count; /* bytes, elements */
    uint32_t ndim, itemsize;
    char dtype[16];
    uint64_t shape[HL_BUFFER_MAX_DIMS];
};
/* Run built-in kernel `kernel` on n buffers and ns scalars.  HL_OK; 1 when
 * the C kernel does not take these dtypes / shapes (the caller hands the
 * packet to the Python kernel); HL_E_VALUE with a message when the arguments
 * are wrong whatever the implementation (counts, shapes, work bound). */
/* A CBLAS sgemm (row-major order 101, no-transpose 111; 32-bit ints). */
typedef void (*hle_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c, int ldc);
struct hle_kenv {
    hle_sgemm_fn sgemm; /* NULL: no BLAS (GEMM returns 1: the Python kernel) */
};
/* dlopen `path` and find its sgemm (scipy_cblas_sgemm, then cblas_sgemm);
 * threads > 0 sets its thread count.  1 on success (why: the library),
 * 0 without (why: the reason).  The library stays loaded. */
int hle_blas_load(struct hle_kenv *env, const char *path, int threads, char *why, size_t n);
int hle_kernel_run(const struct hle_kenv *env, uint32_t kernel, struct hle_kbuf *b, int n, const uint64_t *scalars,
                   int ns);

/* ---- SIGBUS guard (guard.c) ---- */
/* Put [lo, hi) under the guard: a truncation seen there marks c truncated. */
int hle_guard_add_region(hle_ctx *c, uintptr_t lo, uintptr_t hi);
int hle_guard_add(hle_ctx *c); /* HL_OK, or HL_E_NOMEM: then the mapping must not be used */
void hle_guard_remove(hle_ctx *c);
/* The same for a mapping of no context (a read-only view, hostless.view): a truncation
 * seen in [lo, hi) reads zeros and sets *flag; remove (every region of flag) before
 * unmapping.  *flag must outlive the regions. */
int hle_guard_add_flag(uintptr_t lo, uintptr_t hi, int *flag);
void hle_guard_remove_flag(int *flag);
/* Put the guard's handler back in front if a library installed its own SIGBUS handler since
 * (one sigaction query when it is there).  Every add does it; the watchdog does it on each
 * tick, and the binding after code known to install handlers (ray.init). */
void hle_guard_front(void);

#endif /* HOSTLESS_CORE_ENGINE_H */
