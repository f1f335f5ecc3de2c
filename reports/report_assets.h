// The report's inline CSS and scripts (no network: no fonts, no CDN). Kept apart from the HTML
// assembly so the page structure reads on its own.
#pragma once

namespace fsdpsim::reports {

// Light and dark schemes (prefers-color-scheme), print rules, and the stream / memory-category
// palette shared by every chart and legend.
const char* report_css();
// Runs first (in <head>): counts script errors, unhandled rejections, console.error calls and
// failed resource loads into <body data-errors="N">, so a headless browser's DOM dump shows them.
const char* report_head_script();
// Runs last: sortable tables, copy buttons; sets <body data-ready="1"> when it completed.
const char* report_body_script();

}  // namespace fsdpsim::reports
