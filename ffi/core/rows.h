// Host side of both modules: the rows of one FFI call (optional leading batch dimensions, the
// last one the item) checked against a codec's payload size. Dims: anything with size() and
// operator[] (ffi::Span, std::vector). Each check returns an error message, "" if valid.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace jaxhc {

struct Rows {
  uint64_t rows = 1;   // product of the leading (batch) dimensions
  uint64_t n = 0;      // values per row
  uint64_t bytes = 0;  // payload bytes per row
};

template <typename Dims>
std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); i++) s += (i ? "," : "") + std::to_string(d[i]);
  return s + "]";
}

// values [..., n], payload [..., bytes_of(n)] and, when given, flags [...] (one per row).
// `what` names the codec parameters in the message (e.g. "at maxbits 32").
template <typename Dims, typename BytesOf>
std::string check_row_shapes(const Dims& values, const Dims& payload, const Dims* flags,
                             BytesOf&& bytes_of, const std::string& what, Rows* r) {
  size_t rank = values.size();
  if (rank == 0) return "values must have at least one dimension, got a scalar";
  *r = Rows{};
  for (size_t i = 0; i + 1 < rank; i++) r->rows *= static_cast<uint64_t>(values[i]);
  r->n = static_cast<uint64_t>(values[rank - 1]);
  r->bytes = bytes_of(r->n);
  bool ok = payload.size() == rank && static_cast<uint64_t>(payload[rank - 1]) == r->bytes;
  for (size_t i = 0; ok && i + 1 < rank; i++) ok = payload[i] == values[i];
  if (!ok)
    return "payload shape " + dims_str(payload) + " does not fit values " + dims_str(values) +
           " " + what + ": need [..., " + std::to_string(r->bytes) + "]";
  if (flags) {
    ok = flags->size() + 1 == rank;
    for (size_t i = 0; ok && i + 1 < rank; i++) ok = (*flags)[i] == values[i];
    if (!ok)
      return "finite shape " + dims_str(*flags) + " must be the batch dims of " + dims_str(values);
  }
  return "";
}

// Payloads [..., parts, bytes] summed into values [..., n]: the dims of one part's payload rows
// (`rows`, [..., bytes]) and of its values (`one`, [..., n]), and the part count.
template <typename Dims>
std::string split_sum_dims(const Dims& pd, const Dims& xd, std::vector<int64_t>* rows,
                           std::vector<int64_t>* one, uint64_t* parts) {
  if (pd.size() < 2 || pd.size() != xd.size() + 1)
    return "payloads " + dims_str(pd) + " must be [..., parts, bytes] for values " +
           dims_str(xd) + " [..., n]";
  rows->assign(pd.begin(), pd.end() - 2);
  *one = *rows;
  rows->push_back(pd.back());
  one->push_back(xd.back());
  for (size_t i = 0; i + 1 < xd.size(); i++)
    if (pd[i] != xd[i])
      return "payloads " + dims_str(pd) + " and values " + dims_str(xd) + " differ in batch dims";
  *parts = static_cast<uint64_t>(pd[pd.size() - 2]);
  if (*parts == 0) return "payloads " + dims_str(pd) + " hold no parts to sum";
  return "";
}

}  // namespace jaxhc
