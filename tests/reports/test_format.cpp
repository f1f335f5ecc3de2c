// Formatting, escaping and axis ticks: exact strings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "reports/format.h"
#include "reports/html_escape.h"
#include "reports/svg.h"

using namespace fsdpsim;
using namespace fsdpsim::reports;

TEST(Format, FixedAndThousands) {
  EXPECT_EQ(fmt_fixed(12.346, 2), "12.35");
  EXPECT_EQ(fmt_fixed(12.345, 2), "12.35");  // printf rounds the binary value, 12.3450000000000006
  EXPECT_EQ(fmt_fixed(-0.001, 2), "0.00");   // no "-0.00"
  EXPECT_EQ(fmt_fixed(-1.5, 1), "-1.5");
  EXPECT_EQ(fmt_thousands(1234567.4), "1,234,567");
  EXPECT_EQ(fmt_thousands(999), "999");
  EXPECT_EQ(fmt_thousands(1000), "1,000");
  EXPECT_EQ(fmt_thousands(-25308.6), "-25,309");
  EXPECT_EQ(fmt_thousands(0.2), "0");
  EXPECT_EQ(fmt_fixed(std::nan(""), 2), "n/a");
  EXPECT_EQ(fmt_thousands(std::numeric_limits<double>::infinity()), "n/a");
}

TEST(Format, UnitsAreGiBAndSeconds) {
  EXPECT_EQ(fmt_gib(static_cast<double>(kGiB)), "1.00 GiB");
  EXPECT_EQ(fmt_gib(24.0 * kGiB, 1), "24.0 GiB");
  EXPECT_EQ(fmt_gib(1.5e9), "1.40 GiB");  // 1.5e9 / 2^30 = 1.3970: GiB, not GB
  EXPECT_EQ(fmt_seconds(12.34), "12.3 s");
  EXPECT_EQ(fmt_seconds(1.234), "1.23 s");
  EXPECT_EQ(fmt_seconds(0.1624), "162 ms");
  EXPECT_EQ(fmt_seconds(0.0123), "12.3 ms");
  EXPECT_EQ(fmt_seconds(0.0055), "5.50 ms");
  EXPECT_EQ(fmt_seconds(0.0000456), "45.6 us");
  EXPECT_EQ(fmt_seconds(0), "0.00 ms");
  EXPECT_EQ(fmt_ms(0.16244), "162.4 ms");
  EXPECT_EQ(fmt_percent(0.4213), "42.1%");
  EXPECT_EQ(fmt_signed_percent(0.032), "+3.2%");
  EXPECT_EQ(fmt_signed_percent(-0.005, 1), "-0.5%");
  EXPECT_EQ(fmt_signed_percent(0.0), "0.0%");
  EXPECT_EQ(fmt_count(8.03e9), "8.03 B");
  EXPECT_EQ(fmt_count(124e6), "124 M");
  EXPECT_EQ(fmt_count(12.4e6), "12.4 M");
  EXPECT_EQ(fmt_count(950), "950");
  EXPECT_EQ(fmt_tokens_per_s(25308.2), "25,308 tokens/s");
  EXPECT_EQ(fmt_bytes_auto(512), "512 B");
  EXPECT_EQ(fmt_bytes_auto(1536), "1.5 KiB");
  EXPECT_EQ(fmt_bytes_auto(12.0 * kMiB), "12.0 MiB");
  EXPECT_EQ(fmt_bytes_auto(3.25 * kGiB), "3.25 GiB");
}

TEST(Format, SvgNumbers) {
  EXPECT_EQ(svg_num(12.0), "12");
  EXPECT_EQ(svg_num(12.5), "12.5");
  EXPECT_EQ(svg_num(12.254), "12.25");
  EXPECT_EQ(svg_num(-0.001), "0");
  EXPECT_EQ(svg_num(std::nan("")), "0");
}

TEST(Escape, EveryMarkupCharacter) {
  EXPECT_EQ(html_escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
  EXPECT_EQ(html_escape("tab\tnl\n"), "tab\tnl\n");
  EXPECT_EQ(html_escape(std::string("a\x01" "b", 3)), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(html_escape("llama-3 8B \xC3\xA9"), "llama-3 8B \xC3\xA9");  // UTF-8 passes through
  EXPECT_EQ(html_token("c0042"), "c0042");
  EXPECT_EQ(html_token("a b\"<c>"), "a_b__c_");
  EXPECT_EQ(html_token(""), "_");
}

TEST(Svg, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 30, 8), (std::vector<double>{0, 5, 10, 15, 20, 25, 30}));
  EXPECT_EQ(nice_ticks(0, 1, 4), (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(nice_ticks(0, 162.4, 10), (std::vector<double>{0, 20, 40, 60, 80, 100, 120, 140, 160}));
  EXPECT_EQ(nice_ticks(5, 5, 4), (std::vector<double>{5}));
  EXPECT_DOUBLE_EQ(nice_ceiling(25.2, 8), 30.0);  // 25.2 / 8 = 3.15 -> step 5 -> 30
  EXPECT_DOUBLE_EQ(nice_ceiling(0.9, 5), 1.0);
}

TEST(Svg, ElementsAreEscaped) {
  Svg s(100, 50, "c\"1", "label <b>");
  s.rect(1, 2, 3, 4, "seg x", "tip <i>&", {{"data-n", "2"}});
  s.text(0, 0, "a<b", "t", "middle");
  std::string out = s.str();
  EXPECT_NE(out.find("id=\"c&quot;1\""), std::string::npos);
  EXPECT_NE(out.find("aria-label=\"label &lt;b&gt;\""), std::string::npos);
  EXPECT_NE(out.find("<rect x=\"1\" y=\"2\" width=\"3\" height=\"4\" class=\"seg x\" data-n=\"2\"><title>tip &lt;i&gt;&amp;</title></rect>"),
            std::string::npos);
  EXPECT_NE(out.find(">a&lt;b</text>"), std::string::npos);
}
