// A batch's row ids as prefetch_rows is handed them, copied as int64 and checked against
// the table's rows in one pass, called as a Python function (a module, unlike the other
// helpers, which ctypes loads). The caller's thread runs this once per table and step just
// after backward, when little of its code is in the caches: one call instead of numpy's
// cast, its reduction and ctypes' reading of two addresses. Needs nothing of MXNet.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

#include "ids_in_table.h"

namespace {

// Whether the ids of a buffer of format ``format`` (one struct character: float32,
// float64, int32 or int64) fit, copied into ``out``; false for any other format.
bool copy_ids(const Py_buffer& ids, int64_t rows, int64_t* out) {
  const char* format = ids.format;
  if (format[0] == '=' || format[0] == '@') ++format;   // (native order; numpy writes none)
  if (format[0] == '\0' || format[1] != '\0') return false;
  const Py_ssize_t count = ids.len / ids.itemsize;
  using kvhybrid::ids_in_table;
  switch (format[0]) {
    case 'f': return ids.itemsize == 4 && ids_in_table<float>(ids.buf, count, rows, out);
    case 'd': return ids.itemsize == 8 && ids_in_table<double>(ids.buf, count, rows, out);
    case 'i': return ids.itemsize == 4 && ids_in_table<int32_t>(ids.buf, count, rows, out);
    case 'l':
    case 'q': return ids.itemsize == 8 && ids_in_table<int64_t>(ids.buf, count, rows, out);
    default: return false;
  }
}

// ids_in_table(ids, out, rows) -> bool: ``ids`` (a C-contiguous buffer of float32,
// float64, int32 or int64 values) copied as int64 into ``out`` (a writable int64 buffer of
// as many) if each lies in [0, rows). False where one does not, or the buffers are not
// that (the caller then reads the ids with numpy, which names a bad one); ``out`` may be
// written in part then.
PyObject* ids_in_table_py(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "ids_in_table takes ids, out and rows");
    return nullptr;
  }
  const long long rows = PyLong_AsLongLong(args[2]);
  if (rows == -1 && PyErr_Occurred()) return nullptr;
  Py_buffer ids, out;
  if (PyObject_GetBuffer(args[0], &ids, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    PyErr_Clear();   // (not a buffer: numpy reads it)
    Py_RETURN_FALSE;
  }
  if (PyObject_GetBuffer(args[1], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT)
      != 0) {
    PyBuffer_Release(&ids);
    return nullptr;   // (the caller's own array: a bug, not bad input)
  }
  const bool fits = ids.itemsize > 0 && out.itemsize == 8 &&
                    out.len == ids.len / ids.itemsize * 8 &&
                    copy_ids(ids, rows, static_cast<int64_t*>(out.buf));
  PyBuffer_Release(&out);
  PyBuffer_Release(&ids);
  return PyBool_FromLong(fits);
}

PyMethodDef methods[] = {
    {"ids_in_table", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(ids_in_table_py)),
     METH_FASTCALL, "Copy a batch's row ids as int64 if each lies in [0, rows)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ids",
                      "A batch's row ids, copied and checked in one pass.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__ids() { return PyModule_Create(&module); }
