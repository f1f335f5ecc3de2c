#include "runtime/train/synthetic_data.h"

#include "runtime/train/init.h"

namespace fsdpsim::runtime {

void synthetic_sequence(std::uint64_t seed, std::int64_t index, int T, int V, std::int32_t* out) {
  const std::uint64_t base = mix64(seed * 0x2545f4914f6cdd1dULL + static_cast<std::uint64_t>(index));
  out[0] = static_cast<std::int32_t>(base % static_cast<std::uint64_t>(V));
  for (int t = 1; t <= T; ++t) {
    const std::uint64_t r = mix64(base + static_cast<std::uint64_t>(t));
    const bool noise = (r & 3) == 0;
    out[t] = noise ? static_cast<std::int32_t>((r >> 8) % static_cast<std::uint64_t>(V))
                   : static_cast<std::int32_t>((5LL * out[t - 1] + 3) % V);
  }
}

std::int64_t sequence_index(std::int64_t step, int rank, int ranks, int micro_batch_index, int micro_batches, int B,
                            int j) {
  const std::int64_t global = static_cast<std::int64_t>(ranks) * micro_batches * B;
  return step * global + (static_cast<std::int64_t>(rank) * micro_batches + micro_batch_index) * B + j;
}

TokenBatch make_batch(std::uint64_t seed, const std::vector<std::int64_t>& idx, int T, int V) {
  TokenBatch b;
  b.inputs.resize(idx.size() * T);
  b.targets.resize(idx.size() * T);
  std::vector<std::int32_t> seq(T + 1);
  for (size_t i = 0; i < idx.size(); ++i) {
    synthetic_sequence(seed, idx[i], T, V, seq.data());
    for (int t = 0; t < T; ++t) {
      b.inputs[i * T + t] = seq[t];
      b.targets[i * T + t] = seq[t + 1];
    }
  }
  return b;
}

}  // namespace fsdpsim::runtime
