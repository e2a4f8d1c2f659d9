// kvhybrid's C++ helper, built against the installed MXNet's headers and linked to its
// library (setup.py), as Horovod builds its MXNet operators. Loaded with ctypes
// (ndarray_view.py), which checks each answer against MXNet's own before using it.
//
// - Where a row_sparse array's row ids lie. MXNet's C API hands a row_sparse array's indices
//   out as a new array filled by an engine operation (MXNDArrayGetAuxNDArray), which the
//   caller then waits for and copies again: a round trip through the engine for a few
//   thousand ids, on the caller's thread, every push of rows. The ids already lie in host
//   memory; this returns where.
// - A training loop's pull of prefetched rows, in one call: whether the batch's ids are
//   those handed over (read in place, not copied into numpy first), and the engine copy
//   of the rows into the out that MXNet's own kvstore pushes (CopyFromTo), without the
//   operator dispatch of `_copyto` (its name lookup, shape and storage inference).
// - A pull's row ids, checked to lie in the table and copied as int64 in one call, read where
//   they lie once the engine wrote them.
// - Room for rows in a row_sparse array, from inside the engine operation that writes it: its
//   row count is known only there (the prefetched rows' hand-out, a served pull), while reads
//   of it were queued before, behind that operation.
#include <cstdint>
#include <exception>

#include <mxnet/c_api.h>
#include <mxnet/ndarray.h>

#include "ids_in_table.h"

namespace {

template <typename T, typename As>
int equal_as(const void* data, const int64_t* expected, int64_t count) {
  const T* values = static_cast<const T*>(data);
  for (int64_t i = 0; i < count; ++i) {
    if (static_cast<As>(values[i]) != static_cast<As>(expected[i])) return 0;
  }
  return 1;
}

}  // namespace

extern "C" {

// The row ids of a host row_sparse array: *ids points at *count int64 ids, valid until the
// array is written again (the caller waits for pending writes first). Returns 0, or: 1 not
// row_sparse, 2 not in host memory, 3 ids not int64, 4 ids not one-dimensional, 5 no
// memory yet.
int kvhybrid_row_sparse_ids(const void* handle, const int64_t** ids, int64_t* count) {
  const auto* array = static_cast<const mxnet::NDArray*>(handle);
  if (array->storage_type() != mxnet::kRowSparseStorage) return 1;
  if (array->is_none()) return 5;
  if (array->ctx().dev_mask() != mshadow::cpu::kDevMask) return 2;
  if (array->aux_type(mxnet::rowsparse::kIdx) != mshadow::kInt64) return 3;
  const mxnet::TShape& shape = array->aux_shape(mxnet::rowsparse::kIdx);
  if (shape.ndim() != 1) return 4;
  *count = shape[0];
  *ids = *count ? static_cast<const int64_t*>(array->aux_data(mxnet::rowsparse::kIdx).dptr_)
                : nullptr;
  return 0;
}

// Whether a dense host array holds `expected` (`count` int64 ids), value by value and
// compared as numpy's == compares them (as doubles where the array holds floats), once the
// engine has written it. Returns 1 equal, 0 not, or where it cannot tell: -1 not a dense
// host array, -2 a dtype it does not read, -3 MXNet failed (the caller asks numpy).
int kvhybrid_ids_equal(void* handle, const int64_t* expected, int64_t count) {
  const auto* array = static_cast<const mxnet::NDArray*>(handle);
  if (array->is_none() || array->storage_type() != mxnet::kDefaultStorage ||
      array->ctx().dev_mask() != mshadow::cpu::kDevMask) {
    return -1;
  }
  if (static_cast<int64_t>(array->shape().Size()) != count) return 0;
  void* data = nullptr;
  if (MXNDArrayWaitToRead(handle) != 0 || MXNDArrayGetData(handle, &data) != 0) return -3;
  switch (array->dtype()) {
    case mshadow::kFloat32: return equal_as<float, double>(data, expected, count);
    case mshadow::kFloat64: return equal_as<double, double>(data, expected, count);
    case mshadow::kInt64: return equal_as<int64_t, int64_t>(data, expected, count);
    case mshadow::kInt32: return equal_as<int32_t, int64_t>(data, expected, count);
    case mshadow::kUint8: return equal_as<uint8_t, int64_t>(data, expected, count);
    case mshadow::kInt8: return equal_as<int8_t, int64_t>(data, expected, count);
    default: return -2;
  }
}

// A batch's row ids in a dense host array (float32, float64, int32 or int64), once the
// engine has written them, copied as int64 into `out` (room for `room`) if each lies in
// [0, rows): the checks and the read of a pull's ids in one call, where MXNet's C API takes
// one call for each of the array's dtype, storage, device, data and shape. Sets *count to
// the array's size. Returns 0, 1 more ids than `room` (nothing copied), or where it cannot:
// -1 not a dense host array, -2 a dtype it does not read, -3 MXNet failed, -5 an id outside
// [0, rows) (the caller reads them with numpy, which names it).
int kvhybrid_ids_in_table(void* handle, int64_t rows, int64_t* out, int64_t room,
                          int64_t* count) {
  const auto* array = static_cast<const mxnet::NDArray*>(handle);
  if (array->is_none() || array->storage_type() != mxnet::kDefaultStorage ||
      array->ctx().dev_mask() != mshadow::cpu::kDevMask) {
    return -1;
  }
  const int dtype = array->dtype();
  if (dtype != mshadow::kFloat32 && dtype != mshadow::kFloat64 && dtype != mshadow::kInt32 &&
      dtype != mshadow::kInt64) {
    return -2;
  }
  *count = static_cast<int64_t>(array->shape().Size());
  if (*count > room) return 1;
  void* data = nullptr;
  if (MXNDArrayWaitToRead(handle) != 0 || MXNDArrayGetData(handle, &data) != 0) return -3;
  bool fits = false;
  switch (dtype) {
    case mshadow::kFloat32: fits = kvhybrid::ids_in_table<float>(data, *count, rows, out); break;
    case mshadow::kFloat64: fits = kvhybrid::ids_in_table<double>(data, *count, rows, out); break;
    case mshadow::kInt32: fits = kvhybrid::ids_in_table<int32_t>(data, *count, rows, out); break;
    default: fits = kvhybrid::ids_in_table<int64_t>(data, *count, rows, out); break;
  }
  return fits ? 0 : -5;
}

// Queue MXNet's engine copy of `from` into `to` (any storage, the same shape; a row_sparse
// out takes the rows of `from`), as MXNet's kvstore copies pulled rows into an out. Returns
// 0, or 1 where MXNet refused (the caller copies through `_copyto`, which says why).
int kvhybrid_engine_copy(const void* from, const void* to, int priority) {
  try {
    mxnet::CopyFromTo(*static_cast<const mxnet::NDArray*>(from),
                      *static_cast<const mxnet::NDArray*>(to), priority, false);
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

// A training loop's pull of prefetched rows in one call: if the dense host array `ids` holds
// `expected` (as kvhybrid_ids_equal compares), queue the engine copy of `from` into `to`
// (as kvhybrid_engine_copy). Returns 1 copied, 0 not equal (nothing queued), or where it
// cannot tell or copy: the negative answers of kvhybrid_ids_equal, -4 MXNet refused the
// copy (the caller compares and copies its own way).
int kvhybrid_pull_prefetched(void* ids, const int64_t* expected, int64_t count,
                             const void* from, const void* to, int priority) {
  const int equal = kvhybrid_ids_equal(ids, expected, count);
  if (equal != 1) return equal;
  return kvhybrid_engine_copy(from, to, priority) == 0 ? 1 : -4;
}

// Whether kvhybrid_alloc_rows can give `handle` rows of a table of `ndim` dimensions `shape`
// and MXNet dtype `dtype`: a host row_sparse array of that shape and dtype with int64 row ids.
// Returns 1 or 0.
int kvhybrid_takes_rows(const void* handle, int ndim, const int64_t* shape, int dtype) {
  const auto* array = static_cast<const mxnet::NDArray*>(handle);
  if (array->is_none() || array->storage_type() != mxnet::kRowSparseStorage ||
      array->ctx().dev_mask() != mshadow::cpu::kDevMask ||
      array->aux_type(mxnet::rowsparse::kIdx) != mshadow::kInt64 || array->dtype() != dtype) {
    return 0;
  }
  const mxnet::TShape& own = array->shape();
  if (own.ndim() != ndim) return 0;
  for (int i = 0; i < ndim; ++i) {
    if (own[i] != shape[i]) return 0;
  }
  return 1;
}

// Give a host row_sparse array room for `count` rows (made without memory, delay_alloc, or
// holding rows already, whose memory it reuses where large enough, as MXNet's own copy into
// a row_sparse out does), from the engine operation that writes it (no other operation may
// touch it meanwhile): *ids points where its `count` int64 row ids go, *rows where its rows
// go (null when `count` is 0). Returns 0, or: 1 not row_sparse, 2 not in host memory, 3 ids
// not int64, 6 MXNet failed.
int kvhybrid_alloc_rows(void* handle, int64_t count, int64_t** ids, void** rows) {
  auto* array = static_cast<mxnet::NDArray*>(handle);
  if (array->is_none() || array->storage_type() != mxnet::kRowSparseStorage) return 1;
  if (array->ctx().dev_mask() != mshadow::cpu::kDevMask) return 2;
  if (array->aux_type(mxnet::rowsparse::kIdx) != mshadow::kInt64) return 3;
  try {
    array->CheckAndAlloc({mxnet::TShape(mshadow::Shape1(count))});
  } catch (const std::exception&) {
    return 6;
  }
  *ids = count ? static_cast<int64_t*>(array->aux_data(mxnet::rowsparse::kIdx).dptr_) : nullptr;
  *rows = count ? array->data().dptr_ : nullptr;
  return 0;
}

}  // extern "C"
