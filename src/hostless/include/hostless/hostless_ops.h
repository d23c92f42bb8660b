/*
 * hostless_ops.h -- the inline operations of the hostless ABI on fences,
 * timelines and buffers: validation of a mapped domain into a private view,
 * handle lookup, signal, fail, poll, buffer addresses.  Queues are in
 * hostless_queue.h.  Include "hostless.h".
 *
 * Every call is described the same way (after IREE's iree/hal headers):
 * what it does, its memory ordering, and EVERY value it returns.  All of them
 * are bounded (no call waits or spins without limit), make at most one
 * system call (a FUTEX_WAKE, hosts only; see hostless_atomic.h) and never
 * trust a value read from shared memory without checking it against the
 * private view (struct hl_dom): a corrupted domain yields an error code,
 * never an access outside the mapping.
 *
 * What the ABI leaves to the core library (the _core extension, and the
 * engine a C participant links): creating objects, taking and dropping
 * references, joining the participant table, propagating a fence's outcome
 * to its merged parents, sleeping waits, and recovery.  A participant that
 * uses only this header must only use handles that a joined participant
 * keeps alive (the write rule, hostless_layout.h).
 */
#ifndef HOSTLESS_OPS_H
#define HOSTLESS_OPS_H

#include "hostless_layout.h"
#include "hostless_atomic.h"
#include "hostless_errors.h"

/* return codes: HL_OK and every HL_E_* are in hostless_errors.h */

/* ---- validation: call once after mapping `size` bytes at `base` ----
 *
 * hl_region_ok(off, len, total)
 *   1 when [off, off + len) is page aligned and lies inside [0, total)
 *   (checked by subtraction: no overflow), else 0.  Pure arithmetic.
 *
 * hl_domain_validate(base, size)
 *   Checks the shared header at base against this ABI and the mapping's size:
 *   magic, abi_version, header_size, total_size == size, slot sizes,
 *   capacities, tag (1..255), poll_ns (HL_POLL_MIN_NS..HL_POLL_MAX_NS), every
 *   region page aligned, inside the mapping and overlapping no other one,
 *   devheap_count <= HL_MAX_DEVICE_HEAPS descriptors inside their region.
 *   Ordering: plain reads (call it before sharing the mapping with other
 *   threads, or accept that a concurrent writer makes it fail).
 *   Returns HL_OK, or HL_E_CORRUPT on the first mismatch.  Reads only the
 *   header page, and nothing of it when size < HL_HEADER_SIZE. */

HL_INLINE int hl_region_ok(hl_u64 off, hl_u64 len, hl_u64 total) {
    return (off % HL_PAGE) == 0 && off <= total && len <= total - off;
}

HL_INLINE int hl_domain_validate(const void *base, hl_u64 size) {
    const struct hl_header *h = (const struct hl_header *)base;
    if (size < HL_HEADER_SIZE) return HL_E_CORRUPT;
    if (h->magic != HL_MAGIC || h->abi_version != HL_ABI_VERSION || h->header_size != HL_HEADER_SIZE) return HL_E_CORRUPT;
    if (h->total_size != size) return HL_E_CORRUPT;
    if (h->participant_size != HL_PARTICIPANT_SIZE || h->fence_size != HL_FENCE_SIZE) return HL_E_CORRUPT;
    if (h->participant_capacity == 0 || h->participant_capacity > HL_MAX_PARTICIPANTS) return HL_E_CORRUPT;
    if (h->fence_capacity == 0 || h->fence_capacity > HL_MAX_FENCES) return HL_E_CORRUPT;
    if (h->tag == 0 || h->tag > 255) return HL_E_CORRUPT;
    if (h->poll_ns < HL_POLL_MIN_NS || h->poll_ns > HL_POLL_MAX_NS) return HL_E_CORRUPT;
    if (!hl_region_ok(h->participants_offset, (hl_u64)h->participant_capacity * HL_PARTICIPANT_SIZE, size)) return HL_E_CORRUPT;
    if (!hl_region_ok(h->fences_offset, (hl_u64)h->fence_capacity * HL_FENCE_SIZE, size)) return HL_E_CORRUPT;
    if (!hl_region_ok(h->queues_offset, h->queues_size, size)) return HL_E_CORRUPT;
    if (!hl_region_ok(h->trace_offset, h->trace_size, size)) return HL_E_CORRUPT;
    if (!hl_region_ok(h->heap_offset, h->heap_size, size)) return HL_E_CORRUPT;
    if (!hl_region_ok(h->devheap_offset, h->devheap_size, size)) return HL_E_CORRUPT;
    if (h->devheap_count > HL_MAX_DEVICE_HEAPS || h->devheap_size / HL_DEVHEAP_SIZE < h->devheap_count) return HL_E_CORRUPT;
    if (h->participants_offset < HL_HEADER_SIZE || h->fences_offset < HL_HEADER_SIZE) return HL_E_CORRUPT;
    {
        /* the regions must not overlap (each one was checked to lie inside the mapping above) */
        hl_u64 off[6], len[6];
        int i, j;
        off[0] = h->participants_offset, len[0] = (hl_u64)h->participant_capacity * HL_PARTICIPANT_SIZE;
        off[1] = h->fences_offset, len[1] = (hl_u64)h->fence_capacity * HL_FENCE_SIZE;
        off[2] = h->queues_offset, len[2] = h->queues_size;
        off[3] = h->trace_offset, len[3] = h->trace_size;
        off[4] = h->heap_offset, len[4] = h->heap_size;
        off[5] = h->devheap_offset, len[5] = h->devheap_size;
        for (i = 0; i < 6; i++)
            for (j = i + 1; j < 6; j++)
                if (len[i] && len[j] && off[i] < off[j] + len[j] && off[j] < off[i] + len[i]) return HL_E_CORRUPT;
    }
    return HL_OK;
}

/* ---- the private view: layout values validated once, then never re-read ----
 *
 * A participant validates the shared header ONCE, when it maps the domain,
 * and from then on uses only this private copy of the layout (offsets,
 * sizes, capacities, poll interval): a header rewritten later by a buggy or
 * hostile participant cannot move any of its accesses.  Every index or
 * offset read from shared memory afterwards (handles' slot indices, a
 * buffer's offset and length, queue positions) is checked against the view,
 * by subtraction so that the check cannot overflow. */
struct hl_dom {
    char *base;                    /* the mapping */
    hl_u64 size;                   /* its size (== header total_size) */
    struct hl_participant *parts;  /* participant table */
    hl_u32 participant_capacity;
    hl_u32 tag;                    /* handle tag */
    struct hl_fence *fences;       /* fence table */
    hl_u32 fence_capacity;
    hl_u32 pad_;
    hl_u64 poll_ns;                /* longest host sleep before re-reading a word */
    struct hl_heap *heap;          /* 0: no heap */
    hl_u64 *heap_bitmap;
    hl_u64 heap_granules;
    char *heap_data;               /* data area (page aligned) */
    hl_u64 heap_data_size;         /* heap_granules * HL_GRANULE */
    struct hl_trace *trace;        /* 0: no trace ring */
    hl_u64 trace_capacity;         /* events */
    hl_u32 devheap_count;          /* device heaps (0..HL_MAX_DEVICE_HEAPS) */
    hl_u32 pad1_;
    struct hl_devheap *devheap[HL_MAX_DEVICE_HEAPS];     /* descriptors */
    hl_u64 *devheap_bitmap[HL_MAX_DEVICE_HEAPS];         /* their bitmaps */
    hl_u64 devheap_granules[HL_MAX_DEVICE_HEAPS];        /* bits of each bitmap */
    hl_u32 devheap_kind[HL_MAX_DEVICE_HEAPS];            /* HL_DEVICE_CUDA */
    hl_u32 devheap_ordinal[HL_MAX_DEVICE_HEAPS];         /* N of cuda:N */
};

/* hl_attach(d, base, size)
 *   Validates the domain mapped at base (size bytes: the whole mapping) with
 *   hl_domain_validate, then the heap header (magic, bitmap and data area
 *   inside the heap region) when heap_size != 0, and fills the private view
 *   *d, which every other operation takes.  Device-heap descriptors are
 *   checked too (hl_devheaps_attach: each field read once, every offset and
 *   size checked by subtraction).  A trace ring whose header does not
 *   check out is left out of the view (d->trace = 0), not an error.
 *   Ordering: plain reads, once; nothing is written to shared memory.
 *   Returns HL_OK, or HL_E_CORRUPT (header, heap header or a device-heap
 *   descriptor inconsistent or not inside the mapping).  *d is zeroed first, so on an error it names no
 *   memory at all. */

/* The device-heap descriptors of the validated header h into d (part of hl_attach). */
HL_INLINE int hl_devheaps_attach(struct hl_dom *d, const struct hl_header *h) {
    hl_u64 roff = h->devheap_offset, rsize = h->devheap_size; /* read once */
    hl_u32 n = h->devheap_count, i, j;
    hl_u64 lo[HL_MAX_DEVICE_HEAPS], hi[HL_MAX_DEVICE_HEAPS];
    if (n == 0) return HL_OK;
    if (n > HL_MAX_DEVICE_HEAPS || !hl_region_ok(roff, rsize, d->size) || rsize / HL_DEVHEAP_SIZE < n) return HL_E_CORRUPT;
    for (i = 0; i < n; i++) {
        const struct hl_devheap *dh = (const struct hl_devheap *)(d->base + roff + (hl_u64)i * HL_DEVHEAP_SIZE);
        hl_u64 magic = dh->magic, gran = dh->granule, g = dh->granules, sz = dh->size, bmo = dh->bitmap_offset;
        hl_u32 kind = dh->device_kind, ord = dh->device_ordinal;
        hl_u64 bm_bytes;
        if (magic != HL_DEVHEAP_MAGIC || kind != HL_DEVICE_CUDA || ord > 255u || gran != HL_DEVICE_GRANULE) return HL_E_CORRUPT;
        if (g == 0 || g > HL_DEVICE_MAX_SIZE / HL_DEVICE_GRANULE || sz != g * HL_DEVICE_GRANULE || sz % HL_DEVICE_ALIGN)
            return HL_E_CORRUPT;
        bm_bytes = (g + 63) / 64 * 8;
        if (bmo % 8 || bmo < (hl_u64)n * HL_DEVHEAP_SIZE || bmo > rsize || bm_bytes > rsize - bmo) return HL_E_CORRUPT;
        for (j = 0; j < i; j++) {
            if (d->devheap_kind[j] == kind && d->devheap_ordinal[j] == ord) return HL_E_CORRUPT;
            if (bmo < hi[j] && lo[j] < bmo + bm_bytes) return HL_E_CORRUPT; /* bitmaps overlap */
        }
        lo[i] = bmo, hi[i] = bmo + bm_bytes;
        d->devheap[i] = (struct hl_devheap *)dh;
        d->devheap_bitmap[i] = (hl_u64 *)(d->base + roff + bmo);
        d->devheap_granules[i] = g;
        d->devheap_kind[i] = kind;
        d->devheap_ordinal[i] = ord;
    }
    d->devheap_count = n;
    return HL_OK;
}

HL_INLINE int hl_attach(struct hl_dom *d, void *base, hl_u64 size) {
    const struct hl_header *h = (const struct hl_header *)base;
    hl_u64 i;
    for (i = 0; i < sizeof *d; i++) ((char *)d)[i] = 0;
    if (hl_domain_validate(base, size) != HL_OK) return HL_E_CORRUPT;
    d->base = (char *)base;
    d->size = size;
    d->parts = (struct hl_participant *)(d->base + h->participants_offset);
    d->participant_capacity = h->participant_capacity;
    d->tag = h->tag;
    d->fences = (struct hl_fence *)(d->base + h->fences_offset);
    d->fence_capacity = h->fence_capacity;
    d->poll_ns = h->poll_ns;
    if (h->heap_size) {
        const struct hl_heap *hp = (const struct hl_heap *)(d->base + h->heap_offset);
        hl_u64 hs = h->heap_size, bmo = hp->bitmap_offset, g = hp->granules, dato = hp->data_offset;
        hl_u64 dsz = hp->data_size, bm_bytes;
        if (hs < HL_PAGE || hp->magic != HL_HEAP_MAGIC) return HL_E_CORRUPT;
        if (g > hs / HL_GRANULE) return HL_E_CORRUPT;
        bm_bytes = (g + 63) / 64 * 8;
        if (bmo < sizeof(struct hl_heap) || bmo > hs || bm_bytes > hs - bmo || bmo % 8) return HL_E_CORRUPT;
        if (dato % HL_PAGE || dato > hs || dato < bmo || dato - bmo < bm_bytes) return HL_E_CORRUPT;
        if (dsz != g * HL_GRANULE || dsz > hs - dato) return HL_E_CORRUPT;
        d->heap = (struct hl_heap *)hp;
        d->heap_bitmap = (hl_u64 *)(d->base + h->heap_offset + bmo);
        d->heap_granules = g;
        d->heap_data = d->base + h->heap_offset + dato;
        d->heap_data_size = dsz;
    }
    if (hl_devheaps_attach(d, h) != HL_OK) {
        for (i = 0; i < sizeof *d; i++) ((char *)d)[i] = 0;
        return HL_E_CORRUPT;
    }
    if (h->trace_size >= 128) {
        const struct hl_trace *t = (const struct hl_trace *)(d->base + h->trace_offset);
        hl_u64 cap = t->capacity;
        if (t->magic == HL_TRACE_MAGIC && cap != 0 && cap <= (h->trace_size - 64) / 64) {
            d->trace = (struct hl_trace *)t;
            d->trace_capacity = cap;
        }
    }
    return HL_OK;
}

/* ---- handles ----
 *
 * hl_fence_slot(d, handle, want_kind)
 *   The slot `handle` names, or 0 when it is not one of this domain's: wrong
 *   tag, index outside the fence table (checked against the view), or, when
 *   want_kind != 0, a handle of another kind (HL_KIND_*).  Pure arithmetic
 *   on the handle: the slot itself is not read (its generation is checked
 *   by hl_fence_matches).
 *
 * hl_fence_matches(f, handle)
 *   1 when slot f holds the LIVE object `handle` names (same 24-bit
 *   generation and kind in f->ctl), else 0.  Ordering: one acquire load of
 *   ctl.  A match says the object was live at that instant; only a reference
 *   (or the write rule's other cases) keeps it so.  hl_ctl_matches(c, handle)
 *   is the same test on a ctl word the caller read.
 *
 * hl_word(d, handle)
 *   Address of the completion word of the slot `handle` names (any kind):
 *   what a device waits on (">= value") and stores to.  0 when the handle is
 *   not one of this domain's (hl_fence_slot with want_kind 0).  The
 *   generation is NOT checked: the caller must hold the object.
 *
 * hl_status_valid(s)
 *   1 when s is a status a fence can complete with: SUCCESS, ERROR, CANCEL,
 *   OWNER_DIED, OWNER_LEFT (ABI 6) or a custom code 64..2^32-1 (never 0 =
 *   ACTIVE, 1, 5, 8..63).
 *   The one definition of the rule: the C core, the CUDA kernels and the
 *   Python checker all use it. */

HL_INLINE struct hl_fence *hl_fence_slot(const struct hl_dom *d, hl_u64 handle, hl_u32 want_kind) {
    hl_i64 idx = HL_HANDLE_INDEX(handle);
    if (HL_HANDLE_TAG(handle) != d->tag) return 0;
    if (idx < 0 || (hl_u64)idx >= (hl_u64)d->fence_capacity) return 0;
    if (want_kind && HL_HANDLE_KIND(handle) != want_kind) return 0;
    return d->fences + idx;
}

HL_INLINE int hl_ctl_matches(hl_u64 c, hl_u64 handle) {
    return HL_CTL_STATE(c) == HL_SLOT_LIVE && (HL_CTL_GEN(c) & 0xffffffu) == HL_HANDLE_GEN(handle) &&
           HL_CTL_KIND(c) == HL_HANDLE_KIND(handle);
}

HL_INLINE int hl_fence_matches(const struct hl_fence *f, hl_u64 handle) { return hl_ctl_matches(hl_load64(&f->ctl), handle); }

HL_INLINE hl_u64 *hl_word(const struct hl_dom *d, hl_u64 handle) {
    struct hl_fence *f = hl_fence_slot(d, handle, 0);
    return f ? &f->word : 0;
}

HL_INLINE int hl_status_valid(hl_u64 s) {
    return s == HL_STATUS_SUCCESS || s == HL_STATUS_ERROR || s == HL_STATUS_CANCEL || s == HL_STATUS_OWNER_DIED ||
           s == HL_STATUS_OWNER_LEFT ||
           (s >= HL_STATUS_CUSTOM_MIN && s <= 0xffffffffULL);
}

/* ---- the packet rule every consumer applies (core/agent.c, agents/gpucp.cu) ----
 *
 * Pure arithmetic on a packet's handles and values and on a completion word
 * already read: the one definition of what a consumer accepts before it waits
 * or runs anything (the liveness of each handle, its generation against its
 * slot, is checked separately: hl_ctl_matches, or a reference).
 *
 * hl_signal_kind_ok(h)
 *   1 when h is of a kind a packet may signal: a binary fence or a timeline
 *   (not a merged fence, a buffer, a queue, an unknown kind).
 *
 * hl_wait_kind_ok(h)
 *   1 when h is of a kind a packet may wait on: a binary fence, a merged fence
 *   or a timeline.
 *
 * hl_point_ok(h, value)
 *   1 unless h is a timeline and value > HL_TIMELINE_MAX (a point no timeline
 *   reaches: a wait on it would never end, a signal to it can never be made).
 *   A fence's value is ignored.
 *
 * hl_input_status(h, w)
 *   The status an input passes on once its completion word w is final (a
 *   fence's word != 0; a timeline's word >= the point waited for, or failed):
 *   SUCCESS; a failed timeline's status; a fence's status; ERROR when that is
 *   not a final status (hl_status_valid: ACTIVE, 5, bits above 32, ...). */

HL_INLINE int hl_signal_kind_ok(hl_u64 h) {
    return HL_HANDLE_KIND(h) == HL_KIND_FENCE || HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
}

HL_INLINE int hl_wait_kind_ok(hl_u64 h) {
    return HL_HANDLE_KIND(h) == HL_KIND_FENCE || HL_HANDLE_KIND(h) == HL_KIND_MERGED ||
           HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
}

HL_INLINE int hl_point_ok(hl_u64 h, hl_u64 value) {
    return HL_HANDLE_KIND(h) != HL_KIND_TIMELINE || value <= HL_TIMELINE_MAX;
}

HL_INLINE hl_u32 hl_input_status(hl_u64 h, hl_u64 w) {
    hl_u64 s = w;
    if (HL_HANDLE_KIND(h) == HL_KIND_TIMELINE) s = (w & HL_TIMELINE_FAILED) ? (w & 0xffffffffULL) : HL_STATUS_SUCCESS;
    return hl_status_valid(s) ? (hl_u32)s : HL_STATUS_ERROR;
}

/* ---- binary fences ----
 *
 * hl_fence_signal(d, handle, status)
 *   Signals the binary fence `handle` with `status`: one CAS of its word from
 *   0 (ACTIVE) to status, then hl_wake_fence.  The first signal stands.
 *   Ordering: the CAS is seq_cst (release for the data written before it;
 *   atomicCAS_system on a device), so a waiter that observes the status also
 *   observes everything the signaler wrote before; the waiter count is read
 *   after it (no lost wake-up).
 *   Returns:
 *     HL_OK         the word went from 0 to status; host sleepers were woken
 *     HL_E_HANDLE   `handle` is not a live binary fence of this domain: wrong
 *                   tag, index outside the table, another kind (a timeline,
 *                   a merged fence, a buffer, a queue), or a stale generation
 *                   (checked in that order; nothing is written)
 *     HL_E_VALUE    status is not hl_status_valid (nothing is written)
 *     HL_E_ALREADY  the word was not 0: signaled before (by anyone, or
 *                   OWNER_DIED / CANCEL by recovery or the last release)
 *   The caller must hold the fence, or use a handle a joined participant
 *   keeps alive (the write rule): the generation check and the CAS are two
 *   steps.  Propagation to merged parents is done by the core library (and
 *   by any host waiter of the parent, and by watchdog sweeps); a participant
 *   using only this header leaves it to them.
 *
 * hl_fence_poll(d, handle, *status)
 *   Reads the status of a binary or merged fence: the word's low 32 bits, or
 *   HL_STATUS_ACTIVE while the word is 0.  Does not wait and writes nothing
 *   shared.  Ordering: acquire loads of ctl, then of the word (a status
 *   observed makes the signaler's earlier writes visible).
 *   Returns HL_OK (*status set), or HL_E_HANDLE when `handle` names no live
 *   object of this domain (any kind is accepted; for a timeline, use
 *   hl_timeline_poll); *status is untouched then. */

HL_INLINE int hl_fence_signal(const struct hl_dom *d, hl_u64 handle, hl_u32 status) {
    struct hl_fence *f = hl_fence_slot(d, handle, HL_KIND_FENCE);
    hl_u64 expected = 0;
    if (!f || !hl_fence_matches(f, handle)) return HL_E_HANDLE;
    if (!hl_status_valid(status)) return HL_E_VALUE;
    if (!hl_cas64(&f->word, &expected, (hl_u64)status)) return HL_E_ALREADY;
    hl_wake_fence(f);
    return HL_OK;
}

HL_INLINE int hl_fence_poll(const struct hl_dom *d, hl_u64 handle, hl_u32 *status) {
    struct hl_fence *f = hl_fence_slot(d, handle, 0);
    hl_u64 w;
    if (!f || !hl_fence_matches(f, handle)) return HL_E_HANDLE;
    w = hl_load64(&f->word);
    *status = w ? (hl_u32)w : HL_STATUS_ACTIVE;
    return HL_OK;
}

/* ---- timelines ----
 *
 * hl_timeline_advance(f, value, *cur_out)
 *   Moves the word of timeline slot f up to `value`: a CAS loop that retries
 *   while others move it, then hl_wake_timeline on success.  No handle
 *   check: the caller holds the slot (the core library and hl_timeline_signal
 *   call it after their own checks; a CUDA kernel on a slot its host holds).
 *   Ordering: seq_cst CAS (atomicCAS_system on a device).
 *   Returns:
 *     HL_OK        the word was below value and now holds it
 *     HL_E_VALUE   value > HL_TIMELINE_MAX, or value <= the current value
 *                  (a timeline only grows; nothing is written)
 *     HL_E_FAILED  the timeline has failed (HL_TIMELINE_FAILED is set)
 *   *cur_out (optional) receives the word seen last: the value it replaced
 *   on success, the word that refused it on an error (the word as first
 *   read when value > HL_TIMELINE_MAX).
 *
 * hl_timeline_fail(f, status, *cur_out)
 *   Fails timeline slot f with `status`: raises aux to the current value
 *   (hl_timeline_raise_aux: aux only grows, so a concurrent failer that read
 *   an older value cannot lower it), then CASes the word to
 *   HL_TIMELINE_FAILED | status, so that every ">= v" waiter wakes; then
 *   hl_wake_timeline.  No handle check: the caller holds the slot (write
 *   rule).  Ordering: seq_cst CAS of aux before the seq_cst CAS of the word
 *   (a reader that sees the failure sees aux >= the value failed from:
 *   tests/model/protocol_model.py, timeline-reached-point).
 *   Returns:
 *     HL_OK        the timeline failed with status
 *     HL_E_VALUE   status is not hl_status_valid, or is SUCCESS (nothing is
 *                  written)
 *     HL_E_FAILED  it had failed already (the first failure stands)
 *   *cur_out (optional) receives the word seen last.
 *
 * hl_timeline_signal(d, handle, value)
 *   hl_timeline_advance on the timeline `handle` names, after checking it.
 *   Ordering: as hl_timeline_advance.
 *   Returns:
 *     HL_OK        advanced to value; host sleepers were woken
 *     HL_E_HANDLE  `handle` is not a live timeline of this domain: wrong tag,
 *                  index outside the table, another kind, stale generation
 *     HL_E_VALUE   value > HL_TIMELINE_MAX or not above the current value
 *     HL_E_FAILED  the timeline has failed
 *   The caller must hold the timeline (or use a handle a joined participant
 *   keeps alive), as for hl_fence_signal.
 *
 * hl_timeline_raise_aux(f, value)
 *   aux = max(aux, value), by a seq_cst CAS loop.  Only values the word held
 *   are ever stored, so aux never exceeds the value a timeline failed from.
 *
 * hl_point_status(f, w, value)
 *   The status a wait for `value` on timeline slot f ends with, given the word
 *   w it read (w >= value, or failed): SUCCESS when w is a value; when w is a
 *   failure, SUCCESS if the point was reached before it (aux >= value: a
 *   point reached stays reached, ABI 6), else the failure's status (ERROR
 *   when that is no valid status).  Reads aux (acquire) after the caller's
 *   read of w.  A timeline failed by a participant that could not write aux
 *   (a GPU command processor without a reference) reports the failure for
 *   points it reached: conservative, never a SUCCESS not reached.
 *
 * hl_timeline_poll(d, handle, *word)
 *   Reads the timeline's word: its value, or HL_TIMELINE_FAILED | status.
 *   Ordering: acquire loads of ctl, then of the word.
 *   Returns HL_OK (*word set), or HL_E_HANDLE when `handle` is not a live
 *   timeline of this domain (*word untouched). */

HL_INLINE int hl_timeline_advance(struct hl_fence *f, hl_u64 value, hl_u64 *cur_out) {
    hl_u64 cur = hl_load64(&f->word);
    int r = HL_OK;
    if (value > HL_TIMELINE_MAX) r = HL_E_VALUE;
    while (r == HL_OK) {
        if (cur & HL_TIMELINE_FAILED) r = HL_E_FAILED;
        else if (value <= cur) r = HL_E_VALUE;
        else if (hl_cas64(&f->word, &cur, value)) break;
    }
    if (cur_out) *cur_out = cur;
    if (r == HL_OK) hl_wake_timeline(f);
    return r;
}

HL_INLINE void hl_timeline_raise_aux(struct hl_fence *f, hl_u64 value) {
    hl_u64 a = hl_load64(&f->aux);
    while (a < value && !hl_cas64(&f->aux, &a, value)) {
    }
}

HL_INLINE hl_u32 hl_point_status(struct hl_fence *f, hl_u64 w, hl_u64 value) {
    hl_u64 s;
    if (!(w & HL_TIMELINE_FAILED)) return HL_STATUS_SUCCESS;
    s = hl_load64(&f->aux);
    if (s >= value && s <= HL_TIMELINE_MAX) return HL_STATUS_SUCCESS;
    s = w & ~HL_TIMELINE_FAILED;
    return hl_status_valid(s) && s != HL_STATUS_SUCCESS ? (hl_u32)s : HL_STATUS_ERROR;
}

HL_INLINE int hl_timeline_fail(struct hl_fence *f, hl_u32 status, hl_u64 *cur_out) {
    hl_u64 cur = hl_load64(&f->word);
    int r = HL_OK;
    if (!hl_status_valid(status) || status == HL_STATUS_SUCCESS) r = HL_E_VALUE;
    while (r == HL_OK) {
        if (cur & HL_TIMELINE_FAILED) {
            r = HL_E_FAILED;
            break;
        }
        hl_timeline_raise_aux(f, cur);
        if (hl_cas64(&f->word, &cur, HL_TIMELINE_FAILED | (hl_u64)status)) break;
    }
    if (cur_out) *cur_out = cur;
    if (r == HL_OK) hl_wake_timeline(f);
    return r;
}

HL_INLINE int hl_timeline_signal(const struct hl_dom *d, hl_u64 handle, hl_u64 value) {
    struct hl_fence *f = hl_fence_slot(d, handle, HL_KIND_TIMELINE);
    if (!f || !hl_fence_matches(f, handle)) return HL_E_HANDLE;
    return hl_timeline_advance(f, value, 0);
}

HL_INLINE int hl_timeline_poll(const struct hl_dom *d, hl_u64 handle, hl_u64 *word) {
    struct hl_fence *f = hl_fence_slot(d, handle, HL_KIND_TIMELINE);
    if (!f || !hl_fence_matches(f, handle)) return HL_E_HANDLE;
    *word = hl_load64(&f->word);
    return HL_OK;
}

/* ---- buffers ----
 *
 * hl_buffer_data(d, handle, *nbytes)
 *   Address of the data of the live buffer `handle` names, or 0 when the
 *   handle is not a live buffer of this domain (tag, index, kind,
 *   generation), the domain has no heap, the buffer lives in a device heap
 *   (no host address: see hl_buffer_device), or the buffer's extent (offset
 *   and length read from its slot) leaves the heap's data area (checked
 *   against the private view, by subtraction).  *nbytes (optional) receives
 *   its size on success.  Ordering: acquire loads of ctl, err (placement),
 *   word (offset) and aux (size).  The caller must hold the buffer while it
 *   uses the address.
 *
 * hl_buffer_device(d, handle, *heap, *offset, *nbytes)
 *   Placement of the live device buffer `handle` names: *heap = its device
 *   heap index (0..devheap_count-1: d->devheap_kind / _ordinal name the
 *   device), *offset = byte offset of its data from the start of that heap,
 *   *nbytes = its size.  Returns HL_OK; HL_E_HANDLE (not a live buffer of
 *   this domain); HL_E_VALUE (a host buffer: nothing is written);
 *   HL_E_CORRUPT (placement or extent outside the heap, checked against the
 *   private view by subtraction).  Ordering and holding as hl_buffer_data.
 *
 * hl_buffer_extent(d, err, offset, nbytes)
 *   The pure part of both: checks a buffer slot's placement word (err),
 *   offset (word) and size (aux), as read by the caller from a slot whose
 *   ctl it matched, against the private view: a host buffer (HL_PLACE_HEAP
 *   -1) must lie in the heap's data area, a device buffer in its device
 *   heap, within its granule count.  Returns HL_OK or HL_E_CORRUPT.  A
 *   device reads the whole 64-byte slot at once (one bus round trip) and
 *   checks the words with hl_ctl_matches and this. */

HL_INLINE int hl_buffer_extent(const struct hl_dom *d, hl_u64 e, hl_u64 off, hl_u64 n) {
    int i = HL_PLACE_HEAP(e);
    hl_u64 size;
    if (i < 0) return d->heap && off <= d->heap_data_size && n <= d->heap_data_size - off ? HL_OK : HL_E_CORRUPT;
    if ((hl_u32)i >= d->devheap_count) return HL_E_CORRUPT;
    size = d->devheap_granules[i] * HL_DEVICE_GRANULE;
    if (off % HL_DEVICE_GRANULE || off > size || n > size - off || HL_PLACE_GRANULES(e) > (size - off) / HL_DEVICE_GRANULE ||
        n > HL_PLACE_GRANULES(e) * HL_DEVICE_GRANULE)
        return HL_E_CORRUPT;
    return HL_OK;
}

HL_INLINE void *hl_buffer_data(const struct hl_dom *d, hl_u64 handle, hl_u64 *nbytes) {
    struct hl_fence *f = hl_fence_slot(d, handle, HL_KIND_BUFFER);
    hl_u64 e, off, n;
    if (!f || !hl_fence_matches(f, handle) || !d->heap) return 0;
    e = hl_load64(&f->err);
    if (HL_PLACE_HEAP(e) >= 0) return 0; /* device memory */
    off = hl_load64(&f->word);
    n = hl_load64(&f->aux);
    if (hl_buffer_extent(d, e, off, n) != HL_OK) return 0;
    if (nbytes) *nbytes = n;
    return d->heap_data + off;
}

HL_INLINE int hl_buffer_device(const struct hl_dom *d, hl_u64 handle, hl_u32 *heap, hl_u64 *offset, hl_u64 *nbytes) {
    struct hl_fence *f = hl_fence_slot(d, handle, HL_KIND_BUFFER);
    hl_u64 e, off, n;
    int i;
    if (!f || !hl_fence_matches(f, handle)) return HL_E_HANDLE;
    e = hl_load64(&f->err);
    i = HL_PLACE_HEAP(e);
    if (i < 0) return HL_E_VALUE;
    off = hl_load64(&f->word);
    n = hl_load64(&f->aux);
    if (hl_buffer_extent(d, e, off, n) != HL_OK) return HL_E_CORRUPT;
    *heap = (hl_u32)i;
    *offset = off;
    *nbytes = n;
    return HL_OK;
}

#endif /* HOSTLESS_OPS_H */