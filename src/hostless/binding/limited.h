/*
 * limited.h -- the binding against the limited C API (an abi3 extension:
 * setup.py's HOSTLESS_LIMITED_API=1 defines Py_LIMITED_API=0x030B0000).
 * The macros the binding uses that the limited API lacks become their
 * checked function forms, so the call sites read the same in both builds;
 * the types are heap types (PyType_FromSpec) in both.  Included by binding.h.
 */
#ifndef HOSTLESS_BINDING_LIMITED_H
#define HOSTLESS_BINDING_LIMITED_H

#ifndef HOSTLESS_INTERNAL
#error "binding/limited.h is internal to the hostless extension"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef Py_LIMITED_API
#if Py_LIMITED_API + 0 < 0x030B0000
#error "the binding needs the limited API of 3.11 or later (the buffer protocol)"
#endif
#define PyTuple_GET_ITEM(t, i) PyTuple_GetItem((t), (i))
#define PyTuple_GET_SIZE(t) PyTuple_Size(t)
#define PyTuple_SET_ITEM(t, i, v) ((void)PyTuple_SetItem((t), (i), (v))) /* a fresh tuple: cannot fail */
#define PyList_GET_ITEM(l, i) PyList_GetItem((l), (i))
#define PyList_GET_SIZE(l) PyList_Size(l)
#define PyList_SET_ITEM(l, i, v) ((void)PyList_SetItem((l), (i), (v))) /* a fresh list: cannot fail */
/* the result of PySequence_Fast: a list or a tuple */
#undef PySequence_Fast_GET_ITEM
#undef PySequence_Fast_GET_SIZE
#define PySequence_Fast_GET_ITEM(s, i) (PyList_Check(s) ? PyList_GetItem((s), (i)) : PyTuple_GetItem((s), (i)))
#define PySequence_Fast_GET_SIZE(s) (PyList_Check(s) ? PyList_Size(s) : PyTuple_Size(s))
#define PyDict_GET_SIZE(d) PyDict_Size(d)
#define PyBytes_AS_STRING(b) PyBytes_AsString(b)
#define PyBytes_GET_SIZE(b) PyBytes_Size(b)
#define PyFloat_AS_DOUBLE(f) PyFloat_AsDouble(f)
#define PyUnicode_AsUTF8(u) PyUnicode_AsUTF8AndSize((u), NULL)
#define PyObject_CallOneArg(f, a) PyObject_CallFunctionObjArgs((f), (a), NULL)
#define PyObject_CallMethodNoArgs(o, name) PyObject_CallMethodObjArgs((o), (name), NULL)
#endif

#ifndef Py_XSETREF
#define Py_XSETREF(dst, src)                                                                      \
    do {                                                                                          \
        PyObject **_dst = (PyObject **)&(dst);                                                    \
        PyObject *_old = *_dst;                                                                   \
        *_dst = (PyObject *)(src);                                                                \
        Py_XDECREF(_old);                                                                         \
    } while (0)
#endif

/* A type's allocator and deallocator (slots: the limited API has no PyTypeObject fields). */
static inline PyObject *hlpy_alloc(PyTypeObject *t, Py_ssize_t n) {
#ifdef Py_LIMITED_API
    allocfunc f = (allocfunc)PyType_GetSlot(t, Py_tp_alloc);
    return f(t, n);
#else
    return t->tp_alloc(t, n);
#endif
}

/* The end of a heap type's tp_dealloc: free the object, then drop its type's
 * reference (a heap subtype's subtype_dealloc leaves that to its heap base). */
static inline void hlpy_free(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
#ifdef Py_LIMITED_API
    freefunc f = (freefunc)PyType_GetSlot(t, Py_tp_free);
    f(o);
#else
    t->tp_free(o);
#endif
    Py_DECREF(t);
}

/* The name of o's type (a new str), for messages. */
static inline PyObject *hlpy_type_name(PyObject *o) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyType_GetName(Py_TYPE(o));
#else
    return PyUnicode_FromString(Py_TYPE(o)->tp_name);
#endif
}

#endif
