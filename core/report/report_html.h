// The report as one self-contained HTML page: `gpuckpt report --html FILE`
// and the mount's report.html.
//
// The page fetches nothing and runs nothing: its charts are inline SVG
// drawn here (no JavaScript, no fonts, images or style sheets from
// anywhere), so that it opens the same from a file, a mail or a machine
// with no network, and its Content-Security-Policy (default-src 'none')
// has the browser refuse anything else. Under each chart a plain table
// holds the same numbers (exact, in `data-value`, and in words), for
// screen readers and for tests.
//
// Every string of the data (checkpoint names, commands, user names) is
// untrusted: bytes that are not UTF-8 or are control characters are shown
// as "\xNN", and the rest is HTML-escaped, so no input can add markup.
//
// Pure functions: thread-safe.
#ifndef GPUCKPT_CORE_REPORT_REPORT_HTML_H_
#define GPUCKPT_CORE_REPORT_REPORT_HTML_H_

#include <string>
#include <string_view>

#include "core/report/report_data.h"

namespace gpuckpt {

// The whole page, UTF-8.
std::string RenderReportHtml(const ReportData& data);

// `text` as HTML text or a quoted attribute value: every byte that is not
// well-formed UTF-8, and every control character, written "\xNN"; then
// & < > " ' as character references.
std::string HtmlEscape(std::string_view text);

}  // namespace gpuckpt

#endif  // GPUCKPT_CORE_REPORT_REPORT_HTML_H_
