// Zoo plans shared by the simulator's exactness tests (test_fast_forward.cpp, test_stretch.cpp): the
// bench case first, then FSDP2 and FSDP1 plans that together touch every prefetch, strategy and
// checkpointing path of the lowering. Each test appends the cases only it needs.
#pragma once
#include <string>
#include <vector>

namespace fsdpsim::sim {

struct ZooCase {
  std::string model, cluster, plan;
};

inline std::vector<ZooCase> shared_zoo_cases() {
  return {
      // the bench case (tests/bench/bench_simulate.cpp)
      {"llama3-70b", "128x8xH100-SXM-IB-NDR400",
       R"({"mesh":{"replicate":16,"shard":64},"sharding_strategy":"HYBRID_SHARD","activation_checkpointing":"full",)"
       R"("seq_len":4096,"grad_accum":2,"grad_sync":true})"},
      {"llama3-8b", "8xH100-SXM", R"({"activation_checkpointing":"full","seq_len":4096,"grad_accum":2,"grad_sync":true})"},
      {"llama3-8b", "8xH100-SXM", R"({})"},
      {"llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"reshard_after_forward":false,"prefetch_depth":2})"},
      {"llama3-8b", "2x8xH100-SXM-IB-NDR400", R"({"reshard_after_forward":8,"activation_checkpointing":"every_2"})"},
      {"mistral-7b", "8xA100-80GB", R"({"fsdp_version":1,"backward_prefetch":"BACKWARD_PRE","limit_all_gathers":true})"},
      {"mistral-7b", "8xA100-80GB", R"({"fsdp_version":1,"backward_prefetch":"BACKWARD_POST","forward_prefetch":true,)"
                                     R"("limit_all_gathers":false,"activation_checkpointing":"full"})"},
      {"llama2-13b", "4x8xA100-40GB-IB-HDR200", R"({"fsdp_version":1,"sharding_strategy":"SHARD_GRAD_OP",)"
                                                 R"("backward_prefetch":"NONE","activation_checkpointing":"selective_op"})"},
  };
}

// shared_zoo_cases() followed by `more`.
inline std::vector<ZooCase> zoo_cases_and(const std::vector<ZooCase>& more) {
  std::vector<ZooCase> all = shared_zoo_cases();
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

}  // namespace fsdpsim::sim
