/*
 * hostless_queue.h -- the producer side of a hostless command queue: open
 * (validate once) and push, by a host thread, firmware or a GPU thread.  The
 * queue's layout and protocol (cells, doorbell, who may write what) are in
 * hostless_layout.h, "Command queues"; the consumer side (bind, pop,
 * complete) and recovery of a producer that died while filling a packet are
 * the core library's.  Include "hostless.h".
 */
#ifndef HOSTLESS_QUEUE_H
#define HOSTLESS_QUEUE_H

#include "hostless_layout.h"
#include "hostless_atomic.h"
#include "hostless_ops.h"

/* A queue, validated once: the addresses and capacity a producer uses, in
 * private memory (the queue header's offsets are never re-read). */
struct hl_qview {
    struct hl_queue *q;
    hl_u64 *cells;
    struct hl_packet *packets;
    hl_u64 capacity; /* a power of two */
};

/* HL_E_FULL (-7: no free cell, nothing overwritten) is in hostless_errors.h */

/* hl_queue_open(d, handle, *v)
 *   Validates the queue behind a queue handle and fills the private view *v:
 *   the slot is a live queue of this domain, its block lies in the heap's
 *   data area, its header has the magic and a power-of-two capacity that
 *   fits the block, and the cell and packet arrays lie inside the block,
 *   8-byte aligned (all by subtraction).  The queue header's offsets are
 *   never re-read afterwards: a producer pushes through *v only.
 *   Ordering: acquire loads of ctl, word and aux; plain reads of the queue
 *   header; nothing is written.
 *   Returns:
 *     HL_OK         *v is filled
 *     HL_E_HANDLE   `handle` is not a live queue of this domain (tag, index,
 *                   kind, generation)
 *     HL_E_CORRUPT  the domain has no heap, or the block or the queue header
 *                   is inconsistent
 *   *v is untouched on an error.  The caller must hold the queue (or use a
 *   handle a joined participant keeps alive) while it pushes through *v. */

HL_INLINE int hl_queue_open(const struct hl_dom *d, hl_u64 handle, struct hl_qview *v) {
    struct hl_fence *f = hl_fence_slot(d, handle, HL_KIND_QUEUE);
    struct hl_queue *q;
    hl_u64 off, n, cap, co, po;
    if (!f || !hl_fence_matches(f, handle)) return HL_E_HANDLE;
    if (!d->heap) return HL_E_CORRUPT;
    off = hl_load64(&f->word);
    n = hl_load64(&f->aux);
    if (off > d->heap_data_size || n > d->heap_data_size - off || n < HL_QUEUE_HEADER_SIZE) return HL_E_CORRUPT;
    q = (struct hl_queue *)(d->heap_data + off);
    cap = q->capacity;
    co = q->cells_offset;
    po = q->packets_offset;
    if (q->magic != HL_QUEUE_MAGIC || cap == 0 || (cap & (cap - 1)) != 0) return HL_E_CORRUPT;
    if (cap > n / (8 + HL_PACKET_SIZE)) return HL_E_CORRUPT;
    if (co < HL_QUEUE_HEADER_SIZE || co > n || 8 * cap > n - co || co % 8) return HL_E_CORRUPT;
    if (po < co || po - co < 8 * cap || po > n || HL_PACKET_SIZE * cap > n - po || po % 8) return HL_E_CORRUPT;
    v->q = q;
    v->cells = (hl_u64 *)((char *)q + co);
    v->packets = (struct hl_packet *)((char *)q + po);
    v->capacity = cap;
    return HL_OK;
}

/* hl_queue_push(v, p, producer, *index_out)
 *   Enqueues a copy of packet *p into the validated queue *v: reserves the
 *   next write index w by CAS of cell w % capacity from FREE(w) to
 *   RESERVED(w, producer), advances write_index (anyone may help), fills the
 *   packet (signal first: recovery reads it if the producer dies while
 *   filling), publishes READY(w), stores doorbell = w + 1 and, on a host
 *   with futexes, wakes a consumer asleep on the doorbell.  A device is
 *   handed the view by its host, so it skips the table reads that each
 *   cross the bus.  producer: the participant index, or a device's
 *   (HL_PRODUCER_DEVICE_OF its host participant, or HL_PRODUCER_DEVICE).
 *   Ordering: seq_cst CASes of the cell and write_index; the READY store is
 *   seq_cst on a host, release on a device (hl_publish64: release for the
 *   packet's bytes, which the consumer reads after an acquire load of the
 *   cell); the doorbell store follows it (hl_ring64), and on a host the
 *   doorbell_waiters read follows that (no lost wake-up).
 *   Returns:
 *     HL_OK         enqueued; *index_out (optional) receives w
 *     HL_E_FULL     the cell at write_index still holds an older lap: the
 *                   queue is full; nothing was written (retry later)
 *     HL_E_CORRUPT  the queue's words contradict each other (a cell ahead of
 *                   write_index that does not move), or no progress in 4096
 *                   rounds (every retry means another producer moved on)
 *   Bounded: it never spins forever and never overwrites a packet.
 *
 * hl_queue_reserve(v, producer, hint, *w_out) and hl_queue_publish(v, w, p, producer)
 *   hl_queue_push in two halves, for a producer that reserves while it does
 *   something else (a device reserving the follow-up's cell while its
 *   signal's CAS crosses the bus: each half is a bus round trip).
 *   hl_queue_reserve returns as hl_queue_push, without writing a packet; on
 *   HL_OK the caller must hl_queue_publish index *w_out (a reserved cell
 *   that is never published holds the queue until recovery SKIPs it).
 *   hint: a write index the caller expects to be free, at most the queue's
 *   write_index (the one after the caller's own last reservation in this
 *   queue always is: write_index only grows), or HL_QUEUE_NO_HINT.  The
 *   first round CASes cell hint from FREE(hint) without reading write_index
 *   or the cell; a stale hint fails that CAS (the 48-bit lap sequence is in
 *   the cell) and costs one round, after which the usual rounds run.  A hint
 *   AHEAD of write_index is outside this contract: it could reserve a cell
 *   past unreserved ones, which breaks the caller's order or strands its
 *   packet (tests/model/queue_model.py shows it).  hl_queue_publish cannot fail.
 *
 * hl_queue_skip_reserved(v, k, cl, producer)
 *   Recovery's half: cell k holds cl = RESERVED(s, p) of a producer that
 *   died before publishing.  Moves write_index from s to s + 1 when it is
 *   still there (the producer may have died between its cell CAS and its
 *   write_index CAS: left behind, write_index would trail read_index once
 *   the SKIP is consumed, and every later reserve would find the cell ahead
 *   of it and return HL_E_CORRUPT), then CASes the cell to SKIP(s,
 *   producer).  Returns 1 when the cell was skipped, 0 when it had changed.
 *   Ordering: seq_cst CASes, write_index first. */
#define HL_QUEUE_NO_HINT (~0ULL)

HL_INLINE int hl_queue_reserve(const struct hl_qview *v, hl_u32 producer, hl_u64 hint, hl_u64 *w_out) {
    struct hl_queue *q = v->q;
    hl_u64 *cells = v->cells, w, c, mask = v->capacity - 1, seq48 = HL_CELL_SEQ_MASK;
    int rounds;
    if (hint != HL_QUEUE_NO_HINT) {
        hl_u64 e = HL_CELL(hint, 0, HL_CELL_FREE);
        if (hl_cas64(&cells[hint & mask], &e, HL_CELL(hint, producer, HL_CELL_RESERVED))) {
            hl_u64 ww = hint;
            hl_cas64(&q->write_index, &ww, hint + 1);
            *w_out = hint;
            return HL_OK;
        }
    }
    for (rounds = 0;; rounds++) {
        if (rounds >= 4096) return HL_E_CORRUPT; /* every retry means another producer moved on */
        w = hl_load64(&q->write_index);
        c = hl_load64(&cells[w & mask]);
        if (HL_CELL_STATE(c) == HL_CELL_FREE && HL_CELL_SEQ(c) == (w & seq48)) {
            hl_u64 e = c;
            if (hl_cas64(&cells[w & mask], &e, HL_CELL(w, producer, HL_CELL_RESERVED))) {
                hl_u64 ww = w;
                hl_cas64(&q->write_index, &ww, w + 1);
                break;
            }
            continue;
        }
        if (HL_CELL_SEQ(c) == (w & seq48) && HL_CELL_STATE(c) != HL_CELL_FREE) {
            /* reserved by someone who has not advanced write_index yet: help */
            hl_u64 ww = w;
            hl_cas64(&q->write_index, &ww, w + 1);
            continue;
        }
        if (HL_CELL_SEQ(c) < (w & seq48)) return HL_E_FULL; /* the cell still holds an older lap */
        /* the cell is ahead of w: write_index moved under us, or the words are corrupt */
        if (hl_load64(&q->write_index) == w) return HL_E_CORRUPT;
    }
    *w_out = w;
    return HL_OK;
}

HL_INLINE void hl_queue_publish(const struct hl_qview *v, hl_u64 w, const struct hl_packet *p, hl_u32 producer) {
    struct hl_queue *q = v->q;
    struct hl_packet *slot = v->packets + (w & (v->capacity - 1));
    slot->signal = p->signal; /* first: recovery reads it if we die while filling */
    slot->type = p->type;
    slot->flags = p->flags;
    slot->kernel = p->kernel;
    slot->args = p->args;
    slot->signal_value = p->signal_value;
    slot->wait[0] = p->wait[0];
    slot->wait[1] = p->wait[1];
    slot->wait_value[0] = p->wait_value[0];
    slot->wait_value[1] = p->wait_value[1];
    hl_publish64(&v->cells[w & (v->capacity - 1)], HL_CELL(w, producer, HL_CELL_READY));
    hl_ring64(&q->doorbell, w + 1);
#if defined(HL_HAVE_FUTEX)
    if (hl_load32(&q->doorbell_waiters) != 0)
        hl_futex_wake_all((hl_u32 *)&q->doorbell);
#endif
}

HL_INLINE int hl_queue_skip_reserved(const struct hl_qview *v, hl_u64 k, hl_u64 cl, hl_u32 producer) {
    hl_u64 wi = hl_load64(&v->q->write_index), e = cl;
    if ((wi & HL_CELL_SEQ_MASK) == HL_CELL_SEQ(cl)) hl_cas64(&v->q->write_index, &wi, wi + 1);
    return hl_cas64(&v->cells[k], &e, HL_CELL(HL_CELL_SEQ(cl), producer, HL_CELL_SKIP));
}

HL_INLINE int hl_queue_push(const struct hl_qview *v, const struct hl_packet *p, hl_u32 producer,
                            hl_u64 *index_out) {
    hl_u64 w = 0;
    int r = hl_queue_reserve(v, producer, HL_QUEUE_NO_HINT, &w);
    if (r != HL_OK) return r;
    hl_queue_publish(v, w, p, producer);
    if (index_out) *index_out = w;
    return HL_OK;
}

/* hl_queue_try_push(d, qhandle, p, producer, *index_out)
 *   hl_queue_open + hl_queue_push: enqueues one packet by queue handle.
 *   Ordering: as hl_queue_push.
 *   Returns HL_OK, HL_E_FULL, HL_E_HANDLE (qhandle is not a live queue of
 *   this domain) or HL_E_CORRUPT (hl_queue_open's or hl_queue_push's). */

HL_INLINE int hl_queue_try_push(const struct hl_dom *d, hl_u64 qhandle, const struct hl_packet *p, hl_u32 producer,
                                hl_u64 *index_out) {
    struct hl_qview v;
    int r = hl_queue_open(d, qhandle, &v);
    if (r != HL_OK) return r;
    return hl_queue_push(&v, p, producer, index_out);
}

#endif /* HOSTLESS_QUEUE_H */