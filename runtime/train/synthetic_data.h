// A deterministic synthetic language-modelling dataset: sequence i of T+1 tokens is a function of
// (seed, i) alone, so every rank reads its own slice of the global batch without coordination and
// the unsharded reference reads the same tokens. The sequences follow a fixed affine "grammar"
// (next = (a * tok + c) mod V) three times in four, otherwise a random token, so a model can learn
// it and the loss must fall from ln(V) toward the noise floor.
#pragma once
#include <cstdint>
#include <vector>

namespace fsdpsim::runtime {

// Writes T+1 tokens of sequence `index` into out.
void synthetic_sequence(std::uint64_t seed, std::int64_t index, int T, int V, std::int32_t* out);

// Index of sequence j of micro-batch m on data-parallel rank r at optimizer step s, where one
// step's global batch is ranks * micro_batches * B sequences and each rank owns a contiguous slice.
std::int64_t sequence_index(std::int64_t step, int rank, int ranks, int micro_batch_index, int micro_batches, int B,
                            int j);

// Inputs (first T tokens) and targets (next T tokens) of B sequences [B, T] each, starting at the
// given sequence indices.
struct TokenBatch {
  std::vector<std::int32_t> inputs;    // [B, T]
  std::vector<std::int32_t> targets;   // [B, T]
};
TokenBatch make_batch(std::uint64_t seed, const std::vector<std::int64_t>& sequence_indices, int T, int V);

}  // namespace fsdpsim::runtime
