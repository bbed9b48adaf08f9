#include "core/report/report_html.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/base/display_text.h"
#include "core/base/time_text.h"

namespace gpuckpt {
namespace {

// The charts are inline SVG written here, and the page has no script:
// nothing to fetch, nothing to run, the same page offline. The policy
// has the browser refuse anything else (a style sheet, an image, a font
// or a script that a bug let in), and say so in its console.
constexpr char kContentSecurityPolicy[] = "default-src 'none'; style-src 'unsafe-inline'";

// One palette for the series, so that a colour means the same in every
// chart; sans-serif is whatever the reader's system has (no web font).
constexpr char kStyle[] = R"(body{font-family:sans-serif;margin:1.5em;color:#222;max-width:64em}
h1,h2,h3{font-weight:600}
section.process{border-top:1px solid #ddd;margin-top:1.5em}
svg.chart{display:block;margin:.5em 0;max-width:100%;height:auto}
svg.chart text{font-size:12px;fill:#333}
svg.chart line.grid{stroke:#e4e4e4}
svg.chart line.axis{stroke:#888}
svg.chart polyline.line{fill:none;stroke-width:2}
svg.chart polyline.line.new{stroke-dasharray:6 4}
svg.chart circle.point.new{fill:#fff;stroke-width:2}
.logical{fill:#4e79a7;stroke:#4e79a7}
.new{fill:#f28e2b;stroke:#f28e2b}
.stored{fill:#59a14f;stroke:#59a14f}
.unique{fill:#edc948;stroke:#edc948}
.disk{fill:#b07aa1;stroke:#b07aa1}
.frozen{fill:#e15759;stroke:#e15759}
.durable{fill:#76b7b2;stroke:#76b7b2}
.owner{fill:#9c755f;stroke:#9c755f}
table.numbers{border-collapse:collapse;margin:.5em 0 1.5em}
table.numbers caption{text-align:left;font-style:italic;padding:.2em 0}
table.numbers th,table.numbers td{border:1px solid #ccc;padding:.2em .6em;text-align:left}
table.numbers td.num{text-align:right;font-variant-numeric:tabular-nums}
p.empty{font-style:italic}
)";

// The longest a command or a label is shown in full: a process's command
// line can be megabytes.
constexpr size_t kMaxCommandBytes = 300;
constexpr size_t kMaxSvgLabelBytes = 28;

// The chart geometry, in SVG user units (the page scales them down on
// narrow screens).
constexpr double kChartWidth = 720;
constexpr double kTimeChartHeight = 260;
constexpr double kPlotLeft = 90;
constexpr double kPlotRight = kChartWidth - 24;
constexpr double kPlotTop = 40;
constexpr double kPlotBottom = kTimeChartHeight - 40;
constexpr double kBarLabelWidth = 200;
constexpr double kBarValueWidth = 110;
constexpr double kBarRowHeight = 28;
constexpr double kPointRadius = 4;
// New bytes are often all of a checkpoint's stored bytes (memory that does
// not compress): drawn as larger rings, they show around the stored points
// they cover.
constexpr double kRingRadius = 6;

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The shortest text that reads back as `v` exactly (for data-value).
std::string ExactNumber(double v) {
  char buf[64];
  const auto [end, error] = std::to_chars(buf, buf + sizeof buf, v);
  return error == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// Bytes as people read them, in the units `gpuckpt ls` and `status` use
// (powers of 1000).
std::string Bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1000 && unit + 1 < std::size(kUnits)) {
    v /= 1000;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

// A time as the page shows it: RFC 3339 in UTC, whole seconds.
std::string Time(int64_t ns) { return Rfc3339Utc(ns); }

// The first `max_bytes` of `text`, and "..." where it was cut.
std::string Shortened(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return std::string(text.substr(0, max_bytes)) + "...";
}

// "1 checkpoint", "2 checkpoints"; `plural` where adding "s" will not do.
std::string Counted(uint64_t n, std::string_view one, std::string_view plural = "") {
  std::string text = std::to_string(n) + " ";
  if (n == 1) return text + std::string(one);
  return text + (plural.empty() ? std::string(one) + "s" : std::string(plural));
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "0%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / whole);
  return buf;
}

// --- tables --------------------------------------------------------------

// A cell of a table of numbers: the exact value for machines, the words
// for people.
struct Cell {
  std::string text;   // as shown (escaped when the table is written)
  std::string exact;  // data-value; "" where there is no value
  bool is_number = false;
};

Cell TextCell(std::string text) { return Cell{std::move(text), "", false}; }
Cell BytesCell(uint64_t bytes) { return Cell{Bytes(bytes), std::to_string(bytes), true}; }
Cell CountCell(uint64_t n) { return Cell{std::to_string(n), std::to_string(n), true}; }
Cell SecondsCell(const std::optional<double>& s) {
  if (!s) return Cell{"\u2014", "", true};  // an em dash: not recorded
  return Cell{Seconds(*s), ExactNumber(*s), true};
}

void Table(std::string* out, std::string_view css_class, std::string_view caption,
           const std::vector<std::string>& headings, const std::vector<std::vector<Cell>>& rows) {
  *out += "<table class=\"numbers ";
  *out += css_class;
  *out += "\">\n<caption>" + HtmlEscape(caption) + "</caption>\n<thead><tr>";
  for (const std::string& h : headings) *out += "<th scope=\"col\">" + HtmlEscape(h) + "</th>";
  *out += "</tr></thead>\n<tbody>\n";
  for (const auto& row : rows) {
    *out += "<tr>";
    for (size_t i = 0; i < row.size(); ++i) {
      const Cell& c = row[i];
      if (i == 0) {
        *out += "<th scope=\"row\">" + HtmlEscape(c.text) + "</th>";
      } else if (c.is_number) {
        *out += "<td class=\"num\" data-value=\"" + HtmlEscape(c.exact) + "\">" +
                HtmlEscape(c.text) + "</td>";
      } else {
        *out += "<td>" + HtmlEscape(c.text) + "</td>";
      }
    }
    *out += "</tr>\n";
  }
  *out += "</tbody>\n</table>\n";
}

// --- charts --------------------------------------------------------------

// The opening tag of a chart: `points` is how many marks it draws
// (points or bars), for whoever checks that all of them were drawn.
void OpenSvg(std::string* out, std::string_view css_class, std::string_view title, double height,
             size_t marks) {
  *out += "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart ";
  *out += css_class;
  *out += "\" viewBox=\"0 0 " + Number(kChartWidth) + " " + Number(height) + "\" width=\"" +
          Number(kChartWidth) + "\" height=\"" + Number(height) + "\" role=\"img\" aria-label=\"" +
          HtmlEscape(title) + "\" data-marks=\"" + std::to_string(marks) + "\">\n";
  *out += "<title>" + HtmlEscape(title) + "</title>\n";
}

void Text(std::string* out, double x, double y, std::string_view anchor, std::string_view text) {
  *out += "<text x=\"" + Number(x) + "\" y=\"" + Number(y) + "\" text-anchor=\"";
  *out += anchor;
  *out += "\">" + HtmlEscape(text) + "</text>\n";
}

void Line(std::string* out, std::string_view css_class, double x1, double y1, double x2,
          double y2) {
  *out += "<line class=\"";
  *out += css_class;
  *out += "\" x1=\"" + Number(x1) + "\" y1=\"" + Number(y1) + "\" x2=\"" + Number(x2) + "\" y2=\"" +
          Number(y2) + "\"/>\n";
}

// A point in time of one series: its value, and what its tooltip says.
struct TimePoint {
  int64_t t_ns = 0;
  double value = 0;
  std::string tip;
};
struct TimeSeries {
  std::string css;   // its colour's class: "logical", "frozen", ...
  std::string name;  // in the legend
  std::vector<TimePoint> points;
  double radius = kPointRadius;
};

// Values over time: each series a line through its points, time across
// (from the first point to the last), value up (from 0 to the largest).
void TimeChart(std::string* out, std::string_view css_class, std::string_view title,
               const std::vector<TimeSeries>& series,
               const std::function<std::string(double)>& value_text) {
  size_t marks = 0;
  int64_t t_min = INT64_MAX, t_max = INT64_MIN;
  double v_max = 0;
  for (const TimeSeries& s : series) {
    for (const TimePoint& p : s.points) {
      ++marks;
      t_min = std::min(t_min, p.t_ns);
      t_max = std::max(t_max, p.t_ns);
      v_max = std::max(v_max, p.value);
    }
  }
  if (v_max <= 0) v_max = 1;  // all zero: drawn on the axis
  OpenSvg(out, css_class, title, kTimeChartHeight, marks);
  // One checkpoint, or all at one time: in the middle.
  auto x_of = [&](int64_t t) {
    if (t_max <= t_min) return (kPlotLeft + kPlotRight) / 2;
    return kPlotLeft + (kPlotRight - kPlotLeft) * static_cast<double>(t - t_min) /
                           static_cast<double>(t_max - t_min);
  };
  auto y_of = [&](double v) { return kPlotBottom - (kPlotBottom - kPlotTop) * (v / v_max); };
  // Grid and value labels at 0, half and the top.
  for (double share : {0.0, 0.5, 1.0}) {
    const double y = y_of(v_max * share);
    Line(out, share == 0 ? "axis" : "grid", kPlotLeft, y, kPlotRight, y);
    Text(out, kPlotLeft - 6, y + 4, "end", value_text(v_max * share));
  }
  Line(out, "axis", kPlotLeft, kPlotTop, kPlotLeft, kPlotBottom);
  if (marks > 0) {
    Text(out, kPlotLeft, kPlotBottom + 18, "start", Time(t_min));
    if (t_max > t_min) Text(out, kPlotRight, kPlotBottom + 18, "end", Time(t_max));
  }
  // The legend, across the top.
  double legend_x = kPlotLeft;
  for (const TimeSeries& s : series) {
    *out += "<rect class=\"legend " + s.css + "\" x=\"" + Number(legend_x) +
            "\" y=\"12\" width=\"12\" height=\"12\"/>\n";
    Text(out, legend_x + 16, 22, "start", s.name);
    legend_x += 24 + 7.5 * static_cast<double>(s.name.size());
  }
  for (const TimeSeries& s : series) {
    if (s.points.size() >= 2) {
      *out += "<polyline class=\"line " + s.css + "\" points=\"";
      for (const TimePoint& p : s.points)
        *out += Number(x_of(p.t_ns)) + "," + Number(y_of(p.value)) + " ";
      out->pop_back();
      *out += "\"/>\n";
    }
    for (const TimePoint& p : s.points) {
      *out += "<circle class=\"point " + s.css + "\" cx=\"" + Number(x_of(p.t_ns)) + "\" cy=\"" +
              Number(y_of(p.value)) + "\" r=\"" + Number(s.radius) + "\"><title>" +
              HtmlEscape(p.tip) + "</title></circle>\n";
    }
  }
  *out += "</svg>\n";
}

struct Bar {
  std::string label;
  uint64_t value = 0;
  std::string css;
};

// Amounts side by side: one horizontal bar each, as long as its share of
// the largest.
void BarChart(std::string* out, std::string_view css_class, std::string_view title,
              const std::vector<Bar>& bars) {
  const double height = kBarRowHeight * static_cast<double>(bars.size()) + 16;
  OpenSvg(out, css_class, title, height, bars.size());
  uint64_t largest = 1;
  for (const Bar& b : bars) largest = std::max(largest, b.value);
  const double x0 = kBarLabelWidth + 10;
  const double room = kChartWidth - x0 - kBarValueWidth;
  double y = 8;
  for (const Bar& b : bars) {
    double width = room * static_cast<double>(b.value) / static_cast<double>(largest);
    if (b.value > 0) width = std::max(width, 1.0);  // however small, visible
    Text(out, kBarLabelWidth, y + 15, "end", Shortened(b.label, kMaxSvgLabelBytes));
    *out += "<rect class=\"bar " + b.css + "\" x=\"" + Number(x0) + "\" y=\"" + Number(y + 2) +
            "\" width=\"" + Number(width) + "\" height=\"" + Number(kBarRowHeight - 8) +
            "\" data-value=\"" + std::to_string(b.value) + "\"><title>" +
            HtmlEscape(b.label + ": " + Bytes(b.value)) + "</title></rect>\n";
    Text(out, x0 + width + 6, y + 15, "start", Bytes(b.value));
    y += kBarRowHeight;
  }
  *out += "</svg>\n";
}

// --- the sections ----------------------------------------------------------

void StoreSection(std::string* out, const ReportStoreTotals& store) {
  *out += "<section id=\"store\">\n<h2>The store</h2>\n";
  std::vector<Bar> bars;
  std::vector<std::vector<Cell>> rows;
  rows.push_back({TextCell("checkpoints"), CountCell(store.checkpoint_count)});
  auto amount = [&](std::string label, uint64_t bytes, std::string css) {
    bars.push_back({label, bytes, css});
    rows.push_back({TextCell(std::move(label)), BytesCell(bytes)});
  };
  amount("logical", store.logical_bytes, "logical");
  if (store.whole_store) {
    const uint64_t unique = store.unique_bytes.value_or(0);
    amount("after dedup", unique, "unique");
    amount("stored (compressed)", store.stored_bytes, "stored");
    if (store.disk_bytes) amount("on disk", *store.disk_bytes, "disk");
    const uint64_t by_dedup = store.logical_bytes > unique ? store.logical_bytes - unique : 0;
    const uint64_t by_compression = unique > store.stored_bytes ? unique - store.stored_bytes : 0;
    *out += "<p>" + Counted(store.checkpoint_count, "checkpoint") + " of " +
            Bytes(store.logical_bytes) + ": dedup saved " + Bytes(by_dedup) + " (" +
            Percent(by_dedup, store.logical_bytes) + "), compression a further " +
            Bytes(by_compression) + " (" + Percent(by_compression, store.logical_bytes) +
            "). On disk: " + Bytes(store.disk_bytes.value_or(0)) +
            ", with the index, chunks not yet collected and the reserve.</p>\n";
  } else {
    amount("held (stored)", store.stored_bytes, "stored");
    const uint64_t saved =
        store.logical_bytes > store.stored_bytes ? store.logical_bytes - store.stored_bytes : 0;
    *out += "<p>" + Counted(store.checkpoint_count, "checkpoint") + " of " +
            Bytes(store.logical_bytes) + (store.checkpoint_count == 1 ? " holds " : " hold ") +
            Bytes(store.stored_bytes) +
            " of the store (each chunk once, compressed): dedup and compression saved " +
            Bytes(saved) + " (" + Percent(saved, store.logical_bytes) + ").</p>\n";
  }
  BarChart(out, "store-sizes", "The checkpoints' logical size against what the store keeps", bars);
  Table(out, "store-sizes", "Sizes", {"what", "bytes"}, rows);
  *out += "</section>\n";
}

// A list of holders as bars (of class `bar_css`) with their table under
// them, both of class "holders `kind`"; a line saying so when it is empty.
void HoldersChart(std::string* out, const std::vector<ReportHolder>& holders, std::string_view kind,
                  std::string_view bar_css, std::string_view title, std::string_view caption,
                  const std::vector<std::string>& headings) {
  if (holders.empty()) {
    *out += "<p class=\"empty\">No checkpoints.</p>\n";
    return;
  }
  std::vector<Bar> bars;
  std::vector<std::vector<Cell>> rows;
  for (const ReportHolder& h : holders) {
    bars.push_back({h.name, h.bytes, std::string(bar_css)});
    rows.push_back({TextCell(h.name), BytesCell(h.bytes)});
  }
  const std::string css = "holders " + std::string(kind);
  BarChart(out, css, title, bars);
  Table(out, css, caption, headings, rows);
}

void HoldersSection(std::string* out, const ReportData& data) {
  *out += "<section id=\"holders\">\n<h2>Who holds the most</h2>\n";
  if (data.store.whole_store) {
    *out +=
        "<h3>Owners</h3>\n<p>What each owner's checkpoints hold of the store: each chunk "
        "they name once, compressed (what a quota charges them).</p>\n";
    HoldersChart(out, data.owners, "owners", "owner", "What each owner holds of the store",
                 "Owners", {"owner", "held"});
  }
  *out +=
      "<h3>Checkpoints that added the most</h3>\n<p>What each added to the store when it "
      "was made: its new chunks, compressed (the largest " +
      std::to_string(kReportTopCheckpoints) + ").</p>\n";
  HoldersChart(out, data.checkpoints, "checkpoints", "stored",
               "What each checkpoint added to the store", "Checkpoints",
               {"checkpoint", "added (stored)"});
  *out += "</section>\n";
}

void ProcessSection(std::string* out, const ReportProcess& p) {
  const std::string what = p.pid > 0 ? "pid " + std::to_string(p.pid) : "imports of no process";
  *out += "<section class=\"process\" data-pid=\"" + std::to_string(p.pid) + "\" data-owner=\"" +
          HtmlEscape(p.owner_name) + "\">\n<h3>" + HtmlEscape(what) + " of " +
          HtmlEscape(p.owner_name) + "</h3>\n";
  if (!p.command.empty())
    *out +=
        "<p>command: <code>" + HtmlEscape(Shortened(p.command, kMaxCommandBytes)) + "</code></p>\n";

  std::vector<TimeSeries> sizes = {{"logical", "logical", {}, kPointRadius},
                                   {"new", "new", {}, kRingRadius},
                                   {"stored", "stored", {}, kPointRadius}};
  std::vector<TimeSeries> times = {{"frozen", "frozen", {}}, {"durable", "durable after", {}}};
  std::vector<std::vector<Cell>> rows;
  for (const ReportCheckpoint& c : p.checkpoints) {
    auto size_point = [&](TimeSeries& s, uint64_t bytes) {
      s.points.push_back(
          {c.created_ns, static_cast<double>(bytes), c.id + ": " + s.name + " " + Bytes(bytes)});
    };
    size_point(sizes[0], c.logical_bytes);
    size_point(sizes[1], c.new_bytes);
    size_point(sizes[2], c.stored_bytes);
    if (c.frozen_s)
      times[0].points.push_back(
          {c.created_ns, *c.frozen_s, c.id + ": frozen " + Seconds(*c.frozen_s)});
    if (c.durable_s)
      times[1].points.push_back(
          {c.created_ns, *c.durable_s, c.id + ": durable after " + Seconds(*c.durable_s)});
    rows.push_back({TextCell(c.id), TextCell(Time(c.created_ns)), BytesCell(c.logical_bytes),
                    BytesCell(c.new_bytes), BytesCell(c.stored_bytes), SecondsCell(c.frozen_s),
                    SecondsCell(c.durable_s)});
  }
  const auto bytes_text = [](double v) { return Bytes(static_cast<uint64_t>(v)); };
  TimeChart(out, "bytes-over-time", "Sizes of the checkpoints of " + what, sizes, bytes_text);
  if (times[0].points.empty() && times[1].points.empty()) {
    *out += "<p class=\"empty\">No frozen or durable times recorded.</p>\n";
  } else {
    const auto seconds_text = [](double v) { return Seconds(v); };
    TimeChart(out, "times-over-time", "Frozen and durable times of the checkpoints of " + what,
              times, seconds_text);
  }
  Table(out, "checkpoints", "Checkpoints of " + what,
        {"checkpoint", "made (UTC)", "logical", "new", "stored", "frozen", "durable after"}, rows);
  *out += "</section>\n";
}

}  // namespace

std::string HtmlEscape(std::string_view text) {
  // Valid UTF-8 first, so that what follows sees whole characters.
  const std::string shown = DisplayText(text);
  std::string out;
  out.reserve(shown.size());
  for (size_t i = 0; i < shown.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(shown[i]);
    // Control characters (C0, DEL, and C1: U+0080..U+009F, encoded
    // C2 80..C2 9F) as bytes: a terminal escape or a NUL says what it is.
    const bool c1 = c == 0xC2 && i + 1 < shown.size() &&
                    static_cast<unsigned char>(shown[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(shown[i + 1]) <= 0x9F;
    if (c < 0x20 || c == 0x7F || c1) {
      char buf[16];
      if (c1) {
        std::snprintf(buf, sizeof buf, "\\xC2\\x%02X", static_cast<unsigned char>(shown[++i]));
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02X", c);
      }
      out += buf;
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += static_cast<char>(c);
    }
  }
  return out;
}

std::string RenderReportHtml(const ReportData& data) {
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"";
  out += kContentSecurityPolicy;
  out += "\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<title>gpuckpt report</title>\n<style>\n";
  out += kStyle;
  out += "</style>\n</head>\n<body>\n<h1>gpuckpt report</h1>\n";
  size_t checkpoint_count = 0;
  for (const ReportProcess& p : data.processes) checkpoint_count += p.checkpoints.size();
  out += "<p id=\"scope\">Report of " + HtmlEscape(data.scope) + ", as of " +
         HtmlEscape(Time(data.generated_ns)) + ": " + Counted(checkpoint_count, "checkpoint") +
         " of " + Counted(data.processes.size(), "process", "processes") + ".</p>\n";
  StoreSection(&out, data.store);
  HoldersSection(&out, data);
  out += "<section id=\"processes\">\n<h2>Processes</h2>\n";
  if (data.processes.empty()) out += "<p class=\"empty\">No checkpoints.</p>\n";
  for (const ReportProcess& p : data.processes) ProcessSection(&out, p);
  out += "</section>\n</body>\n</html>\n";
  return out;
}

}  // namespace gpuckpt
