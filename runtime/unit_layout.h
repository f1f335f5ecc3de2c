// Where each parameter of an FSDP unit lives in the buffers of a StepProgram, for both FSDP
// versions (docs fsdp-semantics.md M1, M6, F2.9), and the data movements between those layouts:
//  * FSDP1 FlatParameter: tensors concatenated in registration order (use_orig_params: each tensor
//    starts 16-byte aligned, the whole padded to a multiple of N); rank r's shard is flat[r*S, (r+1)*S).
//    The unsharded grad uses the flat layout too (unpadded when !use_orig_params, then F.pad).
//  * FSDP2 per-parameter dim-0 sharding: tensor t (d0 rows of `rest` elements) is chunked into
//    ceil(d0/N)-row chunks, zero-padded; rank r's shard is the concatenation of its chunks. The
//    all-gather output is [N][shard]; the unsharded params are per tensor ceil(d0/N)*N rows; the
//    unsharded grads are the tensors unpadded, back to back; the reduce-scatter input is [N][shard].
#pragma once
#include <cstdint>
#include <vector>

#include "models/wrap_graph.h"
#include "runtime/model/param_tensors.h"

namespace fsdpsim::runtime {

struct UnitLayout {
  std::vector<ParamTensor> tensors;
  int N = 1;
  bool fsdp2 = true;
  std::int64_t shard = 0;        // numel of one rank's shard
  std::int64_t unsharded = 0;    // N * shard: all-gather output / FSDP1 full flat param
  std::int64_t grad = 0;         // numel of the unsharded grad buffer
  std::int64_t grad_shard = 0;   // reduce-scatter output numel
  std::int64_t rs_input = 0;     // reduce-scatter input numel
  // Per tensor:
  std::vector<std::int64_t> flat_offset;      // FSDP1: offset in the flat param (and flat grad)
  std::vector<std::int64_t> rows, rest;       // dim 0 and numel / dim 0
  std::vector<std::int64_t> chunk_rows;       // FSDP2: ceil(rows / N)
  std::vector<std::int64_t> shard_offset;     // FSDP2: offset of the tensor's chunk in a rank's shard
  std::vector<std::int64_t> unsharded_offset; // FSDP2: offset in the per-parameter unsharded storage
  std::vector<std::int64_t> grad_offset;      // offset in the unsharded grad buffer
};

UnitLayout make_unit_layout(const std::vector<ParamTensor>& tensors, int N, bool fsdp2, bool use_orig_params);

// Rank `r`'s shard of the deterministic initial parameters (runtime/train/init.h).
void init_shard(const UnitLayout& l, int r, std::uint64_t seed, float* shard);
// The full tensors, from the concatenation of every rank's shard ([N][shard], rank order).
std::vector<std::vector<float>> tensors_from_shards(const UnitLayout& l, const float* all_shards);

}  // namespace fsdpsim::runtime
