// Writes the reports fixtures to a directory for looking at them by hand:
//   reports_fixture_tool OUTDIR  ->  OUTDIR/{plan_small,plan_measured,plan_nofit,plan_big}.json + .html, trace.json
//   reports_fixture_tool --render PLAN.json OUT.html   (render any plan.json, e.g. one `fsdpsim plan` wrote)
#include <chrono>
#include <iostream>

#include "common/json_reader.h"

#include "common/errors.h"
#include "common/output_file.h"
#include "fixture_plan.h"
#include "reports/html_report.h"
#include "reports/trace.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--render") {
    try {
      nlohmann::json doc = read_json_file(argv[2], "PLAN.json");
      auto t0 = std::chrono::steady_clock::now();
      std::string html = render_html(doc);
      auto t1 = std::chrono::steady_clock::now();
      write_file_atomic(argv[3], html, "OUT.html");
      std::cout << html.size() << " bytes, rendered in "
                << std::chrono::duration<double, std::milli>(t1 - t0).count() << " ms\n";
      return 0;
    } catch (const InputError& e) {
      std::cerr << "error: " << e.what() << "\n";
      return 2;
    }
  }
  if (argc != 2) {
    std::cerr << "usage: reports_fixture_tool OUTDIR\n";
    return 2;
  }
  try {
    std::string dir = argv[1];
    ensure_directory(dir, "OUTDIR");
    fixture::FixtureOptions small, measured, nofit, big;
    measured.with_measured = true;
    nofit.nothing_fits = true;
    big.grad_accum_scale = 40;
    big.units = 32;
    for (auto& [name, o] : std::vector<std::pair<std::string, fixture::FixtureOptions>>{
             {"plan_small", small}, {"plan_measured", measured}, {"plan_nofit", nofit}, {"plan_big", big}}) {
      nlohmann::json doc = fixture::fixture_plan_doc(o);
      write_file_atomic(dir + "/" + name + ".json", doc.dump(2) + "\n", "OUTDIR");
      write_html(dir + "/" + name + ".html", doc, {}, "OUTDIR");
    }
    write_trace(dir + "/trace.json", fixture::fixture_result(0, small, true), nlohmann::json{{"tool", "fsdpsim"}});
  } catch (const InputError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
