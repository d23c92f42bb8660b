/*
 * module.c -- the hostless._core module: the types, the module functions,
 * the ABI constants, and hostless._core.testing, a separate table of test
 * hooks that production code never reaches.
 */
#include "binding.h"

/* layout(fences, participants, queues_size, trace_size, heap_size) -> dict of offsets */
static PyObject *py_layout(PyObject *m, PyObject *args) {
    unsigned long long f, p, q, t, hs;
    if (!PyArg_ParseTuple(args, "KKKKK", &f, &p, &q, &t, &hs)) return NULL;
    struct hl_header h;
    hle_layout(f, p, q, t, hs, &h);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "total_size", (unsigned long long)h.total_size,
                         "participants_offset", (unsigned long long)h.participants_offset, "fences_offset",
                         (unsigned long long)h.fences_offset, "queues_offset", (unsigned long long)h.queues_offset,
                         "queues_size", (unsigned long long)h.queues_size, "trace_offset",
                         (unsigned long long)h.trace_offset, "trace_size", (unsigned long long)h.trace_size,
                         "heap_offset", (unsigned long long)h.heap_offset, "heap_size",
                         (unsigned long long)h.heap_size);
}

static PyObject *py_host_wake_fn(PyObject *m, PyObject *noargs) {
    return PyLong_FromVoidPtr((void *)(uintptr_t)&hle_host_wake);
}

/* status_valid(s) -> bool: hl_status_valid, for the Python checker */
static PyObject *py_status_valid(PyObject *m, PyObject *arg) {
    unsigned long long s = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    return PyBool_FromLong(hl_status_valid(s));
}

static PyObject *py_set_status(PyObject *m, PyObject *args) {
    PyObject *cls, *map;
    if (!PyArg_ParseTuple(args, "OO!", &cls, &PyDict_Type, &map)) return NULL;
    if (hlpy_set_status(cls, map) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"host_wake_fn", py_host_wake_fn, METH_NOARGS, "address of void hl_host_wake(void *futex_word)"},
    {"set_status", py_set_status, METH_VARARGS, NULL},
    {"status_valid", py_status_valid, METH_O, "hl_status_valid(s): a status a fence can complete with"},
    {"layout", py_layout, METH_VARARGS, "layout(fences, participants, queues, trace, heap) -> offsets"},
    {"agent_table", hlpy_agent_table, METH_VARARGS, "agent_table(kind, c_kernels=0) -> (present, map): an empty table's default"},
    {"blas_probe", hlpy_blas_probe, METH_VARARGS, "blas_probe(path, threads=0) -> (loaded, why): the BLAS an agent would use"},
    {"handle_method", hlpy_handle_method, METH_O, "handle_method(i): Fence.signal/wait, Timeline.signal/wait (0..3)"},
    {NULL, NULL, 0, NULL},
};

/* ---- hostless._core.testing: hooks that make a test's failure happen ---- */

static Core *core_arg(PyObject *o) {
    if (!PyObject_TypeCheck(o, &CoreType)) {
        PyErr_SetString(PyExc_TypeError, "the first argument is a hostless._core.Core (dom._core)");
        return NULL;
    }
    return (Core *)o;
}

/* device_store(core, handle, word): store a word like a device would (one
 * plain 64-bit store, no wake, no propagation). */
static PyObject *t_device_store(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "device_store(core, handle, word)");
        return NULL;
    }
    Core *c = core_arg(args[0]);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(args[1]);
    uint64_t v = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int r = hle_device_store(&c->ctx, h, v);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* queue_reserve_stuck(core, queue, signal) -> index: reserve a cell, write
 * only its signal handle, and stop (as a producer killed while filling). */
static PyObject *t_queue_reserve_stuck(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_reserve_stuck(core, queue, signal)");
        return NULL;
    }
    Core *c = core_arg(args[0]);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    uint64_t h, sig, w;
    if (hlpy_handle_arg(args[1], &h) < 0 || hlpy_handle_arg(args[2], &sig) < 0) return NULL;
    int r = hle_queue_reserve_stuck(&c->ctx, h, sig, &w);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(w);
}

/* heap_lock_forever(core): take the heap lock and never give it back (as a
 * holder killed inside the critical section would). */
static PyObject *t_heap_lock_forever(PyObject *m, PyObject *arg) {
    Core *c = core_arg(arg);
    if (!c) return NULL;
    NEED_ATTACHED(c);
    int r = hle_heap_lock_forever(&c->ctx);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

static PyMethodDef testing_methods[] = {
    {"device_store", (PyCFunction)(void (*)(void))t_device_store, METH_FASTCALL, NULL},
    {"queue_reserve_stuck", (PyCFunction)(void (*)(void))t_queue_reserve_stuck, METH_FASTCALL, NULL},
    {"heap_lock_forever", (PyCFunction)t_heap_lock_forever, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef testingmodule = {PyModuleDef_HEAD_INIT, "hostless._core.testing",
                                           "test hooks of the C core (not for production code)", -1,
                                           testing_methods};

PyObject *hlpy_testing_module(void) { return PyModule_Create(&testingmodule); }

static struct PyModuleDef coremodule = {PyModuleDef_HEAD_INIT, "hostless._core", "hostless C core", -1,
                                        module_methods};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    if (PyType_Ready(&HandleType) < 0) return NULL;
    PyObject *m = PyModule_Create(&coremodule);
    if (!m) return NULL;
    Py_INCREF(&CoreType);
    PyModule_AddObject(m, "Core", (PyObject *)&CoreType);
    Py_INCREF(&HandleType);
    PyModule_AddObject(m, "Handle", (PyObject *)&HandleType);
    PyObject *testing = hlpy_testing_module();
    if (!testing || PyModule_AddObject(m, "testing", testing) < 0 || hlpy_add_abi_constants(m) < 0) {
        Py_XDECREF(testing);
        Py_DECREF(m);
        return NULL;
    }
    /* the exception classes, by name (retried at the first error if hostless.errors cannot be imported now) */
    if (hlpy_errors_init() < 0) PyErr_Clear();
    return m;
}
