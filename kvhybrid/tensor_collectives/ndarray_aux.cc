// kvhybrid's C++ helper, built against the installed MXNet's headers (setup.py), as Horovod
// builds its MXNet operators: where a row_sparse array's row ids lie.
//
// MXNet's C API hands a row_sparse array's indices out as a new array filled by an engine
// operation (MXNDArrayGetAuxNDArray), which the caller then waits for and copies again: a
// round trip through the engine for a few thousand ids, on the caller's thread, every push
// of rows. The ids already lie in host memory; this returns where. Loaded with ctypes
// (ndarray_view.py), which checks it against MXNet's own answer before using it.
#include <cstdint>

#include <mxnet/ndarray.h>

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

}  // extern "C"
