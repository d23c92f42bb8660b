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
    if (!link || (link & HL_WATCH_TAG)) return 0;
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
        if (l[i] && !(l[i] & HL_WATCH_TAG)) hle_propagate_link(c, l[i], (uint32_t)w, depth); /* a node's next: no link */
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
 *   HOSTLESS_TEST_KILL_AT=watch-marked: SIGKILL in a watch node's finalize
 *     between marking its next and unlinking it (its recoverer finishes);
 *   HOSTLESS_TEST_STOP_AT=watchers-checked: SIGSTOP in a watch node's
 *     finalize between checking its target's ctl and the walk that unlinks
 *     it from the target's list (the model's watch-target-reuse window), so
 *     that a test can reuse the target's slot before it goes on (SIGCONT). */
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
static int kill_after_mark(void) {
    static int v = -1;
    return test_switch("HOSTLESS_TEST_KILL_AT", "watch-marked", &v);
}
static int stop_after_check(void) {
    static int v = -1;
    return test_switch("HOSTLESS_TEST_STOP_AT", "watchers-checked", &v);
}
#else
#define kill_after_publish() 0
#define kill_after_mark() 0
#define stop_after_check() 0
#endif

/* Push watch node (widx, wgen) on the list of the object `target` names: its
 * next, then the head (we hold the target: rule (a); the node: rule (a)).
 * Returns 1 when pushed; 0 when the target has no list (a watch node, a
 * merged fence, or not that object any more): the sweeps complete the node. */
static int watch_push(hle_ctx *c, uint64_t target, uint32_t widx, uint32_t wgen) {
    int64_t t = HL_HANDLE_INDEX(target);
    if (HL_HANDLE_TAG(target) != c->tag || t < 0 || (uint64_t)t >= c->cap) return 0;
    struct hl_fence *f = slot(c, (uint32_t)t);
    uint32_t kind = HL_HANDLE_KIND(target), gen = HL_HANDLE_GEN(target);
    uint64_t *head = watch_field(f, kind);
    if (!head) return 0;
    uint64_t ctl = ld(&f->ctl);
    if (HL_CTL_KIND(ctl) != kind || (HL_CTL_GEN(ctl) & 0xffffffu) != gen) return 0;
    if (kind == HL_KIND_FENCE && ld(&f->aux)) return 0; /* a watch node: its err is a threshold */
    /* what the field holds before a first node: a timeline's parents[0] is 0,
     * a fence's err is gen << 32 (hle_alloc_begin) */
    uint64_t fresh = kind == HL_KIND_TIMELINE ? 0 : (uint64_t)gen << 32;
    struct hl_fence *w = slot(c, widx);
    uint64_t v = ld(head);
    for (;;) {
        if (!HL_WHEAD_IS(v, gen) && v != fresh) return 0; /* another object's field: never touched */
        uint32_t ver = HL_WHEAD_IS(v, gen) ? HL_WHEAD_VER(v) : 0;
        st(&w->parents[1], HL_WNEXT(wgen, HL_WHEAD_IS(v, gen) ? HL_WLIST_IDX1(v) : 0));
        if (cas(head, &v, HL_WHEAD(gen, ver + 1, widx + 1))) return 1;
    }
}

/* One node of the list of `target`, read between two reads of its ctl:
 * 1 with its ctl and next; 0 when it is moving; -1 when it is not a node of
 * that list (a slot reused while linked, or garbage: the list is broken). */
static int watch_node(hle_ctx *c, uint32_t idx1, uint64_t target, uint64_t *ctl, uint64_t *next) {
    if (idx1 == 0 || idx1 > c->cap) return -1;
    struct hl_fence *n = slot(c, idx1 - 1);
    uint64_t c1 = ld(&n->ctl), a = ld(&n->aux), nx = ld(&n->parents[1]);
    if (ld(&n->ctl) != c1) return 0;
    uint32_t s = HL_CTL_STATE(c1);
    if (HL_CTL_KIND(c1) != HL_KIND_FENCE || (s != HL_SLOT_LIVE && s != HL_SLOT_DYING) || a != target ||
        !(nx & HL_WATCH_TAG) || HL_WNEXT_GEN(nx) != (HL_CTL_GEN(c1) & 0xffffffu))
        return -1;
    *ctl = c1;
    *next = nx;
    return 1;
}

/* Evaluate the unmarked LIVE nodes of the list from head `h` (read-only).
 * Returns 1 when the walk reached the list's end; 0 when it met a slot that
 * is not a node of this list, or went on longer than the table (the caller
 * scans the table instead). */
static int watch_walk(hle_ctx *c, uint64_t target, uint64_t h) {
    uint32_t cur = HL_WLIST_IDX1(h);
    for (uint32_t steps = 0; cur; steps++) {
        uint64_t nc = 0, nx = 0;
        int r = 0;
        for (int tries = 0; tries < 8 && r == 0; tries++) r = watch_node(c, cur, target, &nc, &nx);
        if (r <= 0 || steps >= c->cap) return 0;
        if (!(nx & HL_WNEXT_MARK) && HL_CTL_STATE(nc) == HL_SLOT_LIVE) hle_watch_eval(c, cur - 1);
        cur = HL_WLIST_IDX1(nx);
    }
    return 1;
}

/* One walk of the list from its head (field `head`, object generation gen)
 * that unlinks every marked node it meets: CAS of the unmarked predecessor's
 * next (its generation in it: rule (c)) or of the head (the object's
 * generation and the version in it).  Returns 1 when node widx is not in the
 * list any more (or the field is not a list of that object); 0 when a CAS
 * lost a race or a node moved (walk again); -1 when the walk met a slot that
 * is not a node of the list: a node that left while we read it (its finalize
 * cleared it: walk again from the head), or a broken list. */
static int watch_unlink_walk(hle_ctx *c, uint64_t *head, uint32_t gen, uint64_t target, uint32_t widx) {
    uint64_t *pf = head;
    uint64_t pv = ld(head);
    int at_head = 1;
    if (!HL_WHEAD_IS(pv, gen)) return 1;
    uint32_t cur = HL_WLIST_IDX1(pv);
    for (uint32_t steps = 0; cur; steps++) {
        uint64_t nc = 0, nx = 0;
        int r = watch_node(c, cur, target, &nc, &nx);
        if (r == 0) return 0;
        if (r < 0 || steps >= c->cap) return -1;
        uint32_t nxt = HL_WLIST_IDX1(nx);
        if (nx & HL_WNEXT_MARK) {
            uint64_t nv = at_head ? HL_WHEAD(gen, HL_WHEAD_VER(pv) + 1, nxt) : ((pv & ~0xffffffull) | nxt);
            if (!cas(pf, &pv, nv)) return 0;
            if (cur - 1 == widx) return 1;
            pv = nv; /* the predecessor stays; on to the unlinked node's next */
        } else {
            pf = &slot(c, cur - 1)->parents[1];
            pv = nx;
            at_head = 0;
        }
        cur = nxt;
    }
    return 1;
}

void hle_watch_unlink(hle_ctx *c, uint32_t widx) {
    struct hl_fence *w = slot(c, widx);
    uint64_t target = ld(&w->aux);
    uint32_t wgen = HL_CTL_GEN(ld(&w->ctl)) & 0xffffffu;
    /* mark our next: from here nobody changes it (the node is DYING by us:
     * rule (b); an unlink of our successor expects it unmarked) */
    uint64_t nx = ld(&w->parents[1]);
    for (;;) {
        if (!(nx & HL_WATCH_TAG) || HL_WNEXT_GEN(nx) != wgen) return; /* not a list node */
        if ((nx & HL_WNEXT_MARK) || cas(&w->parents[1], &nx, nx | HL_WNEXT_MARK)) break;
    }
    if (kill_after_mark()) raise(SIGKILL);
    int64_t t = HL_HANDLE_INDEX(target);
    if (HL_HANDLE_TAG(target) != c->tag || t < 0 || (uint64_t)t >= c->cap) return;
    struct hl_fence *tf = slot(c, (uint32_t)t);
    uint32_t kind = HL_HANDLE_KIND(target), gen = HL_HANDLE_GEN(target);
    uint64_t *head = watch_field(tf, kind);
    if (!head) return;
    for (int tries = 0, broken = 0; tries < 64 && broken < 3; tries++) {
        uint64_t tc = ld(&tf->ctl);
        uint32_t s = HL_CTL_STATE(tc);
        if (HL_CTL_KIND(tc) != kind || (HL_CTL_GEN(tc) & 0xffffffu) != gen || (s != HL_SLOT_LIVE && s != HL_SLOT_DYING))
            return; /* the object is gone: nobody walks its list */
        if (tries == 0 && stop_after_check()) raise(SIGSTOP);
        int r = watch_unlink_walk(c, head, gen, target, widx);
        if (r > 0) return;
        if (r < 0) broken++;
    }
    /* lost 64 races, or the list is broken: the node stays linked, marked;
     * when its slot is reused walkers see a broken list and scan the table */
}

void hle_watch_eval(hle_ctx *c, uint32_t idx) {
    struct hl_fence *w = slot(c, idx);
    uint64_t c1 = ld(&w->ctl);
    if (HL_CTL_STATE(c1) != HL_SLOT_LIVE || HL_CTL_KIND(c1) != HL_KIND_FENCE) return;
    uint64_t h = ld(&w->aux), thr = ld(&w->err), word = ld(&w->word);
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
    uint64_t ctl = ld(&f->ctl);
    uint32_t k = HL_CTL_KIND(ctl), gen = HL_CTL_GEN(ctl) & 0xffffffu;
    uint64_t *w = watch_field(f, k);
    if (!w) return;
    uint64_t h = ld(w);
    if (!HL_WHEAD_IS(h, gen) || !HL_WLIST_IDX1(h) || (k == HL_KIND_FENCE && ld(&f->aux))) return;
    uint64_t target = HL_HANDLE(c->tag, k, gen, idx);
    /* a walk that met a node leaving under it goes once more from the head */
    if (watch_walk(c, target, h)) return;
    h = ld(w);
    if (!HL_WHEAD_IS(h, gen) || !watch_walk(c, target, h)) hle_watch_scan(c, idx);
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
    st(&w->parents[1], HL_WNEXT(gen, 0)); /* a list node from birth (not pushed yet) */
    uint64_t h = hle_alloc_publish(c, (uint32_t)idx, HL_KIND_FENCE, gen);
    if (kill_after_publish()) raise(SIGKILL);
    /* published before pushed: a signaller that misses the node in the list
     * advanced the word before our evaluation below reads it */
    watch_push(c, target, (uint32_t)idx, gen);
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
            if ((old & HL_WATCH_TAG) || hle_link_live(c, old)) continue; /* a watch node's next stays */
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
