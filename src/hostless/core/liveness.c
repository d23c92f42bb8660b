/*
 * liveness.c -- who is alive.  A participant's liveness is an OFD write lock
 * on byte HL_LOCK_BASE + index of the domain file, taken at join: the kernel
 * drops it when the process dies, so a held write lock means alive (or a live
 * recoverer on it) and a free byte means dead.
 *
 * Read locks never mean alive.  Anyone who can open the domain for reading
 * can take OFD read locks on any byte, and a read lock keeps every write
 * lock off that byte: it can hide a dead participant's free byte, and keep a
 * joiner or a recoverer from taking the lock.  So when a read lock is found
 * (F_OFD_GETLK answers F_RDLCK: no write lock can be there), or when the
 * participant joined without its lock because of one (HL_PART_FLAG_PIDLIVE,
 * written only by the participant itself, and a reader cannot write), the
 * answer comes from the process instead: alive when its pid exists with the
 * start time recorded at join.  A reader can thus slow nothing but the
 * lock-based answer; it cannot make a dead slot look alive nor keep a joiner
 * out.  The pid fallback assumes one pid namespace.
 */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

/* What the kernel says is on byte i: F_WRLCK, F_RDLCK, F_UNLCK, or -1 unknown. */
int hle_lock_state(int fd, int i) {
    struct flock fl;
    if (lock_byte(fd, i, F_OFD_GETLK, F_WRLCK, &fl) != 0) return -1;
    return fl.l_type;
}

/* 1 when the process that joined slot i still runs: its pid exists with the
 * start time it recorded.  pid 0 is a joiner between its claim and its pid
 * store (fields are cleared before a slot is freed): alive. */
static int pid_alive(struct hl_participant *p) {
    uint32_t pid = __atomic_load_n(&p->pid, __ATOMIC_SEQ_CST);
    if (pid == 0) return 1;
    if (pid > 0x7fffffffu) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
    uint64_t st = hle_proc_start_time((int)pid);
    return st == 0 || st == __atomic_load_n(&p->start_time, __ATOMIC_SEQ_CST); /* 0: /proc unreadable, trust kill */
}

/* Liveness of i; `depth` bounds the recoverer-of-a-recoverer chain to one step. */
static int held(hle_ctx *c, int i, int depth) {
    int t = hle_lock_state(c->fd, i);
    if (t < 0 || t == F_WRLCK) return 1; /* unknown: assume alive */
    struct hl_participant *p = &c->parts[i];
    uint32_t fl = __atomic_load_n(&p->flags, __ATOMIC_SEQ_CST);
    if (t == F_UNLCK && !(fl & HL_PART_FLAG_PIDLIVE)) return 0;
    /* a read lock hides the answer, or i joined without its lock */
    uint64_t pc = ld(&p->ctl);
    uint32_t s = HL_PCTL_STATE(pc);
    if (s == HL_PART_ALIVE) return pid_alive(p);
    if (s != HL_PART_RECOVERING || depth > 0) return 0;
    /* a lockless recovery: alive while its recoverer is */
    uint32_t r = HL_PCTL_RECOVERER(pc);
    if (r >= c->pcap || (int)r == i) return 0;
    if ((int)r == c->me) return 0; /* ours, left unfinished: reap_mu says we are not on it now */
    if (HL_PCTL_STATE(ld(&c->parts[r].ctl)) != HL_PART_ALIVE) return 0;
    return held(c, (int)r, depth + 1);
}

int hle_part_lock_held(hle_ctx *c, int i) {
    return held(c, i, 0);
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
