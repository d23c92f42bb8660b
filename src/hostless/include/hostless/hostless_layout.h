/*
 * hostless_layout.h -- the shared-memory layout of a hostless domain: types
 * and constants only (no code, no system call, no atomic).  Part of the
 * hostless ABI; include "hostless.h" (the umbrella) unless a program needs
 * nothing but the layout (a parser, a debugger, a code generator):
 *
 *   hostless_layout.h   this file: integer types, constants, the header,
 *                       participant and fence slots, the name table
 *   hostless_layout_regions.h  its part for the regions after the fence
 *                       table (heap, device heaps, queues, trace ring),
 *                       included by this file, never directly
 *   hostless_atomic.h   atomics, the 16-byte word/ctl CAS, futex wake-ups
 *   hostless_ops.h      return codes, validation (struct hl_dom), fences,
 *                       timelines, buffers
 *   hostless_queue.h    command queues: open, push
 *
 * Valid C11, C++11 and CUDA (nvcc and NVRTC: under NVRTC no system header is
 * included).  docs/abi.md explains every part of it.
 *
 * ------------------------------------------------------------------------
 * Layout (all offsets from the start of the mapping, all little-endian):
 *
 *   [0, 16384)           struct hl_header (the name table in [1024, 16384))
 *   participants_offset  participant_capacity x struct hl_participant (128 B)
 *   fences_offset        fence_capacity x struct hl_fence (64 B, one cache line)
 *   queues_offset        queues_size bytes (reserved for command queues)
 *   trace_offset         trace_size bytes (reserved for the trace ring)
 *   heap_offset          heap_size bytes (shared heap, page aligned)
 *   devheap_offset       devheap_size bytes (device-heap descriptors and bitmaps; ABI 4)
 *
 * Every region starts on a 4096-byte boundary.  A reader must check magic,
 * abi_version, header_size, the slot sizes and that every region lies inside
 * total_size before it touches anything else, ONCE, and then use its private
 * copy of the layout: hl_attach() does both (struct hl_dom, hostless_ops.h),
 * and every operation takes that view, never the shared header.
 *
 * ------------------------------------------------------------------------
 * The completion word.  Every fence and timeline completes through ONE
 * naturally aligned 64-bit word, hl_fence.word, so that a device can signal
 * with a single 64-bit store and wait with "word >= value":
 *
 *   binary fence:  0 = ACTIVE; nonzero = signaled, the word IS the status
 *                  (HL_STATUS_SUCCESS, _ERROR, _CANCEL, _OWNER_DIED, or a
 *                  custom code >= 64, all < 2^32).  A ">= 1" waiter wakes on
 *                  every outcome, failures included.
 *   timeline:      the value, always < HL_TIMELINE_FAILED (2^62).  A failed
 *                  timeline holds HL_TIMELINE_FAILED | status: larger than
 *                  every legal value, so every ">= v" waiter wakes, also with
 *                  CUDA's cyclic GEQ ((int64)(word - v) >= 0) since the
 *                  distance stays below 2^63.  A point reached stays reached
 *                  (ABI 6): every failer first raises aux to the value it
 *                  fails from (a max-CAS: aux only grows), so a waiter that
 *                  sees the failure reads aux and reports SUCCESS for a point
 *                  <= aux (hl_point_status, hostless_ops.h).
 *
 * Memory ordering: a signal is a release store (or CAS) of the word; a wait
 * is an acquire load of it.  Data written before a signal is visible to a
 * waiter that observed the signal.
 *
 * Host sleepers: a waiter that stops spinning increments hl_fence.waiters and
 * sleeps in FUTEX_WAIT (shared futex) with a bounded timeout (hl_header.
 * poll_ns, at most HL_POLL_MAX_NS) on a 32-bit word that every host signal
 * changes:
 *   binary and merged fences: the LOW 32 BITS of the word (offset 0).  The
 *     word goes once from 0 to a status whose low 32 bits are nonzero.
 *   timelines: hl_fence.wake, a sequence that host signalers bump after
 *     changing the word (a value may move by a multiple of 2^32, or fail with
 *     a status equal to its low bits, leaving the word's low half unchanged).
 * The waiter reads the futex word BEFORE re-reading the completion word; the
 * signaler changes the completion word, then the futex word, then reads
 * waiters: in seq_cst order no wake-up is lost (hl_wake_fence,
 * hl_wake_timeline in hostless_atomic.h).  A device store wakes nobody, and is seen at the latest
 * when the bounded sleep ends.
 *
 * ------------------------------------------------------------------------
 * THE WRITE RULE.  A participant writes a slot's fields only
 *   (a) while it holds a reference to that object (its bit in refs; during
 *       recovery of a dead participant d, d's bit, which only d's one
 *       recoverer may use: it holds d's liveness lock while it recovers), or
 *   (b) while the slot is ALLOC or DYING by itself (nobody else may hold it), or
 *   (c) with one atomic operation that checks the object's generation and
 *       state in the same step: a CAS of aux or err of a merged slot (both
 *       carry gen24 in their high half), or hl_cas_word_ctl(), a 16-byte
 *       CAS over {word, ctl} (offsets 0 and 8; hostless_atomic.h), which
 *       completes a merged fence only if it is still that LIVE object.
 * Nobody else's object is ever touched, even by a stale participant that
 * read a link or an owner long ago.  A reader of several fields of an object
 * it does not hold (propagation, sweeps, recovery) brackets them between two
 * reads of ctl (a seqlock) and drops them if the generation moved.  Freed
 * slots are reused round-robin (alloc_hint only advances), not at once.
 * docs/abi.md states the protocol (section 4) and its model (section 11).
 *
 * ------------------------------------------------------------------------
 * Slot state machine (hl_fence.ctl, 64 bits, changed only by CAS):
 *
 *   ctl = gen[63:32] | kind[31:24] | pidx[15:8] | state[7:0]
 *
 *   FREE --alloc CAS (gen+1, pidx=allocator)--> ALLOC --init--> LIVE
 *   LIVE --last reference dropped (pidx=releaser)--> DYING --finalize--> FREE
 *
 * References: hl_fence.refs is a bitmask of the participants that hold a
 * reference (bit i = participant slot i; one bit per participant, a process
 * counts its own handles locally).  A slot is freed when the bitmask drops to
 * zero; an ACTIVE fence freed that way is first signaled CANCEL.
 *
 * Handles: handle = tag[63:56] | kind[55:48] | gen[47:24] | (index+1)[23:0]
 * where tag is hl_header.tag (per-domain, nonzero), gen the low 24 bits of
 * the slot generation.  0 is never a valid handle.
 *
 * Recovery: see docs/abi.md.  Every step is a single atomic operation, so a
 * participant killed at any instruction leaves a state that another
 * participant can finish or roll back; no lock exists in this layout.
 */
#ifndef HOSTLESS_LAYOUT_H
#define HOSTLESS_LAYOUT_H

/* ---- fixed-width integers: <stdint.h> on a host, built-in types under NVRTC ----
 * HL_DEVICE_CODE is defined when compiling for a GPU (NVRTC, or nvcc's device
 * pass): no system calls, CUDA intrinsics for the atomics. */
#if defined(__CUDACC_RTC__)
typedef unsigned long long hl_u64;
typedef long long hl_i64;
typedef unsigned int hl_u32;
typedef unsigned short hl_u16;
typedef unsigned char hl_u8;
#define HL_DEVICE_CODE 1
#else
#include <stdint.h>
#include <stddef.h>
typedef uint64_t hl_u64;
typedef int64_t hl_i64;
typedef uint32_t hl_u32;
typedef uint16_t hl_u16;
typedef uint8_t hl_u8;
#if defined(__CUDA_ARCH__)
#define HL_DEVICE_CODE 1
#endif
#endif

#define HL_MAGIC 0x3153534c54534f48ULL /* "HOSTLSS1" little-endian */
#define HL_ABI_VERSION 6u /* 2: timeline wake sequence, write rule (see above); 3: the name table; 4: device heaps;
                             5: watch nodes (timeline points and shared children in merges);
                             6: reached points (a failed timeline's aux only grows and answers
                             for the points below it), OWNER_LEFT, a 16 KiB header (239 names);
                             watch lists (a watched object's nodes, linked from it) */
#define HL_HEADER_SIZE 16384u /* the header region: struct hl_header, the name table at its end */
#define HL_PAGE 4096u
#define HL_CACHELINE 64u
#define HL_MAX_PARTICIPANTS 64u
#define HL_MAX_FENCES (1u << 24) /* index field of a handle is 24 bits */
#define HL_PARTICIPANT_SIZE 128u
#define HL_FENCE_SIZE 64u

/* ---- statuses (binary fence word values; Synx numbering) ---- */
#define HL_STATUS_ACTIVE 1u     /* reported for word == 0, never stored */
#define HL_STATUS_SUCCESS 2u
#define HL_STATUS_ERROR 3u
#define HL_STATUS_CANCEL 4u
#define HL_STATUS_OWNER_DIED 6u  /* the owner died (recovery of a dead participant) */
#define HL_STATUS_OWNER_LEFT 7u  /* the owner left cleanly (hle_leave) without signalling it (ABI 6) */
#define HL_STATUS_CUSTOM_MIN 64u /* custom codes: 64 .. 2^32-1 */

#define HL_POLL_MIN_NS 1000ULL          /* bounds of hl_header.poll_ns, checked at attach */
#define HL_POLL_MAX_NS 100000000ULL     /* 100 ms: the latest a sleeper sees a device store */

#define HL_TIMELINE_FAILED (1ULL << 62)
#define HL_TIMELINE_MAX (HL_TIMELINE_FAILED - 1)

/* ---- slot states and kinds ---- */
#define HL_SLOT_FREE 0u
#define HL_SLOT_ALLOC 1u
#define HL_SLOT_LIVE 2u
#define HL_SLOT_DYING 3u

#define HL_KIND_FENCE 1u
#define HL_KIND_TIMELINE 2u
#define HL_KIND_MERGED 3u
#define HL_KIND_BUFFER 4u /* a heap block; see "buffers" below */
#define HL_KIND_QUEUE 5u  /* a heap block holding a command queue; see "queues" below */

#define HL_CTL(gen, kind, pidx, state) \
    (((hl_u64)(gen) << 32) | ((hl_u64)((kind) & 0xffu) << 24) | ((hl_u64)((pidx) & 0xffu) << 8) | ((hl_u64)(state) & 0xffu))
#define HL_CTL_STATE(c) ((hl_u32)((c) & 0xffu))
#define HL_CTL_PIDX(c) ((hl_u32)(((c) >> 8) & 0xffu))
#define HL_CTL_KIND(c) ((hl_u32)(((c) >> 24) & 0xffu))
#define HL_CTL_GEN(c) ((hl_u32)((c) >> 32))

#define HL_HANDLE(tag, kind, gen, index) \
    (((hl_u64)((tag) & 0xffu) << 56) | ((hl_u64)((kind) & 0xffu) << 48) | ((hl_u64)((gen) & 0xffffffu) << 24) | \
     ((hl_u64)(index) + 1u))
#define HL_HANDLE_TAG(h) ((hl_u32)((h) >> 56))
#define HL_HANDLE_KIND(h) ((hl_u32)(((h) >> 48) & 0xffu))
#define HL_HANDLE_GEN(h) ((hl_u32)(((h) >> 24) & 0xffffffu))
#define HL_HANDLE_INDEX(h) ((hl_i64)((h) & 0xffffffu) - 1)

/* A link from a child fence to a merged (composite) parent:
 * link = pos[62:56] | gen24[55:32] | (parent index + 1)[31:0]; 0 = none.
 * pos is the child's bit in the parent's pending mask (aux[31:0]).
 * Propagation clears that bit with a CAS that checks the parent's gen, so it
 * is idempotent: recovery and sweeps may repeat it safely. */
#define HL_LINK(pos, gen, index) \
    ((((hl_u64)(pos) & 0x7fu) << 56) | (((hl_u64)(gen) & 0xffffffu) << 32) | ((hl_u64)(index) + 1u))
#define HL_LINK_INDEX(l) ((hl_i64)((l) & 0xffffffffu) - 1)
#define HL_LINK_GEN(l) ((hl_u32)(((l) >> 32) & 0xffffffu))
#define HL_LINK_POS(l) ((hl_u32)(((l) >> 56) & 0x7fu))
#define HL_MAX_PARENTS 2
#define HL_MERGE_MAX_CHILDREN 32 /* per composite slot; larger merges build a tree */

/* Watch nodes (ABI 5; lists ABI 6): a FENCE slot whose aux is nonzero is a
 * watch node: it completes (like a binary fence, and propagates through its
 * own parent link, parents[0]) when the object named by the handle in aux has
 * word >= err: a timeline point (err = the value) or a fence already in
 * HL_MAX_PARENTS merges (err = 1).  Its status is the watched fence's status,
 * the timeline's failure, else SUCCESS; CANCEL if the watched object is gone.
 * Anyone may complete it, holder or not, with hl_cas_word_ctl (write rule (c)).
 *
 * Watch list (ABI 6): the watched object's nodes form a singly linked list,
 * newest first, so that its signaller visits its nodes, not the table.  The
 * head lives in a timeline's parents[0] (timelines have no parent links) and
 * in a plain fence's err:
 *   head = TAG[63] | ver[62:56] | gen24[55:32] | ver[31:24] | (node index + 1)[23:0]
 * (gen: the watched object's; ver: 15 bits bumped at every change of the head,
 * so that an unlink that read an older head fails).  A node's next, in its
 * parents[1] (a node has one parent link):
 *   next = TAG[63] | MARK[62] | gen24[55:32] | (next node index + 1)[23:0]
 * (gen: the node's own, so that a CAS of it checks the node's generation:
 * rule (c)).  The creator pushes its node (holding the target: rule (a));
 * a node's finalize marks its own next (DYING by itself: rule (b)), after
 * which nobody changes it, then unlinks it: CAS of the unmarked predecessor's
 * next (or of the head) from the node to the node's next; the walk unlinks
 * every marked node it meets (a marked node cannot be unlinked through a
 * marked predecessor).  No link, merged err, timeline word or block field has
 * bit 63 (TAG): a CAS that expects a head or a next never matches another
 * kind's value in a slot reused meanwhile (tests/model/protocol_model.py,
 * watch-target-reuse).  The list is a hint: a walker that meets a slot that is
 * not a node of that object (reused while linked: a creator or finalizer died
 * mid-way) scans the table instead, and the sweeps (host waiters of merged
 * fences before every sleep, the watchdog) complete every node within their
 * interval, as for a merged fence's nodes (a merged fence has no free field). */
#define HL_WATCH_TAG (1ull << 63)
#define HL_WNEXT_MARK (1ull << 62)
#define HL_WHEAD(gen, ver, idx1)                                                        \
    (HL_WATCH_TAG | ((((hl_u64)(ver) >> 8) & 0x7fu) << 56) | (((hl_u64)(gen) & 0xffffffu) << 32) | \
     (((hl_u64)(ver) & 0xffu) << 24) | ((hl_u64)(idx1) & 0xffffffu))
#define HL_WHEAD_IS(w, gen) \
    (((w) & HL_WATCH_TAG) && (((w) >> 32) & 0xffffffu) == ((hl_u64)(gen) & 0xffffffu))
#define HL_WHEAD_VER(w) ((hl_u32)(((((w) >> 56) & 0x7fu) << 8) | (((w) >> 24) & 0xffu)))
#define HL_WNEXT(gen, idx1) (HL_WATCH_TAG | (((hl_u64)(gen) & 0xffffffu) << 32) | ((hl_u64)(idx1) & 0xffffffu))
#define HL_WNEXT_GEN(w) ((hl_u32)(((w) >> 32) & 0xffffffu))
#define HL_WLIST_IDX1(w) ((hl_u32)((w) & 0xffffffu)) /* the index + 1 a head or next names; 0: none */

/* ---- participant slot states; ctl = incarnation[47:16] | recoverer[15:8] | state[7:0] ---- */
#define HL_PART_FREE 0u
#define HL_PART_ALIVE 1u
#define HL_PART_RECOVERING 2u
/* hl_participant.flags: joined without its liveness lock (a reader's OFD read
 * lock kept it off): its liveness is its pid and start time (liveness.c). */
#define HL_PART_FLAG_PIDLIVE 1u
#define HL_PCTL(inc, rec, state) (((hl_u64)(inc) << 16) | ((hl_u64)((rec) & 0xffu) << 8) | ((hl_u64)(state) & 0xffu))
#define HL_PCTL_STATE(c) ((hl_u32)((c) & 0xffu))
#define HL_PCTL_RECOVERER(c) ((hl_u32)(((c) >> 8) & 0xffu))
#define HL_PCTL_INC(c) ((hl_u32)(((c) >> 16) & 0xffffffffu))

/* Owner field of a fence: (incarnation & 0xffffff) << 8 | (participant index + 1); 0 = none. */
#define HL_OWNER(inc, idx) ((((hl_u32)(inc) & 0xffffffu) << 8) | ((hl_u32)(idx) + 1u))
#define HL_OWNER_INDEX(o) ((int)((o) & 0xffu) - 1)
#define HL_OWNER_INC(o) ((hl_u32)((o) >> 8))

/* Byte offset (beyond any real data) of participant i's liveness lock: each
 * live participant holds an OFD write lock on byte HL_LOCK_BASE + i of the
 * domain file; the kernel drops it when the process dies. */
#define HL_LOCK_BASE (1ULL << 40)

/* ---- the name table: independent processes find objects by name ----
 * In the header region at HL_NAMES_OFFSET, up to HL_MAX_NAMES (239) live
 * names (ABI 6; 47 before).  An entry maps a name (1..47 bytes
 * of UTF-8, NUL-terminated in its cell) to an object's handle; it is valid
 * while that object is live with that generation ("an entry dies with its
 * object": readers check the handle, the next publish frees the cell).
 * Writers (publish, remove) hold `lock` (HL_OWNER of the holder; a dead
 * holder's lock is taken over, its WRITING cells freed); readers take no
 * lock: they read a cell between two reads of its ctl (a seqlock).  `seq` is
 * bumped after every change (a futex for lookups that wait).  Everything in
 * the table is checked on use: it is shared memory. */
#define HL_NAMES_OFFSET 1024u
#define HL_NAME_MAX 48u          /* bytes of a cell's name, NUL included */
#define HL_MAX_NAMES ((HL_HEADER_SIZE - HL_NAMES_OFFSET - 64u) / 64u) /* 239: the header region's tail */
#define HL_NAME_FREE 0u
#define HL_NAME_WRITING 1u
#define HL_NAME_LIVE 2u
#define HL_NAME_CTL(seq, state) (((hl_u64)(seq) << 8) | ((hl_u64)(state) & 0xffu))
#define HL_NAME_STATE(c) ((hl_u32)((c) & 0xffu))
#define HL_NAME_SEQ(c) ((c) >> 8)
struct hl_name {
    hl_u64 ctl;                   /*  0 HL_NAME_CTL(seq, state): seq changes on every write */
    hl_u64 handle;                /*  8 the object */
    char name[HL_NAME_MAX];       /* 16 */
};
struct hl_names {
    hl_u32 lock;                  /*  0 HL_OWNER of the writer, 0 = free */
    hl_u32 seq;                   /*  4 bumped after every change; futex of waiting lookups */
    hl_u8 pad[56];
    struct hl_name entry[HL_MAX_NAMES]; /* 64 */
};

/* ---- the header: the first HL_HEADER_SIZE bytes of the domain ---- */
struct hl_header {
    hl_u64 magic;                 /*   0 HL_MAGIC */
    hl_u32 abi_version;           /*   8 HL_ABI_VERSION */
    hl_u32 header_size;           /*  12 HL_HEADER_SIZE */
    hl_u64 total_size;            /*  16 size of the whole mapping */
    hl_u32 participant_size;      /*  24 HL_PARTICIPANT_SIZE */
    hl_u32 participant_capacity;  /*  28 <= HL_MAX_PARTICIPANTS */
    hl_u32 fence_size;            /*  32 HL_FENCE_SIZE */
    hl_u32 fence_capacity;        /*  36 <= HL_MAX_FENCES */
    hl_u64 participants_offset;   /*  40 */
    hl_u64 fences_offset;         /*  48 */
    hl_u64 queues_offset;         /*  56 */
    hl_u64 queues_size;           /*  64 */
    hl_u64 trace_offset;          /*  72 */
    hl_u64 trace_size;            /*  80 */
    hl_u64 heap_offset;           /*  88 */
    hl_u64 heap_size;             /*  96 */
    hl_u32 tag;                   /* 104 handle tag, 1..255 */
    hl_u32 flags;                 /* 108 HL_FLAG_* */
    hl_u64 created_ns;            /* 112 CLOCK_REALTIME at creation */
    hl_u64 poll_ns;               /* 120 longest host sleep before re-reading a word */
    hl_u64 epoch;                 /* 128 bumped by every completed recovery */
    hl_u32 alloc_hint;            /* 136 where fence allocation starts scanning */
    hl_u32 ready;                 /* 140 1 once the creator finished initialising */
    hl_u64 stats_recovered;       /* 144 participants recovered so far */
    hl_u64 devheap_offset;        /* 152 the device-heap region (see "Device heaps") */
    hl_u64 devheap_size;          /* 160 its size in bytes, 0 = none */
    hl_u32 devheap_count;         /* 168 descriptors at its start, <= HL_MAX_DEVICE_HEAPS */
    hl_u32 pad0;                  /* 172 0 */
    hl_u8 reserved[HL_NAMES_OFFSET - 176];
    struct hl_names names;        /* 1024 the name table (above) */
};

struct hl_participant {
    hl_u64 ctl;                   /*   0 HL_PCTL(incarnation, recoverer, state) */
    hl_u32 pid;                   /*   8 OS process id */
    hl_u32 flags;                 /*  12 HL_PART_FLAG_* (written by the participant itself) */
    hl_u64 start_time;            /*  16 process start time (clock ticks since boot, /proc/pid/stat field 22) */
    hl_u64 joined_ns;             /*  24 CLOCK_REALTIME when it joined */
    char label[32];               /*  32 NUL-terminated label */
    char kind[16];                /*  64 "cpu", "npu", "cuda", ... */
    /* The last recovery of this slot's occupant, for monitors (`hostless top`), in what was
     * padding: written by its recoverer once the recovery succeeded (the slot may already
     * hold a new participant then), never cleared, never read for control. */
    hl_u32 recovered_pid;         /*  80 the pid of the participant recovered (0: none yet) */
    hl_u32 recovered_by;          /*  84 the recoverer's participant index + 1 (256: a process not joined) */
    hl_u64 recovered_ns;          /*  88 CLOCK_REALTIME when its recovery finished */
    hl_u8 reserved[HL_PARTICIPANT_SIZE - 96];
};

struct hl_fence {
    hl_u64 word;                  /*   0 completion word (see above); futex on its low 32 bits */
    hl_u64 ctl;                   /*   8 HL_CTL(gen, kind, pidx, state) */
    hl_u64 refs;                  /*  16 bitmask of participants holding a reference */
    hl_u32 waiters;               /*  24 host threads asleep on the word */
    hl_u32 owner;                 /*  28 HL_OWNER of the expected signaler, 0 = none */
    hl_u64 aux;                   /*  32 timeline: last value before failure;
                                             merged: gen24[55:32] | pending-children bitmask[31:0];
                                             fence: 0, or the handle a watch node watches */
    hl_u64 parents[HL_MAX_PARENTS]; /* 40 HL_LINK(gen, index) of merged parents, 0 = none;
                                             timeline: parents[0] = its watch list's head;
                                             watch node: parents[1] = its next (HL_WNEXT) */
    union {                       /*  56 */
        hl_u64 err;               /*     merged: gen24[55:32] | first error status[31:0];
                                             fence: its watch list's head; watch node: the threshold */
        hl_u32 wake;              /*     timeline: wake sequence, the futex of its sleepers */
    };
};

/* The regions after the fence table (heap, device heaps, queues, trace ring):
 * their own part of this header, included here (never on its own). */
#include "hostless_layout_regions.h"

#if defined(__cplusplus) && __cplusplus >= 201103L
static_assert(sizeof(struct hl_header) == HL_HEADER_SIZE, "hl_header size");
static_assert(sizeof(struct hl_name) == 64 && sizeof(struct hl_names) == HL_HEADER_SIZE - HL_NAMES_OFFSET, "hl_names");
static_assert(sizeof(struct hl_participant) == HL_PARTICIPANT_SIZE, "hl_participant size");
static_assert(sizeof(struct hl_fence) == HL_FENCE_SIZE, "hl_fence size");
#if !defined(HL_DEVICE_CODE)
static_assert(offsetof(struct hl_header, names) == HL_NAMES_OFFSET, "hl_header: the name table's place");
static_assert(offsetof(struct hl_fence, ctl) == 8 && offsetof(struct hl_fence, err) == 56 &&
                  offsetof(struct hl_fence, wake) == 56, "hl_fence: word and ctl form one 16-byte unit");
#endif
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct hl_header) == HL_HEADER_SIZE, "hl_header size");
_Static_assert(sizeof(struct hl_name) == 64 && offsetof(struct hl_header, names) == HL_NAMES_OFFSET, "hl_names");
_Static_assert(sizeof(struct hl_participant) == HL_PARTICIPANT_SIZE, "hl_participant size");
_Static_assert(sizeof(struct hl_fence) == HL_FENCE_SIZE, "hl_fence size");
_Static_assert(offsetof(struct hl_fence, ctl) == 8 && offsetof(struct hl_fence, err) == 56 &&
                   offsetof(struct hl_fence, wake) == 56, "hl_fence: word and ctl form one 16-byte unit");
#endif

#endif /* HOSTLESS_LAYOUT_H */
