/*
 * names.c -- Core's name-table methods (the engine's core/names.c):
 * name_publish(name, handle, replace), name_remove(name, handle=0),
 * name_lookup(name) -> handle or None, name_list() -> [(name, handle)],
 * name_seq() -> int.
 */
#include "binding.h"

static int name_arg(PyObject *o, const char **s, Py_ssize_t *n) {
    if (!PyUnicode_Check(o)) {
        PyObject *tn = hlpy_type_name(o);
        if (tn) PyErr_Format(PyExc_TypeError, "a name is a str, got %U", tn);
        Py_XDECREF(tn);
        return -1;
    }
    *s = PyUnicode_AsUTF8AndSize(o, n);
    return *s ? 0 : -1;
}

PyObject *Core_name_publish(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    const char *s;
    Py_ssize_t n;
    uint64_t h, existing = 0;
    NEED_ATTACHED(c);
    if (nargs != 3) return PyErr_Format(PyExc_TypeError, "name_publish(name, handle, replace)");
    if (name_arg(args[0], &s, &n) < 0 || hlpy_handle_arg(args[1], &h) < 0) return NULL;
    int replace = PyObject_IsTrue(args[2]);
    if (replace < 0) return NULL;
    int r = hle_name_publish(&c->ctx, s, (size_t)n, h, replace, &existing);
    return r ? hlpy_raise(r) : Py_NewRef(Py_None);
}

PyObject *Core_name_remove(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    const char *s;
    Py_ssize_t n;
    uint64_t h = 0;
    NEED_ATTACHED(c);
    if (nargs < 1 || nargs > 2) return PyErr_Format(PyExc_TypeError, "name_remove(name, handle=0)");
    if (name_arg(args[0], &s, &n) < 0 || (nargs == 2 && args[1] != Py_None && hlpy_handle_arg(args[1], &h) < 0))
        return NULL;
    int r = hle_name_remove(&c->ctx, s, (size_t)n, h);
    return r ? hlpy_raise(r) : Py_NewRef(Py_None);
}

PyObject *Core_name_lookup(Core *c, PyObject *name) {
    const char *s;
    Py_ssize_t n;
    uint64_t h = 0;
    NEED_ATTACHED(c);
    if (name_arg(name, &s, &n) < 0) return NULL;
    int r = hle_name_lookup(&c->ctx, s, (size_t)n, &h);
    if (r == HL_E_NOT_FOUND) Py_RETURN_NONE;
    return r ? hlpy_raise(r) : PyLong_FromUnsignedLongLong(h);
}

static int add_entry(void *ctx, const char *name, uint64_t handle) {
    PyObject *item = Py_BuildValue("(sK)", name, (unsigned long long)handle);
    if (!item) {
        PyErr_Clear(); /* a cell that is not UTF-8 (shared memory): skip it */
        return 0;
    }
    int r = PyList_Append((PyObject *)ctx, item);
    Py_DECREF(item);
    return r < 0 ? HL_E_NOMEM : 0;
}

PyObject *Core_name_list(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    int r = hle_name_list(&c->ctx, add_entry, out);
    if (r < 0) {
        Py_DECREF(out);
        return r == HL_E_NOMEM ? NULL : hlpy_raise(r);
    }
    return out;
}

PyObject *Core_name_seq(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    return PyLong_FromUnsignedLong(hle_name_seq(&c->ctx));
}
