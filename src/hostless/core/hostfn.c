/*
 * hostfn.c -- functions a CUDA stream runs on the host (cuLaunchHostFunc) after
 * its device work: the wake-up of a word's host sleepers, and the push of a
 * follow-up packet with the host's atomics.  They run in CUDA's callback
 * thread: no Python, no CUDA call, bounded time.
 */
#include "engine.h"

#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/futex.h>

/* After a device store to a slot's word (addr = the slot): wakes its host
 * sleepers as a host signaler would (one syscall). */
void hle_host_wake(void *addr) {
    struct hl_fence *f = (struct hl_fence *)addr;
    if (HL_CTL_KIND(__atomic_load_n(&f->ctl, __ATOMIC_SEQ_CST)) == HL_KIND_TIMELINE)
        hl_wake_timeline(f);
    else
        syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 0x7fffffff, 0, 0, 0);
}

/* The push of struct hle_push_rec (engine.h): hl_queue_push, the header's rule every host
 * producer runs, with host atomics; a full queue is retried until
 * timeout_ns (sleeping 20 us between tries), then HL_E_FULL is left for the agent, which
 * fails the follow-up's signal. */
void hle_host_push(void *arg) {
    struct hle_push_rec *r = (struct hle_push_rec *)arg;
    int rc = 1;
    if (__atomic_load_n(&r->gate, __ATOMIC_ACQUIRE) == 0) {
        struct hl_qview v;
        struct hl_packet local;
        hl_u64 idx = 0;
        v.q = (struct hl_queue *)(uintptr_t)r->q;
        v.cells = (hl_u64 *)(uintptr_t)r->cells;
        v.packets = (struct hl_packet *)(uintptr_t)r->packets;
        v.capacity = r->capacity;
        memcpy(&local, (const void *)(uintptr_t)r->packet, sizeof local);
        uint64_t deadline = now_ns() + r->timeout_ns;
        for (;;) {
            rc = hl_queue_push(&v, &local, r->producer, &idx);
            if (rc != HL_E_FULL || now_ns() >= deadline) break;
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if (rc == HL_OK) hle_host_wake((void *)(uintptr_t)r->doorbell);
    }
    r->result = rc;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
}
