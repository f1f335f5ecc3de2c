// Escaping text for HTML and SVG. Every string that reaches the report goes through one of these:
// model names, labels and explanations come from user files and must never become markup.
#pragma once
#include <string>
#include <string_view>

namespace fsdpsim::reports {

// For element content and for attribute values (double- or single-quoted): & < > " ' become
// entities; C0 control characters other than tab/newline/CR (invalid in HTML text) become U+FFFD.
std::string html_escape(std::string_view s);

// A string safe as an id / class token: [A-Za-z0-9_-] kept, anything else becomes '_'.
std::string html_token(std::string_view s);

}  // namespace fsdpsim::reports
