/*
 * objects.c -- handles and the slot life cycle: validation, allocation
 * (ALLOC -> LIVE), references (the per-participant bit mask and the local
 * counts), release (LIVE -> DYING -> FREE), and the operations on fences and
 * timelines that a holder performs (create, import, release, signal, fail).
 */
#include "engine.h"

#include <string.h>

/* Validate a handle against this domain (contract in engine.h). */
int64_t hle_check_handle(hle_ctx *c, uint64_t h, uint32_t want_kind, int need_held) {
    int64_t idx = HL_HANDLE_INDEX(h);
    if (HL_HANDLE_TAG(h) != c->tag || idx < 0 || (uint64_t)idx >= c->cap) {
        return hle_fail(HL_E_HANDLE, "handle 0x%llx does not belong to this domain", (unsigned long long)h);
    }
    uint32_t k = HL_HANDLE_KIND(h);
    if (k < HL_KIND_FENCE || k > HL_KIND_QUEUE) {
        return hle_fail(HL_E_HANDLE, "handle 0x%llx has an unknown kind %u", (unsigned long long)h, k);
    }
    static const char *names[] = {"?", "fence", "timeline", "merged fence", "buffer", "queue"};
    int ok = want_kind == 0 || k == want_kind || (want_kind == HL_KIND_FENCE && k == HL_KIND_MERGED) ||
             (want_kind == HL_KIND_SYNC && !HAS_BLOCK(k));
    if (!ok) {
        return hle_fail(HL_E_HANDLE, "handle 0x%llx is a %s, not a %s", (unsigned long long)h, names[k],
               want_kind == HL_KIND_SYNC ? "fence or timeline" : names[want_kind]);
    }
    uint64_t ctl = ld(&slot(c, (uint32_t)idx)->ctl);
    if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE || (HL_CTL_GEN(ctl) & 0xffffffu) != HL_HANDLE_GEN(h) ||
        HL_CTL_KIND(ctl) != k) {
        return hle_fail(HL_E_HANDLE, "handle 0x%llx is stale or forged (slot %lld is not that object)",
                     (unsigned long long)h, (long long)idx);
    }
    if (need_held && (c->lrefs[idx] == 0 || c->lgen[idx] != HL_HANDLE_GEN(h))) {
        return hle_fail(HL_E_HANDLE, "handle 0x%llx is not held by this participant (released?)", (unsigned long long)h);
    }
    return idx;
}

/* ------------------------------------------------------------------ */
/* slot life cycle */

/* Free a DYING slot (mask already zero; the caller is the one releaser, or
 * the dead releaser's recoverer).  Idempotent.  The pending mask and the
 * links are cleared before the slot is FREE, so nothing of this object is
 * left for a stale reader; alloc_hint is not moved here: a freed slot is
 * reused round-robin, not by the next allocation. */
void hle_finalize(hle_ctx *c, uint32_t idx, uint64_t dying) {
    struct hl_fence *f = slot(c, idx);
    uint32_t k = HL_CTL_KIND(dying);
    if (HAS_BLOCK(k)) {
        if (!hle_heap_free_block(c, idx)) {
            /* the heap lock is held by a live participant that does not let
             * go: the slot stays DYING (ours) with its block, and the free
             * is retried later (a recovery retries at its next pass) */
            if (hle_tls_rec >= 0)
                hle_tls_deferred = 1;
            else
                hle_defer_free(c, idx, dying);
            return;
        }
    } else {
        if (k != HL_KIND_TIMELINE) {
            uint64_t z = 0;
            if (cas(&f->word, &z, HL_STATUS_CANCEL)) hl_wake_fence(f);
            hle_propagate(c, idx, 0);
            if (k == HL_KIND_FENCE) {
                if (ld(&f->aux))
                    hle_watch_unlink(c, idx); /* a watch node leaves its target's list */
                else
                    hle_watch_notify(c, idx); /* a watched fence's nodes: CANCEL (or its status) now */
            }
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
void hle_drop_ref(hle_ctx *c, uint32_t idx, uint64_t bit, uint32_t actor) {
    struct hl_fence *f = slot(c, idx);
    for (;;) {
        /* refs read between two reads of ctl: a mask read before another
         * object's initialisation must not meet that object's LIVE ctl (the
         * protocol model found a leak that way: tests/model/protocol_model.py) */
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
            hle_finalize(c, idx, dying);
            return;
        }
        /* someone took a reference meanwhile: back to LIVE and retry.  A
         * merged fence whose last child completed while it was DYING could
         * not be resolved then (resolve_merged wants LIVE): do it now. */
        e = dying;
        if (cas(&f->ctl, &e, ctl) && HL_CTL_KIND(ctl) == HL_KIND_MERGED) hle_resolve_merged(c, idx, ctl, 0);
    }
}

/* Claim a FREE slot: it is left in ALLOC state with every field initialised
 * (a merged slot's pending mask `mask` included) and our reference bit set;
 * hle_alloc_publish() makes it LIVE.  Returns the index or -1. */
int hle_alloc_begin(hle_ctx *c, uint32_t kind, uint32_t owner, uint32_t mask, uint32_t *gen_out) {
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

uint64_t hle_alloc_publish(hle_ctx *c, uint32_t idx, uint32_t kind, uint32_t gen) {
    st(&slot(c, idx)->ctl, HL_CTL(gen, kind, 0, HL_SLOT_LIVE));
    __atomic_store_n(&c->h->alloc_hint, idx + 1 < c->cap ? idx + 1 : 0, __ATOMIC_RELAXED);
    c->lrefs[idx] = 1;
    c->lgen[idx] = gen & 0xffffffu;
    return HL_HANDLE(c->tag, kind, gen, idx);
}

/* Give back a slot we hold in ALLOC state (nothing was published). */
void hle_alloc_abort(hle_ctx *c, uint32_t idx, uint32_t kind, uint32_t gen) {
    struct hl_fence *f = slot(c, idx);
    st(&f->refs, 0);
    st(&f->ctl, HL_CTL(gen, kind, 0, HL_SLOT_FREE));
}

int hle_alloc_slot(hle_ctx *c, uint32_t kind, uint32_t owner, uint32_t mask, uint64_t *handle_out) {
    uint32_t gen;
    int idx = hle_alloc_begin(c, kind, owner, mask, &gen);
    if (idx < 0) return -1;
    *handle_out = hle_alloc_publish(c, (uint32_t)idx, kind, gen);
    return idx;
}

/* Complete slot idx with `status` (OWNER_DIED, OWNER_LEFT) when it is still
 * ACTIVE: a fence's word CAS 0 -> status (then its merged parents are told),
 * a timeline fails (its points reached stay SUCCESS: hl_timeline_fail).
 * The caller holds the slot (its own bit, or the dead participant's bit that
 * its recovery pinned): write rule (a). */
void hle_fail_owned(hle_ctx *c, uint32_t idx, uint32_t status) {
    struct hl_fence *f = slot(c, idx);
    uint32_t k = HL_CTL_KIND(ld(&f->ctl));
    if (k == HL_KIND_TIMELINE) {
        hl_timeline_fail(f, status, NULL);
        hle_watch_notify(c, idx);
    } else if (k == HL_KIND_FENCE) {
        uint64_t z = 0;
        if (cas(&f->word, &z, status)) hl_wake_fence(f);
        hle_propagate(c, idx, 0);
        hle_watch_notify(c, idx);
    }
}

/* After creating a fence owned by another participant: if that owner is no
 * longer the live incarnation we named, its recovery may have missed the
 * fence, so signal OWNER_DIED ourselves. */
void hle_owner_recheck(hle_ctx *c, uint32_t idx, uint32_t owner) {
    int oi = HL_OWNER_INDEX(owner);
    if (oi < 0 || (uint32_t)oi >= c->pcap || oi == c->me) return;
    uint64_t pc = ld(&c->parts[oi].ctl);
    if (HL_PCTL_STATE(pc) == HL_PART_ALIVE && (HL_PCTL_INC(pc) & 0xffffffu) == HL_OWNER_INC(owner)) return;
    /* we hold the slot (we just created it): write rule (a) */
    hle_fail_owned(c, idx, HL_STATUS_OWNER_DIED);
}

/* ------------------------------------------------------------------ */
/* the operations of a holder (contracts in hostless_engine.h / engine.h) */

int hle_create(hle_ctx *c, uint32_t kind, uint32_t owner, uint64_t *handle) {
    int r = hle_need_attached(c);
    if (r) return r;
    if (kind != HL_KIND_FENCE && kind != HL_KIND_TIMELINE) return hle_fail(HL_E_VALUE, "kind must be FENCE or TIMELINE");
    if (owner) {
        int oi = HL_OWNER_INDEX(owner);
        if (oi < 0 || (uint32_t)oi >= c->pcap) return hle_fail(HL_E_VALUE, "owner id %u names no participant slot", owner);
        uint64_t pc = ld(&c->parts[oi].ctl);
        if (HL_PCTL_STATE(pc) != HL_PART_ALIVE || (HL_PCTL_INC(pc) & 0xffffffu) != HL_OWNER_INC(owner))
            return hle_fail(HL_E_VALUE, "owner participant %u is not alive", owner);
    } else {
        owner = HL_OWNER(c->inc, c->me);
    }
    uint64_t h;
    int idx = hle_alloc_slot(c, kind, owner, 0, &h);
    if (idx < 0) return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots)", c->cap);
    hle_owner_recheck(c, (uint32_t)idx, owner);
    *handle = h;
    return HL_OK;
}

int hle_import(hle_ctx *c, uint64_t h, uint32_t want_kind) {
    int64_t idx = hle_check_handle(c, h, want_kind, 0);
    if (idx < 0) return (int)idx;
    if (c->lrefs[idx] && c->lgen[idx] == HL_HANDLE_GEN(h)) {
        c->lrefs[idx]++;
        return HL_OK;
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
            if (!(old & c->mybit)) hle_drop_ref(c, (uint32_t)idx, c->mybit, (uint32_t)c->me);
            if ((HL_CTL_GEN(c2) & 0xffffffu) != HL_HANDLE_GEN(h)) goto stale;
        }
        /* DYING: its last holder is releasing it; wait for LIVE (revert) or
         * FREE, bounded, without the GIL */
        if (!t0) t0 = now_ns();
        if (now_ns() - t0 > HLE_DYING_WAIT_NS) goto stale;
        void *tok = hle_unlock(c);
        sched_yield();
        hle_relock(c, tok);
    }
    c->lrefs[idx] = 1;
    c->lgen[idx] = HL_HANDLE_GEN(h);
    return HL_OK;
stale:
    return hle_fail(HL_E_HANDLE, "handle 0x%llx is stale (the object was released)", (unsigned long long)h);
}

int hle_held_by_others(hle_ctx *c, uint64_t h) {
    uint64_t idx = HL_HANDLE_INDEX(h);
    if (HL_HANDLE_TAG(h) != c->tag || idx >= c->cap || c->lrefs[idx] == 0) return 0;
    return (ld(&slot(c, (uint32_t)idx)->refs) & ~c->mybit) != 0;
}

int hle_release(hle_ctx *c, uint64_t h) {
    int64_t idx = HL_HANDLE_INDEX(h);
    if (HL_HANDLE_TAG(h) != c->tag || idx < 0 || (uint64_t)idx >= c->cap || c->lrefs[idx] == 0 ||
        c->lgen[idx] != HL_HANDLE_GEN(h))
        return hle_fail(HL_E_HANDLE, "handle 0x%llx is not held by this participant", (unsigned long long)h);
    if (--c->lrefs[idx] == 0) hle_drop_ref(c, (uint32_t)idx, c->mybit, (uint32_t)c->me);
    return HL_OK;
}

int hle_signal(hle_ctx *c, uint64_t h, uint64_t s) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_FENCE, 1);
    if (idx < 0) return (int)idx;
    if (HL_HANDLE_KIND(h) == HL_KIND_MERGED)
        return hle_fail(HL_E_INVALID, "a merged fence completes from its children and cannot be signaled directly");
    if (!hl_status_valid(s))
        return hle_fail(HL_E_VALUE, "invalid status %llu (SUCCESS, ERROR, CANCEL, OWNER_DIED or 64..2^32-1)",
                        (unsigned long long)s);
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t z = 0;
    if (!cas(&f->word, &z, s)) {
        if (!hl_status_valid(z))
            return hle_fail(HL_E_CORRUPT,
                            "fence 0x%llx holds an invalid completion word 0x%llx (written by a buggy or hostile "
                            "participant)",
                            (unsigned long long)h, (unsigned long long)z);
        return hle_fail(HL_E_ALREADY, "fence 0x%llx was already signaled with status %llu", (unsigned long long)h,
                        (unsigned long long)z);
    }
    hl_wake_fence(f);
    if (ld(&f->parents[0]) || ld(&f->parents[1])) hle_propagate(c, (uint32_t)idx, 0);
    hle_watch_notify(c, (uint32_t)idx);
    if (c->trace) hle_trace_emit(c, HL_EV_SIGNAL, h, s, 0, 0, 0);
    return HL_OK;
}

int hle_timeline_signal(hle_ctx *c, uint64_t h, uint64_t v) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_TIMELINE, 1);
    if (idx < 0) return (int)idx;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    if (v > HL_TIMELINE_MAX)
        return hle_fail(HL_E_VALUE, "timeline value %llu exceeds the maximum 2^62-1", (unsigned long long)v);
    uint64_t cur;
    int r = hl_timeline_advance(f, v, &cur); /* wakes sleepers through the wake sequence */
    if (r == HL_E_FAILED)
        return hle_fail(HL_E_ALREADY, "timeline failed with status %llu; it cannot be signaled",
                        (unsigned long long)(cur & 0xffffffffull));
    if (r != HL_OK)
        return hle_fail(HL_E_VALUE, "timeline value must grow: current %llu, asked %llu", (unsigned long long)cur,
                        (unsigned long long)v);
    hle_watch_notify(c, (uint32_t)idx);
    if (c->trace) hle_trace_emit(c, HL_EV_SIGNAL, h, v, 0, 0, 0);
    return HL_OK;
}

int hle_timeline_fail(hle_ctx *c, uint64_t h, uint64_t s) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_TIMELINE, 1);
    if (idx < 0) return (int)idx;
    if (!hl_status_valid(s) || s == HL_STATUS_SUCCESS)
        return hle_fail(HL_E_VALUE, "invalid failure status %llu (ERROR, CANCEL, OWNER_DIED or 64..2^32-1)",
                        (unsigned long long)s);
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t cur;
    if (hl_timeline_fail(f, (hl_u32)s, &cur) == HL_E_FAILED)
        return hle_fail(HL_E_ALREADY, "timeline already failed with status %llu",
                        (unsigned long long)(cur & 0xffffffffull));
    hle_watch_notify(c, (uint32_t)idx);
    return HL_OK;
}

int hle_word(hle_ctx *c, uint64_t h, uint64_t *out) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_SYNC, 1);
    if (idx < 0) return (int)idx;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t w = ld(&f->word);
    if (w == 0 && HL_HANDLE_KIND(h) == HL_KIND_MERGED) {
        hle_sweep(c);
        w = ld(&f->word);
    }
    *out = w;
    return HL_OK;
}

/* Contract in hostless_engine.h. */
int hle_point_status(hle_ctx *c, uint64_t h, uint64_t value, uint64_t word, uint32_t *status) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_TIMELINE, 1);
    if (idx < 0) return (int)idx;
    *status = hl_point_status(slot(c, (uint32_t)idx), word, value);
    return HL_OK;
}

int hle_aux(hle_ctx *c, uint64_t h, uint64_t *out) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_SYNC, 1);
    if (idx < 0) return (int)idx;
    *out = ld(&slot(c, (uint32_t)idx)->aux);
    return HL_OK;
}
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */

int hle_device_store(hle_ctx *c, uint64_t h, uint64_t v) {
    int64_t idx = hle_check_handle(c, h, 0, 1);
    if (idx < 0) return (int)idx;
    __atomic_store_n(&slot(c, (uint32_t)idx)->word, v, __ATOMIC_RELEASE);
    return HL_OK;
}
#endif
