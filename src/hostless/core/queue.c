/*
 * queue.c -- command queues (layout and the lock-free push in hostless.h,
 * "Command queues"): creation in the heap, binding the one consumer, the
 * blocking push (producers) and pop (the consumer), which skips the cells of
 * dead producers.  The waits go through hle_wait_loop.
 */
#include "engine.h"

#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/futex.h>

#define HLE_PUSH_SPIN_NS 10000ull /* a full queue is polled this long before its producer sleeps */
#define HLE_E_DEAD_CONSUMER (-1000) /* private: push found the queue's consumer dead */

uint64_t hle_queue_bytes(uint32_t cap) {
    return HL_QUEUE_HEADER_SIZE + ALIGN_UP(8ull * cap, 64) + (uint64_t)HL_PACKET_SIZE * cap;
}

void hle_queue_init(struct hl_queue *q, uint32_t cap) {
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

int hle_queue_new(hle_ctx *c, uint64_t cap, uint64_t *handle) {
    if (cap < 2 || cap > (1ull << 20) || (cap & (cap - 1)))
        return hle_fail(HL_E_VALUE, "queue capacity must be a power of two in 2..2^20");
    uint64_t off;
    return hle_block_new(c, HL_KIND_QUEUE, hle_queue_bytes((uint32_t)cap), NULL, (uint32_t)cap, handle, &off);
}

int hle_queue_view(hle_ctx *c, uint64_t h, struct hl_qview *v) {
    int64_t idx = hle_check_handle(c, h, HL_KIND_QUEUE, 1);
    if (idx < 0) return (int)idx;
    if (hl_queue_open(&c->dv, h, v) != HL_OK)
        return hle_fail(HL_E_CORRUPT, "queue 0x%llx has a corrupt header or lies outside the heap",
                        (unsigned long long)h);
    return HL_OK;
}

int hle_queue_bind(hle_ctx *c, uint64_t h) {
    struct hl_qview v;
    int r = hle_queue_view(c, h, &v);
    if (r) return r;
    struct hl_queue *q = v.q;
    uint32_t me = HL_OWNER(c->inc, c->me);
    uint32_t cur = __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST);
    for (;;) {
        if (cur == me) return HL_OK;
        if (cur && hle_owner_alive(c, cur))
            return hle_fail(HL_E_INVALID, "queue 0x%llx already has a live consumer (participant %u)",
                            (unsigned long long)h, cur);
        if (__atomic_compare_exchange_n(&q->consumer, &cur, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) break;
    }
    uint32_t was = __atomic_fetch_or(&q->flags, HL_QUEUE_WAS_BOUND, __ATOMIC_SEQ_CST);
    /* a takeover (a dead consumer, or one its recovery unbound): what is queued up to
     * now was queued for it.  Read after the CAS: a reserve that comes later gets an
     * index at or above this one and runs on us. */
    uint64_t floor = (cur != 0 || (was & HL_QUEUE_WAS_BOUND)) ? ld(&q->write_index) : 0;
    uint32_t i, slot = c->bound_next % HLE_BOUND_MAX;
    for (i = 0; i < HLE_BOUND_MAX; i++)
        if (c->bound_q[i] == h) slot = i;
    if (c->bound_q[slot] != h) c->bound_next++;
    c->bound_q[slot] = h;
    c->bound_floor[slot] = floor;
    return HL_OK;
}

uint64_t hle_queue_stale_below(hle_ctx *c, uint64_t h) {
    for (uint32_t i = 0; i < HLE_BOUND_MAX; i++)
        if (h && c->bound_q[i] == h) return c->bound_floor[i];
    return 0;
}

/* ---- push ---- */

struct push_wait {
    hle_ctx *c;
    struct hl_qview *v;
    const struct hl_packet *p;
    uint64_t *idx;
    int r;
};

static int push_poll(void *a) {
    struct push_wait *x = a;
    x->r = hl_queue_push(x->v, x->p, (uint32_t)x->c->me, x->idx);
    return x->r != HL_E_FULL;
}

/* its consumer died (recovery may already have unbound it) */
static int push_check(void *a) {
    struct push_wait *x = a;
    struct hl_queue *q = x->v->q;
    uint32_t cons = __atomic_load_n(&q->consumer, __ATOMIC_SEQ_CST);
    int dead = cons ? !hle_owner_alive(x->c, cons) : (__atomic_load_n(&q->flags, __ATOMIC_SEQ_CST) & HL_QUEUE_WAS_BOUND);
    return dead ? HLE_E_DEAD_CONSUMER : 0;
}

/* sleep until the consumer frees a cell (it wakes us), bounded */
static int push_sleep(void *a, uint64_t nap) {
    struct push_wait *x = a;
    struct hl_queue *q = x->v->q;
    uint64_t ri = ld(&q->read_index);
    __atomic_add_fetch(&q->space_waiters, 1, __ATOMIC_SEQ_CST);
    if (push_poll(x)) {
        __atomic_sub_fetch(&q->space_waiters, 1, __ATOMIC_SEQ_CST);
        return 1;
    }
    struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)&q->read_index, FUTEX_WAIT, (uint32_t)ri, &ts, 0, 0);
    __atomic_sub_fetch(&q->space_waiters, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* The wait of a push into the validated queue v, called unlocked (tok: what
 * hle_unlock returned, for the interrupt hook), with its errors and the
 * ENQUEUE trace event. */
static int push_wait_loop(hle_ctx *c, uint64_t h, struct hl_qview *v, const struct hl_packet *p, int64_t timeout,
                          uint64_t *idx, int interruptible, void **tok) {
    struct push_wait x = {c, v, p, idx, HL_OK};
    int r = HL_OK;
    if (!push_poll(&x)) { /* full: wait for a cell (a free one at once needs no clock, no loop) */
        struct hle_waiter wt = {push_poll, push_sleep, push_check, &x, now_ns(), timeout, HLE_PUSH_SPIN_NS,
                                interruptible};
        r = hle_wait_loop(c, &wt, tok);
    }
    uint64_t t_pushed = c->trace ? now_ns() : 0; /* no clock read when tracing is off */
    if (r == HL_E_INTR) return r;
    if (r == HL_E_CLOSED) return hle_closed_error(c, "the domain was closed while the queue was full");
    if (r == HLE_E_DEAD_CONSUMER)
        return hle_fail(HL_E_INVALID, "queue 0x%llx: its consumer died; respawn the agent", (unsigned long long)h);
    if (x.r == HL_E_FULL)
        return hle_fail(HL_E_QUEUE_FULL, "queue 0x%llx is full (%llu packets)", (unsigned long long)h,
                        (unsigned long long)v->capacity);
    if (x.r != HL_OK)
        return hle_fail(HL_E_CORRUPT, "queue 0x%llx: its cells contradict its write index (corrupt queue)",
                        (unsigned long long)h);
    hle_trace_emit_at(c, t_pushed, HL_EV_ENQUEUE, h, *idx, p->signal, p->kernel, p->type);
    return HL_OK;
}

/* Push a packet; blocks while the queue is full (contract in engine.h). */
int hle_queue_push(hle_ctx *c, uint64_t h, const struct hl_packet *p, int64_t timeout, uint64_t *idx) {
    struct hl_qview v;
    int r = hle_queue_view(c, h, &v);
    if (r) return r;
    int intr = hle_interruptible(c);
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    r = push_wait_loop(c, h, &v, p, timeout, idx, intr, &tok);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    return r;
}

/* The same, called unlocked inside a GIL-free section (contract in engine.h). */
int hle_queue_push_unlocked(hle_ctx *c, uint64_t h, const struct hl_packet *p, int64_t timeout, uint64_t *idx,
                            int interruptible, void **tok) {
    struct hl_qview v;
    int r = hle_queue_view(c, h, &v);
    if (r) return r;
    return push_wait_loop(c, h, &v, p, timeout, idx, interruptible, tok);
}

/* ---- pop ---- */

struct pop_wait {
    hle_ctx *c;
    struct hl_qview *v;
    uint64_t r;
    struct hl_packet *out;
    uint32_t producer; /* of the packet taken: a participant index or HL_PRODUCER_DEVICE */
};

static int cell_ready(uint64_t cl, uint64_t r) {
    uint32_t s = HL_CELL_STATE(cl);
    return HL_CELL_SEQ(cl) == (r & HL_CELL_SEQ_MASK) && (s == HL_CELL_READY || s == HL_CELL_SKIP);
}

/* Take the cell at the read index when it is READY (1) or SKIP (consumed, 0). */
static int pop_poll(void *a) {
    struct pop_wait *x = a;
    if (CLOSING(x->c)) return 0; /* nothing is taken from a closing domain */
    struct hl_qview *v = x->v;
    struct hl_queue *q = v->q;
    uint64_t mask = v->capacity - 1;
    uint64_t r = ld(&q->read_index);
    uint64_t cl = __atomic_load_n(&v->cells[r & mask], __ATOMIC_ACQUIRE);
    if (!cell_ready(cl, r)) return 0;
    uint32_t stt = HL_CELL_STATE(cl);
    if (stt == HL_CELL_READY) memcpy(x->out, &v->packets[r & mask], sizeof *x->out);
    x->producer = HL_CELL_PRODUCER(cl);
    st(&v->cells[r & mask], HL_CELL(r + v->capacity, 0, HL_CELL_FREE));
    st(&q->read_index, r + 1);
    if (__atomic_load_n(&q->space_waiters, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, (uint32_t *)&q->read_index, FUTEX_WAKE, 0x7fffffff, 0, 0, 0);
    x->r = r;
    /* a SKIP cell: go on (a queue full of them still honours the timeout) */
    return stt == HL_CELL_READY;
}

/* idle: sleep on the doorbell, bounded (devices ring it without a wake-up) */
static int pop_sleep(void *a, uint64_t nap) {
    struct pop_wait *x = a;
    struct hl_queue *q = x->v->q;
    uint64_t r = ld(&q->read_index);
    uint64_t db = ld(&q->doorbell);
    __atomic_add_fetch(&q->doorbell_waiters, 1, __ATOMIC_SEQ_CST);
    uint64_t cl = ld(&x->v->cells[r & (x->v->capacity - 1)]);
    if (!cell_ready(cl, r)) {
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        syscall(SYS_futex, (uint32_t *)&q->doorbell, FUTEX_WAIT, (uint32_t)db, &ts, 0, 0);
    }
    __atomic_sub_fetch(&q->doorbell_waiters, 1, __ATOMIC_SEQ_CST);
    return 0;
}

int hle_queue_pop(hle_ctx *c, uint64_t h, int64_t timeout, int64_t spin, uint64_t *idx, struct hl_packet *out) {
    return hle_queue_pop_nap(c, h, timeout, spin, 0, idx, out, NULL);
}

int hle_queue_pop_nap(hle_ctx *c, uint64_t h, int64_t timeout, int64_t spin, uint64_t nap, uint64_t *idx,
                      struct hl_packet *out, uint32_t *producer) {
    struct hl_qview v;
    int r = hle_queue_view(c, h, &v);
    if (r) return r;
    if (__atomic_load_n(&v.q->consumer, __ATOMIC_SEQ_CST) != HL_OWNER(c->inc, c->me))
        return hle_fail(HL_E_INVALID, "queue 0x%llx: only its bound consumer may pop (call queue_bind)",
                        (unsigned long long)h);
    struct pop_wait x = {c, &v, 0, out, 0};
    struct hle_waiter wt = {pop_poll, pop_sleep, NULL, &x, now_ns(), timeout, spin > 0 ? (uint64_t)spin : 0,
                            hle_interruptible(c), nap};
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    r = hle_wait_loop(c, &wt, &tok);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (r == HL_E_CLOSED) return hle_closed_error(c, "the domain was closed during the wait");
    *idx = x.r;
    if (producer) *producer = x.producer;
    return r;
}
#ifdef HOSTLESS_TEST_HOOKS /* compiled into the test build only (setup.py) */

int hle_queue_reserve_stuck(hle_ctx *c, uint64_t h, uint64_t sig, uint64_t *out) {
    struct hl_qview v;
    int r = hle_queue_view(c, h, &v);
    if (r) return r;
    struct hl_queue *q = v.q;
    uint64_t *cells = v.cells;
    uint64_t mask = v.capacity - 1;
    for (;;) {
        uint64_t w = ld(&q->write_index), cl = ld(&cells[w & mask]);
        if (HL_CELL_STATE(cl) == HL_CELL_FREE && HL_CELL_SEQ(cl) == (w & HL_CELL_SEQ_MASK)) {
            if (cas(&cells[w & mask], &cl, HL_CELL(w, (uint32_t)c->me, HL_CELL_RESERVED))) {
                uint64_t ww = w;
                cas(&q->write_index, &ww, w + 1);
                v.packets[w & mask].signal = sig;
                *out = w;
                return HL_OK;
            }
        } else {
            return hle_fail(HL_E_QUEUE_FULL, "queue full");
        }
    }
}
#endif
