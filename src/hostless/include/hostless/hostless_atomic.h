/*
 * hostless_atomic.h -- atomics and the futex layer of the hostless ABI.
 *
 * Everything here works on one word of shared memory; nothing validates a
 * handle or an offset (hostless_ops.h does).  Three targets:
 *
 *   host (GCC / Clang, C or C++)   __atomic builtins; FUTEX_WAKE by syscall
 *                                  on Linux unless HL_NO_SYSCALLS is defined
 *                                  (HL_HAVE_FUTEX is then defined)
 *   device (NVRTC, nvcc's device   plain volatile accesses fenced with
 *   pass: HL_DEVICE_CODE)          __threadfence_system(), atomicCAS_system;
 *                                  no system call: a device store wakes no
 *                                  sleeper, which sees it when its bounded
 *                                  sleep ends (hl_header.poll_ns)
 *   firmware without syscalls      define HL_NO_SYSCALLS: the wake helpers are
 *                                  no-ops, with the same bounded-sleep rule
 *
 * Memory ordering in one line: loads acquire, stores and CAS are seq_cst on
 * a host (a device fences around each access at system scope), so data
 * written before a signal is visible to whoever observed the signal, and
 * the sleeper/signaler handshake of docs/abi.md section 3 loses no wake-up.
 */
#ifndef HOSTLESS_ATOMIC_H
#define HOSTLESS_ATOMIC_H

#include "hostless_layout.h"

/* Every operation of the ABI is a header-only inline function (host and
 * device under CUDA). */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HL_INLINE static __host__ __device__ __forceinline__
#else
#define HL_INLINE static inline
#endif

#if !defined(HL_DEVICE_CODE) && defined(__linux__) && !defined(HL_NO_SYSCALLS)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>
#define HL_HAVE_FUTEX 1
#if !defined(__cplusplus)
/* declared by <unistd.h> only with _DEFAULT_SOURCE; strict C11 needs it here */
extern long syscall(long number, ...);
#endif
#endif

/* ---- 32/64-bit atomics: GCC/Clang builtins on the host, CUDA intrinsics on a device ----
 *
 * hl_load64(p)   Reads the 64-bit word *p.  Ordering: acquire (device: a
 *                volatile load followed by a system-scope fence).  Cannot fail.
 * hl_store64(p, v)
 *                Writes v to *p.  Ordering: seq_cst (device: system-scope
 *                fences before and after a volatile store).  Cannot fail.
 * hl_cas64(p, expected, desired)
 *                If *p == *expected, stores desired and returns 1; otherwise
 *                stores the value seen into *expected and returns 0 (strong:
 *                no spurious failure).  Ordering: seq_cst on success, acquire
 *                on failure (device: atomicCAS_system).
 * hl_load32(p)   Reads the 32-bit word *p (waiter counts, futex words).
 *                Ordering: seq_cst (device: volatile).  Cannot fail.
 * hl_publish64(p, v)
 *                Writes v to *p, publishing what was written before it (a
 *                queue cell's READY, a doorbell).  Ordering: seq_cst on a
 *                host, where a read of a waiter count may follow (no lost
 *                wake-up); release on a device (a system-scope fence, then a
 *                volatile store, with no fence after it: devices never read
 *                waiter counts, and a trailing fence would wait a bus round
 *                trip for the store).  Cannot fail.
 * hl_ring64(p, v)
 *                Writes v to a doorbell word *p (a hint for consumers asleep
 *                on it).  seq_cst on a host (the waiter-count read follows);
 *                on a device a plain volatile store: a device wakes nobody,
 *                its consumers see the queue's cells by polling or within a
 *                bounded sleep, so the doorbell's order against the cell's
 *                READY does not matter there.  Cannot fail.
 *
 * p must be naturally aligned and inside the mapping (the callers' bounds
 * checks guarantee it). */
#if defined(HL_DEVICE_CODE)
HL_INLINE hl_u64 hl_load64(const hl_u64 *p) { hl_u64 v = *(const volatile hl_u64 *)p; __threadfence_system(); return v; }
HL_INLINE void hl_store64(hl_u64 *p, hl_u64 v) { __threadfence_system(); *(volatile hl_u64 *)p = v; __threadfence_system(); }
HL_INLINE int hl_cas64(hl_u64 *p, hl_u64 *expected, hl_u64 desired) {
    hl_u64 old = (hl_u64)atomicCAS_system((unsigned long long *)p, (unsigned long long)*expected, (unsigned long long)desired);
    if (old == *expected) return 1;
    *expected = old;
    return 0;
}
HL_INLINE hl_u32 hl_load32(const hl_u32 *p) { return *(const volatile hl_u32 *)p; }
HL_INLINE void hl_publish64(hl_u64 *p, hl_u64 v) { __threadfence_system(); *(volatile hl_u64 *)p = v; }
HL_INLINE void hl_ring64(hl_u64 *p, hl_u64 v) { *(volatile hl_u64 *)p = v; }
#else
HL_INLINE hl_u64 hl_load64(const hl_u64 *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
HL_INLINE void hl_store64(hl_u64 *p, hl_u64 v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
HL_INLINE int hl_cas64(hl_u64 *p, hl_u64 *expected, hl_u64 desired) {
    return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE);
}
HL_INLINE hl_u32 hl_load32(const hl_u32 *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
HL_INLINE void hl_publish64(hl_u64 *p, hl_u64 v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
HL_INLINE void hl_ring64(hl_u64 *p, hl_u64 v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
#endif

/* ---- futex wake-ups (hosts only; the sleeping side lives in the core library) ----
 *
 * hl_futex_wake_all(word)
 *                FUTEX_WAKE (shared futex) of every thread of every process
 *                asleep on the 32-bit word `word`.  The caller changed the
 *                word, or the completion word it guards, with a seq_cst
 *                store before, and read a nonzero waiter count: only then is
 *                the system call worth making.  Defined only where
 *                HL_HAVE_FUTEX is.  Its result is ignored: a failed wake is
 *                covered by the sleepers' bounded sleeps.
 * hl_wake_fence(f)
 *                After a binary or merged fence's word changed: wakes the
 *                host sleepers on the word's low 32 bits when f->waiters is
 *                nonzero (a seq_cst read of waiters after the word's store).
 *                No-op on a device or without syscalls.
 * hl_wake_timeline(f)
 *                After a timeline's word changed: increments f->wake (seq_cst
 *                fetch-add: a timeline's futex word), then wakes its host
 *                sleepers when f->waiters is nonzero.  No-op on a device or
 *                without syscalls (the wake sequence is not bumped either:
 *                sleepers see the word when their bounded sleep ends). */
HL_INLINE void hl_wake_fence(struct hl_fence *f);
HL_INLINE void hl_wake_timeline(struct hl_fence *f);

#if defined(HL_HAVE_FUTEX)
HL_INLINE void hl_futex_wake_all(hl_u32 *word) { syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, 0, 0, 0); }
HL_INLINE void hl_wake_fence(struct hl_fence *f) {
    if (hl_load32(&f->waiters) != 0) hl_futex_wake_all((hl_u32 *)&f->word);
}
HL_INLINE void hl_wake_timeline(struct hl_fence *f) {
    __atomic_add_fetch(&f->wake, 1u, __ATOMIC_SEQ_CST);
    if (hl_load32(&f->waiters) != 0) hl_futex_wake_all(&f->wake);
}
#else
/* device or no futex: sleepers see the store within poll_ns */
HL_INLINE void hl_wake_fence(struct hl_fence *f) { (void)f; }
HL_INLINE void hl_wake_timeline(struct hl_fence *f) { (void)f; }
#endif

#if !defined(HL_DEVICE_CODE) && (defined(__x86_64__) || defined(__aarch64__))
#define HL_HAVE_CAS_WORD_CTL 1
/* hl_cas_word_ctl(f, word_expected, ctl_expected, word_new)
 *
 * One 16-byte CAS over {f->word, f->ctl} (offsets 0 and 8 of a 64-byte
 * aligned slot): if word == word_expected and ctl == ctl_expected, stores
 * word_new (ctl unchanged) and returns 1; else returns 0 and changes nothing.
 * This is how a participant that holds no reference completes a merged
 * fence: only if the slot is still that LIVE object (write rule (c)).
 * Ordering: a full barrier (x86-64 lock cmpxchg16b; AArch64 ldaxp/stlxp,
 * acquire + release).  The caller wakes the sleepers (hl_wake_fence).
 * Defined (HL_HAVE_CAS_WORD_CTL) on x86-64 and AArch64 hosts; devices never
 * need it (they signal objects their host holds). */
HL_INLINE int hl_cas_word_ctl(struct hl_fence *f, hl_u64 word_expected, hl_u64 ctl_expected, hl_u64 word_new) {
#if defined(__x86_64__)
    unsigned char ok;
    hl_u64 lo = word_expected, hi = ctl_expected;
    __asm__ __volatile__("lock cmpxchg16b %1\n\tsete %0"
                         : "=q"(ok), "+m"(*(volatile hl_u64(*)[2])(void *)f), "+a"(lo), "+d"(hi)
                         : "b"(word_new), "c"(ctl_expected)
                         : "memory", "cc");
    return ok;
#elif defined(__aarch64__)
    hl_u64 lo, hi;
    hl_u32 fail;
    do {
        __asm__ __volatile__("ldaxp %0, %1, [%2]" : "=&r"(lo), "=&r"(hi) : "r"(f) : "memory");
        if (lo != word_expected || hi != ctl_expected) {
            __asm__ __volatile__("clrex" ::: "memory");
            return 0;
        }
        __asm__ __volatile__("stlxp %w0, %2, %3, [%1]" : "=&r"(fail) : "r"(f), "r"(word_new), "r"(ctl_expected)
                             : "memory");
    } while (fail);
    return 1;
#endif
}
#endif

#endif /* HOSTLESS_ATOMIC_H */
