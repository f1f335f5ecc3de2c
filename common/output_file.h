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

// SIGINT / SIGTERM. A command whose long loops poll interrupted() and stop cleanly (the planner's search, the
// calibration loops: `cooperative`) gets the flag on the first signal; any other command, or a second signal,
// ends the process at once with 128 + the signal (outputs are written atomically: never half a file).
bool interrupted();
void install_interrupt_handler(bool cooperative = true);

}  // namespace fsdpsim
