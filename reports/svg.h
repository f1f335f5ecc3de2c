// A tiny inline-SVG writer for the report's charts: elements are appended as text, every string
// escaped, every coordinate printed by svg_num (deterministic, 2 decimals). Charts are drawn in C++
// so the page shows them without JavaScript (issue #6: "must not need JavaScript to show its charts").
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace fsdpsim::reports {

// Linear map from a data interval onto a pixel interval (either may be reversed, as y axes are).
struct LinearScale {
  double d0 = 0, d1 = 1;   // data
  double p0 = 0, p1 = 1;   // pixels
  double operator()(double v) const;
};

// "Nice" tick values covering [lo, hi] with about `target` ticks (steps of 1, 2, 2.5 or 5 x 10^k),
// deterministic; returns at least two values when hi > lo.
std::vector<double> nice_ticks(double lo, double hi, int target);
// The first tick >= hi (to round an axis maximum up to a nice value).
double nice_ceiling(double hi, int target);

class Svg {
 public:
  // id: the element id (tests look charts up by it); label: aria-label / <title> of the chart.
  Svg(double width, double height, const std::string& id, const std::string& label);

  // Attributes are given already formatted: {name, value}; values are escaped here.
  using Attrs = std::vector<std::pair<std::string, std::string>>;
  void rect(double x, double y, double w, double h, const std::string& cls, const std::string& tooltip = "",
            const Attrs& extra = {});
  void line(double x1, double y1, double x2, double y2, const std::string& cls);
  void circle(double cx, double cy, double r, const std::string& cls, const std::string& tooltip = "",
              const Attrs& extra = {});
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& cls);
  // anchor: "start" | "middle" | "end".
  void text(double x, double y, const std::string& s, const std::string& cls, const std::string& anchor = "start");
  void open_group(const std::string& cls, const Attrs& extra = {});
  void close_group();
  std::string str() const;   // the complete <svg>...</svg>

 private:
  std::string attrs(const Attrs& a) const;
  std::string body_;
  std::string head_;
};

}  // namespace fsdpsim::reports
