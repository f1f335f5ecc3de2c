#include "reports/svg.h"

#include <cmath>

#include "reports/format.h"
#include "reports/html_escape.h"

namespace fsdpsim::reports {

double LinearScale::operator()(double v) const {
  if (d1 == d0) return p0;
  return p0 + (v - d0) / (d1 - d0) * (p1 - p0);
}

namespace {
double nice_step(double span, int target) {
  if (!(span > 0) || !std::isfinite(span)) return 1.0;
  double raw = span / std::max(1, target);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10.0 * mag;
}
}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return out;
  if (hi <= lo) {
    out.push_back(lo);
    return out;
  }
  double step = nice_step(hi - lo, target);
  // Integer tick indices avoid accumulating floating-point error across ticks.
  long long first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  long long last = static_cast<long long>(std::floor(hi / step + 1e-9));
  for (long long k = first; k <= last && out.size() < 64; ++k) out.push_back(static_cast<double>(k) * step);
  return out;
}

double nice_ceiling(double hi, int target) {
  if (!(hi > 0) || !std::isfinite(hi)) return 1.0;
  double step = nice_step(hi, target);
  return std::ceil(hi / step - 1e-9) * step;
}

Svg::Svg(double width, double height, const std::string& id, const std::string& label) {
  head_ = "<svg id=\"" + html_escape(id) + "\" class=\"chart\" viewBox=\"0 0 " + svg_num(width) + " " +
          svg_num(height) + "\" width=\"" + svg_num(width) + "\" height=\"" + svg_num(height) +
          "\" role=\"img\" aria-label=\"" + html_escape(label) + "\" preserveAspectRatio=\"xMinYMin meet\">\n";
}

std::string Svg::attrs(const Attrs& a) const {
  std::string s;
  for (const auto& [k, v] : a) s += " " + k + "=\"" + html_escape(v) + "\"";
  return s;
}

void Svg::rect(double x, double y, double w, double h, const std::string& cls, const std::string& tooltip,
               const Attrs& extra) {
  body_ += "<rect x=\"" + svg_num(x) + "\" y=\"" + svg_num(y) + "\" width=\"" + svg_num(std::max(0.0, w)) +
           "\" height=\"" + svg_num(std::max(0.0, h)) + "\" class=\"" + html_escape(cls) + "\"" + attrs(extra);
  if (tooltip.empty())
    body_ += "/>\n";
  else
    body_ += "><title>" + html_escape(tooltip) + "</title></rect>\n";
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& cls) {
  body_ += "<line x1=\"" + svg_num(x1) + "\" y1=\"" + svg_num(y1) + "\" x2=\"" + svg_num(x2) + "\" y2=\"" +
           svg_num(y2) + "\" class=\"" + html_escape(cls) + "\"/>\n";
}

void Svg::circle(double cx, double cy, double r, const std::string& cls, const std::string& tooltip,
                 const Attrs& extra) {
  body_ += "<circle cx=\"" + svg_num(cx) + "\" cy=\"" + svg_num(cy) + "\" r=\"" + svg_num(r) + "\" class=\"" +
           html_escape(cls) + "\"" + attrs(extra);
  if (tooltip.empty())
    body_ += "/>\n";
  else
    body_ += "><title>" + html_escape(tooltip) + "</title></circle>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const std::string& cls) {
  if (pts.empty()) return;
  body_ += "<polyline class=\"" + html_escape(cls) + "\" points=\"";
  for (size_t i = 0; i < pts.size(); ++i)
    body_ += (i ? " " : "") + svg_num(pts[i].first) + "," + svg_num(pts[i].second);
  body_ += "\"/>\n";
}

void Svg::text(double x, double y, const std::string& s, const std::string& cls, const std::string& anchor) {
  body_ += "<text x=\"" + svg_num(x) + "\" y=\"" + svg_num(y) + "\" class=\"" + html_escape(cls) + "\"";
  if (anchor != "start") body_ += " text-anchor=\"" + html_escape(anchor) + "\"";
  body_ += ">" + html_escape(s) + "</text>\n";
}

void Svg::open_group(const std::string& cls, const Attrs& extra) {
  body_ += "<g class=\"" + html_escape(cls) + "\"" + attrs(extra) + ">\n";
}

void Svg::close_group() { body_ += "</g>\n"; }

std::string Svg::str() const { return head_ + body_ + "</svg>\n"; }

}  // namespace fsdpsim::reports
