/*
 * hostless-agent -- a native agent with no Python: joins a domain and serves
 * one queue with the engine's loop (hle_agent_run) and its built-in kernels
 * (the "firmware" participant of the brief).  Built with the package
 * (hostless/_bin/hostless-agent, hostless.agents.executable_path()) and by
 * `make agent` (build/hostless-agent, from build/libhostless.a).
 *
 *   hostless-agent --domain PATH (--queue NAME | --queue-handle H) [--kind cpu]
 *                  [--label TEXT] [--spin-ns N] [--wait-timeout-ns N]
 *                  [--follow-timeout-ns N] [--parent PID] [--trace]
 *
 * --kind npu runs the emulated NPU's ERT command processor (hle_agent_cfg.kind
 * HLE_AGENT_NPU, its CU table); --blas PATH loads that CBLAS for GEMM (without
 * one a GEMM needs Python and fails); --idle-poll-ns bounds the doorbell sleep
 * once idle (hle_agent_cfg.idle_nap_ns, default 20 ms).  PATH without a '/' is a name under /dev/shm.  Once it consumes the queue it
 * prints its participant id (incarnation << 8 | slot) on stdout: the spawner
 * (hostless.agents.spawn(..., native="exe")) waits for that line.  A packet
 * needing Python (a user kernel, a dtype the C kernels do not take, an ERT
 * packet on a cpu agent) fails alone with ERROR and a record
 * (hostless.records) saying why; the agent goes on.  It loads no code at
 * all: a LOAD_KERNEL packet (kernel 999) is refused the same way.  --trace writes a line on
 * stderr when it starts, for each failure it records, and when it leaves.
 *
 * Exit status: 0 after a STOP packet, SIGTERM / SIGINT, or the death of
 * --parent (it leaves the domain: its slot is freed, fences it owns fail
 * with OWNER_DIED); 1 on a runtime error (no such domain, not a domain, no
 * such queue, a live consumer already, ...); 2 on a usage error.  Killed, it
 * is recovered like any participant.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hostless/hostless_engine.h"

#define USAGE                                                                                             \
    "usage: hostless-agent --domain PATH (--queue NAME | --queue-handle H) [--kind cpu|npu] [--label TEXT]\n" \
    "                      [--spin-ns N] [--wait-timeout-ns N] [--follow-timeout-ns N] [--parent PID] [--trace]\n" \
    "                      [--idle-poll-ns N] [--blas LIBCBLAS.so]\n"

static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) { stop_signal = sig; }

struct agent {
    hle_ctx *c;
    struct hle_records rec;
    long parent;
    int parent_is_ppid, trace;
};

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "hostless-agent: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n" USAGE);
    return 2;
}

static int fail(const char *what, int code) {
    fprintf(stderr, "hostless-agent: %s: %s (code %d)\n", what, hle_errmsg(), code);
    return 1;
}

/* A whole-string integer (base 0: 0x... accepted); 0 when it is not one. */
static int num(const char *s, long long lo, long long *out) {
    if (!s || !*s) return 0;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (errno || *end || v < lo) return 0;
    *out = v;
    return 1;
}

/* A whole-string unsigned 64-bit value (a handle); 0 when it is not one. */
static int unum(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return 0;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || v == 0) return 0;
    *out = v;
    return 1;
}

static int should_stop(void *ud) {
    struct agent *a = ud;
    if (stop_signal) return 1;
    if (!a->parent) return 0;
    if (a->parent_is_ppid) return (long)getppid() != a->parent; /* reparented: the spawner died */
    return kill((pid_t)a->parent, 0) != 0 && errno == ESRCH;
}

static void record(void *ud, uint64_t sig, const char *why) {
    struct agent *a = ud;
    int r = hle_record_write(a->c, &a->rec, sig, why);
    if (a->trace)
        fprintf(stderr, "hostless-agent: packet signaling 0x%llx failed: %s%s\n", (unsigned long long)sig, why,
                r ? " (not recorded)" : "");
}

/* hostless.kernels.LOAD_KERNEL: a request for code, which no agent takes from a queue */
#define LOAD_KERNEL_ID 999u

/* What the Python agents would run: here the packet fails alone, with the why. */
static uint64_t needs_python(void *ud, uint64_t idx, const struct hl_packet *p) {
    char why[200];
    if (p->type != HL_PKT_ERT && p->kernel == LOAD_KERNEL_ID)
        snprintf(why, sizeof why,
                 "LOAD_KERNEL refused: hostless-agent loads no code, and no agent takes code from its queue; "
                 "nothing was loaded");
    else if (p->type == HL_PKT_ERT)
        snprintf(why, sizeof why, "BadPacket: an ERT packet on a cpu agent; hostless-agent runs built-in kernels only");
    else if (hle_agent_has_kernel(p->kernel))
        snprintf(why, sizeof why,
                 "kernel %u on these dtypes or shapes needs Python; hostless-agent runs built-in kernels only "
                 "(float32 in C)", p->kernel);
    else
        snprintf(why, sizeof why, "kernel %u needs Python; hostless-agent runs built-in kernels only", p->kernel);
    record(ud, p->signal, why);
    return HL_STATUS_ERROR;
}

/* the defaults of the options (ns) */
#define SPIN_NS 50000ll             /* --spin-ns */
#define WAIT_TIMEOUT_NS 60000000000ll /* --wait-timeout-ns: an input wait, 60 s */
#define FOLLOW_TIMEOUT_NS 10000000000ll /* --follow-timeout-ns: a packet's follow-up pushes, 10 s */
#define IDLE_NAP_NS 20000000ll       /* --idle-nap-ns: 20 ms */
#define WATCHDOG_NS 20000000ull      /* the watchdog's period, 20 ms */
#define READY_TIMEOUT_NS 2000000000ll /* waiting for the domain's creator to finish, 2 s */

int main(int argc, char **argv) {
    const char *domain = NULL, *qname = NULL, *qhandle = NULL, *kind = "cpu", *label = "hostless-agent";
    long long spin = SPIN_NS, wto = WAIT_TIMEOUT_NS, fto = FOLLOW_TIMEOUT_NS, parent = 0, idle = IDLE_NAP_NS;
    const char *blas = NULL;
    int trace = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--trace")) { trace = 1; continue; }
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) { fputs(USAGE, stdout); return 0; }
        if (!v) return usage(o[0] == '-' ? "%s needs a value" : "unexpected argument %s", o);
        i++;
        if (!strcmp(o, "--domain")) domain = v;
        else if (!strcmp(o, "--queue")) qname = v;
        else if (!strcmp(o, "--queue-handle")) qhandle = v;
        else if (!strcmp(o, "--kind")) kind = v;
        else if (!strcmp(o, "--label")) label = v;
        else if (!strcmp(o, "--spin-ns")) { if (!num(v, 0, &spin)) return usage("--spin-ns: not a count of ns >= 0: %s", v); }
        else if (!strcmp(o, "--wait-timeout-ns")) { if (!num(v, -1, &wto)) return usage("--wait-timeout-ns: not ns >= -1 (-1: none): %s", v); }
        else if (!strcmp(o, "--follow-timeout-ns")) { if (!num(v, 0, &fto)) return usage("--follow-timeout-ns: not a count of ns >= 0: %s", v); }
        else if (!strcmp(o, "--parent")) { if (!num(v, 1, &parent) || parent > INT_MAX) return usage("--parent: not a pid (1..2147483647): %s", v); }
        else if (!strcmp(o, "--idle-poll-ns")) { if (!num(v, 0, &idle)) return usage("--idle-poll-ns: not a count of ns >= 0: %s", v); }
        else if (!strcmp(o, "--blas")) blas = v;
        else return usage("unknown option %s", o);
    }
    if (!domain) return usage("%s", "--domain is required");
    if (!qname == !qhandle) return usage("%s", "give one of --queue NAME or --queue-handle H");
    uint64_t q = 0;
    if (qhandle && !unum(qhandle, &q)) return usage("--queue-handle: not a handle: %s", qhandle);
    if (strcmp(kind, "cpu") != 0 && strcmp(kind, "npu") != 0) return usage("--kind %s: unknown kind (cpu, npu)", kind);
    if (strlen(label) > 31) return usage("--label is longer than 31 bytes: %s", label);

    struct agent a = {0};
    a.trace = trace;
    a.parent = (long)parent;
    a.parent_is_ppid = parent && (long)getppid() == a.parent;
    if (parent && kill((pid_t)parent, 0) != 0 && errno == ESRCH) {
        fprintf(stderr, "hostless-agent: --parent %lld is not running\n", parent);
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a sleep ends early, the loop sees the flag */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    char path[4096];
    snprintf(path, sizeof path, strchr(domain, '/') ? "%s" : "/dev/shm/%s", domain);
    if (!(a.c = hle_ctx_new())) return fail("out of memory", HL_E_NOMEM);
    int r = hle_open(a.c, path, label, kind, WATCHDOG_NS, READY_TIMEOUT_NS);
    if (r) {
        int rc = fail("cannot join the domain", r);
        hle_ctx_free(a.c);
        return rc;
    }
    int rc = 0;
    if (qname && (r = hle_name_lookup(a.c, qname, strlen(qname), &q))) {
        fprintf(stderr, "hostless-agent: no queue named %s in %s: %s\n", qname, path, hle_errmsg());
        rc = 1;
    } else if (HL_HANDLE_KIND(q) != HL_KIND_QUEUE) {
        fprintf(stderr, "hostless-agent: %s 0x%llx is an object of kind %u, not a queue (kind %u)\n",
                qname ? qname : "handle", (unsigned long long)q, HL_HANDLE_KIND(q), HL_KIND_QUEUE);
        rc = 1;
    } else if ((r = hle_import(a.c, q, HL_KIND_QUEUE))) {
        rc = fail("cannot hold the queue", r);
    } else {
        if ((r = hle_queue_bind(a.c, q))) {
            rc = fail("cannot consume the queue", r);
        } else {
            char text[64];
            uint64_t id = ((uint64_t)(hle_owner_code(a.c) >> 8) << 8) | (uint64_t)hle_me(a.c);
            snprintf(text, sizeof text, "%s (%s)", label, kind);
            hle_trace_user(a.c, HLE_TRACE_JOIN, id, text);
            printf("%llu\n", (unsigned long long)id);
            fflush(stdout);
            if (trace) fprintf(stderr, "hostless-agent: participant %llu serves queue 0x%llx of %s\n",
                               (unsigned long long)id, (unsigned long long)q, path);
            uint32_t mask = 0;
            for (uint32_t k = 0; k < 32; k++) mask |= hle_agent_has_kernel(k) ? 1u << k : 0;
            struct hle_agent_cfg cfg = {0};
            cfg.spin_ns = spin;
            cfg.wait_timeout_ns = wto;
            cfg.follow_timeout_ns = fto;
            cfg.ud = &a;
            cfg.should_stop = should_stop;
            cfg.python_kernel = needs_python;
            cfg.record = record;
            cfg.c_kernels = mask;
            /* npu: the ERT command processor in C with the emulated NPU's CU table */
            cfg.kind = strcmp(kind, "npu") ? HLE_AGENT_CPU : HLE_AGENT_NPU;
            cfg.blas_path = blas;  /* GEMM through this CBLAS; without one it needs Python: fails */
            cfg.blas_threads = 1;
            cfg.idle_nap_ns = idle;
            cfg.keep_ns = HLE_AGENT_KEEP_NS; /* kept imports, as hostless's agents */
            if ((r = hle_agent_run(a.c, q, &cfg))) {
                int u = hle_usable(a.c); /* a truncated file shows first as garbage read through it */
                rc = fail("the agent loop stopped", u ? u : r);
            }
            if (trace) fprintf(stderr, "hostless-agent: leaving after %llu packets (%llu failed)%s\n",
                               (unsigned long long)cfg.packets, (unsigned long long)cfg.failures,
                               stop_signal ? " on a signal" : "");
        }
        hle_release(a.c, q);
    }
    hle_records_close(a.c, &a.rec);
    hle_leave(a.c);
    hle_ctx_free(a.c);
    return rc;
}
