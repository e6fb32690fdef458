// One owned reference to a Python object, released at scope exit (the Python
// C API code of python/src/: module_walk.cc, portable_bind.cc).
#pragma once

#include <Python.h>

namespace tsar::python {

struct PyRef {
  PyObject* p;
  explicit PyRef(PyObject* o = nullptr) : p(o) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { Py_XDECREF(p); }
};

}  // namespace tsar::python
