#include "runtime/unit_layout.h"

#include <algorithm>
#include <cstring>

#include "runtime/train/init.h"

namespace fsdpsim::runtime {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

UnitLayout make_unit_layout(const std::vector<ParamTensor>& tensors, int N, bool fsdp2, bool use_orig_params) {
  UnitLayout l;
  l.tensors = tensors;
  l.N = N;
  l.fsdp2 = fsdp2;
  for (const auto& t : tensors) {
    const std::int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    l.rows.push_back(rows);
    l.rest.push_back(rows > 0 ? t.numel() / rows : 0);
  }
  const size_t T = tensors.size();
  if (!fsdp2) {
    // M1: _get_aligned_numel = 16 / 4 bytes = 4 fp32 elements with use_orig_params.
    const std::int64_t align = use_orig_params ? 4 : 1;
    std::int64_t total = 0;
    for (size_t i = 0; i < T; ++i) {
      if (total % align != 0) total += align - total % align;
      l.flat_offset.push_back(total);
      total += tensors[i].numel();
    }
    if (use_orig_params && total % N != 0) total += N - total % N;
    l.shard = ceil_div(total, N);
    l.unsharded = l.shard * N;
    l.grad = total;
    l.grad_shard = ceil_div(total, N);
    l.rs_input = l.grad_shard * N;
    l.grad_offset = l.flat_offset;
    return l;
  }
  std::int64_t shard = 0, unsharded = 0, grad = 0;
  for (size_t i = 0; i < T; ++i) {
    const std::int64_t cr = ceil_div(l.rows[i], N);
    l.chunk_rows.push_back(cr);
    l.shard_offset.push_back(shard);
    l.unsharded_offset.push_back(unsharded);
    l.grad_offset.push_back(grad);
    shard += cr * l.rest[i];
    unsharded += cr * N * l.rest[i];
    grad += tensors[i].numel();
  }
  l.shard = shard;
  l.unsharded = shard * N;
  l.grad = grad;
  l.grad_shard = shard;
  l.rs_input = shard * N;
  return l;
}

void init_shard(const UnitLayout& l, int r, std::uint64_t seed, float* shard) {
  std::fill(shard, shard + l.shard, 0.0f);
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const std::int64_t n = l.tensors[i].numel();
    if (!l.fsdp2) {
      // Elements of tensor i that fall in [r*S, (r+1)*S) of the flat param.
      const std::int64_t lo = std::max(l.flat_offset[i], r * l.shard);
      const std::int64_t hi = std::min(l.flat_offset[i] + n, (r + 1) * l.shard);
      const ParamInitializer init(seed, l.tensors[i]);
      for (std::int64_t f = lo; f < hi; ++f) shard[f - r * l.shard] = init(f - l.flat_offset[i]);
      continue;
    }
    const std::int64_t row0 = r * l.chunk_rows[i];
    const std::int64_t row1 = std::min(l.rows[i], row0 + l.chunk_rows[i]);
    const ParamInitializer init(seed, l.tensors[i]);
    for (std::int64_t row = row0; row < row1; ++row)
      for (std::int64_t j = 0; j < l.rest[i]; ++j)
        shard[l.shard_offset[i] + (row - row0) * l.rest[i] + j] = init(row * l.rest[i] + j);
  }
}

std::vector<std::vector<float>> tensors_from_shards(const UnitLayout& l, const float* all) {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const std::int64_t n = l.tensors[i].numel();
    std::vector<float> t(n);
    if (!l.fsdp2) {
      std::memcpy(t.data(), all + l.flat_offset[i], sizeof(float) * n);
    } else {
      const std::int64_t chunk = l.chunk_rows[i] * l.rest[i];
      for (int r = 0; r < l.N; ++r) {
        const std::int64_t lo = std::min(n, r * chunk), hi = std::min(n, (r + 1) * chunk);
        std::memcpy(t.data() + lo, all + r * l.shard + l.shard_offset[i], sizeof(float) * (hi - lo));
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace fsdpsim::runtime
