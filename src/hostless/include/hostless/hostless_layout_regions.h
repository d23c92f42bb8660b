/*
 * hostless_layout_regions.h -- part of hostless_layout.h: the layout of the
 * domain's regions after the fence table (types and constants only, like
 * all of hostless_layout.h):
 *
 *   heap_offset      the shared heap: struct hl_heap, bitmap, data; buffer
 *                    slots and struct hl_buffer_meta
 *   devheap_offset   device-heap descriptors (struct hl_devheap) and bitmaps
 *   (heap blocks)    command queues: struct hl_queue, cells, struct
 *                    hl_packet; argument blocks (struct hl_kernarg,
 *                    struct hl_follow)
 *   trace_offset     the trace ring: struct hl_trace, struct hl_trace_event
 *
 * Do not include this file directly: include "hostless.h" (or
 * "hostless_layout.h", which includes it after the integer types, the
 * header, the participant and fence slots it builds on).  One ABI, one
 * version (HL_ABI_VERSION in hostless_layout.h) covers both files.
 */
#ifndef HOSTLESS_LAYOUT_REGIONS_H
#define HOSTLESS_LAYOUT_REGIONS_H

#ifndef HOSTLESS_LAYOUT_H
#error "hostless_layout_regions.h is a part of hostless_layout.h: include hostless.h (or hostless_layout.h) instead"
#else

/* ------------------------------------------------------------------------
 * Buffers and the shared heap.
 *
 * The heap region (heap_offset, heap_size) starts with struct hl_heap, then
 * the allocation bitmap (one bit per 64-byte granule of the data area), then
 * the data area (page aligned).  A buffer is a fence-table slot of kind
 * HL_KIND_BUFFER (so references, handles and recovery are the fences'):
 *
 *   word        offset of the buffer's data from the start of the data area
 *   aux         nbytes requested
 *   parents[0]  first granule of the block
 *   parents[1]  number of granules of the block (0 = no block owned)
 *   err         0 (a host buffer; see "Device heaps" below for the others)
 *
 * The block starts with a struct hl_buffer_meta (dtype and shape, for
 * importers); data follows at +128 bytes (64-byte aligned) for blocks under
 * HL_LARGE_BUFFER, at +4096 (page aligned) for larger ones.
 *
 * The bitmap is derived state: it is changed only under hl_heap.lock, a
 * participant-owned lock (value HL_OWNER of the holder).  A lock whose holder
 * is dead is broken by CAS and the bitmap is rebuilt from the buffer slots
 * (which are the truth), so a holder killed at any instruction loses nothing.
 * Participants that only use the header never allocate.
 */
#define HL_GRANULE 64u
#define HL_LARGE_BUFFER 65536u
#define HL_BUFFER_META_SIZE 128u
#define HL_BUFFER_MAX_DIMS 12
#define HL_HEAP_MAGIC 0x5041454853534c48ULL /* "HLSSHEAP" */

struct hl_heap {
    hl_u64 magic;          /*  0 HL_HEAP_MAGIC */
    hl_u64 lock;           /*  8 0 = free, else HL_OWNER of the holder */
    hl_u64 bitmap_offset;  /* 16 from the start of the heap region */
    hl_u64 granules;       /* 24 bits in the bitmap */
    hl_u64 data_offset;    /* 32 from the start of the heap region, page aligned */
    hl_u64 data_size;      /* 40 granules * HL_GRANULE */
    hl_u64 used_granules;  /* 48 maintained under the lock */
    hl_u64 hint;           /* 56 granule where the next search starts */
    hl_u64 repairs;        /* 64 times the bitmap was rebuilt after a holder died */
    hl_u64 allocs;         /* 72 allocations so far */
    hl_u8 reserved[128 - 80];
};

/* ------------------------------------------------------------------------
 * Device heaps (ABI 4).
 *
 * A domain declares up to HL_MAX_DEVICE_HEAPS device heaps at creation (one
 * per GPU, say "cuda:0"): each is an address range [0, size) of device memory
 * (a CUDA virtual-memory allocation shared by every process of the domain;
 * the allocation itself is made and mapped by hostless.devmem, outside this
 * layout).  The domain file holds only the bookkeeping: the region
 * (devheap_offset, devheap_size) starts with devheap_count struct
 * hl_devheap descriptors (128 bytes each), followed by their allocation
 * bitmaps (one bit per HL_DEVICE_GRANULE bytes of device memory), each at
 * its descriptor's bitmap_offset (from the start of the region, 8-byte
 * aligned).  Nothing on the host dereferences a device offset.
 *
 * A descriptor's lock, used_granules, hint, repairs and allocs follow the
 * rules of hl_heap's (same offsets): the bitmap is derived state, changed
 * only under the lock; a lock whose holder died is broken and the bitmap
 * rebuilt from the buffer slots.  Validation (hl_attach, once): magic, kind,
 * granule == HL_DEVICE_GRANULE, size == granules * granule, a multiple of
 * HL_DEVICE_ALIGN, at most HL_DEVICE_MAX_SIZE, bitmaps inside the region
 * after the descriptors and disjoint, no (kind, ordinal) twice.
 *
 * A device buffer is a buffer slot (HL_KIND_BUFFER) whose placement, in err,
 * names a device heap:
 *
 *   err[7:0]    0: a host buffer (the data is in its heap block; err = 0);
 *               i + 1: the data is in device heap i
 *   err[63:8]   device buffers: granules of the device extent (0 once freed)
 *   word        device buffers: byte offset of the data from the start of
 *               device heap i (a multiple of HL_DEVICE_GRANULE)
 *   aux         nbytes requested, as for every buffer
 *   parents[0..1]  the host heap block, which for a device buffer holds only
 *               its struct hl_buffer_meta (at the block's start)
 *
 * A domain created with device heaps but no heap gets a heap of
 * HL_DEVICE_META_HEAP bytes for these metadata blocks, and HL_FLAG_META_HEAP
 * in hl_header.flags: its participants allocate no host buffer or queue there.
 *
 * So a device buffer owns two extents: its device extent (under the device
 * heap's lock) and its metadata block (under the host heap's lock); freeing
 * the slot frees both, each idempotently, and recovery treats it as any
 * buffer.  hl_buffer_data() returns 0 for a device buffer (no host memory);
 * hl_buffer_device() gives its heap and offset.
 */
#define HL_MAX_DEVICE_HEAPS 8u
#define HL_DEVICE_META_HEAP (256u << 10) /* heap of a domain created with device heaps and no heap */
#define HL_FLAG_META_HEAP 1u /* hl_header.flags: the heap holds only device buffers' metadata */
#define HL_DEVHEAP_SIZE 128u
#define HL_DEVHEAP_MAGIC 0x5041454856454448ULL /* "HDEVHEAP" */
#define HL_DEVICE_GRANULE 256u
#define HL_DEVICE_ALIGN (2ULL << 20)     /* a device heap's size is a multiple of 2 MiB */
#define HL_DEVICE_MAX_SIZE (1ULL << 40)  /* 1 TiB per device heap */
#define HL_DEVICE_CUDA 2u                /* device kinds are DLPack's: kDLCUDA */
#define HL_PLACE(heap, granules) (((hl_u64)(granules) << 8) | ((hl_u64)(heap) + 1u))
#define HL_PLACE_HEAP(e) ((int)((e) & 0xffu) - 1) /* -1: host */
#define HL_PLACE_GRANULES(e) ((e) >> 8)

struct hl_devheap {
    hl_u64 magic;          /*  0 HL_DEVHEAP_MAGIC */
    hl_u64 lock;           /*  8 as hl_heap.lock: 0 = free, else HL_OWNER of the holder */
    hl_u32 device_kind;    /* 16 HL_DEVICE_CUDA */
    hl_u32 device_ordinal; /* 20 N of "cuda:N" */
    hl_u64 granule;        /* 24 HL_DEVICE_GRANULE */
    hl_u64 granules;       /* 32 bits in the bitmap */
    hl_u64 size;           /* 40 granules * granule: the device range [0, size) */
    hl_u64 used_granules;  /* 48 maintained under the lock (hl_heap's offset) */
    hl_u64 hint;           /* 56 granule where the next search starts */
    hl_u64 repairs;        /* 64 times the bitmap was rebuilt after a holder died */
    hl_u64 allocs;         /* 72 allocations so far */
    hl_u64 bitmap_offset;  /* 80 from the start of the device-heap region */
    hl_u8 reserved[HL_DEVHEAP_SIZE - 88];
};

struct hl_buffer_meta {
    hl_u64 nbytes;         /*   0 */
    hl_u32 ndim;           /*   8 0 = raw bytes */
    hl_u32 itemsize;       /*  12 */
    char dtype[16];        /*  16 NumPy dtype.str, NUL-terminated ("<f4", "|u1") */
    hl_u64 shape[HL_BUFFER_MAX_DIMS]; /* 32 */
};


/* ------------------------------------------------------------------------
 * Command queues.
 *
 * A queue is a heap block (slot kind HL_KIND_QUEUE, extent as for buffers)
 * holding struct hl_queue, then `capacity` cell words, then `capacity`
 * 64-byte packets.  One consumer (an agent), any number of producers (the
 * host, other agents, GPU kernels, firmware).
 *
 * Cell word of packet slot i: seq[63:16] | producer[15:8] | state[7:0].
 *   FREE(seq = w)      slot is free for the packet with write index w
 *   RESERVED(w, p)     producer p (participant index, 255 = a device) is filling it
 *   READY(w)           packet w is complete: the consumer may take it
 *   SKIP(w)            recovery abandoned it (its producer died while filling)
 * A producer reserves index w by CAS FREE(w) -> RESERVED(w, p) on cell w %
 * capacity, then advances write_index by CAS (anyone may help), fills the
 * packet (signal first), stores READY(w) with release order and bumps the
 * doorbell.  The consumer takes packet read_index when READY or SKIP, copies
 * it out, stores FREE(read_index + capacity) and advances read_index.  A full
 * queue is never overwritten: a producer that finds RESERVED/READY of an
 * older lap at w waits or gives up.
 *
 * Doorbell: producers store doorbell = w + 1 after READY; a sleeping
 * consumer futex-waits on its low 32 bits with a bounded sleep, so a device
 * store is seen within poll_ns.
 */
#define HL_QUEUE_MAGIC 0x455545555153534cULL /* "LSSQUEUE" */
#define HL_PACKET_SIZE 64u
#define HL_QUEUE_HEADER_SIZE 256u
#define HL_QUEUE_WAS_BOUND 1u /* hl_queue.flags: a consumer bound it once (unbound again = it died) */
#define HL_QUEUE_COUNTS 2u    /* hl_queue.flags: a consumer that keeps failed, busy_ns, last_failed served it */

#define HL_CELL_FREE 0u
#define HL_CELL_RESERVED 1u
#define HL_CELL_READY 2u
#define HL_CELL_SKIP 3u
#define HL_CELL(seq, producer, state) (((hl_u64)(seq) << 16) | ((hl_u64)((producer) & 0xffu) << 8) | (hl_u64)(state))
#define HL_CELL_SEQ(c) ((c) >> 16)
#define HL_CELL_SEQ_MASK 0xffffffffffffULL /* a cell keeps the low 48 bits of its index */
#define HL_CELL_PRODUCER(c) ((hl_u32)(((c) >> 8) & 0xffu))
#define HL_CELL_STATE(c) ((hl_u32)((c) & 0xffu))
#define HL_PRODUCER_DEVICE 255u /* a device no participant answers for */
/* A device pushing for participant p (its host process: a GPU command
 * processor, a CUDA peer's enqueue kernel): recovery of p SKIPs its
 * reservations as it does p's own; consumers treat 128..255 as devices (they
 * ring doorbells by plain stores, with no futex wake). */
#define HL_PRODUCER_DEVICE_BASE 128u
#define HL_PRODUCER_DEVICE_OF(p) (HL_PRODUCER_DEVICE_BASE + (hl_u32)(p))
#define HL_PRODUCER_IS_DEVICE(x) ((hl_u32)(x) >= HL_PRODUCER_DEVICE_BASE)

/* packet types */
#define HL_PKT_KERNEL 1u   /* run kernel `kernel` of the consumer with the argument block `args` */
#define HL_PKT_ERT 2u      /* `args` is a buffer holding an XRT ERT command (npu agents) */
#define HL_PKT_BARRIER 3u  /* only wait and signal */
#define HL_PKT_STOP 4u     /* the consumer stops after this packet */

struct hl_queue {
    hl_u64 magic;            /*   0 HL_QUEUE_MAGIC */
    hl_u32 capacity;         /*   8 packets, a power of two */
    hl_u32 packet_size;      /*  12 HL_PACKET_SIZE */
    hl_u32 consumer;         /*  16 HL_OWNER of the consumer, 0 = none yet */
    hl_u32 flags;            /*  20 HL_QUEUE_WAS_BOUND once a consumer bound it */
    hl_u64 cells_offset;     /*  24 from the start of the queue */
    hl_u64 packets_offset;   /*  32 from the start of the queue */
    hl_u8 pad0[64 - 40];
    hl_u64 write_index;      /*  64 next index to reserve (own cache line) */
    hl_u8 pad1[56];
    hl_u64 read_index;       /* 128 next index the consumer takes */
    hl_u32 space_waiters;    /* 136 producers asleep on read_index (full queue) */
    hl_u32 pad2;
    hl_u64 completed;        /* 144 packets the consumer finished (statistics) */
    /* Statistics for monitors (`hostless top`), in what was padding: zero from a
     * consumer that does not keep them (the Python and GPU loops); written by the
     * consumer only, read by anyone without a lock, never trusted for control. */
    hl_u64 failed;           /* 152 packets (and follow-ups) the consumer failed */
    hl_u64 busy_ns;          /* 160 ns the consumer spent running packets (pop to done) */
    hl_u64 last_failed;      /* 168 signal handle of the last packet that failed, 0 = none */
    hl_u8 pad3[192 - 176];
    hl_u64 doorbell;         /* 192 last write index + 1 published; futex on its low 32 bits */
    hl_u32 doorbell_waiters; /* 200 consumers asleep on the doorbell */
    hl_u32 pad4;
    hl_u8 pad5[256 - 208];
};

/* One command packet (AQL-like, 64 bytes). */
struct hl_packet {
    hl_u16 type;             /*  0 HL_PKT_* */
    hl_u16 flags;            /*  2 reserved, 0 */
    hl_u32 kernel;           /*  4 kernel id in the consumer's registry / ERT CU index */
    hl_u64 args;             /*  8 buffer handle of the argument block or ERT command, 0 = none */
    hl_u64 signal;           /* 16 fence or timeline handle signaled on completion, 0 = none */
    hl_u64 signal_value;     /* 24 timeline value to signal (ignored for fences) */
    hl_u64 wait[2];          /* 32 fences / timelines to wait for before running, 0 = none */
    hl_u64 wait_value[2];    /* 48 timeline values (ignored for fences) */
};

/* The argument block of a KERNEL packet (a heap buffer):
 *   struct hl_kernarg, then u64 buffers[nbuffers] (heap handles),
 *   u64 scalars[nscalars] (raw 64-bit values), then nfollow x
 *   struct hl_follow (packets the consumer enqueues when this one completes
 *   successfully: direct dispatch). */
#define HL_KERNARG_MAGIC 0x4b41524bu /* "KRAK" */
struct hl_kernarg {
    hl_u32 magic;
    hl_u16 nbuffers;
    hl_u16 nscalars;
    hl_u16 nfollow;
    hl_u16 reserved0;
    hl_u32 reserved1;
};
struct hl_follow {
    hl_u64 queue;            /* queue handle */
    struct hl_packet packet;
};

/* XRT ERT command buffers (the `args` buffer of an HL_PKT_ERT packet): their
 * format and decoder are in hostless_ert.h. */

/* ------------------------------------------------------------------------
 * Trace ring (trace_offset, trace_size): struct hl_trace then events.  A
 * writer takes index i with fetch_add on `write`, fills event i % capacity and
 * stores seq = i + 1 last; a reader keeps events whose seq matches. */
#define HL_TRACE_MAGIC 0x4543415254534c48ULL /* "HLSTRACE" */
struct hl_trace {
    hl_u64 magic;
    hl_u64 capacity;         /* events */
    hl_u64 write;            /* events written so far */
    hl_u8 pad[64 - 24];
};
struct hl_trace_event {
    hl_u64 seq;              /* index + 1, stored last */
    hl_u64 ts_ns;            /* CLOCK_MONOTONIC */
    hl_u32 type;             /* HL_EV_* */
    hl_u32 participant;      /* the writer: HL_OWNER(incarnation, index) (ABI 6; its index before), 0 = none */
    hl_u64 a, b, c, d, e;    /* event arguments */
};
#define HL_EV_ENQUEUE 1u     /* a=queue, b=packet index, c=signal handle, d=kernel */
#define HL_EV_START 2u       /* a=queue, b=packet index, c=signal handle, d=kernel */
#define HL_EV_END 3u         /* a=queue, b=packet index, c=signal handle, d=status */
#define HL_EV_SIGNAL 4u      /* a=handle, b=status or value */
#define HL_EV_WAIT 5u        /* a wait that did not find its word ready, at its end: a=handle, b=threshold,
                                c=start ns, d=the word it returned with */
#define HL_EV_USER 6u        /* free use */

#if defined(__cplusplus) && __cplusplus >= 201103L
static_assert(sizeof(struct hl_queue) == HL_QUEUE_HEADER_SIZE, "hl_queue size");
static_assert(sizeof(struct hl_packet) == HL_PACKET_SIZE, "hl_packet size");
static_assert(sizeof(struct hl_trace_event) == 64, "hl_trace_event size");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct hl_queue) == HL_QUEUE_HEADER_SIZE, "hl_queue size");
_Static_assert(sizeof(struct hl_packet) == HL_PACKET_SIZE, "hl_packet size");
_Static_assert(sizeof(struct hl_trace_event) == 64, "hl_trace_event size");
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
static_assert(sizeof(struct hl_heap) == 128, "hl_heap size");
static_assert(sizeof(struct hl_devheap) == HL_DEVHEAP_SIZE, "hl_devheap size");
static_assert(sizeof(struct hl_buffer_meta) == HL_BUFFER_META_SIZE, "hl_buffer_meta size");
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(struct hl_heap) == 128, "hl_heap size");
_Static_assert(sizeof(struct hl_devheap) == HL_DEVHEAP_SIZE, "hl_devheap size");
_Static_assert(sizeof(struct hl_buffer_meta) == HL_BUFFER_META_SIZE, "hl_buffer_meta size");
#endif

#endif /* HOSTLESS_LAYOUT_H */
#endif /* HOSTLESS_LAYOUT_REGIONS_H */
