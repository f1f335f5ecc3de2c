// report.html in a real browser: Debian's headless Chromium loads the generated page from disk (no
// network), a probe script appended for the test counts what the browser actually parsed and drew
// (SVG elements in the SVG namespace, table rows, bar segments, timeline rects), clicks a column
// header to check sorting, and reads the page's error counter; stderr's CONSOLE lines are checked
// too. Screenshots (light and dark) are saved under <build>/test-artifacts/. A page with a
// deliberate script error and a missing resource must be caught (the test tests itself).
// Needs /usr/bin/chromium (scripts/deps.sh); FSDPSIM_SKIP_BROWSER=1 skips explicitly.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/json_reader.h"
#include "fixture_plan.h"
#include "reports/charts.h"
#include "reports/html_report.h"
#include "reports/plan_doc.h"
#include "models/zoo.h"
#include "planner/planner.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kChromium = "/usr/bin/chromium";

// Counts taken inside the browser after the page's own scripts ran; written into <pre id="__probe">.
const char* kProbe = R"JS(<script>
(function(){
  function q(s){return document.querySelectorAll(s);}
  var r={};
  r.scatter_points=q('#scatter-chart circle.pt').length;
  var sn=0;q('#scatter-chart circle.pt').forEach(function(e){sn+=parseInt(e.getAttribute('data-n'),10);});
  r.scatter_candidates=sn;
  r.table_rows=q('#candidate-table tbody tr').length;
  r.bar_segments=q('#memory-bar rect.seg').length;
  r.timeline_rects=q('#stream-timeline rect.span').length;
  var n=0;q('#stream-timeline rect.span').forEach(function(e){n+=parseInt(e.getAttribute('data-n'),10);});
  r.timeline_span_sum=n;
  r.measured_rects=q('#measured-timeline rect.span').length;
  r.exposed_rects=q('#stream-timeline rect.exposed').length;
  r.memory_series=q('#memory-timeline polyline.series').length;
  var ms=document.querySelector('#memory-timeline g.memory-series');
  if(ms){r.mem_t_end_ns=parseFloat(ms.getAttribute('data-t-end-ns'));r.mem_last_sample_ns=parseFloat(ms.getAttribute('data-last-sample-ns'));}
  var al=document.querySelector('#memory-timeline polyline.allocated');
  if(al&&al.points.numberOfItems>2){var P=al.points,n=P.numberOfItems,x0=P.getItem(0).x,xe=P.getItem(n-1).x;
    r.mem_last_point_frac=(P.getItem(n-2).x-x0)/(xe-x0);}
  var eb=0;q('#stream-timeline rect.exposed').forEach(function(e){eb+=parseFloat(e.getAttribute('data-busy-ns'));});
  r.exposed_busy_ns=eb;
  r.copy_buttons=q('button.copy').length;
  var ns='http:'+'//www.w3.org/2000/svg';
  r.svg_namespace_ok=Array.prototype.every.call(q('svg.chart *'),function(e){return e.namespaceURI===ns;});
  r.svg_elements=q('svg.chart *').length;
  var sc=document.getElementById('scatter-chart');
  r.scatter_width=sc?Math.round(sc.getBoundingClientRect().width):0;
  var t=document.getElementById('candidate-table'),ths=t.tHead.rows[0].cells,col=-1;
  for(var i=0;i<ths.length;i++)if(ths[i].textContent==='tokens/s/GPU')col=i;
  function column(){return Array.prototype.map.call(t.tBodies[0].rows,function(row){return parseFloat(row.cells[col].getAttribute('data-v'));});}
  function sorted(a,dir){for(var i=1;i<a.length;i++)if(dir*(a[i]-a[i-1])<0)return false;return true;}
  ths[col].click();r.sort_ascending=sorted(column(),1)&&ths[col].getAttribute('aria-sort')==='ascending';
  ths[col].click();r.sort_descending=sorted(column(),-1)&&ths[col].getAttribute('aria-sort')==='descending';
  r.errors=window.__fsdpsimErrors;
  r.ready=document.body.getAttribute('data-ready');
  var pre=document.createElement('pre');pre.id='__probe';pre.textContent=JSON.stringify(r);document.body.appendChild(pre);
})();
</script>)JS";

struct BrowserRun {
  int exit_code = -1;
  std::string dom, log;
};

std::string artifacts() {
  std::string d = fixture::artifact_dir() + "/browser";
  fs::create_directories(d);
  return d;
}

// One headless Chromium run (the flags of issue #6) with a fresh profile directory.
BrowserRun chromium(const std::string& html_path, const std::string& mode, const std::string& tag) {
  std::string profile = artifacts() + "/profile-" + tag;
  fs::remove_all(profile);
  fs::create_directories(profile);
  std::string out = artifacts() + "/" + tag + ".dom", err = artifacts() + "/" + tag + ".log";
  std::string cmd = std::string("timeout 120 ") + kChromium +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
                    " --disable-component-update --disable-sync --user-data-dir=" + profile +
                    " --enable-logging=stderr --v=0 " + mode + " file://" + fs::absolute(html_path).string() + " > " + out +
                    " 2> " + err;
  int rc = std::system(cmd.c_str());
  BrowserRun r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.dom = fixture::read_file(out);
  r.log = fixture::read_file(err);
  fs::remove_all(profile);
  return r;
}

std::string unescape_text(std::string s) {
  for (auto [from, to] : {std::pair<std::string, std::string>{"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}}) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  }
  return s;
}

struct PageCheck {
  json probe;                      // null when the probe did not run
  int body_errors = -1;            // <body data-errors> after the load event (failed resources included)
  std::vector<std::string> problems;
};

// Loads a page with the probe appended and collects every sign of a broken page.
PageCheck load_and_probe(const std::string& html, const std::string& tag) {
  std::string page = html;
  size_t body_end = page.rfind("</body>");
  page.insert(body_end, kProbe);
  std::string path = artifacts() + "/" + tag + ".html";
  std::ofstream(path, std::ios::binary) << page;
  BrowserRun run = chromium(path, "--dump-dom", tag);
  PageCheck c;
  if (run.exit_code != 0) c.problems.push_back("chromium exit code " + std::to_string(run.exit_code) + "\n" + run.log);
  size_t a = run.dom.find("<pre id=\"__probe\">");
  if (a == std::string::npos) {
    c.problems.push_back("the probe did not run (a script failed before it?)");
  } else {
    a += std::string("<pre id=\"__probe\">").size();
    c.probe = json::parse(unescape_text(run.dom.substr(a, run.dom.find("</pre>", a) - a)));
    if (c.probe["errors"] != 0) c.problems.push_back("page counted " + c.probe["errors"].dump() + " script/resource errors");
    if (c.probe["ready"] != "1") c.problems.push_back("the page's script did not complete (data-ready != 1)");
  }
  // The probe runs before the load event; a resource that fails to load is counted by then, so the
  // attribute in the dumped DOM (taken after the load event) is the final count.
  size_t e = run.dom.find("data-errors=\"");
  if (e != std::string::npos) c.body_errors = std::atoi(run.dom.c_str() + e + 13);
  if (c.body_errors != 0) c.problems.push_back("<body data-errors> is " + std::to_string(c.body_errors));
  for (size_t p = run.log.find("CONSOLE"); p != std::string::npos; p = run.log.find("CONSOLE", p + 1))
    c.problems.push_back("console: " + run.log.substr(p, run.log.find('\n', p) - p));
  return c;
}

bool skip() {
  const char* s = std::getenv("FSDPSIM_SKIP_BROWSER");
  return s && std::string(s) == "1";
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

bool is_png(const std::string& path, size_t min_bytes) {
  std::string b = fixture::read_file(path);
  return b.size() >= min_bytes && b.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0;
}

}  // namespace

class Browser : public ::testing::Test {
 protected:
  void SetUp() override {
    if (skip()) GTEST_SKIP() << "FSDPSIM_SKIP_BROWSER=1";
    ASSERT_TRUE(fs::exists(kChromium)) << kChromium << " not found: apt-get install -y chromium";
  }
};

TEST_F(Browser, FixtureReportRendersEveryChartWithoutErrors) {
  json doc = read_json_file(fixture::source_path("tests/reports/fixtures/plan_small.json"), "fixture");
  const PlanDocView v = read_plan_doc(doc);
  const StreamTimelineChart tc = stream_timeline_chart(*v.detail);
  int nonzero = 0;
  for (const auto& [k, b] : v.detail->result.breakdown) nonzero += b > 0;

  PageCheck c = load_and_probe(render_html(doc), "report_small");
  ASSERT_TRUE(c.problems.empty()) << joined(c.problems);
  const json& p = c.probe;
  EXPECT_EQ(p["scatter_points"], scatter_chart(v, 0.05).points);
  EXPECT_EQ(p["scatter_points"], v.candidates.size());   // the fixture's 8 predictions are distinct
  EXPECT_EQ(p["scatter_candidates"], v.candidates.size());
  EXPECT_EQ(p["table_rows"], v.candidates.size());
  EXPECT_EQ(p["bar_segments"], nonzero);
  EXPECT_EQ(p["timeline_rects"], tc.rects);
  EXPECT_EQ(p["timeline_span_sum"], v.detail->trace.size());
  EXPECT_EQ(p["exposed_rects"], tc.exposed_rects);
  EXPECT_GT(tc.exposed_rects, 0);
  EXPECT_EQ(p["memory_series"], 2);
  EXPECT_EQ(p["copy_buttons"], v.exports.size());
  EXPECT_EQ(p["svg_namespace_ok"], true);
  EXPECT_GT(p["svg_elements"].get<int>(), 200);
  EXPECT_GT(p["scatter_width"].get<int>(), 500);
  EXPECT_EQ(p["sort_ascending"], true);
  EXPECT_EQ(p["sort_descending"], true);
}

TEST_F(Browser, ScreenshotsInLightAndDarkMode) {
  json doc = read_json_file(fixture::source_path("tests/reports/fixtures/plan_small.json"), "fixture");
  std::string html = artifacts() + "/report.html";
  std::ofstream(html, std::ios::binary) << render_html(doc);
  const std::string light = fixture::artifact_dir() + "/report.png", dark = fixture::artifact_dir() + "/report-dark.png";
  fs::remove(light);
  fs::remove(dark);
  BrowserRun a = chromium(html, "--window-size=1400,5000 --screenshot=" + light, "shot_light");
  EXPECT_EQ(a.exit_code, 0) << a.log;
  EXPECT_TRUE(is_png(light, 50 * 1000)) << light;
  // preferredColorScheme=0 selects the dark scheme in Blink's settings.
  BrowserRun b = chromium(html, "--blink-settings=preferredColorScheme=0 --window-size=1400,1800 --screenshot=" + dark, "shot_dark");
  EXPECT_EQ(b.exit_code, 0) << b.log;
  EXPECT_TRUE(is_png(dark, 50 * 1000)) << dark;
  EXPECT_NE(fixture::read_file(light), fixture::read_file(dark));
}

TEST_F(Browser, MeasuredAndLargeReports) {
  fixture::FixtureOptions m;
  m.with_measured = true;
  json doc = fixture::fixture_plan_doc(m);
  PageCheck c = load_and_probe(render_html(doc), "report_measured");
  ASSERT_TRUE(c.problems.empty()) << joined(c.problems);
  EXPECT_GT(c.probe["measured_rects"].get<int>(), 0);

  fixture::FixtureOptions big;
  big.grad_accum_scale = 40;
  big.units = 32;
  doc = fixture::fixture_plan_doc(big);
  const PlanDocView v = read_plan_doc(doc);
  const StreamTimelineChart tc = stream_timeline_chart(*v.detail);
  ASSERT_GT(tc.merged_rects, 0);
  c = load_and_probe(render_html(doc), "report_big");
  ASSERT_TRUE(c.problems.empty()) << joined(c.problems);
  EXPECT_EQ(c.probe["timeline_rects"], tc.rects);
  EXPECT_EQ(c.probe["timeline_span_sum"], v.detail->trace.size());
}

// The checks above must fail on a broken page: a script error and a resource that does not load.
TEST_F(Browser, InjectedErrorsAreCaught) {
  std::string html = render_html(read_json_file(fixture::source_path("tests/reports/fixtures/plan_small.json"), "fixture"));
  size_t body_end = html.rfind("</body>");
  html.insert(body_end, "<script>window.__no_such_object.x = 1;</script><img src=\"no-such-image.png\" alt=\"\">");
  PageCheck c = load_and_probe(html, "report_broken");
  ASSERT_FALSE(c.problems.empty());
  ASSERT_TRUE(c.probe.is_object()) << joined(c.problems);
  EXPECT_GE(c.probe["errors"].get<int>(), 1) << joined(c.problems);
  EXPECT_EQ(c.body_errors, 2) << joined(c.problems);
  bool console_seen = false;
  for (const auto& p : c.problems) console_seen = console_seen || p.find("Uncaught TypeError") != std::string::npos;
  EXPECT_TRUE(console_seen) << joined(c.problems);
}

// A real plan, simulated: the memory chart spans the whole step (the CPU issues this communication-
// bound step far ahead of the GPU, so on the CPU's clock the samples would end early) and the
// exposed-communication lane adds up to the simulator's exposed_comm_ns within 1%.
TEST_F(Browser, SimulatedPlanMemorySpansTheStepAndExposedLaneMatchesTheSimulator) {
  for (const char* version : {"2", "1"}) {
    SCOPED_TRACE(std::string("fsdp_version ") + version);
    planner::PlanRequest req;
    req.model = models::load_model("llama-1b");
    req.cluster = calibrate::load_cluster("2x8xH100-SXM-ETH-10G");
    req.hw = calibrate::HardwareProfile::for_cluster(req.cluster);
    req.profile_name = "builtin";
    req.space.batch = planner::resolve_batch_target(2048, 0, 32, req.cluster.world());
    for (const char* f : {"mesh=[1,16]", "activation_checkpointing=none", "cpu_offload=false", "micro_batch=1", "grad_sync=true"})
      req.space.fixed.push_back(planner::parse_constraint(f, "--fix"));
    req.space.fixed.push_back(planner::parse_constraint(std::string("fsdp_version=") + version, "--fix"));
    planner::PlanOutcome out = planner::run_planner(req);
    ASSERT_GE(out.ranking.recommended, 0);
    const sim::SimResult& r = out.recommended_detail;
    ASSERT_FALSE(r.trace.empty());
    ASSERT_GT(r.exposed_comm_ns, 0);
    HtmlOptions opt;
    opt.detail = &r;
    PageCheck c = load_and_probe(render_html(planner::plan_document(req, out), opt), std::string("report_sim_v") + version);
    ASSERT_TRUE(c.problems.empty()) << joined(c.problems);
    const json& p = c.probe;
    const double step_ns = static_cast<double>(r.step_time_ns);
    // The chart's axis ends with the step, and its last sample is drawn near the end, not at the CPU's
    // last issue (on the CPU's clock it would be at r.memory_timeline.back().t_ns).
    EXPECT_NEAR(p["mem_t_end_ns"].get<double>(), step_ns, 1e-3 * step_ns);
    EXPECT_GT(p["mem_last_sample_ns"].get<double>(), 0.9 * step_ns) << "CPU clock: " << r.memory_timeline.back().t_ns;
    EXPECT_GT(p["mem_last_point_frac"].get<double>(), 0.9);
    EXPECT_NEAR(p["exposed_busy_ns"].get<double>(), static_cast<double>(r.exposed_comm_ns), 0.01 * static_cast<double>(r.exposed_comm_ns));
  }
}
