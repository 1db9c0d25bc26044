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
 * - char out_hex[65] / sha256_hex[65] and float* outputs are returned, so is
 *   qsakv_overlay_read_scale_file's *num_layers: it returns [num_layers, sha256] and
 *   writes the scales into the caller's arrays (layers int32, k_scales / v_scales
 *   float32, each of `capacity`; None with capacity 0 asks for the count alone);
 * - pointer arguments (device or host buffers) take an int address, None (NULL), or
 *   any object with __cuda_array_interface__ / __array_interface__ (NumPy, CuPy,
 *   torch fp16 ...): the object must stay alive, and for async calls unchanged, until
 *   the work ran. Struct members of pointer type read back as int addresses;
 * - typed buffers: where a call reads or writes a counted buffer (store, observe,
 *   select, attention, overlay_write, read_scale_file, memcpy, get_stats' histogram,
 *   plan_update's batch arrays, cache_create's external top-k, cache_create_with_memory's
 *   arrays against their byte counts; calib_merge's count against its list), an
 *   array argument's element type must be the one the call reads (float16
 *   for FP16 activations, int64 slot mappings, int32 top-k ...) and it must hold every
 *   element the count implies: otherwise InvalidArgumentError naming the argument,
 *   before the library is called. An int address is taken as it is, unchecked (as in
 *   C); an array is the checked way;
 * - a destroyed handle (qsakv_X_destroy) raises ClosedError (a StateError) when used;
 *   destroying a context or cache destroys the caches / plans / calibration handles
 *   made on it first (the C API requires that order), and they raise ClosedError too;
 * - qsakv_stream_t takes None, an int, an object with __cuda_stream__, a torch stream
 *   (.cuda_stream) or a CuPy stream (.ptr);
 * - int32_t array members (qsa_layers) read as lists and are set from sequences; so is
 *   qsakv_cache_memory.layers, from a sequence of qsakv_layer_memory (copied when set);
 *   a cache over caller memory keeps that struct, and the arrays it was set from, alive.
 * This is the thin layer; the `qsakv` ctypes package is the Pythonic one.
 */
%module(docstring="SWIG bindings of libqsakv (include/qsakv.h); see bindings/swig/qsakv.i") qsakv_swig

%{
#include <stddef.h>
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

/* The qsakv_layer_memory array a qsakv_cache_memory.layers owns (set from a sequence):
 * its entry count sits before the entries, so the getter can list them. */
typedef struct qsakv_swig_layers {
  size_t n;
  qsakv_layer_memory items[];
} qsakv_swig_layers;
#define QSAKV_SWIG_LAYERS_OF(p) \
  ((qsakv_swig_layers*)((char*)(p) - offsetof(qsakv_swig_layers, items)))

static PyObject* qsakv_swig_closed_class = NULL;

/* 0 when the handle proxy `o` (and the context / cache it depends on) is usable; -1
 * with ClosedError set when it or one of them was destroyed. */
static int qsakv_swig_check_open(PyObject* o, const char* kind) {
  static const char* const parents[][2] = {{"_cache", "cache"}, {"_context", "context"}};
  if (o == Py_None) return 0;
  PyObject* flag = PyObject_GetAttrString(o, "_qsakv_closed");
  int closed = 0;
  if (flag) { closed = PyObject_IsTrue(flag); Py_DECREF(flag); } else { PyErr_Clear(); }
  if (closed) {
    char msg[160];
    snprintf(msg, sizeof msg, "this %s was destroyed (qsakv_%s_destroy): it cannot be used "
             "any more", kind, kind);
    PyObject* exc = qsakv_swig_closed_class
        ? PyObject_CallFunction(qsakv_swig_closed_class, "is", (int)QSAKV_ERROR_STATE, msg)
        : NULL;
    if (exc) { PyErr_SetObject((PyObject*)Py_TYPE(exc), exc); Py_DECREF(exc); }
    else if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, msg);
    return -1;
  }
  for (size_t i = 0; i < 2; ++i) {
    PyObject* parent = PyObject_GetAttrString(o, parents[i][0]);
    if (!parent) { PyErr_Clear(); continue; }
    int r = qsakv_swig_check_open(parent, parents[i][1]);
    Py_DECREF(parent);
    if (r != 0) return r;
  }
  return 0;
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
/* Registers ClosedError, raised for destroyed handles (done at import). */
void _set_closed_class(PyObject* cls) {
  Py_XINCREF(cls);
  Py_XDECREF(qsakv_swig_closed_class);
  qsakv_swig_closed_class = cls;
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
/* A handle argument: refused with ClosedError once destroyed (or its parent was). */
%typemap(in) TYPE*, const TYPE* {
  void* argp = NULL;
  if (qsakv_swig_check_open($input, #ARG) != 0) SWIG_fail;
  /* $disown: DESTROY (%delobject) takes the object from the proxy. */
  int res = SWIG_ConvertPtr($input, &argp, $descriptor(TYPE*), $disown | 0);
  if (!SWIG_IsOK(res)) {
    SWIG_exception_fail(SWIG_ArgError(res), "in method '$symname', argument $argnum of type '$type'");
  }
  $1 = ($ltype)argp;
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
    _destroy_children(ARG)  # a cache's plans, a context's caches: first, as in C
%}
%pythonappend DESTROY %{
    if ARG is not None:
        ARG._qsakv_closed = True
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
/* A config starts as qsakv_model_config_init leaves it (QSAKV_MODEL_CONFIG_INIT): zeroed
 * but for struct_size, version and the one defaulted field, index_key_dtype (FP16). */
%extend qsakv_model_config {
  qsakv_model_config() {
    qsakv_model_config* s = (qsakv_model_config*)calloc(1, sizeof(qsakv_model_config));
    if (s) (void)qsakv_model_config_init(s); /* fails only for NULL */
    return s;
  }
}
QSAKV_VERSIONED(qsakv_overlay_write_options, QSAKV_OVERLAY_WRITE_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_cache_options, QSAKV_CACHE_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_plan_options, QSAKV_PLAN_OPTIONS_VERSION)
QSAKV_VERSIONED(qsakv_batch, QSAKV_BATCH_VERSION)
QSAKV_VERSIONED(qsakv_step_stores, QSAKV_STEP_STORES_VERSION)
/* As QSAKV_CACHE_MEMORY_INIT leaves it (the header has no _init function for it). */
QSAKV_VERSIONED(qsakv_cache_memory, QSAKV_CACHE_MEMORY_VERSION)
QSAKV_OUT_STRUCT(qsakv_context_info, QSAKV_CONTEXT_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_rank_geometry, QSAKV_RANK_GEOMETRY_VERSION)
QSAKV_OUT_STRUCT(qsakv_overlay_info, QSAKV_OVERLAY_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_capacity, QSAKV_CAPACITY_VERSION)
QSAKV_OUT_STRUCT(qsakv_cache_layout, QSAKV_CACHE_LAYOUT_VERSION)
QSAKV_OUT_STRUCT(qsakv_layer_buffers, QSAKV_LAYER_BUFFERS_VERSION)
QSAKV_OUT_STRUCT(qsakv_plan_info, QSAKV_PLAN_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_calib_info, QSAKV_CALIB_INFO_VERSION)
QSAKV_OUT_STRUCT(qsakv_calib_stats, QSAKV_CALIB_STATS_VERSION)
QSAKV_OUT_STRUCT(qsakv_calib_summary, QSAKV_CALIB_SUMMARY_VERSION)

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

/* qsakv_cache_memory.layers: set from a sequence of qsakv_layer_memory (or None), whose
 * entries are copied into an array the struct owns (freed on reassignment and with the
 * struct); reads back as a list of copies. num_layers stays the caller's to set, as in C
 * (qsakv_cache_create_with_memory refuses more than the list holds). */
%typemap(in) const qsakv_layer_memory* layers (qsakv_swig_layers* block = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else {
    PyObject* seq = PySequence_Fast($input, "layers: expected a sequence of qsakv_layer_memory");
    if (!seq) SWIG_fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    block = (qsakv_swig_layers*)calloc(1, sizeof(qsakv_swig_layers) +
                                          (size_t)(n ? n : 1) * sizeof(qsakv_layer_memory));
    if (!block) { Py_DECREF(seq); SWIG_exception_fail(SWIG_MemoryError, "out of memory"); }
    for (Py_ssize_t i = 0; i < n; ++i) {
      void* p = NULL;
      if (!SWIG_IsOK(SWIG_ConvertPtr(PySequence_Fast_GET_ITEM(seq, i), &p,
                                     $descriptor(qsakv_layer_memory*), 0)) || !p) {
        free(block);
        Py_DECREF(seq);
        PyErr_Format(PyExc_TypeError, "layers[%zd]: expected a qsakv_layer_memory", i);
        SWIG_fail;
      }
      block->items[i] = *(const qsakv_layer_memory*)p;
    }
    Py_DECREF(seq);
    block->n = (size_t)n;
    $1 = block->items;
  }
}
%typemap(memberin) const qsakv_layer_memory* layers {
  if ($1) free(QSAKV_SWIG_LAYERS_OF($1));
  $1 = $input;
}
%typemap(out) const qsakv_layer_memory* layers {
  size_t n = $1 ? QSAKV_SWIG_LAYERS_OF($1)->n : 0;
  $result = PyList_New((Py_ssize_t)n);
  if (!$result) SWIG_fail;
  for (size_t i = 0; i < n; ++i) {
    qsakv_layer_memory* copy = (qsakv_layer_memory*)malloc(sizeof *copy);
    if (!copy) { Py_DECREF($result); SWIG_exception_fail(SWIG_MemoryError, "out of memory"); }
    *copy = $1[i];
    PyList_SET_ITEM($result, (Py_ssize_t)i,
        SWIG_NewPointerObj(SWIG_as_voidptr(copy), $descriptor(qsakv_layer_memory*),
                           SWIG_POINTER_OWN));
  }
}
%extend qsakv_cache_memory {
  ~qsakv_cache_memory() {
    if ($self->layers) free(QSAKV_SWIG_LAYERS_OF($self->layers));
    free($self);
  }
}

/* ---- scalar and string outputs ------------------------------------------------------- */
%apply float* OUTPUT { float* k_scale, float* v_scale, float* scale };
%typemap(in, numinputs=0) char out_hex[65] (char tmp[65]) { tmp[0] = 0; $1 = tmp; }
%typemap(argout) char out_hex[65] {
  $result = SWIG_Python_AppendOutput($result, PyUnicode_FromString($1));
}
%apply char out_hex[65] { char sha256_hex[65] };  /* qsakv_overlay_read_scale_file's */
/* qsakv_overlay_read_scale_file: the count of layers the file holds is returned. */
%typemap(in, numinputs=0) int32_t* num_layers (int32_t tmp = 0) { $1 = &tmp; }
%typemap(argout) int32_t* num_layers {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromLong((long)*$1));
}
%typemap(in, numinputs=0) void** out (void* tmp = NULL) { $1 = &tmp; }
%typemap(argout) void** out {
  $result = SWIG_Python_AppendOutput($result, PyLong_FromVoidPtr(*$1));
}

/* ---- buffers: addresses ------------------------------------------------------------- */
%typemap(in) void*, const void*, int32_t*, const int32_t*, const int64_t*, const float*,
             uint64_t*, float* k_scales, float* v_scales {
  void* p = NULL;
  if (qsakv_swig_address($input, &p) != 0) SWIG_fail;
  $1 = ($1_ltype)p;
}
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) void*, const void*, int32_t*,
    const int32_t*, const int64_t*, const float*, uint64_t*, float* k_scales,
    float* v_scales { $1 = 1; }
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
    val._geom = _geometry(config)
    _adopt(context, val)
%}
%pythonappend qsakv_cache_create_with_memory %{
    val._context = context  # the context must outlive the cache
    val._memory = memory  # so must the caller's arrays the cache runs on
    val._geom = _geometry(config)
    _adopt(context, val)
%}
%pythonappend qsakv_plan_create %{
    val._cache = cache  # the cache must outlive the plan
    _adopt(cache, val)
%}
%pythonappend qsakv_calib_create %{
    val._context = context
    val._geom = _geometry(config)
    _adopt(context, val)
%}

/* ---- typed buffers: element types and lengths checked against the counts ------------ */
%pythonprepend qsakv_store_kv %{
    g = _geom_of(cache)
    _buffer(k, "k", g["act"], num_tokens * g["kv"])
    _buffer(v, "v", g["act"], num_tokens * g["kv"])
    _buffer(slot_mapping, "slot_mapping", _I64, num_tokens)
%}
%pythonprepend qsakv_store_index_keys %{
    g = _geom_of(cache)
    _buffer(keys, "keys", _F16, num_tokens * g["ihd"])
    _buffer(request_slots, "request_slots", _I32, num_tokens)
    _buffer(positions, "positions", _I64, num_tokens)
%}
%pythonprepend qsakv_store_compressed_keys %{
    g = _geom_of(cache)
    _buffer(keys, "keys", _F16, num_keys * g["ihd"])
    _buffer(slot_mapping, "slot_mapping", _I64, num_keys)
%}
%pythonprepend qsakv_store_step %{
    _check_step_stores(cache, stores)
%}
%pythonprepend qsakv_calib_observe %{
    g = _geom_of(calib)
    _buffer(k, "k", g["act"], num_tokens * g["kv"])
    _buffer(v, "v", g["act"], num_tokens * g["kv"])
%}
%pythonprepend qsakv_select_topk %{
    g, rows = _plan_rows(plan)
    _buffer(index_q, "index_q", _F16, rows * g["iq"])
    _buffer(topk, "topk", _I32, rows * max(topk_stride, 0))
%}
%pythonprepend qsakv_attention_run %{
    g, rows = _plan_rows(plan)
    _buffer(q, "q", g["act"], rows * g["q"])
    _buffer(out, "out", g["act"], rows * g["q"])
    _buffer(topk, "topk", _I32, rows * max(topk_stride, 0))
%}
%pythonprepend qsakv_overlay_write %{
    _buffer(layers, "layers", _I32, num_layers)
    _buffer(k_scales, "k_scales", _F32, num_layers)
    _buffer(v_scales, "v_scales", _F32, num_layers)
%}
%pythonprepend qsakv_overlay_read_scale_file %{
    _buffer(layers, "layers", _I32, capacity)
    _buffer(k_scales, "k_scales", _F32, capacity)
    _buffer(v_scales, "v_scales", _F32, capacity)
%}
%pythonprepend qsakv_memcpy %{
    _buffer(dst, "dst", None, bytes)
    _buffer(src, "src", None, bytes)
%}
%pythonprepend qsakv_calib_get_stats %{
    _buffer(histogram, "histogram", _U64, QSAKV_CALIB_BINS)
%}
%pythonprepend qsakv_plan_update %{
    _check_batch(batch)
%}
%pythonprepend qsakv_cache_create %{
    _check_external_topk(options)
%}
%pythonprepend qsakv_cache_create_with_memory %{
    _check_external_topk(options)
    _check_memory(memory)
%}
%pythonprepend qsakv_calib_merge %{
    if not 0 <= num_inputs <= len(inputs):
        raise InvalidArgumentError(  # noqa: F821
            QSAKV_ERROR_INVALID_ARGUMENT,
            f"num_inputs: {num_inputs}, but inputs holds {len(inputs)} handles")
%}
/* Batch and cache-option members remember the arrays they were set from, so that
 * plan_update / cache_create can check them. */
%pythondynamic qsakv_batch;
%pythondynamic qsakv_step_stores;
%pythondynamic qsakv_cache_options;
%pythondynamic qsakv_layer_memory;
%pythondynamic qsakv_cache_memory;

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


class ClosedError(StateError):  # noqa: F821 (made above from QSAKV_ERROR_STATE)
    """A destroyed handle (or one whose context / cache was destroyed) was used."""


_set_closed_class(ClosedError)


def _adopt(parent, child):
    """Records `child` (weakly) so that destroying `parent` destroys it first."""
    import weakref

    kids = parent.__dict__.get("_children")
    if kids is None:
        kids = parent.__dict__["_children"] = weakref.WeakSet()
    kids.add(child)


def _destroy_children(handle):
    destroy = {"qsakv_cache": qsakv_cache_destroy, "qsakv_plan": qsakv_plan_destroy,
               "qsakv_calib": qsakv_calib_destroy}
    for child in list(getattr(handle, "__dict__", {}).get("_children", ())):
        destroy[type(child).__name__](child)

# Typed buffers (see the interface's header comment). Accepted __array_interface__ /
# __cuda_array_interface__ typestrs per element type; bfloat16 arrives as ml_dtypes'
# void-2 or as raw uint16.
_F16, _BF16, _F32 = ("<f2",), ("<V2", "|V2", "<u2"), ("<f4",)
_I32, _I64, _U64 = ("<i4",), ("<i8",), ("<u8",)
_NAMES = {"<f2": "float16", "<V2": "bfloat16", "|V2": "bfloat16", "<u2": "uint16",
          "<f4": "float32", "<f8": "float64", "|i1": "int8", "|u1": "uint8",
          "<i2": "int16", "<i4": "int32", "<u4": "uint32", "<i8": "int64", "<u8": "uint64"}


def _interface(obj):
    if obj is None or isinstance(obj, int):
        return None  # NULL, or an address taken as it is
    for attr in ("__cuda_array_interface__", "__array_interface__"):
        d = getattr(obj, attr, None)
        if isinstance(d, dict):
            return d
    return None  # the C typemap refuses it with a TypeError


def _buffer(obj, name, typestrs, count):
    """Checks an array argument: element type (typestrs; None: any, count in bytes),
    C-contiguity, and that it holds at least `count` elements."""
    d = _interface(obj)
    if d is None:
        return
    t = d["typestr"]
    if typestrs is not None and t not in typestrs:
        want = " or ".join(sorted({_NAMES.get(x, x) for x in typestrs}))
        raise InvalidArgumentError(  # noqa: F821
            QSAKV_ERROR_INVALID_ARGUMENT,
            f"{name}: expected {want} elements, got {_NAMES.get(t, t)} ({t})")
    size = int(t[2:]) if t[2:].isdigit() else 1
    n = 1
    for s in d["shape"]:
        n *= s
    strides = d.get("strides")
    if strides is not None:
        expect = size
        for dim, st in zip(reversed(d["shape"]), reversed(strides)):
            if dim != 1 and st != expect:
                raise InvalidArgumentError(  # noqa: F821
                    QSAKV_ERROR_INVALID_ARGUMENT, f"{name}: expected a C-contiguous array")
            expect *= dim
    have = n * size if typestrs is None else n
    if count < 0:
        raise InvalidArgumentError(  # noqa: F821
            QSAKV_ERROR_INVALID_ARGUMENT, f"{name}: the count is negative ({count})")
    if have < count:
        unit = "bytes" if typestrs is None else "elements"
        raise InvalidArgumentError(  # noqa: F821
            QSAKV_ERROR_INVALID_ARGUMENT,
            f"{name}: the call uses {count} {unit}, the array holds {have} "
            f"(shape {list(d['shape'])})")


def _geometry(config):
    """What the buffer checks need of a config (its rank's geometry)."""
    g = qsakv_model_config_rank_geometry(config)
    return {"act": _F16 if config.activation_dtype == QSAKV_DTYPE_FP16 else _BF16,
            "kv": g.kv_heads * config.head_dim, "q": g.q_heads * config.head_dim,
            "ihd": config.index_head_dim,
            "iq": config.index_num_heads * config.index_head_dim}


def _geom_of(handle):
    g = getattr(handle, "_geom", None)
    if g is None:  # None / a foreign pointer: let the library refuse it
        return {"act": None, "kv": 0, "q": 0, "ihd": 0, "iq": 0}
    return g


def _plan_rows(plan):
    cache = getattr(plan, "_cache", None)
    if plan is None or cache is None:
        return _geom_of(None), 0
    return _geom_of(cache), qsakv_plan_get_info(plan).num_rows


def _batch_setattr(self, name, value):
    if name in ("query_start", "seq_lens", "request_slots", "block_table"):
        self.__dict__.setdefault("_arrays", {})[name] = value
    _swig_setattr_base(self, name, value)


_swig_setattr_base = qsakv_batch.__setattr__
qsakv_batch.__setattr__ = _batch_setattr


def _options_setattr(self, name, value):
    if name == "external_topk":
        self.__dict__["_external_topk"] = value
    _swig_setattr_options(self, name, value)


_swig_setattr_options = qsakv_cache_options.__setattr__
qsakv_cache_options.__setattr__ = _options_setattr


_STEP_ARRAYS = ("k", "v", "kv_slot_mapping", "index_keys", "index_request_slots",
                "index_positions", "compressed_keys", "compressed_slot_mapping")


def _step_setattr(self, name, value):
    if name in _STEP_ARRAYS:  # kept alive with the struct, and checked at the call
        self.__dict__.setdefault("_arrays", {})[name] = value
    _swig_setattr_step(self, name, value)


_swig_setattr_step = qsakv_step_stores.__setattr__
qsakv_step_stores.__setattr__ = _step_setattr


def _check_step_stores(cache, stores):
    """The arrays of each part present against its count (qsakv_store_step)."""
    arrays = getattr(stores, "__dict__", {}).get("_arrays", {})
    g = _geom_of(cache)
    parts = (("num_tokens", (("k", g["act"], g["kv"]), ("v", g["act"], g["kv"]),
                             ("kv_slot_mapping", _I64, 1))),
             ("num_index_keys", (("index_keys", _F16, g["ihd"]),
                                 ("index_request_slots", _I32, 1), ("index_positions", _I64, 1))),
             ("num_compressed_keys", (("compressed_keys", _F16, g["ihd"]),
                                      ("compressed_slot_mapping", _I64, 1))))
    for count, fields in parts:
        n = getattr(stores, count, 0) if stores is not None else 0
        if n > 0:
            for name, types, per in fields:
                if name in arrays:
                    _buffer(arrays[name], "stores." + name, types, n * per)


_MEMORY_FIELDS = (("kv", "kv_bytes"), ("compressed_keys", "compressed_bytes"),
                  ("ring_keys", "ring_bytes"))


def _layer_memory_setattr(self, name, value):
    if name in ("kv", "compressed_keys", "ring_keys"):
        self.__dict__.setdefault("_arrays", {})[name] = value
    _swig_setattr_layer_memory(self, name, value)


_swig_setattr_layer_memory = qsakv_layer_memory.__setattr__
qsakv_layer_memory.__setattr__ = _layer_memory_setattr


def _cache_memory_setattr(self, name, value):
    _swig_setattr_cache_memory(self, name, value)
    if name == "layers":  # the entries were copied: so are the arrays they were set from
        self.__dict__["_layer_arrays"] = [
            dict(getattr(e, "__dict__", {}).get("_arrays", {})) for e in (value or ())]


_swig_setattr_cache_memory = qsakv_cache_memory.__setattr__
qsakv_cache_memory.__setattr__ = _cache_memory_setattr


def _check_memory(memory):
    """qsakv_cache_create_with_memory: num_layers against the entries the struct holds,
    each entry's arrays against the byte counts it states."""
    if memory is None:
        return
    entries = memory.layers
    if memory.num_layers > len(entries):
        raise InvalidArgumentError(  # noqa: F821
            QSAKV_ERROR_INVALID_ARGUMENT,
            f"memory.num_layers: {memory.num_layers}, but memory.layers holds "
            f"{len(entries)} entries")
    arrays = memory.__dict__.get("_layer_arrays", [])
    for i, (entry, held) in enumerate(zip(entries, arrays)):
        for field, count in _MEMORY_FIELDS:
            if field in held:
                _buffer(held[field], f"memory.layers[{i}].{field}", None,
                        getattr(entry, count))


def _check_external_topk(options):
    topk = getattr(options, "__dict__", {}).get("_external_topk")
    if topk is not None:
        rows, cols = options.external_topk_rows, options.external_topk_cols
        _buffer(topk, "options.external_topk", _I32, max(rows, 0) * max(cols, 0))


def _check_batch(batch):
    arrays = getattr(batch, "__dict__", {}).get("_arrays", {})
    n = batch.num_requests if batch is not None else 0
    for name, count in (("query_start", n + 1), ("seq_lens", n), ("request_slots", n),
                        ("block_table", n * batch.block_table_stride if n else 0)):
        if name in arrays:
            _buffer(arrays[name], "batch." + name, _I32, count)
%}
