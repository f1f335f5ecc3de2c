// A bump layout of named fp32 tensors inside one byte region: used to place a block's saved
// activations inside the activation buffer the StepProgram allocated for it, so the bytes the
// kernels really keep are the bytes the allocator counts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/units.h"

namespace fsdpsim::runtime {

class ArenaLayout {
 public:
  // Reserves `elements` fp32 values named `name`; returns the region's index.
  int add(const std::string& name, std::int64_t elements);
  Bytes bytes() const { return static_cast<Bytes>(offset_) * 4; }
  std::int64_t offset(int region) const { return regions_[region].offset; }
  // Pointer to a region inside a base of at least bytes() bytes.
  float* at(void* base, int region) const { return static_cast<float*>(base) + regions_[region].offset; }
  struct Region {
    std::string name;
    std::int64_t offset = 0, elements = 0;
  };
  const std::vector<Region>& regions() const { return regions_; }

 private:
  std::vector<Region> regions_;
  std::int64_t offset_ = 0;
};

}  // namespace fsdpsim::runtime
