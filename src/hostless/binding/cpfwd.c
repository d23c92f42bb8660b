/*
 * cpfwd.c -- hostless._core.cpfwd_start / cpfwd_stop: the GPU command
 * processor's host forwarder (core/cpfwd.c) for hostless.agents.gpucp.
 */
#include "binding.h"
#include "hostless/hostless_gpucp.h"

struct fwd_box {
    struct hle_cpfwd *f;
    Py_buffer view; /* the outbox, held while the thread runs */
    PyObject *core; /* the context it uses */
};

static void fwd_finish(struct fwd_box *b, uint64_t *pushed, uint64_t *failed) {
    if (b->f) {
        Py_BEGIN_ALLOW_THREADS hle_cpfwd_stop(b->f, pushed, failed);
        Py_END_ALLOW_THREADS b->f = NULL;
        PyBuffer_Release(&b->view);
        Py_CLEAR(b->core);
    }
}

static void fwd_destroy(PyObject *cap) {
    struct fwd_box *b = PyCapsule_GetPointer(cap, "hostless.cpfwd");
    if (!b) {
        PyErr_Clear();
        return;
    }
    fwd_finish(b, NULL, NULL);
    PyMem_Free(b);
}

/* cpfwd_start(core, outbox, own_queue) -> forwarder: outbox is a writable, 8-byte aligned
 * buffer of CP_OUTBOX_SIZE bytes or more that the GPU reaches (pinned, mapped). */
PyObject *hlpy_cpfwd_start(PyObject *m, PyObject *args) {
    PyObject *core, *obj;
    unsigned long long own;
    if (!PyArg_ParseTuple(args, "O!OK", CoreType, &core, &obj, &own)) return NULL;
    struct fwd_box *b = PyMem_Calloc(1, sizeof *b);
    if (!b) return PyErr_NoMemory();
    if (hlpy_words_view(obj, &b->view, (Py_ssize_t)sizeof(struct hl_cp_outbox), "the outbox") < 0) {
        PyMem_Free(b);
        return NULL;
    }
    int r = hle_cpfwd_start(&((Core *)core)->ctx, b->view.buf, own, &b->f);
    if (r) {
        PyBuffer_Release(&b->view);
        PyMem_Free(b);
        return hlpy_raise(r);
    }
    Py_INCREF(core);
    b->core = core;
    PyObject *cap = PyCapsule_New(b, "hostless.cpfwd", fwd_destroy);
    if (!cap) {
        fwd_finish(b, NULL, NULL);
        PyMem_Free(b);
    }
    return cap;
}

/* cpfwd_stop(forwarder) -> (pushed, failed); again: (0, 0). */
PyObject *hlpy_cpfwd_stop(PyObject *m, PyObject *cap) {
    struct fwd_box *b = PyCapsule_GetPointer(cap, "hostless.cpfwd");
    if (!b) return NULL;
    uint64_t pushed = 0, failed = 0;
    fwd_finish(b, &pushed, &failed);
    return Py_BuildValue("(KK)", (unsigned long long)pushed, (unsigned long long)failed);
}
