// The row exchange's arithmetic on row ids and rows (rows.py, kvstore/sparse_push.py), made
// in one pass instead of numpy's sorts and per-rank Python loops. What the row group master
// gathers is each rank's rows under its sorted unique row ids (one row_sparse gradient per
// rank), so the ranks' ids merge in one walk: the union of the next ids, the sum of the
// ranks' rows by id, and each rank's rows taken from the servers' answer for the union.
// numpy's versions sort, search and loop per rank on the master's communication thread. Every
// rank also sorts the next batch's ids it was handed (a bitmap of a vocabulary's rows).
//
// The sums add a row's copies in rank order, the lowest rank's first, as sum_rows in
// rows.py does: the same bits. Each function returns -1 where its input is not what it
// expects (a rank's ids not strictly increasing: several devices' arrays concatenated; an
// id outside the table), so that the caller falls back to numpy. Needs nothing of MXNet.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// Whether every rank's part of ``ids`` is strictly increasing; fills each rank's start.
bool ranks_sorted(int64_t ranks, const int64_t* ids, const int64_t* counts,
                  std::vector<int64_t>* starts) {
  starts->resize(ranks + 1);
  int64_t at = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    (*starts)[r] = at;
    for (int64_t i = at + 1; i < at + counts[r]; ++i) {
      if (ids[i] <= ids[i - 1]) return false;
    }
    at += counts[r];
  }
  (*starts)[ranks] = at;
  return true;
}

// Walks the ranks' sorted ids in order: for each distinct id, ``visit(id, first, ranks)``
// with the positions (into ``ids``) of the ranks that hold it, in rank order.
template <typename Visit>
int64_t merge(int64_t ranks, const int64_t* ids, const int64_t* counts, Visit visit) {
  std::vector<int64_t> next, end;
  if (!ranks_sorted(ranks, ids, counts, &next)) return -1;
  end.assign(next.begin() + 1, next.end());
  next.pop_back();
  std::vector<int64_t> holders(ranks);
  int64_t distinct = 0;
  for (;;) {
    int64_t low = std::numeric_limits<int64_t>::max();
    bool any = false;
    for (int64_t r = 0; r < ranks; ++r) {
      if (next[r] < end[r] && (!any || ids[next[r]] < low)) {
        low = ids[next[r]];
        any = true;
      }
    }
    if (!any) return distinct;
    int64_t held = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      if (next[r] < end[r] && ids[next[r]] == low) holders[held++] = next[r]++;
    }
    visit(distinct++, low, holders.data(), held);
  }
}

template <typename T>
int64_t sum_rows(int64_t ranks, const int64_t* ids, const int64_t* counts, const T* rows,
                 int64_t width, int64_t* out_ids, T* out_rows) {
  return merge(ranks, ids, counts, [&](int64_t n, int64_t id, const int64_t* at,
                                       int64_t held) {
    out_ids[n] = id;
    T* total = out_rows + n * width;
    std::memcpy(total, rows + at[0] * width, sizeof(T) * width);
    for (int64_t h = 1; h < held; ++h) {
      const T* row = rows + at[h] * width;
      for (int64_t j = 0; j < width; ++j) total[j] += row[j];
    }
  });
}

}  // namespace

extern "C" {

// The sorted unique values of ``ids`` (``count`` of them, each in [0, rows): a batch's
// word ids as prefetch_rows was handed them) into ``out`` (room for ``count``); returns
// how many, or -1 where an id lies outside [0, rows). Ids already increasing are copied; else
// a bitmap of the ids' span where it is small beside them (a vocabulary's rows), or a sort.
int64_t kvhybrid_unique_ids(const int64_t* ids, int64_t count, int64_t rows, int64_t* out) {
  if (count == 0) return 0;
  int64_t low = ids[0], high = ids[0];
  bool increasing = true;   // (sorted and unique already: a pull of every row, in order)
  for (int64_t i = 1; i < count; ++i) {
    increasing = increasing && ids[i] > ids[i - 1];
    low = std::min(low, ids[i]);
    high = std::max(high, ids[i]);
  }
  if (low < 0 || high >= rows) return -1;
  if (increasing) {
    std::memcpy(out, ids, sizeof(int64_t) * count);
    return count;
  }
  const int64_t span = high - low + 1;
  // The bitmap costs a word per 64 rows of the span, a sort about log2(count) steps an id:
  // the bitmap up to a span of 512 rows an id, a sort for a sparse spread over a larger
  // table
  if (span > 512 * count + 65536) {
    std::memcpy(out, ids, sizeof(int64_t) * count);
    std::sort(out, out + count);
    return std::unique(out, out + count) - out;
  }
  std::vector<uint64_t> seen((span + 63) / 64, 0);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = ids[i] - low;
    seen[at >> 6] |= uint64_t(1) << (at & 63);
  }
  int64_t n = 0;
  for (size_t w = 0; w < seen.size(); ++w) {
    for (uint64_t bits = seen[w]; bits != 0; bits &= bits - 1) {
      out[n++] = low + int64_t(w) * 64 + __builtin_ctzll(bits);
    }
  }
  return n;
}

// The sorted union of the ranks' sorted unique ``ids`` (``counts[r]`` of rank r, back to
// back) into ``out`` (room for all of them); returns its length, or -1 (see above).
int64_t kvhybrid_union_ids(int64_t ranks, const int64_t* ids, const int64_t* counts,
                           int64_t* out) {
  return merge(ranks, ids, counts, [&](int64_t n, int64_t id, const int64_t*, int64_t) {
    out[n] = id;
  });
}

// The ranks' rows (``width`` elements each, one per id of ``ids``) summed by id: the sorted
// unique ids into ``out_ids`` and their sums into ``out_rows``; returns how many, or -1.
int64_t kvhybrid_sum_rows_f32(int64_t ranks, const int64_t* ids, const int64_t* counts,
                              const float* rows, int64_t width, int64_t* out_ids,
                              float* out_rows) {
  return sum_rows(ranks, ids, counts, rows, width, out_ids, out_rows);
}

int64_t kvhybrid_sum_rows_f64(int64_t ranks, const int64_t* ids, const int64_t* counts,
                              const double* rows, int64_t width, int64_t* out_ids,
                              double* out_rows) {
  return sum_rows(ranks, ids, counts, rows, width, out_ids, out_rows);
}

// Each rank's rows of its sorted unique ``wanted`` ids (``counts[r]`` of rank r, back to
// back) taken from ``table``, whose rows (``row_bytes`` each) belong to the sorted unique
// ``have``, into ``out`` at rank r's byte offset ``offsets[r]``, back to back. Returns 0,
// or -1 where a rank's ids are not sorted or hold one ``have`` lacks (the caller then
// takes them with numpy, over what was written here).
int64_t kvhybrid_take_rows(const int64_t* have, int64_t have_count, const void* table,
                           int64_t row_bytes, int64_t ranks, const int64_t* wanted,
                           const int64_t* counts, void* out, const int64_t* offsets) {
  const char* from = static_cast<const char*>(table);
  for (int64_t r = 0; r < ranks; ++r) {
    char* into = static_cast<char*>(out) + offsets[r];
    if (counts[r] == have_count && counts[r] > 0   // every row of the table: one copy
        && std::memcmp(wanted, have, sizeof(int64_t) * have_count) == 0) {
      std::memcpy(into, from, row_bytes * have_count);
      wanted += counts[r];
      continue;
    }
    int64_t h = 0;
    for (int64_t i = 0; i < counts[r]; ++i) {
      if (i > 0 && wanted[i] <= wanted[i - 1]) return -1;
      while (h < have_count && have[h] < wanted[i]) ++h;
      if (h == have_count || have[h] != wanted[i]) return -1;
      std::memcpy(into + i * row_bytes, from + h * row_bytes, row_bytes);
    }
    wanted += counts[r];
  }
  return 0;
}

}  // extern "C"
