/*
 * recovery.c -- recovering a dead participant: its ALLOC slots are freed, its
 * DYING slots finished or rolled back, the fences and timelines it owned fail
 * with OWNER_DIED (OWNER_LEFT when a participant recovers itself as it leaves), its references are dropped, its queue cells skipped and
 * its queues unbound, a heap or device-heap lock it held broken; then its slot is FREE.  Any
 * live participant (joined or not) does it, one at a time per dead
 * participant (its liveness lock), idempotently.  And the watchdog thread
 * that runs it periodically.
 */
#include "engine.h"

#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/futex.h>

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
static int hle_settle_wait(uint64_t *t0) {
    uint64_t t = now_ns();
    if (*t0) tls_waited += t - *t0;
    *t0 = t;
    if (tls_waited >= RECOVERY_WAIT_NS) return 0;
    sched_yield();
    return 1;
}

int hle_pin(hle_ctx *c, uint32_t idx, uint64_t ctl, uint64_t bit, uint32_t actor) {
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
            if (hle_settle_wait(&t0)) continue;
            if (!(old & bit)) hle_drop_ref(c, idx, bit, actor);
            return -1;
        }
        if (!(old & bit)) hle_drop_ref(c, idx, bit, actor); /* a stale bit on another object: take it back */
        return 0;
    }
}

/* Cells a dead producer reserved become SKIP (their signal fence, when it is
 * a valid one, gets OWNER_DIED); a dead consumer is unbound.  The queue slot
 * is pinned by the caller. */
void hle_recover_queue(hle_ctx *c, uint32_t idx, uint64_t ctl, int d, uint32_t dinc, uint32_t status) {
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
        /* d's reservations: its own, and those of a device it drove (a GPU command processor) */
        if (HL_CELL_STATE(cl) != HL_CELL_RESERVED ||
            (HL_CELL_PRODUCER(cl) != (uint32_t)d && HL_CELL_PRODUCER(cl) != HL_PRODUCER_DEVICE_OF(d)))
            continue;
        uint64_t sig = pk[k].signal;
        struct hl_fence *sf = sig ? hl_fence_slot(&c->dv, sig, 0) : NULL;
        uint32_t sk = HL_HANDLE_KIND(sig);
        if (sf && (sk == HL_KIND_TIMELINE || sk == HL_KIND_FENCE)) {
            uint32_t si = (uint32_t)HL_HANDLE_INDEX(sig);
            uint64_t sctl = ld(&sf->ctl);
            /* the packet's signal fence is not ours: pin it with d's bit first */
            if (hl_fence_matches(sf, sig) && hle_pin(c, si, sctl, dbit, (uint32_t)d) == 1) {
                hle_fail_owned(c, si, status);
                hle_drop_ref(c, si, dbit, (uint32_t)d);
            }
        }
        if (hl_queue_skip_reserved(&v, k, cl, (uint32_t)d)) skipped = 1;
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
static int hle_recover_participant_(hle_ctx *c, int d, uint64_t pctl, uint32_t status);
int hle_recover_participant(hle_ctx *c, int d, uint64_t pctl, uint32_t status) {
    hle_tls_rec = d;
    hle_tls_deferred = 0;
    tls_waited = 0;
    hle_tls_rec_inc = HL_PCTL_INC(pctl) & 0xffffffu;
    int r = hle_recover_participant_(c, d, pctl, status);
    hle_tls_rec = -1;
    return r;
}

static int hle_recover_participant_(hle_ctx *c, int d, uint64_t pctl, uint32_t status) {
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
            if (HAS_BLOCK(HL_CTL_KIND(ctl)) && !hle_heap_free_block(c, i)) {
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
                    hle_finalize(c, i, ctl);
                    continue;
                }
            }
            uint64_t e = ctl;
            uint64_t live = HL_CTL(HL_CTL_GEN(ctl), HL_CTL_KIND(ctl), 0, HL_SLOT_LIVE);
            if (cas(&f->ctl, &e, live) && HL_CTL_KIND(ctl) == HL_KIND_MERGED) hle_resolve_merged(c, i, live, 0);
            ctl = ld(&f->ctl);
            s = HL_CTL_STATE(ctl);
        }
        if (s == HL_SLOT_DYING) {
            /* DYING by someone else: its releaser frees it, or rolls it back
             * to LIVE when a reference came in; in that case it may be d's to
             * fail, so look again once it settles (the protocol model found a
             * fence of d left ACTIVE when such a slot was skipped) */
            if (hle_settle_wait(&t0)) goto again;
            complete = 0; /* its releaser is stuck or dead (or the table is garbage): retry at the next reap */
            continue;
        }
        if (s != HL_SLOT_LIVE) continue;
        uint32_t k = HL_CTL_KIND(ctl);
        uint32_t o = __atomic_load_n(&f->owner, __ATOMIC_SEQ_CST);
        int owned = o && HL_OWNER_INDEX(o) == d && HL_OWNER_INC(o) == dinc && (k == HL_KIND_FENCE || k == HL_KIND_TIMELINE);
        if (owned || k == HL_KIND_QUEUE) {
            int r = hle_pin(c, i, ctl, dbit, actor);
            if (r < 0) complete = 0;
            if (r <= 0) continue; /* another object now, or retry later */
            /* pinned: owner and queue now belong to this object for sure */
            o = __atomic_load_n(&f->owner, __ATOMIC_SEQ_CST);
            if (owned && o && HL_OWNER_INDEX(o) == d && HL_OWNER_INC(o) == dinc) hle_fail_owned(c, i, status);
            if (k == HL_KIND_QUEUE) hle_recover_queue(c, i, ctl, d, dinc, status);
            hle_drop_ref(c, i, dbit, actor); /* our pin, and d's own reference if it had one */
        } else if (ld(&f->refs) & dbit) {
            hle_drop_ref(c, i, dbit, actor);
        }
    }
    if (hle_tls_deferred) complete = 0;
    if (!complete) return 0;
    struct hle_pool pool; /* the heap and the device heaps */
    for (int pi = 0; pi < (int)HLE_POOLS; pi++) {
        if (!hle_pool(c, pi, &pool)) continue;
        uint64_t l = ld(pool.lock);
        if (l && HL_OWNER_INDEX((uint32_t)l) == d && !hle_owner_alive(c, l)) {
            if (hle_pool_lock_for(c, &pool, HEAP_LOCK_WAIT_NS)) /* breaks it and rebuilds the bitmap */
                hle_pool_unlock(&pool);
            else
                return 0;
        }
    }
    /* the slot's label is left as it is: a joiner overwrites it; pid and
     * flags are cleared so that a joiner's pid 0 reads "joining" (liveness.c) */
    struct hl_participant *p = &c->parts[d];
    __atomic_store_n(&p->pid, 0u, __ATOMIC_SEQ_CST);
    __atomic_store_n(&p->flags, 0u, __ATOMIC_SEQ_CST);
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
static int hle_reap_all_locked(hle_ctx *c, uint64_t *out, int outcap);
int hle_reap_all(hle_ctx *c, uint64_t *out, int outcap) {
    pthread_mutex_lock(&c->reap_mu);
    int n = hle_reap_all_locked(c, out, outcap);
    pthread_mutex_unlock(&c->reap_mu);
    return n;
}

static int hle_reap_all_locked(hle_ctx *c, uint64_t *out, int outcap) {
    int n = 0;
    if (c->me >= 0 && (__atomic_load_n(&c->parts[c->me].flags, __ATOMIC_SEQ_CST) & HL_PART_FLAG_PIDLIVE) &&
        hle_take_lock(c->fd, c->me) == 0) /* joined without our lock: the reader has gone, take it */
        __atomic_store_n(&c->parts[c->me].flags, 0u, __ATOMIC_SEQ_CST);
    for (int i = 0; i < (int)c->pcap; i++) {
        if (i == c->me) continue;
        uint64_t pc = ld(&c->parts[i].ctl);
        uint32_t s = HL_PCTL_STATE(pc);
        if (s != HL_PART_ALIVE && s != HL_PART_RECOVERING) continue; /* FREE, or unknown: check() reports it */
        if (hle_part_lock_held(c, i)) continue; /* alive, or a live recoverer is on it */
        /* a reader's read lock keeps the lock off: a joined participant then
         * claims by the ctl CAS alone, and is itself the recovery's liveness
         * (RECOVERING(i, me), liveness.c); an unjoined one cannot (255) */
        int locked = hle_take_lock(c->fd, i) == 0;
        if (!locked && (c->me < 0 || hle_lock_state(c->fd, i) != F_RDLCK)) continue; /* lost the race for it */
        __atomic_store_n(&c->rec_busy, i, __ATOMIC_SEQ_CST);
        pc = ld(&c->parts[i].ctl); /* re-read under the lock: a recovery may have just finished */
        s = HL_PCTL_STATE(pc);
        if (s == HL_PART_ALIVE || s == HL_PART_RECOVERING) {
            /* recoverer field: who recovers (255: a process that has not joined yet) */
            uint64_t claimed = HL_PCTL(HL_PCTL_INC(pc), (uint32_t)(c->me >= 0 ? c->me : 255), HL_PART_RECOVERING);
            uint64_t e = pc;
            uint32_t dead_pid = __atomic_load_n(&c->parts[i].pid, __ATOMIC_SEQ_CST); /* recovery clears it */
            if ((pc == claimed || cas(&c->parts[i].ctl, &e, claimed)) && hle_recover_participant(c, i, claimed, HL_STATUS_OWNER_DIED)) {
                struct timespec ts; /* the slot's last recovery, for monitors (hl_participant) */
                clock_gettime(CLOCK_REALTIME, &ts);
                __atomic_store_n(&c->parts[i].recovered_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                                 __ATOMIC_RELAXED);
                __atomic_store_n(&c->parts[i].recovered_by, (uint32_t)(c->me >= 0 ? c->me + 1 : 256), __ATOMIC_RELAXED);
                __atomic_store_n(&c->parts[i].recovered_pid, dead_pid, __ATOMIC_RELEASE);
                /* counted here, not in recover_participant: a clean leave is no recovery */
                __atomic_add_fetch(&c->h->epoch, 1, __ATOMIC_SEQ_CST);
                __atomic_add_fetch(&c->h->stats_recovered, 1, __ATOMIC_SEQ_CST);
                if (n < outcap) out[n++] = ((uint64_t)HL_PCTL_INC(pc) << 8) | (uint64_t)i;
            }
        }
        __atomic_store_n(&c->rec_busy, -1, __ATOMIC_SEQ_CST);
        if (locked) hle_drop_lock(c->fd, i);
    }
    return n;
}

/* ------------------------------------------------------------------ */
/* watchdog thread: periodic liveness check, recovery and merge sweep */

static void *watchdog_main(void *arg) {
    hle_ctx *c = (hle_ctx *)arg;
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
        hle_guard_front(); /* a library's SIGBUS handler installed since the open: ours in front again */
        if (!__atomic_load_n(&c->truncated, __ATOMIC_SEQ_CST)) {
            hle_reap_all(c, ids, HL_MAX_PARTICIPANTS);
            hle_sweep(c);
            hle_retry_deferred(c);
        }
        pthread_mutex_lock(&c->wd_mu);
    }
    pthread_mutex_unlock(&c->wd_mu);
    return NULL;
}

void hle_stop_watchdog(hle_ctx *c) {
    if (!c->wd_running) return;
    pthread_mutex_lock(&c->wd_mu);
    c->wd_stop = 1;
    pthread_cond_signal(&c->wd_cv);
    pthread_mutex_unlock(&c->wd_mu);
    void *tok = hle_unlock(c);
    pthread_join(c->wd, NULL);
    hle_relock(c, tok);
    c->wd_running = 0;
}

void hle_start_watchdog(hle_ctx *c, uint64_t interval_ns) {
    c->wd_interval_ns = interval_ns;
    c->wd_stop = 0;
    if (pthread_create(&c->wd, NULL, watchdog_main, c) == 0) c->wd_running = 1;
}

int hle_reap(hle_ctx *c, uint64_t *out, int outcap) {
    int r = hle_need_attached(c);
    if (r) return r;
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    int n = hle_reap_all(c, out, outcap);
    hle_sweep(c);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    return n;
}
