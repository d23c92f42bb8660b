/*
 * open.c -- join a domain by its path, as hostless.shm.open_file and
 * Domain.open do from Python (contract in hostless_engine.h).
 */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int hle_open(hle_ctx *c, const char *path, const char *label, const char *kind, uint64_t watchdog_ns,
             int64_t ready_timeout_ns) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        hle_fail_errno(e);
        return hle_fail(HL_E_OS, "cannot open the domain %s: %s", path, strerror(e));
    }
    struct stat sb;
    int r;
    if (fstat(fd, &sb) != 0) {
        r = hle_fail_errno(errno);
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        r = hle_fail(HL_E_CORRUPT, "%s is not a regular file", path);
        goto fail;
    }
    if (sb.st_uid != geteuid()) {
        r = hle_fail(HL_E_INVALID, "%s belongs to user %u, not to this user (%u)", path, (unsigned)sb.st_uid,
                     (unsigned)geteuid());
        goto fail;
    }
    /* wait for a creator that is still initialising (ready == 1), as shm.wait_ready */
    uint64_t t0 = now_ns();
    for (;;) {
        struct hl_header h;
        if (fstat(fd, &sb) != 0) {
            r = hle_fail_errno(errno);
            goto fail;
        }
        if ((uint64_t)sb.st_size >= sizeof h && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h) {
            if (h.magic == HL_MAGIC && h.abi_version != HL_ABI_VERSION) { /* another layout: no `ready` to wait for */
                r = hle_version_fail(path, h.abi_version);
                goto fail;
            }
            if (h.ready == 1) break;
            if (h.magic != 0 && h.magic != HL_MAGIC) {
                r = hle_fail(HL_E_CORRUPT, "%s is not a hostless domain (magic 0x%llx)", path,
                             (unsigned long long)h.magic);
                goto fail;
            }
        }
        if (ready_timeout_ns >= 0 && now_ns() - t0 >= (uint64_t)ready_timeout_ns) {
            r = hle_fail(HL_E_CORRUPT, "%s is not an initialised hostless domain (its creator died or is still starting)",
                         path);
            goto fail;
        }
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    if ((r = hle_attach(c, fd, NULL, label, kind, watchdog_ns)) == HL_OK) return HL_OK; /* c owns fd */
fail:
    close(fd);
    return r;
}

int hle_usable(hle_ctx *c) { return hle_need_attached(c); }
