// Writing outputs atomically: the content goes to a temporary file in the same directory, is
// flushed and fsync'ed, then renamed over the target, so a reader (or an interrupted run) sees the
// old file or the new one, never half of one. A directory that does not exist or cannot be
// written is InputError(field, path).
#pragma once
#include <string>

namespace fsdpsim {

void write_file_atomic(const std::string& path, const std::string& content, const std::string& field);
// Creates dir (and parents) if missing; InputError(field, dir) if that fails or it is a file.
void ensure_directory(const std::string& dir, const std::string& field);

// Set by the SIGINT handler; long loops poll it and stop cleanly (outputs are never half-written).
bool interrupted();
void install_interrupt_handler();

}  // namespace fsdpsim
