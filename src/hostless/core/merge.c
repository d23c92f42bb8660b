/*
 * merge.c -- merged fences: a merged slot holds a pending mask of its
 * children (aux, tagged with its generation) and the first failure (err,
 * tagged too); a child's completion clears its bit in each parent it links
 * to (two links per fence), and whoever clears the last bit completes the
 * parent with one 16-byte CAS over {word, ctl} (write rule (c)).
 */
#include "engine.h"

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
        if ((ld(&f->parents[0]) || ld(&f->parents[1])) && ld(&f->word)) hle_propagate(c, i, 0);
        if (k == HL_KIND_MERGED && ld(&f->word) == 0) hle_resolve_merged(c, i, ctl, 0);
    }
}

int hle_merge(hle_ctx *c, const uint64_t *handles, int n, uint64_t *out) {
    int r = hle_need_attached(c);
    if (r) return r;
    if (n < 1 || n > HL_MERGE_MAX_CHILDREN)
        return hle_fail(HL_E_VALUE, "merge takes 1..%d handles per node, got %d", HL_MERGE_MAX_CHILDREN, n);
    int64_t idxs[HL_MERGE_MAX_CHILDREN];
    for (int i = 0; i < n; i++) {
        uint64_t h = handles[i];
        idxs[i] = hle_check_handle(c, h, HL_KIND_FENCE, 1);
        if (idxs[i] < 0) return (int)idxs[i];
        for (int j = 0; j < i; j++)
            if (idxs[j] == idxs[i]) return hle_fail(HL_E_VALUE, "the same fence appears twice in a merge");
        struct hl_fence *f = slot(c, (uint32_t)idxs[i]);
        if (hle_link_live(c, ld(&f->parents[0])) && hle_link_live(c, ld(&f->parents[1])))
            return hle_fail(HL_E_INVALID,
                            "fence 0x%llx is already part of %d merged fences (the most a fence can join)",
                            (unsigned long long)h, HL_MAX_PARENTS);
    }
    uint64_t ph;
    uint32_t mask = (n == 32) ? 0xffffffffu : (uint32_t)((1ull << n) - 1);
    int pidx = hle_alloc_slot(c, HL_KIND_MERGED, 0, mask, &ph); /* the mask is set before it is LIVE */
    if (pidx < 0) return hle_fail(HL_E_TABLE_FULL, "fence table full (%u slots)", c->cap);
    uint32_t pgen = HL_HANDLE_GEN(ph);
    for (int i = 0; i < n; i++) {
        struct hl_fence *f = slot(c, (uint32_t)idxs[i]);
        uint64_t link = HL_LINK((uint32_t)i, pgen, (uint32_t)pidx);
        int done = 0;
        for (int k = 0; k < HL_MAX_PARENTS && !done; k++) {
            uint64_t old = ld(&f->parents[k]);
            if (hle_link_live(c, old)) continue;
            /* an empty link, or one whose parent was freed: reuse it */
            if (cas(&f->parents[k], &old, link)) done = 1;
        }
        if (!done) {
            /* lost a race for the last link: count this child as failed */
            hle_propagate_link(c, link, HL_STATUS_ERROR, 0);
            continue;
        }
        if (ld(&f->word)) hle_propagate_link(c, link, (uint32_t)ld(&f->word), 0);
    }
    *out = ph;
    return HL_OK;
}
