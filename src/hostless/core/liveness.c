/*
 * liveness.c -- who is alive.  A participant's liveness is an OFD lock on
 * byte HL_LOCK_BASE + index of the domain file, taken at join: the kernel
 * drops it when the process dies, so a held lock means alive (or a live
 * recoverer on it) and a free one means dead.  No shared-memory writes here.
 */
#include "engine.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* 1 when owner code o names a live participant: heap-lock codes of a
 * recoverer (HL_HEAP_REC_FLAG) name one that is RECOVERING in that
 * incarnation with its liveness lock held; other codes one ALIVE in it. */
int hle_owner_alive(hle_ctx *c, uint64_t o) {
    int i = HL_OWNER_INDEX((uint32_t)o);
    if ((o >> 32) & ~1ull || i < 0 || (uint32_t)i >= c->pcap) return 0;
    uint64_t pc = ld(&c->parts[i].ctl);
    uint32_t want = (o & HL_HEAP_REC_FLAG) ? HL_PART_RECOVERING : HL_PART_ALIVE;
    if (HL_PCTL_STATE(pc) != want || (HL_PCTL_INC(pc) & 0xffffffu) != HL_OWNER_INC((uint32_t)o)) return 0;
    if (i == hle_tls_rec) return 0; /* we recover i: a holder naming i is a dead recoverer of i */
    return i == c->me || i == __atomic_load_n(&c->rec_busy, __ATOMIC_SEQ_CST) || hle_part_lock_held(c, i);
}

/* One fcntl on participant i's liveness lock byte (HL_LOCK_BASE + i), with an OFD lock
 * of `type`; *fl keeps what the kernel answered (F_OFD_GETLK). */
static int lock_byte(int fd, int i, int cmd, short type, struct flock *fl) {
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = (off_t)(HL_LOCK_BASE + (uint64_t)i);
    fl->l_len = 1;
    return fcntl(fd, cmd, fl);
}

int hle_part_lock_held(hle_ctx *c, int i) {
    struct flock fl;
    if (lock_byte(c->fd, i, F_OFD_GETLK, F_WRLCK, &fl) != 0) return 1; /* unknown: assume alive */
    return fl.l_type != F_UNLCK;
}

int hle_take_lock(int fd, int i) {
    struct flock fl;
    return lock_byte(fd, i, F_OFD_SETLK, F_WRLCK, &fl);
}

void hle_drop_lock(int fd, int i) {
    struct flock fl;
    (void)lock_byte(fd, i, F_OFD_SETLK, F_UNLCK, &fl);
}

int hle_lock_held(hle_ctx *c, int i) {
    return i == c->me || i == __atomic_load_n(&c->rec_busy, __ATOMIC_SEQ_CST) ? 1 : hle_part_lock_held(c, i);
}
