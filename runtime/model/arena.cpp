#include "runtime/model/arena.h"

namespace fsdpsim::runtime {

int ArenaLayout::add(const std::string& name, std::int64_t elements) {
  regions_.push_back({name, offset_, elements});
  offset_ += elements;
  return static_cast<int>(regions_.size()) - 1;
}

}  // namespace fsdpsim::runtime
