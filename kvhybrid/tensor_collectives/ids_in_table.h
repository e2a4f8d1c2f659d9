// A batch's row ids copied as int64 and checked against a table's rows in one pass: shared by
// ids.cc (a Python module, ids handed to prefetch_rows) and ndarray_aux.cc (a pull's ids,
// read where MXNet keeps them).
#ifndef KVHYBRID_IDS_IN_TABLE_H_
#define KVHYBRID_IDS_IN_TABLE_H_

#include <cstdint>
#include <type_traits>

namespace kvhybrid {

// ``count`` ids as int64 into ``out``, as numpy's cast does (a float truncated toward
// zero); false at the first one whose cast lies outside [0, rows) (a float that is not a
// number among them).
template <typename T>
bool ids_in_table(const void* from, int64_t count, int64_t rows, int64_t* out) {
  const T* ids = static_cast<const T*>(from);
  for (int64_t i = 0; i < count; ++i) {
    const T id = ids[i];
    if constexpr (std::is_floating_point<T>::value) {
      if (!(id > T(-1) && id < T(rows))) return false;
    } else if (id < 0 || static_cast<int64_t>(id) >= rows) {
      return false;
    }
    out[i] = static_cast<int64_t>(id);
  }
  return true;
}

}  // namespace kvhybrid

#endif  // KVHYBRID_IDS_IN_TABLE_H_
