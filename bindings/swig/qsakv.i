/* qsakv.i -- SWIG interface of include/qsakv.h: the compiled Python module `qsakv_swig`.
 *
 * The whole header is wrapped as it stands (SWIG parses it; nothing is restated here
 * except how C idioms become Python ones):
 * - a failing qsakv_status raises qsakv_swig.QsakvError (one subclass per status,
 *   e.g. OverlayIncompleteError) carrying .status and the thread's qsakv_last_error(),
 *   which is then cleared; a success returns the out-parameters (or None);
 * - `T** out` handles become return values that own the object: the proxy destroys
 *   it when collected (%newobject semantics through SWIG_POINTER_OWN), and calling
 *   qsakv_T_destroy(h) disowns it (%delobject), so nothing is freed twice (a second
 *   destroy of the same proxy is a no-op);
 *   a cache keeps its context alive, a plan its cache, a calibration handle its
 *   context (Python references set on the returned proxies);
 * - info / layout / geometry structs are returned (struct_size and version filled);
 *   option and config structs are constructed with struct_size and version set;
 * - char out_hex[65] and float* outputs are returned;
 * - pointer arguments (device or host buffers) take an int address, None (NULL), or
 *   any object with __cuda_array_interface__ / __array_interface__ (NumPy, CuPy,
 *   torch fp16 ...): the object must stay alive, and for async calls unchanged, until
 *   the work ran. Struct members of pointer type read back as int addresses;
 * - qsakv_stream_t takes None, an int, an object with __cuda_stream__, a torch stream
 *   (.cuda_stream) or a CuPy stream (.ptr);
 * - int32_t array members (qsa_layers) read as lists and are set from sequences.
 * This is the thin layer; the `qsakv` ctypes package is the Pythonic one.
 */
%module(docstring="SWIG bindings of libqsakv (include/qsakv.h); see bindings/swig/qsakv.i") qsakv_swig

%{
#include <string.h>
#include <stdlib.h>
#include "qsakv.h"

static PyObject* qsakv_swig_error_factory = NULL;

/* Raises the exception of `status` with the calling thread's message, then clears it. */
static void qsakv_swig_raise(qsakv_status status) {
  const char* msg = qsakv_last_error();
  PyObject* exc = NULL;
  if (qsakv_swig_error_factory)
    exc = PyObject_CallFunction(qsakv_swig_error_factory, "is", (int)status, msg);
  if (exc) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  } else if (!PyErr_Occurred()) {
    PyErr_Format(PyExc_RuntimeError, "%s: %s", qsakv_status_string(status), msg);
  }
  qsakv_clear_error();
}

/* An address from an int, None, or an object exposing an array interface. */
static int qsakv_swig_address(PyObject* o, void** out) {
  static const char* const attrs[] = {"__cuda_array_interface__", "__array_interface__"};
  if (o == Py_None) { *out = NULL; return 0; }
  if (PyLong_Check(o)) {
    *out = PyLong_AsVoidPtr(o);
    return PyErr_Occurred() ? -1 : 0;
  }
  for (size_t i = 0; i < 2; ++i) {
    PyObject* iface = PyObject_GetAttrString(o, attrs[i]);
    if (!iface) { PyErr_Clear(); continue; }
    PyObject* data = PyDict_Check(iface) ? PyDict_GetItemString(iface, "data") : NULL;
    PyObject* addr = data && PyTuple_Check(data) && PyTuple_Size(data) > 0
                         ? PyTuple_GetItem(data, 0) : NULL;
    int ok = addr && PyLong_Check(addr);
    if (ok) *out = PyLong_AsVoidPtr(addr);
    Py_DECREF(iface);
    if (ok) return PyErr_Occurred() ? -1 : 0;
  }
  PyErr_Format(PyExc_TypeError, "expected an address (int), None, or an array with "
               "__cuda_array_interface__ / __array_interface__, got %s", Py_TYPE(o)->tp_name);
  return -1;
}

static int qsakv_swig_stream(PyObject* o, qsakv_stream_t* out) {
  static const char* const attrs[] = {"cuda_stream", "ptr", "handle"};
  void* p = NULL;
  if (o == Py_None) { *out = NULL; return 0; }
  if (PyLong_Check(o)) {
    p = PyLong_AsVoidPtr(o);
    *out = (qsakv_stream_t)p;
    return PyErr_Occurred() ? -1 : 0;
  }
  if (PyObject_HasAttrString(o, "__cuda_stream__")) {
    PyObject* v = PyObject_CallMethod(o, "__cuda_stream__", NULL);
    if (!v) return -1;
    PyObject* h = PyTuple_Check(v) && PyTuple_Size(v) == 2 ? PyTuple_GetItem(v, 1) : v;
    p = PyLong_Check(h) ? PyLong_AsVoidPtr(h) : NULL;
    int ok = PyLong_Check(h);
    Py_DECREF(v);
    if (ok) { *out = (qsakv_stream_t)p; return PyErr_Occurred() ? -1 : 0; }
  }
  for (size_t i = 0; i < 3; ++i) {
    PyObject* v = PyObject_GetAttrString(o, attrs[i]);
    if (!v) { PyErr_Clear(); continue; }
    int ok = PyLong_Check(v);
    if (ok) p = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    if (ok) { *out = (qsakv_stream_t)p; return PyErr_Occurred() ? -1 : 0; }
  }
  PyErr_Format(PyExc_TypeError, "stream: expected None, an int, an object with "
               "__cuda_stream__, a torch or CuPy stream; got %s", Py_TYPE(o)->tp_name);
  return -1;
}
%}

/* stdint.i makes int64_t `long` only with SWIGWORDSIZE64 (set by CMake on LP64
 * platforms); otherwise `long long`, which C compilers reject for int64_t* on Linux. */
%include <stdint.i>
%include <typemaps.i>

/* ---- status -> exception ------------------------------------------------------------ */
%typemap(out) qsakv_status {
  if ($1 != QSAKV_SUCCESS) {
    qsakv_swig_raise($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}
/* qsakv_status_string takes a status as a plain int. */
%typemap(in) qsakv_status = int;

%inline %{
/* Registers the callable (status, message) -> exception instance (done at import). */
void _set_error_factory(PyObject* factory) {
  Py_XINCREF(factory);
  Py_XDECREF(qsakv_swig_error_factory);
  qsakv_swig_error_factory = factory;
}
%}

/* ---- handles: T** out -> owned return value; destroy disowns ------------------------ */
%define QSAKV_HANDLE(TYPE, DESTROY, ARG)
%nodefaultctor TYPE;
struct TYPE {};
%pythondynamic TYPE;
%extend TYPE {
  ~TYPE() { DESTROY($self); }
}
%typemap(in, numinputs=0) TYPE** out (TYPE* tmp = NULL) { $1 = &tmp; }
%typemap(argout) TYPE** out {
  $result = SWIG_Python_AppendOutput($result,
      SWIG_NewPointerObj(SWIG_as_voidptr(*$1), $*1_descriptor, SWIG_POINTER_OWN));
}
%delobject DESTROY;
/* Destroying a handle the proxy no longer owns (destroyed already) is a no-op. */
%pythonprepend DESTROY %{
    if ARG is not None and not ARG.thisown:
        return
%}
%enddef

QSAKV_HANDLE(qsakv_context, qsakv_context_destroy, context)
QSAKV_HANDLE(qsakv_overlay, qsakv_overlay_destroy, overlay)
QSAKV_HANDLE(qsakv_cache, qsakv_cache_destroy, cache)
QSAKV_HANDLE(qsakv_plan, qsakv_plan_destroy, plan)
QSAKV_HANDLE(qsakv_calib, qsakv_calib_destroy, calib)

/* ---- versioned structs: constructed ready to use; out-structs returned ---------------- */
%define QSAKV_VERSIONED(TYPE, VERSION)
%extend TYPE {
  TYPE() {
    TYPE* s = (TYPE*)calloc(1, sizeof(TYPE));
    if (s) { s->struct_size = sizeof(TYPE); s->version = VERSION; }
    return s;
  }
}
%enddef

%define QSAKV_OUT_STRUCT(TYPE, VERSION)
QSAKV_VERSIONED(TYPE, VERSION)
%typemap(in, numinputs=0) TYPE* (TYPE tmp) {
  memset(&tmp, 0, sizeof tmp);
  tmp.struct_size = sizeof tmp;
  tmp.version = VERSION;
  $1 = &tmp;
}
%typemap(argout) TYPE* {
  TYPE* copy = (TYPE*)malloc(sizeof(TYPE));
  if (!copy) SWIG_exception_fail(SWIG_MemoryError, "out of memory");
  *copy = *$1;
  $result = SWIG_Python_AppendOutput($result,
      SWIG_NewPointerObj(SWIG_as_voidptr(copy), $1_descriptor, SWIG_POINTER_OWN));
}
%enddef

QSAKV_VERSIONED(qsakv_context_options, QSAKV_CONTEXT_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_model_config, QSAKV_MODEL_CONFIG_VERSION)
QSAKV_VERSIONED(qsakv_overlay_write_options, QSAKV_OVERLAY_WRITE_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_cache_options, QSAKV_CACHE_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_plan_options, QSAKV_PLAN_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_batch, QSAKV_BATCH_VERSION)
QSAKV_OUT_STRUCT(qsakv_context_info, QSAKV_CONTEXT_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_rank_geometry, QSAKV_RANK_GEOMETRY_VERSION)
QSAKV_OUT_STRUCT(qsakv_overlay_info, QSAKV_OVERLAY_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_capacity, QSAKV_CAPACITY_VERSION)
QSAKV_OUT_STRUCT(qsakv_cache_layout, QSAKV_CACHE_LAYOUT_VERSION)
QSAKV_OUT_STRUCT(qsakv_plan_info, QSAKV_PLAN_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_calib_info, QSAKV_CALIB_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_calib_stats, QSAKV_CALIB_STATS_VERSION)
QSAKV_OUT_STRUCT(qsakv_calib_summary, QSAKV_CALIB_SUMMARY_VERSION)

/* qsakv_layer_buffers has no struct_size: a plain out-struct. */
%typemap(in, numinputs=0) qsakv_layer_buffers* (qsakv_layer_buffers tmp) {
  memset(&tmp, 0, sizeof tmp);
  $1 = &tmp;
}
%typemap(argout) qsakv_layer_buffers* {
  qsakv_layer_buffers* copy = (qsakv_layer_buffers*)malloc(sizeof *copy);
  if (!copy) SWIG_exception_fail(SWIG_MemoryError, "out of memory");
  *copy = *$1;
  $result = SWIG_Python_AppendOutput($result,
      SWIG_NewPointerObj(SWIG_as_voidptr(copy), $1_descriptor, SWIG_POINTER_OWN));
}

/* String members of option structs own a copy (freed on reassignment and with the
 * struct), so setting them neither dangles nor leaks. */
%typemap(memberin) const char* layer_prefix, const char* base_index_path {
  free((char*)$1);
  $1 = $input ? strdup($input) : NULL;
}
%extend qsakv_overlay_write_options {
  ~qsakv_overlay_write_options() {
    free((char*)$self->layer_prefix);
    free((char*)$self->base_index_path);
    free($self);
  }
}

/* ---- scalar and string outputs ------------------------------------------------------- */
%apply float* OUTPUT { float* k_scale, float* v_scale, float* scale };
%typemap(in, numinputs=0) char out_hex[65] (char tmp[65]) { tmp[0] = 0; $1 = tmp; }
%typemap(argout) char out_hex[65] {
  $result = SWIG_Python_AppendOutput($result, PyUnicode_FromString($1));
}
%typemap(in, numinputs=0) void** out (void* tmp = NULL) { $1 = &tmp; }
%typemap(argout) void** out {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr(*$1));
}

/* ---- buffers: addresses ------------------------------------------------------------- */
%typemap(in) void*, const void*, int32_t*, const int32_t*, const int64_t*, const float*,
             uint64_t* {
  void* p = NULL;
  if (qsakv_swig_address($input, &p) != 0) SWIG_fail;
  $1 = ($1_ltype)p;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) void*, const void*, int32_t*,
    const int32_t*, const int64_t*, const float*, uint64_t* { $1 = 1; }
%typemap(out) void*, int32_t*, const int32_t*, const float* {
  $result = PyLong_FromVoidPtr((void*)$1);
}
/* Struct members of pointer type are stored as given (the memory is the caller's). */
%typemap(memberin) void*, const void*, int32_t*, const int32_t*, const int64_t*,
                   const float* { $1 = $input; }

/* qsakv_calib_merge: a sequence of calibration handles. */
%typemap(in) const qsakv_calib* const* inputs (PyObject* seq = NULL) {
  seq = PySequence_Fast($input, "inputs: expected a sequence of qsakv_calib");
  if (!seq) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  $1 = (qsakv_calib**)calloc(n ? (size_t)n : 1, sizeof(qsakv_calib*));
  for (Py_ssize_t i = 0; i < n; ++i) {
    void* p = NULL;
    if (!SWIG_IsOK(SWIG_ConvertPtr(PySequence_Fast_GET_ITEM(seq, i), &p,
                                   SWIGTYPE_p_qsakv_calib, 0))) {
      PyErr_SetString(PyExc_TypeError, "inputs: expected qsakv_calib handles");
      SWIG_fail;
    }
    $1[i] = (qsakv_calib*)p;
  }
}
%typemap(freearg) const qsakv_calib* const* inputs {
  free((void*)$1);
  Py_XDECREF(seq$argnum);
}

/* ---- streams ------------------------------------------------------------------------ */
%typemap(in) qsakv_stream_t {
  if (qsakv_swig_stream($input, &$1) != 0) SWIG_fail;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) qsakv_stream_t { $1 = 1; }

/* ---- int32_t arrays in structs (qsa_layers) ----------------------------------------- */
%typemap(out) int32_t [ANY] {
  $result = PyList_New($1_dim0);
  for (Py_ssize_t i = 0; i < $1_dim0; ++i)
    PyList_SetItem($result, i, PyLong_FromLong((long)$1[i]));
}
%typemap(in) int32_t [ANY] (int32_t tmp[$1_dim0]) {
  PyObject* seq = PySequence_Fast($input, "expected a sequence of ints");
  if (!seq) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > $1_dim0) {
    Py_DECREF(seq);
    SWIG_exception_fail(SWIG_ValueError, "too many values (at most $1_dim0)");
  }
  for (Py_ssize_t i = 0; i < $1_dim0; ++i)
    tmp[i] = i < n ? (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i)) : 0;
  Py_DECREF(seq);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = tmp;
}
%typemap(memberin) int32_t [ANY] { memcpy($1, $input, sizeof($1)); }

/* ---- ownership between handles ------------------------------------------------------ */
%pythonappend qsakv_cache_create %{
    val._context = context  # the context must outlive the cache
%}
%pythonappend qsakv_plan_create %{
    val._cache = cache  # the cache must outlive the plan
%}
%pythonappend qsakv_calib_create %{
    val._context = context
%}

/* The version macros live in the generated qsakv_version.h (CMake's project version),
   which SWIG does not follow from qsakv.h by itself. */
%include "qsakv_version.h"
%include "qsakv.h"

%pythoncode %{
import re as _re


class QsakvError(Exception):
    """A libqsakv call failed: .status (code), .status_name, .message (the library's)."""

    status = None

    def __init__(self, status, message=""):
        super().__init__(status, message)
        self.status, self.message = status, message

    @property
    def status_name(self):
        return qsakv_status_string(self.status)

    def __str__(self):
        return f"{self.status_name}: {self.message}"


_ERRORS = {}
for _name, _value in list(globals().items()):
    if _name.startswith("QSAKV_ERROR_") and isinstance(_value, int):
        _cls_name = "".join(w.capitalize() for w in _name[12:].split("_")) + "Error"
        _ERRORS[_value] = globals()[_cls_name] = type(_cls_name, (QsakvError,), {"status": _value})


def _make_error(status, message):
    return _ERRORS.get(status, QsakvError)(status, message)


_set_error_factory(_make_error)
%}
