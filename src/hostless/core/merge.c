/*
 * merge.c -- merged fences: a merged slot holds a pending mask of its
 * children (aux, tagged with its generation) and the first failure (err,
 * tagged too); a child's completion clears its bit in each parent it links
 * to (two links per fence), and whoever clears the last bit completes the
 * parent with one 16-byte CAS over {word, ctl} (write rule (c)).
 */
#include "engine.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* Record the first failure of a child in the merged parent named by `link`,
 * and upward in every merge above it that has none yet, so that the first
 * failure wins across a tree of merges too. */
static void hle_record_failure(hle_ctx *c, uint64_t link, uint32_t status, int depth) {
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
                if (l[k]) hle_record_failure(c, l[k], status, depth + 1);
            return;
        }
    }
}

/* Complete merged slot pidx, read as LIVE `ctl`, when no child is pending:
 * first failure, else SUCCESS.  The completion is one 16-byte CAS over
 * {word, ctl}, so it lands only on that object (write rule (c)), however
 * stale the caller's view.  Returns 1 when this call completed it. */
int hle_resolve_merged(hle_ctx *c, uint32_t pidx, uint64_t ctl, int depth) {
    struct hl_fence *p = slot(c, pidx);
    uint32_t gen = HL_CTL_GEN(ctl) & 0xffffffu;
    if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE || HL_CTL_KIND(ctl) != HL_KIND_MERGED) return 0;
    uint64_t a = ld(&p->aux);
    if (((a >> 32) & 0xffffffu) != gen || (uint32_t)a != 0) return 0;
    uint64_t e = ld(&p->err);
    uint32_t fin = (((e >> 32) & 0xffffffu) == gen && (uint32_t)e) ? (uint32_t)e : HL_STATUS_SUCCESS;
    if (!hl_cas_word_ctl(p, 0, ctl, fin)) return 0;
    hl_wake_fence(p);
    if (depth < 64) hle_propagate(c, pidx, depth + 1);
    return 1;
}

/* Clear child position `pos` in parent's pending mask; resolve the parent
 * when it reaches zero.  Idempotent. */
void hle_propagate_link(hle_ctx *c, uint64_t link, uint32_t status, int depth) {
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
    if (status != HL_STATUS_SUCCESS) hle_record_failure(c, link, status, depth);
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
    hle_resolve_merged(c, (uint32_t)pidx, ctl, depth);
}

/* 1 when `link` names a merged fence that still exists (same generation). */
int hle_link_live(hle_ctx *c, uint64_t link) {
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
void hle_propagate(hle_ctx *c, uint32_t idx, int depth) {
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
        if (l[i]) hle_propagate_link(c, l[i], (uint32_t)w, depth);
}

/* Finish what signals by plain stores (devices, firmware) left undone:
 * propagate signaled children to their parents and resolve merged fences
 * whose pending mask is empty. */
void hle_sweep(hle_ctx *c) {
    for (uint32_t i = 0; i < c->cap; i++) {
        struct hl_fence *f = slot(c, i);
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) != HL_SLOT_LIVE) continue;
        uint32_t k = HL_CTL_KIND(ctl);
        if (k == HL_KIND_TIMELINE) continue;
        if (k == HL_KIND_FENCE && ld(&f->aux) && ld(&f->word) == 0) hle_watch_eval(c, i);
        if ((ld(&f->parents[0]) || ld(&f->parents[1])) && ld(&f->word)) hle_propagate(c, i, 0);
        if (k == HL_KIND_MERGED && ld(&f->word) == 0) hle_resolve_merged(c, i, ctl, 0);
    }
}

/* ---- watch nodes: timeline points and fences past their links ---- */

static uint64_t *watch_field(struct hl_fence *f, uint32_t kind) {
    return kind == HL_KIND_TIMELINE ? &f->parents[0] : kind == HL_KIND_FENCE ? &f->err : NULL;
}

/* Test-only switches (tests/stress/test_watch_kills.py), compiled only into the test
 * build (HOSTLESS_TEST_HOOKS), each read once from the environment; unset,
 * they cost a load:
 *   HOSTLESS_TEST_KILL_AT=watch-published: SIGKILL between publishing a watch
 *     node and counting it on its target (the protocol model's
 *     watch-creator-dies window);
 *   HOSTLESS_TEST_STOP_AT=watchers-checked: SIGSTOP in a watch node's
 *     finalize between checking its target's ctl and the CAS of the target's
 *     count (the model's watch-target-reuse window), so that a test can reuse
 *     the target's slot before it goes on (SIGCONT). */
#ifdef HOSTLESS_TEST_HOOKS
static int test_switch(const char *var, const char *where, int *cache) {
    if (*cache < 0) {
        const char *e = getenv(var);
        *cache = e && strcmp(e, where) == 0;
    }
    return *cache;
}
static int kill_after_publish(void) {
    static int v = -1;
    return test_switch("HOSTLESS_TEST_KILL_AT", "watch-published", &v);
}
static int stop_after_check(void) {
    static int v = -1;
    return test_switch("HOSTLESS_TEST_STOP_AT", "watchers-checked", &v);
}
#else
#define kill_after_publish() 0
#define stop_after_check() 0
#endif

void hle_watchers_add(hle_ctx *c, uint64_t h, int delta) {
    int64_t t = HL_HANDLE_INDEX(h);
    if (HL_HANDLE_TAG(h) != c->tag || t < 0 || (uint64_t)t >= c->cap) return;
    struct hl_fence *f = slot(c, (uint32_t)t);
    uint32_t kind = HL_HANDLE_KIND(h), gen = HL_HANDLE_GEN(h);
    uint64_t *w = watch_field(f, kind);
    if (!w) return; /* merged: no free field, the sweeps complete its watch nodes */
    uint64_t ctl = ld(&f->ctl);
    if (HL_CTL_KIND(ctl) != kind || (HL_CTL_GEN(ctl) & 0xffffffu) != gen) return;
    if (kind == HL_KIND_FENCE && ld(&f->aux)) return; /* a watch node: its err is a threshold */
    if (delta < 0 && stop_after_check()) raise(SIGSTOP);
    uint64_t v = ld(w);
    /* what the field holds before a first watcher: a timeline's parents[0] is
     * 0, a fence's err is gen << 32 (hle_alloc_begin) */
    uint64_t fresh = kind == HL_KIND_TIMELINE ? 0 : (uint64_t)gen << 32;
    for (;;) {
        uint32_t n;
        if (HL_WATCHERS_IS(v, gen))
            n = HL_WATCHERS_COUNT(v);
        else if (delta > 0 && v == fresh)
            n = 0; /* a first watcher; the caller holds the object (rule (a)) */
        else
            return; /* another object's field: never touched (rule (c)) */
        if (delta < 0 && n == 0) return;
        if (cas(w, &v, HL_WATCHERS(gen, (uint32_t)((int64_t)n + delta)))) return;
    }
}

void hle_watch_eval(hle_ctx *c, uint32_t idx) {
    struct hl_fence *w = slot(c, idx);
    uint64_t c1 = ld(&w->ctl);
    if (HL_CTL_STATE(c1) != HL_SLOT_LIVE || HL_CTL_KIND(c1) != HL_KIND_FENCE) return;
    uint64_t h = ld(&w->aux), thr = HL_WATCH_THRESHOLD(ld(&w->err)), word = ld(&w->word);
    if (ld(&w->ctl) != c1 || !h) return; /* another object now, or a plain fence */
    if (word == 0) {
        int64_t t = HL_HANDLE_INDEX(h);
        if (HL_HANDLE_TAG(h) != c->tag || t < 0 || (uint64_t)t >= c->cap) return; /* corrupt: check() says so */
        struct hl_fence *tf = slot(c, (uint32_t)t);
        uint32_t kind = HL_HANDLE_KIND(h);
        uint64_t s;
        for (int tries = 0;; tries++) {
            uint64_t t1 = ld(&tf->ctl), tw = ld(&tf->word), ta = ld(&tf->aux), t2 = ld(&tf->ctl);
            if (t1 != t2) {
                if (tries < 8) continue;
                return; /* moving: the next evaluation decides */
            }
            int same = (HL_CTL_GEN(t1) & 0xffffffu) == HL_HANDLE_GEN(h) && HL_CTL_KIND(t1) == kind &&
                       (HL_CTL_STATE(t1) == HL_SLOT_LIVE || HL_CTL_STATE(t1) == HL_SLOT_DYING);
            if (!same) {
                s = HL_STATUS_CANCEL; /* the watched object is gone: its point will never come */
            } else if (tw < thr) {
                return;
            } else if (kind == HL_KIND_TIMELINE) {
                /* a point reached before the failure stays reached (ABI 6; aux read after the word) */
                s = (tw & HL_TIMELINE_FAILED) && !(ta >= thr && ta <= HL_TIMELINE_MAX) ? (uint32_t)tw : HL_STATUS_SUCCESS;
            } else {
                s = tw;
            }
            break;
        }
        if (!hl_status_valid(s)) s = HL_STATUS_ERROR;
        if (hl_cas_word_ctl(w, 0, c1, s)) hl_wake_fence(w); /* only on the node we read (rule (c)) */
    }
    hle_propagate(c, idx, 0);
}

void hle_watch_scan(hle_ctx *c, uint32_t idx) {
    for (uint32_t i = 0; i < c->cap; i++) {
        struct hl_fence *f = slot(c, i);
        uint64_t a = ld(&f->aux);
        if ((a & 0xffffffu) != (uint64_t)idx + 1 || HL_HANDLE_TAG(a) != c->tag) continue;
        uint64_t ctl = ld(&f->ctl);
        if (HL_CTL_STATE(ctl) == HL_SLOT_LIVE && HL_CTL_KIND(ctl) == HL_KIND_FENCE) hle_watch_eval(c, i);
    }
}

void hle_watch_notify(hle_ctx *c, uint32_t idx) {
    struct hl_fence *f = slot(c, idx);
    uint32_t k = HL_CTL_KIND(ld(&f->ctl));
    uint64_t *w = watch_field(f, k);
    if (w && HL_WATCHERS_COUNT(ld(w)) && !(k == HL_KIND_FENCE && ld(&f->aux))) hle_watch_scan(c, idx);
}

/* Create a watch node at merge position pos of composite (pidx, pgen):
 * initialised and linked while ALLOC (ours), published, counted on its
 * target, then evaluated once (birth).  Returns the node's handle or 0. */
static uint64_t new_watch(hle_ctx *c, uint64_t target, uint64_t thr, uint32_t pos, uint32_t pgen, uint32_t pidx) {
    uint32_t gen;
    int idx = hle_alloc_begin(c, HL_KIND_FENCE, 0, 0, &gen);
    if (idx < 0) return 0;
    struct hl_fence *w = slot(c, (uint32_t)idx);
    st(&w->aux, target);
    st(&w->err, thr);
    st(&w->parents[0], HL_LINK(pos, pgen, pidx));
    uint64_t h = hle_alloc_publish(c, (uint32_t)idx, HL_KIND_FENCE, gen);
    if (kill_after_publish()) raise(SIGKILL);
    /* published before counted: a signaller that misses the count advanced
     * the word before our evaluation below reads it */
    hle_watchers_add(c, target, +1);
    st(&w->err, thr | HL_WATCH_COUNTED); /* we hold the node (rule (a)) */
    hle_watch_eval(c, (uint32_t)idx);
    return h;
}

int hle_merge_points(hle_ctx *c, const uint64_t *handles, const uint64_t *values, int n, uint64_t *out,
                     uint64_t *watch_out, int *nwatch) {
    int r = hle_need_attached(c);
    if (r) return r;
    *nwatch = 0;
    if (n < 1 || n > HL_MERGE_MAX_CHILDREN)
        return hle_fail(HL_E_VALUE, "merge takes 1..%d handles per node, got %d", HL_MERGE_MAX_CHILDREN, n);
    int64_t idxs[HL_MERGE_MAX_CHILDREN];
    for (int i = 0; i < n; i++) {
        uint64_t h = handles[i];
        idxs[i] = hle_check_handle(c, h, HL_KIND_SYNC, 1);
        if (idxs[i] < 0) return (int)idxs[i];
        int tl = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
        if (tl && values && values[i] > HL_TIMELINE_MAX)
            return hle_fail(HL_E_VALUE, "timeline point %llu exceeds the maximum 2^62-1",
                            (unsigned long long)values[i]);
        for (int j = 0; j < i; j++)
            if (idxs[j] == idxs[i] && !tl) return hle_fail(HL_E_VALUE, "the same fence appears twice in a merge");
    }
    uint64_t ph;
    uint32_t mask = (n == 32) ? 0xffffffffu : (uint32_t)((1ull << n) - 1);
    int pidx = hle_alloc_slot(c, HL_KIND_MERGED, 0, mask, &ph); /* the mask is set before it is LIVE */
    if (pidx < 0) return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots)", c->cap);
    uint32_t pgen = HL_HANDLE_GEN(ph);
    for (int i = 0; i < n; i++) {
        struct hl_fence *f = slot(c, (uint32_t)idxs[i]);
        uint64_t link = HL_LINK((uint32_t)i, pgen, (uint32_t)pidx);
        int tl = HL_HANDLE_KIND(handles[i]) == HL_KIND_TIMELINE;
        int done = 0;
        for (int k = 0; k < HL_MAX_PARENTS && !done && !tl; k++) {
            uint64_t old = ld(&f->parents[k]);
            if (hle_link_live(c, old)) continue;
            /* an empty link, or one whose parent was freed: reuse it */
            if (cas(&f->parents[k], &old, link)) done = 1;
        }
        if (!done) {
            /* a timeline point, or a fence whose links are all taken: a watch node */
            uint64_t wh = new_watch(c, handles[i], tl ? (values ? values[i] : 0) : 1, (uint32_t)i, pgen, (uint32_t)pidx);
            if (!wh) {
                for (int j = 0; j < *nwatch; j++) hle_release(c, watch_out[j]);
                *nwatch = 0;
                hle_release(c, ph);
                return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots): a merge over timeline points or "
                                "over a fence already in %d merges needs one slot per such child",
                                c->cap, HL_MAX_PARENTS);
            }
            watch_out[(*nwatch)++] = wh;
            continue;
        }
        if (ld(&f->word)) hle_propagate_link(c, link, (uint32_t)ld(&f->word), 0);
    }
    *out = ph;
    return HL_OK;
}

int hle_merge(hle_ctx *c, const uint64_t *handles, int n, uint64_t *out) {
    int r = hle_need_attached(c);
    if (r) return r;
    if (n < 1 || n > HL_MERGE_MAX_CHILDREN)
        return hle_fail(HL_E_VALUE, "merge takes 1..%d handles per node, got %d", HL_MERGE_MAX_CHILDREN, n);
    for (int i = 0; i < n; i++) {
        int64_t idx = hle_check_handle(c, handles[i], HL_KIND_FENCE, 1);
        if (idx < 0) return (int)idx;
        struct hl_fence *f = slot(c, (uint32_t)idx);
        if (hle_link_live(c, ld(&f->parents[0])) && hle_link_live(c, ld(&f->parents[1])))
            return hle_fail(HL_E_INVALID,
                            "fence 0x%llx is already part of %d merged fences (the most hle_merge links; "
                            "hle_merge_points takes any number through watch nodes)",
                            (unsigned long long)handles[i], HL_MAX_PARENTS);
    }
    uint64_t w[HL_MERGE_MAX_CHILDREN];
    int nw;
    r = hle_merge_points(c, handles, NULL, n, out, w, &nw);
    if (r == HL_OK && nw) {
        /* lost a race for the last link: this C entry point has nobody to hand
         * the node to, so the child counts as failed, as before */
        for (int j = 0; j < nw; j++) {
            hle_signal(c, w[j], HL_STATUS_ERROR);
            hle_release(c, w[j]);
        }
    }
    return r;
}
