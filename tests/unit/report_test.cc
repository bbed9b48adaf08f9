// The report page (core/report/): the renderer from data made by hand
// (escaping of untrusted strings, an empty store, the numbers of its
// tables and the marks of its charts), and the gatherer on a real store
// (processes grouped by owner and pid, what the store and each owner
// hold, one owner's report measuring only theirs).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "core/report/report_gather.h"
#include "core/report/report_html.h"
#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using testing::TempDir;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The part of `page` from the first `start` on, up to the next `end`.
std::string Between(const std::string& page, const std::string& start, const std::string& end) {
  const size_t from = page.find(start);
  if (from == std::string::npos) return "";
  const size_t to = page.find(end, from);
  return page.substr(from, to == std::string::npos ? std::string::npos : to + end.size() - from);
}

// Every `data-value` of the table of class `table_class`, in order.
std::vector<std::string> TableValues(const std::string& page, const std::string& table_class) {
  const std::string table =
      Between(page, "<table class=\"numbers " + table_class + "\"", "</table>");
  std::vector<std::string> values;
  const std::regex value("data-value=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(table.begin(), table.end(), value);
       it != std::sregex_iterator(); ++it)
    values.push_back((*it)[1]);
  return values;
}

ReportCheckpoint Point(std::string id, int64_t created_s, uint64_t logical, uint64_t added,
                       uint64_t stored, std::optional<double> frozen,
                       std::optional<double> durable) {
  return ReportCheckpoint{std::move(id), created_s * 1000000000, logical, added, stored, frozen,
                          durable};
}

ReportData TwoProcesses() {
  ReportData data;
  data.generated_ns = 1767225600LL * 1000000000;  // 2026-01-01T00:00:00Z
  data.scope = "the checkpoints of every owner";
  ReportProcess a;
  a.pid = 4242;
  a.owner_uid = 1000;
  a.owner_name = "alice";
  a.command = "python3 train.py";
  a.checkpoints = {Point("4242-1", 1767225000, 2000000, 1500000, 700000, 0.25, 1.5),
                   Point("4242-2", 1767225060, 2100000, 30000, 12000, 0.125, 0.75),
                   Point("4242-3", 1767225120, 2200000, 40000, 15000, std::nullopt, 0.5)};
  ReportProcess b;
  b.pid = 77;
  b.owner_uid = 0;
  b.owner_name = "root";
  b.command = "serve";
  b.checkpoints = {Point("77-1", 1767225100, 5000, 5000, 3000, std::nullopt, std::nullopt)};
  data.processes = {a, b};
  data.store = ReportStoreTotals{true, 4, 6305000, 4000000, 730000, 9000000};
  data.owners = {{"alice", 727000}, {"root", 3000}};
  data.checkpoints = {{"4242-1", 700000}, {"4242-3", 15000}, {"4242-2", 12000}, {"77-1", 3000}};
  return data;
}

TEST(HtmlEscapeTest, MarkupAndQuotesBecomeCharacterReferences) {
  EXPECT_EQ(HtmlEscape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;");
  EXPECT_EQ(HtmlEscape("plain: caf\xC3\xA9 \xE2\x9C\x93"), "plain: caf\xC3\xA9 \xE2\x9C\x93");
}

TEST(HtmlEscapeTest, BytesThatAreNotUtf8AndControlCharactersAreShownAsBytes) {
  EXPECT_EQ(HtmlEscape("caf\xE9"), "caf\\xE9");        // Latin-1
  EXPECT_EQ(HtmlEscape("a\x1b[31mb"), "a\\x1B[31mb");  // a terminal escape
  EXPECT_EQ(HtmlEscape(std::string("n\0l", 3)), "n\\x00l");
  EXPECT_EQ(HtmlEscape("x\xC2\x9By"), "x\\xC2\\x9By");  // C1 control (CSI)
  EXPECT_EQ(HtmlEscape("\xC0<"), "\\xC0&lt;");          // overlong start, then markup
}

TEST(ReportHtmlTest, UntrustedNamesCommandsAndOwnersAddNoMarkup) {
  ReportData data = TwoProcesses();
  const std::string evil = "<img src=x onerror=alert(1)>\"'&";
  data.scope = evil;
  data.processes[0].owner_name = evil;
  data.processes[0].command = evil + " \x1b]0;title\x07";
  data.processes[0].checkpoints[0].id = evil;
  data.owners[0].name = evil;
  data.checkpoints[0].name = evil;
  const std::string page = RenderReportHtml(data);
  EXPECT_EQ(page.find("<img"), std::string::npos);
  EXPECT_EQ(page.find("onerror=alert(1)>"), std::string::npos);
  EXPECT_EQ(page.find('\x1b'), std::string::npos);
  EXPECT_NE(page.find("&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;"), std::string::npos);
  EXPECT_NE(page.find("\\x1B]0;title\\x07"), std::string::npos);
  // In an attribute too: the owner in data-owner stays one quoted value.
  EXPECT_NE(page.find("data-owner=\"&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;\""),
            std::string::npos);
}

TEST(ReportHtmlTest, ThePageIsSelfContained) {
  const std::string page = RenderReportHtml(TwoProcesses());
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("<meta charset=\"utf-8\">"), std::string::npos);
  EXPECT_NE(page.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_EQ(page.find("url("), std::string::npos);
  // No address but the SVG namespace's.
  std::string rest = page;
  const std::string xmlns = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t at; (at = rest.find(xmlns)) != std::string::npos;) rest.erase(at, xmlns.size());
  EXPECT_EQ(rest.find("http:"), std::string::npos);
  EXPECT_EQ(rest.find("https:"), std::string::npos);
  EXPECT_EQ(rest.find("//"), std::string::npos);
  EXPECT_EQ(Count(page, "<svg "), Count(page, "</svg>"));
  EXPECT_EQ(Count(page, "<table "), Count(page, "</table>"));
  EXPECT_EQ(Count(page, "<section"), Count(page, "</section>"));
}

TEST(ReportHtmlTest, AnEmptyStoreSaysSo) {
  ReportData data;
  data.generated_ns = 1767225600LL * 1000000000;
  data.scope = "the checkpoints of every owner";
  data.store.whole_store = true;
  data.store.unique_bytes = 0;
  data.store.disk_bytes = 1 << 20;
  const std::string page = RenderReportHtml(data);
  EXPECT_NE(page.find("0 checkpoints of 0 processes"), std::string::npos);
  EXPECT_EQ(Count(page, "<p class=\"empty\">No checkpoints.</p>"),
            3u);  // owners, holders, processes
  EXPECT_EQ(Count(page, "<circle"), 0u);
  EXPECT_EQ(Count(page, "<section class=\"process\""), 0u);
  // The store's sizes are still there, all zero but the directory's.
  EXPECT_EQ(TableValues(page, "store-sizes"),
            (std::vector<std::string>{"0", "0", "0", "0", std::to_string(1 << 20)}));
  EXPECT_EQ(Count(page, "<rect class=\"bar "), 4u);
}

TEST(ReportHtmlTest, TheTablesHoldTheNumbersAndTheChartsAMarkForEach) {
  const std::string page = RenderReportHtml(TwoProcesses());
  EXPECT_NE(page.find("4 checkpoints of 2 processes"), std::string::npos);

  // The store: count, logical, after dedup, stored, on disk.
  EXPECT_EQ(TableValues(page, "store-sizes"),
            (std::vector<std::string>{"4", "6305000", "4000000", "730000", "9000000"}));
  // Dedup saved 2305000 of 6305000 (36.6%), compression 3270000 (51.9%).
  EXPECT_NE(page.find("dedup saved 2.31 MB (36.6%), compression a further 3.27 MB (51.9%)"),
            std::string::npos);
  EXPECT_EQ(TableValues(page, "holders owners"), (std::vector<std::string>{"727000", "3000"}));
  EXPECT_EQ(TableValues(page, "holders checkpoints"),
            (std::vector<std::string>{"700000", "15000", "12000", "3000"}));
  const std::string owners = Between(
      page, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart holders owners\"", "</svg>");
  EXPECT_NE(owners.find("data-marks=\"2\""), std::string::npos) << owners;
  EXPECT_EQ(Count(owners, "<rect class=\"bar owner\""), 2u);

  // The first process: a row per checkpoint (logical, new, stored, frozen,
  // durable; a frozen time not recorded has no value).
  const std::string first =
      Between(page, "<section class=\"process\" data-pid=\"4242\"", "</section>");
  ASSERT_FALSE(first.empty());
  EXPECT_NE(first.find("<h3>pid 4242 of alice</h3>"), std::string::npos);
  EXPECT_NE(first.find("<code>python3 train.py</code>"), std::string::npos);
  EXPECT_EQ(
      TableValues(first, "checkpoints"),
      (std::vector<std::string>{"2000000", "1500000", "700000", "0.25", "1.5", "2100000", "30000",
                                "12000", "0.125", "0.75", "2200000", "40000", "15000", "", "0.5"}));
  EXPECT_NE(first.find("<td>2025-12-31T23:51:00Z</td>"), std::string::npos);  // 4242-2's
  // Sizes: three points per checkpoint, a line per series.
  const std::string sizes = Between(first, "class=\"chart bytes-over-time\"", "</svg>");
  EXPECT_NE(sizes.find("data-marks=\"9\""), std::string::npos);
  EXPECT_EQ(Count(sizes, "<circle class=\"point logical\""), 3u);
  EXPECT_EQ(Count(sizes, "<circle class=\"point new\""), 3u);
  EXPECT_EQ(Count(sizes, "<circle class=\"point stored\""), 3u);
  EXPECT_EQ(Count(sizes, "<polyline class=\"line "), 3u);
  // Times: two frozen, three durable.
  const std::string times = Between(first, "class=\"chart times-over-time\"", "</svg>");
  EXPECT_NE(times.find("data-marks=\"5\""), std::string::npos);
  EXPECT_EQ(Count(times, "<circle class=\"point frozen\""), 2u);
  EXPECT_EQ(Count(times, "<circle class=\"point durable\""), 3u);

  // The second: one checkpoint, no times recorded.
  const std::string second =
      Between(page, "<section class=\"process\" data-pid=\"77\"", "</section>");
  EXPECT_NE(second.find("No frozen or durable times recorded."), std::string::npos);
  EXPECT_EQ(Count(second, "<circle"), 3u);
  EXPECT_EQ(Count(second, "<polyline"), 0u);
}

TEST(ReportHtmlTest, OneOwnersReportShowsWhatTheyHoldAndNoOtherOwners) {
  ReportData data = TwoProcesses();
  data.processes.pop_back();
  data.scope = "the checkpoints of alice";
  data.store = ReportStoreTotals{false, 3, 6300000, std::nullopt, 727000, std::nullopt};
  data.owners.clear();
  const std::string page = RenderReportHtml(data);
  EXPECT_EQ(TableValues(page, "store-sizes"), (std::vector<std::string>{"3", "6300000", "727000"}));
  EXPECT_EQ(page.find("<h3>Owners</h3>"), std::string::npos);
  EXPECT_EQ(page.find("on disk"), std::string::npos);
}

// --- the gatherer, on a real store -----------------------------------------

class GatherReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(store_, Store::Open(tmp_.Sub("store"), testing::TestOptions()));
  }

  // A checkpoint `id` of process `pid` of `uid`, of `bytes` (seeded by
  // `seed`), with its frozen time where given.
  void Add(const std::string& id, uint32_t uid, int pid, const std::string& command, uint64_t seed,
           size_t bytes, std::optional<double> frozen) {
    nlohmann::json extra = {{"version", 2},
                            {"pid", pid},
                            {"command", command},
                            {"owner", {{"uid", uid}, {"gid", uid}}}};
    if (frozen) extra["stages"] = {{"dump_s", 0.5}, {"frozen_s", *frozen}, {"frozen_by", "criu"}};
    ASSERT_OK_AND_ASSIGN(auto writer, store_->BeginSnapshot({id, "test", extra.dump(), "", uid}));
    FileEntry e;
    e.path = "pages-1.img";
    e.mode = 0600;
    e.uid = e.gid = uid;
    ASSERT_OK(testing::AddBytes(writer.get(), e, testing::RandomBytes(bytes, seed)));
    ASSERT_OK(writer->Commit().status());
  }

  TempDir tmp_;
  std::unique_ptr<Store> store_;
};

TEST_F(GatherReportTest, ProcessesAreAnOwnersPidAndTheWholeStoreIsMeasured) {
  Add("4242-1", 1000, 4242, "old command", 1, 300000, 0.25);
  Add("4242-2", 1000, 4242, "python3 train.py", 1, 300000, 0.125);  // the same bytes again
  Add("4242-3", 1001, 4242, "someone else's", 2, 200000, std::nullopt);
  Add("root-import", 0, 0, "", 3, 100000, std::nullopt);
  ASSERT_OK_AND_ASSIGN(auto all, store_->List());
  ASSERT_OK_AND_ASSIGN(ReportData data, GatherReport(*store_, all, ReportScope{}, 42));

  EXPECT_EQ(data.generated_ns, 42);
  ASSERT_EQ(data.processes.size(), 3u);  // root's imports, then uid 1000's and 1001's pid 4242
  EXPECT_EQ(data.processes[0].owner_uid, 0u);
  EXPECT_EQ(data.processes[0].pid, 0);
  EXPECT_EQ(data.processes[0].owner_name, "root");
  const ReportProcess& job = data.processes[1];
  EXPECT_EQ(job.owner_uid, 1000u);
  EXPECT_EQ(job.pid, 4242);
  EXPECT_EQ(job.command, "python3 train.py");  // the latest checkpoint's
  ASSERT_EQ(job.checkpoints.size(), 2u);
  EXPECT_EQ(job.checkpoints[0].id, "4242-1");
  EXPECT_EQ(job.checkpoints[0].frozen_s, 0.25);
  EXPECT_EQ(job.checkpoints[1].frozen_s, 0.125);
  EXPECT_TRUE(job.checkpoints[1].durable_s.has_value());  // gpuckpt's own dump, not an import
  EXPECT_EQ(job.checkpoints[1].new_bytes, 0u);            // all of it deduplicated
  EXPECT_EQ(data.processes[2].owner_uid, 1001u);
  EXPECT_EQ(data.processes[2].checkpoints.size(), 1u);

  ASSERT_OK_AND_ASSIGN(StoreStats stats, store_->Stats());
  EXPECT_TRUE(data.store.whole_store);
  EXPECT_EQ(data.store.checkpoint_count, 4u);
  EXPECT_EQ(data.store.logical_bytes, stats.logical_bytes);
  EXPECT_EQ(data.store.unique_bytes, stats.unique_bytes);
  EXPECT_EQ(data.store.stored_bytes, stats.stored_bytes);
  EXPECT_GT(data.store.disk_bytes.value_or(0), 0u);  // (moves as RocksDB writes its logs)
  // Each owner by what their checkpoints hold, largest first.
  ASSERT_EQ(data.owners.size(), 3u);
  ASSERT_OK_AND_ASSIGN(uint64_t held_1000, store_->HeldBytes({"4242-1", "4242-2"}));
  EXPECT_EQ(data.owners[0].bytes, held_1000);
  EXPECT_GE(data.owners[0].bytes, data.owners[1].bytes);
  EXPECT_GE(data.owners[1].bytes, data.owners[2].bytes);
  // The checkpoints by what they added: the repeated one added nothing.
  ASSERT_EQ(data.checkpoints.size(), 4u);
  EXPECT_EQ(data.checkpoints[0].name, "4242-1");
  EXPECT_EQ(data.checkpoints[3].name, "4242-2");
}

TEST_F(GatherReportTest, OneOwnersReportMeasuresOnlyTheirCheckpoints) {
  Add("4242-1", 1000, 4242, "job", 1, 300000, 0.25);
  Add("other", 1001, 7, "other", 2, 200000, std::nullopt);
  ASSERT_OK_AND_ASSIGN(SnapshotInfo theirs, store_->Get("4242-1"));
  ASSERT_OK_AND_ASSIGN(ReportData data, GatherReport(*store_, {theirs}, ReportScope{1000}, 42));
  ASSERT_EQ(data.processes.size(), 1u);
  EXPECT_FALSE(data.store.whole_store);
  EXPECT_EQ(data.store.checkpoint_count, 1u);
  EXPECT_EQ(data.store.logical_bytes, theirs.logical_bytes);
  ASSERT_OK_AND_ASSIGN(uint64_t held, store_->HeldBytes({"4242-1"}));
  EXPECT_EQ(data.store.stored_bytes, held);
  EXPECT_FALSE(data.store.unique_bytes.has_value());
  EXPECT_FALSE(data.store.disk_bytes.has_value());
  EXPECT_TRUE(data.owners.empty());
  ASSERT_EQ(data.checkpoints.size(), 1u);
  EXPECT_EQ(RenderReportHtml(data).find(">other<"), std::string::npos);
}

TEST_F(GatherReportTest, AnEmptyStore) {
  ASSERT_OK_AND_ASSIGN(ReportData data, GatherReport(*store_, {}, ReportScope{}, 42));
  EXPECT_TRUE(data.processes.empty());
  EXPECT_TRUE(data.owners.empty());
  EXPECT_TRUE(data.checkpoints.empty());
  EXPECT_EQ(data.store.checkpoint_count, 0u);
  EXPECT_NE(RenderReportHtml(data).find("No checkpoints."), std::string::npos);
}

}  // namespace
}  // namespace gpuckpt
