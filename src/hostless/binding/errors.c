/*
 * errors.c -- the one table from engine codes to exception classes, and the
 * GIL hooks the engine calls around its blocking sections.
 *
 * The hostless classes are looked up by name in hostless.errors when the
 * module is imported (hostless.errors imports nothing of hostless, so there
 * is no cycle); until then, or if that fails, built-in classes stand in.
 */
#include "binding.h"

#include <pythread.h>

#define HLPY_E_DEVICE_BUFFER -1000 /* binding only: host access to a device buffer */

static const struct {
    int code;
    const char *name;   /* class in hostless.errors, or NULL */
    PyObject **builtin; /* stand-in, and the class for codes without a hostless one */
} table[] = {
    {HL_E_CORRUPT, "CorruptDomain", &PyExc_RuntimeError},
    {HL_E_HANDLE, "InvalidHandle", &PyExc_ValueError},
    {HL_E_ALREADY, "AlreadySignaled", &PyExc_RuntimeError},
    {HL_E_KIND, "InvalidHandle", &PyExc_ValueError},
    {HL_E_VALUE, NULL, &PyExc_ValueError},
    {HL_E_FAILED, "AlreadySignaled", &PyExc_RuntimeError},
    {HL_E_FULL, "QueueFull", &PyExc_RuntimeError},
    {HL_E_CLOSED, "DomainClosed", &PyExc_RuntimeError},
    {HL_E_OOM, "OutOfMemory", &PyExc_MemoryError},
    {HL_E_TIMEOUT, NULL, &PyExc_TimeoutError},
    {HL_E_QUEUE_FULL, "QueueFull", &PyExc_RuntimeError},
    {HL_E_INVALID, "InvalidOperation", &PyExc_RuntimeError},
    {HL_E_TABLE_FULL, "DomainFull", &PyExc_RuntimeError},
    {HL_E_LOCKED, "HostlessError", &PyExc_RuntimeError},
    {HL_E_OS, NULL, &PyExc_OSError},
    {HL_E_NOMEM, NULL, &PyExc_MemoryError},
    {HL_E_RANGE, NULL, &PyExc_IndexError},
    {HL_E_EXISTS, "NameTaken", &PyExc_KeyError},
    {HL_E_NOT_FOUND, NULL, &PyExc_KeyError},
    {HL_E_DEVICE_FULL, "DeviceHeapFull", &PyExc_MemoryError},
    {HL_E_VERSION, "DomainVersionMismatch", &PyExc_RuntimeError},
    {HLPY_E_DEVICE_BUFFER, "DeviceBufferError", &PyExc_BufferError},
};
#define NCODES (sizeof table / sizeof table[0])
static PyObject *classes[NCODES];
static int looked_up;

int hlpy_errors_init(void) {
    PyObject *mod = PyImport_ImportModule("hostless.errors");
    if (!mod) return -1;
    for (size_t i = 0; i < NCODES; i++) {
        if (!table[i].name) continue;
        PyObject *cls = PyObject_GetAttrString(mod, table[i].name);
        if (!cls) {
            Py_DECREF(mod);
            return -1;
        }
        Py_XSETREF(classes[i], cls);
    }
    Py_DECREF(mod);
    looked_up = 1;
    return 0;
}

PyObject *hlpy_exc(int code) {
    if (!looked_up && hlpy_errors_init() < 0) PyErr_Clear();
    for (size_t i = 0; i < NCODES; i++)
        if (table[i].code == code) return classes[i] ? classes[i] : *table[i].builtin;
    return PyExc_RuntimeError;
}

PyObject *hlpy_device_buffer_error(void) { return hlpy_exc(HLPY_E_DEVICE_BUFFER); }

PyObject *hlpy_raise(int code) {
    if (code == HL_E_INTR) {
        if (!PyErr_Occurred()) PyErr_SetNone(PyExc_KeyboardInterrupt);
        return NULL;
    }
    if (code == HL_E_OS) {
        errno = hle_errno();
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (code == HL_E_NOMEM) return PyErr_NoMemory();
    PyErr_SetString(hlpy_exc(code), hle_errmsg());
    return NULL;
}

int hlpy_raise_int(int code) {
    hlpy_raise(code);
    return -1;
}

/* ---- GIL hooks ---- */

static unsigned long main_ident;

static void *hk_unlock(void) { return PyEval_SaveThread(); }
static void hk_relock(void *token) { PyEval_RestoreThread((PyThreadState *)token); }
/* Signal handlers run in the main thread only: only it needs the slices. */
static int hk_interruptible(void) { return PyThread_get_thread_ident() == main_ident; }
static int hk_interrupted(void **token) {
    PyEval_RestoreThread((PyThreadState *)*token);
    int r = PyErr_CheckSignals();
    *token = PyEval_SaveThread();
    return r < 0;
}

void hlpy_set_hooks(hle_ctx *c) {
    if (!main_ident) {
        PyObject *th = PyImport_ImportModule("threading");
        PyObject *mt = th ? PyObject_CallMethod(th, "main_thread", NULL) : NULL;
        PyObject *id = mt ? PyObject_GetAttrString(mt, "ident") : NULL;
        main_ident = id ? PyLong_AsUnsignedLong(id) : PyThread_get_thread_ident();
        if (PyErr_Occurred()) PyErr_Clear();
        Py_XDECREF(id);
        Py_XDECREF(mt);
        Py_XDECREF(th);
    }
    c->hooks.unlock = hk_unlock;
    c->hooks.relock = hk_relock;
    c->hooks.interruptible = hk_interruptible;
    c->hooks.interrupted = hk_interrupted;
}
