/*
 * agent.c (binding) -- Core.agent_run: the native agent loop (core/agent.c)
 * with the GIL released, taken back only for a Python kernel, a failure
 * record, and the signal check between idle slices.
 */
#include <unistd.h>

#include "binding.h"

struct pyagent {
    PyThreadState *ts; /* the released thread state (NULL while we hold the GIL) */
    PyObject *kernel;  /* kernel(idx, packet bytes) -> status int */
    PyObject *record;  /* record(signal, text) */
    PyObject *cu;      /* cu(index, buffer handles, scalars, signal) -> status int, or None */
    long parent;
    int signalled;     /* a signal handler (or SystemExit in a kernel) raised: stop, re-raise it */
    PyObject *et, *ev, *etb; /* that exception, kept until agent_run returns */
};

/* Keep the pending exception (GIL held) and ask the loop to stop. */
static void keep_exc(struct pyagent *a) {
    if (!a->signalled) PyErr_Fetch(&a->et, &a->ev, &a->etb);
    else PyErr_Clear();
    a->signalled = 1;
}

static void relock(struct pyagent *a) { PyEval_RestoreThread(a->ts); }
static void unlock(struct pyagent *a) { a->ts = PyEval_SaveThread(); }

static int pa_should_stop(void *ud) {
    struct pyagent *a = ud;
    if (a->signalled) return 1;
    if (a->parent && (long)getppid() != a->parent) return 1; /* the spawner died: no orphans */
    relock(a);
    if (PyErr_CheckSignals() < 0) keep_exc(a);
    unlock(a);
    return a->signalled;
}

/* The status a Python callback returned (its result r, a new reference or NULL), ERROR when
 * it raised or returned no valid status.  A callback's own exception is reported as
 * unraisable (the packet failed); SystemExit (SIGTERM's handler) and KeyboardInterrupt are
 * kept to stop the agent.  Called with the GIL held. */
static uint64_t call_status(struct pyagent *a, PyObject *fn, PyObject *r) {
    uint64_t st = HL_STATUS_ERROR;
    if (r) {
        unsigned long long v = PyLong_AsUnsignedLongLong(r);
        if (!PyErr_Occurred() && hl_status_valid(v)) st = v;
        Py_DECREF(r);
    }
    if (PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_WriteUnraisable(fn);
        else
            keep_exc(a);
    }
    return st;
}

static uint64_t pa_kernel(void *ud, uint64_t idx, const struct hl_packet *p) {
    struct pyagent *a = ud;
    relock(a);
    PyObject *r = PyObject_CallFunction(a->kernel, "Ky#", (unsigned long long)idx, (const char *)p,
                                        (Py_ssize_t)sizeof *p);
    uint64_t st = call_status(a, a->kernel, r);
    unlock(a);
    return st;
}

static PyObject *u64_tuple(const uint64_t *v, uint32_t n) {
    PyObject *t = PyTuple_New(n);
    for (uint32_t i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromUnsignedLongLong(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static uint64_t pa_cu(void *ud, uint32_t cu, const uint64_t *bufs, uint32_t nbuf, const uint64_t *sc, uint32_t ns,
                      uint64_t sig) {
    struct pyagent *a = ud;
    relock(a);
    PyObject *hb = u64_tuple(bufs, nbuf), *hs = u64_tuple(sc, ns), *r = NULL;
    if (hb && hs) r = PyObject_CallFunction(a->cu, "IOOK", cu, hb, hs, (unsigned long long)sig);
    Py_XDECREF(hb);
    Py_XDECREF(hs);
    uint64_t st = call_status(a, a->cu, r);
    unlock(a);
    return st;
}

static void pa_record(void *ud, uint64_t sig, const char *why) {
    struct pyagent *a = ud;
    if (a->record == Py_None) return;
    relock(a);
    PyObject *r = PyObject_CallFunction(a->record, "Ks", (unsigned long long)sig, why);
    if (!r) PyErr_Clear();
    Py_XDECREF(r);
    unlock(a);
}

/* agent_run(queue, spin_ns, wait_timeout_ns, follow_timeout_ns, parent_pid, kernel, record, c_kernels,
 *           kind=0, present=0, kernel_map=b"", cu=None, blas_path=None, blas_threads=0, fixed_spin=0,
 *           idle_nap_ns=0, keep_ns=HLE_AGENT_KEEP_NS)
 *   -> dict(packets, failures, blas_loaded, blas_why, spins, parks).  Serves the queue until STOP, the
 * spawner's death, or a signal handler that raised (its exception propagates).
 * kernel_map: up to HLE_AGENT_MAX_CUS bytes (id / CU -> HL_K_* (hostless_kernels.h)). */
PyObject *Core_agent_run(Core *c, PyObject *args) {
    NEED_ATTACHED(c);
    unsigned long long q;
    long long spin, wto, fto;
    long parent;
    unsigned int mask, kind = 0, present = 0;
    PyObject *kernel, *record, *cu = Py_None;
    const char *map = NULL, *blas = NULL;
    Py_ssize_t nmap = 0;
    int threads = 0, fixed = 0;
    long long idle_nap = 0, keep = HLE_AGENT_KEEP_NS;
    if (!PyArg_ParseTuple(args, "KLLLlOOI|IIy#OziILL", &q, &spin, &wto, &fto, &parent, &kernel, &record, &mask, &kind,
                          &present, &map, &nmap, &cu, &blas, &threads, &fixed, &idle_nap, &keep))
        return NULL;
    if (!PyCallable_Check(kernel) || (record != Py_None && !PyCallable_Check(record)) ||
        (cu != Py_None && !PyCallable_Check(cu))) {
        PyErr_SetString(PyExc_TypeError, "agent_run: kernel, record and cu must be callables");
        return NULL;
    }
    if (nmap > HLE_AGENT_MAX_CUS || kind > HLE_AGENT_NPU) {
        PyErr_SetString(PyExc_ValueError, "agent_run: kernel_map longer than AGENT_MAX_CUS, or an unknown kind");
        return NULL;
    }
    struct pyagent a = {NULL, kernel, record, cu, parent, 0, NULL, NULL, NULL};
    struct hle_agent_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.spin_ns = spin;
    cfg.wait_timeout_ns = wto;
    cfg.follow_timeout_ns = fto;
    cfg.ud = &a;
    cfg.should_stop = pa_should_stop;
    cfg.python_kernel = pa_kernel;
    cfg.record = pa_record;
    cfg.c_kernels = mask;
    cfg.kind = kind;
    cfg.present = present;
    if (nmap) memcpy(cfg.kernel_map, map, (size_t)nmap);
    cfg.python_cu = cu != Py_None ? pa_cu : NULL;
    cfg.blas_path = blas;
    cfg.blas_threads = threads;
    cfg.fixed_spin = fixed;
    cfg.idle_nap_ns = idle_nap;
    cfg.keep_ns = keep;
    struct hle_hooks saved = c->ctx.hooks;
    memset(&c->ctx.hooks, 0, sizeof c->ctx.hooks); /* the loop runs unlocked: no relock inside the engine */
    Py_INCREF((PyObject *)c);
    unlock(&a);
    int r = hle_agent_run(&c->ctx, q, &cfg);
    relock(&a);
    c->ctx.hooks = saved;
    Py_DECREF(c);
    if (a.signalled && a.et) {
        PyErr_Restore(a.et, a.ev, a.etb);
        return NULL;
    }
    if (r) return hlpy_raise(r);
    return Py_BuildValue("{sKsKsisssKsK}", "packets", (unsigned long long)cfg.packets, "failures",
                         (unsigned long long)cfg.failures, "blas_loaded", (int)cfg.blas_loaded, "blas_why",
                         cfg.blas_why, "spins", (unsigned long long)cfg.spins, "parks", (unsigned long long)cfg.parks);
}

/* blas_probe(path, threads) -> (loaded, why): what an agent given this BLAS path will run GEMM with. */
PyObject *hlpy_blas_probe(PyObject *self, PyObject *args) {
    const char *path = NULL;
    int threads = 0;
    if (!PyArg_ParseTuple(args, "z|i", &path, &threads)) return NULL;
    struct hle_kenv env;
    char why[200];
    int ok = hle_blas_load(&env, path, threads, why, sizeof why);
    return Py_BuildValue("(Ns)", PyBool_FromLong(ok), why);
}

/* agent_table(kind, c_kernels) -> (present, kernel_map bytes): the table an agent of `kind`
 * gets when its caller leaves it empty (what a C program such as hostless-agent runs). */
PyObject *hlpy_agent_table(PyObject *self, PyObject *args) {
    unsigned int kind, mask = 0;
    if (!PyArg_ParseTuple(args, "I|I", &kind, &mask)) return NULL;
    struct hle_agent_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = kind;
    cfg.c_kernels = mask;
    uint32_t present = 0;
    uint8_t map[HLE_AGENT_MAX_CUS];
    hle_agent_default_table(&cfg, &present, map);
    return Py_BuildValue("(Iy#)", present, (const char *)map, (Py_ssize_t)sizeof map);
}
