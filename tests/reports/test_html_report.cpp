// report.html structure, determinism, golden file, escaping, size and the no-network rule.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "common/errors.h"
#include "common/json_reader.h"
#include "fixture_plan.h"
#include "reports/format.h"
#include "reports/html_report.h"
#include "reports/plan_doc.h"
#include "reports/timeline_decimate.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using nlohmann::json;

namespace {

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// The text of one <svg id="ID" ...>...</svg> element.
std::string svg_by_id(const std::string& html, const std::string& id) {
  size_t a = html.find("<svg id=\"" + id + "\"");
  if (a == std::string::npos) return "";
  size_t b = html.find("</svg>", a);
  return html.substr(a, b - a);
}

int sum_data_n(const std::string& s, const std::string& cls_prefix) {
  std::regex re("class=\"" + cls_prefix + "[^\"]*\" data-n=\"([0-9]+)\"");
  int sum = 0;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), re); it != std::sregex_iterator(); ++it) sum += std::stoi((*it)[1]);
  return sum;
}

const std::string kFixture = "tests/reports/fixtures/plan_small.json";

}  // namespace

TEST(PlanFixture, CheckedInFixtureMatchesItsGenerator) {
  // The fixture file is what the browser test and golden HTML use; it must stay what the generator
  // (and sim_result_to_json) produce. FSDPSIM_UPDATE_GOLDEN=1 rewrites it.
  std::string msg = fixture::check_golden(kFixture, fixture::fixture_plan_doc().dump(2) + "\n");
  EXPECT_EQ(msg, "");
}

TEST(HtmlReport, GoldenFileAndDeterminism) {
  json doc = read_json_file(fixture::source_path(kFixture), "fixture");
  std::string a = render_html(doc), b = render_html(doc);
  EXPECT_EQ(a, b);   // byte-identical for the same input
  EXPECT_EQ(fixture::check_golden("tests/reports/golden/plan_small.html", a), "");
}

TEST(HtmlReport, OneElementPerCandidateCategoryAndSpan) {
  json doc = fixture::fixture_plan_doc();
  std::string h = render_html(doc);
  const int n = static_cast<int>(doc["candidates"].size());
  std::string scatter = svg_by_id(h, "scatter-chart");
  ASSERT_FALSE(scatter.empty());
  EXPECT_EQ(count(scatter, "<circle cx=") - count(scatter, "class=\"rec-ring\""), n);
  EXPECT_EQ(count(scatter, "class=\"pt "), n);
  EXPECT_EQ(count(scatter, "class=\"rec-ring\""), 1);
  EXPECT_EQ(count(h, "<tr id=\"cand-"), n);
  int nonzero = 0;
  for (auto& [k, v] : doc["recommended_detail"]["memory_breakdown_bytes"].items()) nonzero += v.get<std::int64_t>() > 0;
  EXPECT_EQ(count(svg_by_id(h, "memory-bar"), "class=\"seg "), nonzero);
  // Timeline: one rect per decimated rect, and together they stand for every span.
  std::string tl = svg_by_id(h, "stream-timeline");
  const int spans = static_cast<int>(doc["recommended_detail"]["trace"].size());
  EXPECT_EQ(sum_data_n(tl, "span "), spans);
  EXPECT_EQ(count(svg_by_id(h, "memory-timeline"), "<polyline class=\"series "), 2);
  EXPECT_EQ(count(h, "<button type=\"button\" class=\"copy\""), 4);
  EXPECT_NE(h.find("<a href=\"trace.json\">trace.json</a>"), std::string::npos);
  // Units are shown.
  EXPECT_NE(h.find(" GiB"), std::string::npos);
  EXPECT_NE(h.find(" ms"), std::string::npos);
  EXPECT_NE(h.find("tokens/s"), std::string::npos);
  EXPECT_NE(h.find("%"), std::string::npos);
}

TEST(HtmlReport, SelfContainedNoNetwork) {
  std::string h = render_html(fixture::fixture_plan_doc({.with_measured = true}));
  for (const char* bad : {"http://", "https://", " src=", "@import", "url(", "<link", "<iframe", "<img"})
    EXPECT_EQ(h.find(bad), std::string::npos) << bad;
  EXPECT_NE(h.find("prefers-color-scheme: dark"), std::string::npos);
  EXPECT_NE(h.find("@media print"), std::string::npos);
}

TEST(HtmlReport, EveryUserStringIsEscaped) {
  const std::string evil = "<script>alert(1)</script>\"'&<img src=x onerror=alert(2)>";
  fixture::FixtureOptions o;
  o.model_name = evil;
  json doc = fixture::fixture_plan_doc(o);
  doc["candidates"][0]["label"] = evil;
  doc["candidates"][1]["why"][0] = evil;
  doc["exports"]["fsdp2"]["text"] = "</code></pre>" + evil;
  doc["explanations"]["recommended"][0] = evil;
  doc["rejected_families"][0]["reason"] = evil;
  doc["recommended_detail"]["trace"][0]["name"] = evil;
  doc["recommended_detail"]["notes"][0] = evil;
  doc["inputs"]["cluster"]["name"] = evil;
  doc["context"]["command"] = "fsdpsim plan --model " + evil + " -->";
  std::string h = render_html(doc);
  EXPECT_EQ(h.find("<script>alert"), std::string::npos);
  EXPECT_EQ(h.find("<img"), std::string::npos);
  EXPECT_EQ(h.find("</code></pre><script>"), std::string::npos);
  EXPECT_NE(h.find("&lt;/code&gt;&lt;/pre&gt;&lt;script&gt;"), std::string::npos);
  EXPECT_GT(count(h, "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;&lt;img"), 8);
  // Exactly the page's own two <script> elements.
  EXPECT_EQ(count(h, "<script>"), 2);
  // The context comment cannot be closed early by "--" in the command line.
  size_t c0 = h.find("<!-- context:");
  ASSERT_NE(c0, std::string::npos);
  EXPECT_EQ(h.substr(h.find("-->", c0), 10), "-->\n<head>");
}

// A search of thousands of plans: the table lists the top kMaxTableRows, the scatter draws every
// candidate, sharing a circle between candidates on the same pixel (sum of data-n == candidates).
TEST(HtmlReport, ManyCandidatesAreCappedInTheTableAndGroupedInTheScatter) {
  json doc = fixture::fixture_plan_doc();
  const json base = doc["candidates"];
  doc["candidates"] = json::array();
  for (int i = 0; i < 1000; ++i) {
    json c = base[static_cast<size_t>(i % 8)];
    c["rank"] = i + 1;
    c["id"] = "c" + std::to_string(10000 + i);
    if (i >= 8) c["pareto"] = false;
    doc["candidates"].push_back(c);
  }
  doc["explanations"]["runners_up"] = json::array();
  std::string h = render_html(doc);
  EXPECT_EQ(count(h, "<tr id=\"cand-"), 200);
  EXPECT_NE(h.find("The top 200 of 1000 candidates are listed"), std::string::npos);
  std::string scatter = svg_by_id(h, "scatter-chart");
  EXPECT_EQ(count(scatter, "class=\"pt "), 8);   // 8 distinct predictions
  std::regex re("class=\"pt [^\"]*\" data-cand=\"[^\"]*\" data-n=\"([0-9]+)\"");
  int sum = 0;
  for (auto it = std::sregex_iterator(scatter.begin(), scatter.end(), re); it != std::sregex_iterator(); ++it) sum += std::stoi((*it)[1]);
  EXPECT_EQ(sum, 1000);
  EXPECT_NE(h.find("1000 candidates drawn as 8 points"), std::string::npos);
  EXPECT_LT(h.size(), 500u * 1000);
}

TEST(HtmlReport, ThousandsOfSpansStayUnderTwoMegabytes) {
  fixture::FixtureOptions o;
  o.grad_accum_scale = 40;
  o.units = 32;
  json doc = fixture::fixture_plan_doc(o);
  const int spans = static_cast<int>(doc["recommended_detail"]["trace"].size());
  ASSERT_GT(spans, 5000);
  std::string h = render_html(doc);
  EXPECT_LT(h.size(), 2u * 1000 * 1000) << h.size();
  std::string tl = svg_by_id(h, "stream-timeline");
  EXPECT_EQ(sum_data_n(tl, "span "), spans);   // merged rects still account for every span
  EXPECT_LT(count(tl, "class=\"span "), spans);
  EXPECT_NE(h.find("adjacent spans narrower than a pixel"), std::string::npos);
  // The rect count equals the decimation rule's (plot width 930 px = 1100 - 150 - 20).
  PlanDocView v = read_plan_doc(doc);
  TimeNs end = 0;
  for (const auto& s : v.detail->trace) end = std::max(end, s.start_ns + s.dur_ns);
  end = std::max<TimeNs>(end, static_cast<TimeNs>(std::llround(v.detail->result.step_time_s * 1e9)));
  DecimateOptions opt;
  opt.ns_per_px = static_cast<double>(end) / 930.0;
  EXPECT_EQ(count(tl, "class=\"span "), static_cast<int>(decimate_trace(v.detail->trace, opt).size()));
}

TEST(HtmlReport, NothingFitsAndMeasuredVariants) {
  fixture::FixtureOptions nf;
  nf.nothing_fits = true;
  std::string h = render_html(fixture::fixture_plan_doc(nf));
  EXPECT_NE(h.find("No candidate fits"), std::string::npos);
  EXPECT_NE(h.find("id=\"scatter-chart\""), std::string::npos);
  EXPECT_EQ(h.find("id=\"memory-bar\""), std::string::npos);
  EXPECT_EQ(h.find("id=\"stream-timeline\""), std::string::npos);
  EXPECT_NE(h.find("NO_SHARD"), std::string::npos);

  fixture::FixtureOptions m;
  m.with_measured = true;
  json doc = fixture::fixture_plan_doc(m);
  h = render_html(doc);
  EXPECT_NE(h.find("id=\"measured\""), std::string::npos);
  EXPECT_NE(h.find("id=\"measured-table\""), std::string::npos);
  EXPECT_NE(h.find("id=\"measured-timeline\""), std::string::npos);
  EXPECT_NE(h.find("per op ("), std::string::npos);          // the comparison's per-op rows
  EXPECT_NE(h.find("memory breakdown ("), std::string::npos);
  // Errors printed with their sign: the fixture's measured step is slower, so the prediction is low.
  double e = doc["measured"]["step_time_error"];
  EXPECT_LT(e, 0);
  EXPECT_NE(h.find(fmt_signed_percent(e)), std::string::npos);
  // A null error (measured value 0) prints as n/a, never as a number.
  doc["measured"]["step_time_error"] = nullptr;
  EXPECT_NE(render_html(doc).find("<div class=\"v \">n/a</div>"), std::string::npos);
}

TEST(HtmlReport, WriteHtmlIsAtomicAndNamesTheField) {
  std::string dir = fixture::artifact_dir();
  json doc = fixture::fixture_plan_doc();
  write_html(dir + "/report_small.html", doc);
  EXPECT_EQ(fixture::read_file(dir + "/report_small.html"), render_html(doc));
  try {
    write_html(dir + "/missing/dir/report.html", doc);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--out");
  }
}

// The recommendation's peak is the steady step's; a higher reserved peak before it (the first step's, FSDP1's
// construction), which `fits` takes too, is named beside it, and nothing is added when none is higher.
TEST(HtmlReport, PeakNamesAHigherReservedPeakBeforeTheSteadyStep) {
  json doc = fixture::fixture_plan_doc();
  const std::string plain = render_html(doc);
  EXPECT_EQ(plain.find("FSDP1 construction"), std::string::npos);
  EXPECT_EQ(plain.find("; first step "), std::string::npos);
  json& result = doc["recommended_detail"];   // (the recommendation's full result)
  ASSERT_TRUE(result.is_object());
  const double steady = result["peak_memory_bytes"]["reserved"].get<double>();
  result["first_step_peak_memory_bytes"] = {{"allocated", 0}, {"reserved", steady + 2.0 * (1 << 30)}};
  result["construction_peak_memory_bytes"] = {{"allocated", 0}, {"reserved", steady + 3.0 * (1 << 30)}};
  const std::string h = render_html(doc);
  EXPECT_NE(h.find("; first step " + fmt_gib(steady + 2.0 * (1 << 30)) + " reserved"), std::string::npos);
  EXPECT_NE(h.find("; FSDP1 construction " + fmt_gib(steady + 3.0 * (1 << 30)) + " reserved"), std::string::npos);
  // (below the steady peak: not named)
  result["construction_peak_memory_bytes"]["reserved"] = steady / 2;
  result["first_step_peak_memory_bytes"]["reserved"] = steady;
  const std::string low = render_html(doc);
  EXPECT_EQ(low.find("FSDP1 construction"), std::string::npos);
  EXPECT_EQ(low.find("; first step "), std::string::npos);
}
