/*
 * queue_stress.c -- a stress test of the producer side of the ABI's command
 * queue (hostless_queue.h: hl_queue_reserve / hl_queue_publish) against the
 * consumer protocol of core/queue.c (pop_poll), in one process.
 *
 * Built and run by tests/c/test_queue_stress.py:
 *   gcc -O2 -pthread -I src/hostless tests/c/queue_stress.c -o queue_stress
 *   ./queue_stress stress CAPACITY PRODUCERS PACKETS_EACH SEED
 *   ./queue_stress repro-death | repro-ahead
 *
 * stress: a queue laid out as hle_queue_init does (header, cells FREE(i),
 * packets) in aligned malloc'd memory, a struct hl_qview filled by hand;
 * PRODUCERS threads push PACKETS_EACH numbered packets each, with the hint
 * mode producer % 4: 0 no hint (hl_queue_push's path), 1 the index after its
 * last push (the GPU command processor's rule), 2 that hint stale by 1..4
 * laps, 3 a random index at most write_index as loaded just before (stale or
 * fresh, never ahead).  A FULL reserve is retried without a hint (as
 * cp_reserve does); some producers pause between reserve and publish.  One
 * consumer thread pops as pop_poll does (cell r READY/SKIP with seq r, copy,
 * FREE(r + capacity), read_index = r + 1) and checks that every packet
 * arrives exactly once, whole (every field derived from (producer, number)),
 * per producer in order, with the cell's producer field right.  Exit 0: all
 * good; 1: a check failed (the message says which); 2: no progress for 10 s.
 *
 * repro-death / repro-ahead: one thread, deterministic; the two sequences
 * tests/model/queue_model.py finds (death-in-window: fixed by recovery's
 * hl_queue_skip_reserved; hint-ahead: outside the contract).  Exit 0 when the
 * queue still accepts a push afterwards, 3 when the reserve returns
 * HL_E_CORRUPT (the queue is wedged).
 */
#define _GNU_SOURCE
#include "hostless_queue.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 16

static struct hl_qview V;
static hl_u32 NPROD;
static hl_u64 EACH;
static hl_u64 SEED;
static volatile int failed;
static hl_u64 hint_tries, hint_hits; /* hinted reserves, and those that got their hint */

#ifdef QS_BROKEN
/* a deliberately broken hinted round (the test shows that the checks fail on it): the cell at the
 * hint is taken when it is FREE, whatever its lap */
static int broken_reserve(const struct hl_qview *v, hl_u32 producer, hl_u64 hint, hl_u64 *w_out) {
    if (hint != HL_QUEUE_NO_HINT) {
        hl_u64 e = hl_load64(&v->cells[hint & (v->capacity - 1)]);
        if (HL_CELL_STATE(e) == HL_CELL_FREE &&
            hl_cas64(&v->cells[hint & (v->capacity - 1)], &e, HL_CELL(hint, producer, HL_CELL_RESERVED))) {
            hl_u64 ww = hint;
            hl_cas64(&v->q->write_index, &ww, hint + 1);
            *w_out = hint;
            return HL_OK;
        }
    }
    return hl_queue_reserve(v, producer, HL_QUEUE_NO_HINT, w_out);
}
#define RESERVE broken_reserve
#else
#define RESERVE hl_queue_reserve
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fail(const char *msg, unsigned long long a, unsigned long long b, unsigned long long c) {
    if (!__atomic_exchange_n(&failed, 1, __ATOMIC_SEQ_CST)) {
        fprintf(stderr, "FAIL: %s (%llu, %llu, %llu)\n", msg, a, b, c);
        fflush(stderr);
    }
}

static struct hl_queue *queue_new(hl_u32 cap) {
    /* as hle_queue_init / hle_queue_bytes */
    hl_u64 cells_off = HL_QUEUE_HEADER_SIZE, pk_off = HL_QUEUE_HEADER_SIZE + ((8ull * cap + 63) & ~63ull);
    size_t bytes = (size_t)(pk_off + (hl_u64)HL_PACKET_SIZE * cap);
    struct hl_queue *q = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!q) return NULL;
    memset(q, 0, bytes);
    q->capacity = cap;
    q->packet_size = HL_PACKET_SIZE;
    q->cells_offset = cells_off;
    q->packets_offset = pk_off;
    hl_u64 *cells = (hl_u64 *)((char *)q + cells_off);
    for (hl_u32 i = 0; i < cap; i++) cells[i] = HL_CELL(i, 0, HL_CELL_FREE);
    hl_store64(&q->magic, HL_QUEUE_MAGIC);
    V.q = q;
    V.cells = cells;
    V.packets = (struct hl_packet *)((char *)q + pk_off);
    V.capacity = cap;
    return q;
}

/* every field of packet (p, n) */
static void make_packet(struct hl_packet *k, hl_u32 p, hl_u64 n) {
    hl_u64 x = ((hl_u64)p << 40) ^ n;
    k->type = HL_PKT_BARRIER;
    k->flags = (hl_u16)(n & 0xffff);
    k->kernel = p;
    k->args = n;
    k->signal = x * 0x9e3779b97f4a7c15ull;
    k->signal_value = ~x;
    k->wait[0] = x + 1;
    k->wait[1] = x + 2;
    k->wait_value[0] = x ^ 0x5555555555555555ull;
    k->wait_value[1] = x ^ 0xaaaaaaaaaaaaaaaaull;
}

static hl_u64 rnd(hl_u64 *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void *producer(void *arg) {
    hl_u32 me = (hl_u32)(size_t)arg, mode = me % 4;
    hl_u64 s = SEED * 1000003 + me + 1, last = HL_QUEUE_NO_HINT, cap = V.capacity;
    int pause = (me / 4) % 2 == 1 || me == 1; /* some producers sit on their reservation a while */
    for (hl_u64 n = 0; n < EACH && !failed; n++) {
        hl_u64 hint = HL_QUEUE_NO_HINT, w = 0;
        if (last != HL_QUEUE_NO_HINT) {
            if (mode == 1) hint = last + 1;
            if (mode == 2) {
                hl_u64 back = cap * (1 + rnd(&s) % 4);
                hint = last + 1 >= back ? last + 1 - back : HL_QUEUE_NO_HINT;
            }
        }
        if (mode == 3) hint = rnd(&s) % (hl_load64(&V.q->write_index) + 1); /* never ahead */
        int r = RESERVE(&V, me, hint, &w);
        while (r == HL_E_FULL && !failed) {
            sched_yield();
            r = hl_queue_reserve(&V, me, HL_QUEUE_NO_HINT, &w);
        }
        if (failed) break;
        if (r != HL_OK) {
            fail("hl_queue_reserve failed (producer, packet, code)", me, n, (unsigned long long)(long long)r);
            break;
        }
        if (hint != HL_QUEUE_NO_HINT) {
            __atomic_add_fetch(&hint_tries, 1, __ATOMIC_RELAXED);
            if (w == hint) __atomic_add_fetch(&hint_hits, 1, __ATOMIC_RELAXED);
        }
        hl_u64 c = hl_load64(&V.cells[w & (cap - 1)]);
        if (c != HL_CELL(w, me, HL_CELL_RESERVED)) fail("reserved cell not RESERVED(w, me) (w, cell, me)", w, c, me);
        if (last != HL_QUEUE_NO_HINT && w <= last) fail("a producer's indices went back (me, last, w)", me, last, w);
        if (pause && (rnd(&s) & 7) == 0) {
            if (rnd(&s) & 1)
                sched_yield();
            else
                for (volatile int i = 0; i < 200; i++) {
                }
        }
        struct hl_packet k;
        make_packet(&k, me, n);
        hl_queue_publish(&V, w, &k, me);
        last = w;
    }
    return NULL;
}

static int consume(hl_u64 total) {
    hl_u64 next[MAXP] = {0}, mask = V.capacity - 1, r = 0, seq48 = 0xffffffffffffULL;
    double t_last = now_s();
    unsigned long spins = 0;
    while (r < total && !failed) {
        hl_u64 cl = hl_load64(&V.cells[r & mask]);
        hl_u32 stt = HL_CELL_STATE(cl);
        if (HL_CELL_SEQ(cl) != (r & seq48) || (stt != HL_CELL_READY && stt != HL_CELL_SKIP)) {
            /* the consumer freed this cell as FREE(r): only a reservation of index r may follow */
            if (HL_CELL_SEQ(cl) != (r & seq48)) {
                fail("the cell at the read index holds another index (read index, cell, -)", r, cl, 0);
                return 1;
            }
            if ((++spins & 63) == 0) {
                sched_yield();
                if (now_s() - t_last > 10.0) {
                    fprintf(stderr, "STUCK: read_index %llu write_index %llu cell %#llx\n", (unsigned long long)r,
                            (unsigned long long)hl_load64(&V.q->write_index), (unsigned long long)cl);
                    failed = 1;
                    return 2;
                }
            }
            continue;
        }
        t_last = now_s();
        if (stt != HL_CELL_READY) {
            fail("a SKIP cell with no dead producer (index, cell, -)", r, cl, 0);
            return 1;
        }
        struct hl_packet k, want;
        memcpy(&k, &V.packets[r & mask], sizeof k);
        hl_u32 p = k.kernel;
        if (p >= NPROD) {
            fail("packet of an unknown producer (index, producer, -)", r, p, 0);
            return 1;
        }
        make_packet(&want, p, k.args);
        if (memcmp(&k, &want, sizeof k) != 0) fail("torn or foreign packet (index, producer, number)", r, p, k.args);
        if (HL_CELL_PRODUCER(cl) != p) fail("cell's producer is not the packet's (index, cell, producer)", r, cl, p);
        if (k.args != next[p])
            fail("lost, duplicated or out of order (producer, got, expected)", p, k.args, next[p]);
        next[p] = k.args + 1;
        hl_store64(&V.cells[r & mask], HL_CELL(r + V.capacity, 0, HL_CELL_FREE));
        hl_store64(&V.q->read_index, r + 1);
        r++;
    }
    if (failed) return 1;
    for (hl_u32 p = 0; p < NPROD; p++)
        if (next[p] != EACH) fail("producer's packets missing (producer, got, expected)", p, next[p], EACH);
    hl_u64 wi = hl_load64(&V.q->write_index);
    if (wi != total) fail("write_index after the run (write_index, total, -)", wi, total, 0);
    for (hl_u64 i = 0; i < V.capacity; i++) {
        hl_u64 cl = hl_load64(&V.cells[i]);
        hl_u64 want = i >= total ? i : i + ((total - i + mask) / V.capacity) * V.capacity; /* the first index >= total in cell i */
        if (cl != HL_CELL(want, 0, HL_CELL_FREE)) fail("a cell after the run (cell, value, expected seq)", i, cl, want);
    }
    return failed ? 1 : 0;
}

static int stress(int argc, char **argv) {
    if (argc < 6) return 64;
    hl_u32 cap = (hl_u32)strtoul(argv[2], NULL, 0);
    NPROD = (hl_u32)strtoul(argv[3], NULL, 0);
    EACH = strtoull(argv[4], NULL, 0);
    SEED = strtoull(argv[5], NULL, 0);
    if (!cap || (cap & (cap - 1)) || NPROD == 0 || NPROD > MAXP) return 64;
    if (!queue_new(cap)) return 65;
    pthread_t th[MAXP];
    double t0 = now_s();
    for (hl_u32 p = 0; p < NPROD; p++)
        if (pthread_create(&th[p], NULL, producer, (void *)(size_t)p)) return 66;
    int rc = consume((hl_u64)NPROD * EACH);
    for (hl_u32 p = 0; p < NPROD; p++) pthread_join(th[p], NULL);
    printf("capacity %u, %u producers x %llu packets: %s in %.2f s; hinted reserves %llu, hint taken %llu\n", cap,
           NPROD, (unsigned long long)EACH, rc ? "FAILED" : "ok", now_s() - t0, (unsigned long long)hint_tries,
           (unsigned long long)hint_hits);
    free(V.q);
    return rc;
}

/* the consumer's pop of index r (cell READY or SKIP) */
static void pop_one(hl_u64 r) {
    hl_u64 mask = V.capacity - 1, cl = hl_load64(&V.cells[r & mask]);
    if (HL_CELL_SEQ(cl) != r || (HL_CELL_STATE(cl) != HL_CELL_READY && HL_CELL_STATE(cl) != HL_CELL_SKIP)) {
        fprintf(stderr, "repro: cell %llu is %#llx, not READY/SKIP\n", (unsigned long long)r, (unsigned long long)cl);
        exit(1);
    }
    hl_store64(&V.cells[r & mask], HL_CELL(r + V.capacity, 0, HL_CELL_FREE));
    hl_store64(&V.q->read_index, r + 1);
}

static int repro(const char *which) {
    struct hl_packet k;
    hl_u64 w = 0;
    int r;
    queue_new(4);
    make_packet(&k, 0, 0);
    if (!strcmp(which, "repro-death")) {
        /* producer 1 dies between hl_queue_reserve's cell CAS and its write_index CAS */
        hl_u64 e = HL_CELL(0, 0, HL_CELL_FREE);
        if (!hl_cas64(&V.cells[0], &e, HL_CELL(0, 1, HL_CELL_RESERVED))) return 1;
        /* recovery (hle_recover_queue): hl_queue_skip_reserved moves write_index past the cell
         * (it is still 0) and makes the cell SKIP */
        if (!hl_queue_skip_reserved(&V, 0, HL_CELL(0, 1, HL_CELL_RESERVED), 1)) return 1;
        pop_one(0); /* the consumer takes the SKIP */
    } else if (!strcmp(which, "repro-ahead")) {
        /* a hint one ahead of write_index, then an unhinted push fills the hole */
        if (hl_queue_reserve(&V, 1, 1, &w) != HL_OK || w != 1) return 1;
        hl_queue_publish(&V, w, &k, 1);
        if (hl_queue_push(&V, &k, 2, &w) != HL_OK || w != 0) return 1;
        pop_one(0);
        pop_one(1);
    } else {
        return 64;
    }
    r = hl_queue_reserve(&V, 2, HL_QUEUE_NO_HINT, &w);
    printf("%s: write_index %llu, read_index %llu, then hl_queue_reserve = %d\n", which,
           (unsigned long long)hl_load64(&V.q->write_index), (unsigned long long)hl_load64(&V.q->read_index), r);
    free(V.q);
    return r == HL_OK ? 0 : r == HL_E_CORRUPT ? 3 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "stress")) return stress(argc, argv);
    if (argc >= 2) return repro(argv[1]);
    fprintf(stderr, "usage: %s stress CAP PRODUCERS EACH SEED | repro-death | repro-ahead\n", argv[0]);
    return 64;
}
