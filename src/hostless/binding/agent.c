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

static uint64_t pa_kernel(void *ud, uint64_t idx, const struct hl_packet *p) {
    struct pyagent *a = ud;
    uint64_t st = HL_STATUS_ERROR;
    relock(a);
    PyObject *r = PyObject_CallFunction(a->kernel, "Ky#", (unsigned long long)idx, (const char *)p,
                                        (Py_ssize_t)sizeof *p);
    if (r) {
        unsigned long long v = PyLong_AsUnsignedLongLong(r);
        if (!PyErr_Occurred() && hl_status_valid(v)) st = v;
        Py_DECREF(r);
    }
    if (PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_Exception))
            PyErr_WriteUnraisable(a->kernel); /* the callback's own bug: the packet failed */
        else
            keep_exc(a); /* SystemExit (SIGTERM's handler), KeyboardInterrupt: stop the agent */
    }
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

/* agent_run(queue, spin_ns, wait_timeout_ns, follow_timeout_ns, parent_pid, kernel, record, c_kernels)
 *   -> (packets, failures).  Serves the queue until STOP, the spawner's death, or
 * a signal handler that raised (its exception propagates). */
PyObject *Core_agent_run(Core *c, PyObject *args) {
    NEED_ATTACHED(c);
    unsigned long long q;
    long long spin, wto, fto;
    long parent;
    unsigned int mask;
    PyObject *kernel, *record;
    if (!PyArg_ParseTuple(args, "KLLLlOOI", &q, &spin, &wto, &fto, &parent, &kernel, &record, &mask)) return NULL;
    if (!PyCallable_Check(kernel) || (record != Py_None && !PyCallable_Check(record))) {
        PyErr_SetString(PyExc_TypeError, "agent_run: kernel and record must be callables");
        return NULL;
    }
    struct pyagent a = {NULL, kernel, record, parent, 0, NULL, NULL, NULL};
    struct hle_agent_cfg cfg = {spin, wto, fto, &a, pa_should_stop, pa_kernel, pa_record, mask, 0, 0};
    struct hle_hooks saved = c->ctx.hooks;
    memset(&c->ctx.hooks, 0, sizeof c->ctx.hooks); /* the loop runs unlocked: no relock inside the engine */
    Py_INCREF(c);
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
    return Py_BuildValue("(KK)", (unsigned long long)cfg.packets, (unsigned long long)cfg.failures);
}
