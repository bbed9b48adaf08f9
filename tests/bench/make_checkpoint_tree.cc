// make_checkpoint_tree: writes two successive, CRIU-like checkpoints of one
// imaginary process, OUT_DIR/ckpt1 and OUT_DIR/ckpt2, as input for
// tests/bench/store_bench (see README.md next to this file).
//
//   make_checkpoint_tree OUT_DIR [--size-mib 2048] [--seed 1]
//
// The output is a pure function of (size, seed): the benchmark must compare
// tools on the same bytes, today and in a year. Only the standard library is
// used so that the benchmark builds with one g++ command where CMake has not
// run.
//
// What it models, and why:
//  - Page data in raw `pages-N.img` files (CRIU's page images are raw pages,
//    no header), sizes multiples of 4 KiB, a few files of different sizes.
//  - A page mix in runs of 1..512 pages, since memory comes in regions
//    (heap, bss, weights), not page by page: zero-heavy pages (mostly zeros,
//    a few pointers/counters), compressible pages (structs and log text,
//    ~2-4x with zstd), incompressible pages (random, like model weights).
//  - ckpt2 = ckpt1 after some more running: a small fraction of pages
//    rewritten in place, plus runs of pages inserted and removed, which moves
//    every later page by whole pages (what CRIU's page images do when a
//    mapping grows or shrinks). A store that only dedups at fixed offsets
//    loses everything after the first move; content-defined chunking keeps
//    it.
//  - Small metadata images (core, mm, pagemap, ...) with CRIU's magics,
//    random-ish bodies; a few differ between the checkpoints.
//
// Every page's bytes are a function of (seed, page id, version, kind), so
// files can be written in parallel and a page that survives into ckpt2 is
// byte-identical there without keeping ckpt1's bytes around.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr size_t kPageSize = 4096;
constexpr size_t kWordsPerPage = kPageSize / sizeof(uint64_t);

// Page file sizes as fractions of the total, largest first; different sizes
// so that no tool benefits from a regular layout.
constexpr double kFileShares[] = {0.55, 0.25, 0.15, 0.05};
constexpr int kFileCount = sizeof(kFileShares) / sizeof(kFileShares[0]);

// Target page mix, in percent of pages: zero-heavy / compressible / random.
constexpr int kMixPercent[3] = {30, 30, 40};
constexpr uint32_t kMaxRunPages = 512;

// ckpt2's edits, relative to each page file of ckpt1.
constexpr double kChangedFraction = 0.005;  // pages rewritten in place
constexpr uint32_t kMaxChangedRun = 8;      // ... in runs of 1..8 pages
constexpr int kInsertRunsPerFile = 3;       // runs of new pages
constexpr int kRemoveRunsPerFile = 2;       // runs of dropped pages
// A run inserted (removed) is 1..file_pages/500 (1..file_pages/1000) pages.
constexpr uint32_t kInsertRunDivisor = 500;
constexpr uint32_t kRemoveRunDivisor = 1000;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman, Vigna): fast, good enough for test data.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& word : s_) word = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, n); the modulo bias is irrelevant here.
  uint64_t Below(uint64_t n) { return Next() % n; }
  // Uniform in [lo, hi].
  uint64_t Between(uint64_t lo, uint64_t hi) { return lo + Below(hi - lo + 1); }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

enum Kind : uint8_t { kZeroHeavy = 0, kCompressible = 1, kRandom = 2 };
constexpr const char* kKindNames[3] = {"zero-heavy", "compressible", "incompressible"};

// One page of a page file: its bytes are FillPage(seed, ref, kind).
struct PageRef {
  uint32_t id;
  uint32_t version;  // 0 as in ckpt1; 1 once rewritten in ckpt2
};
using PageList = std::vector<PageRef>;

struct Plan {
  std::vector<Kind> kind_of_id;  // the kind of every page id ever made
  uint64_t kind_count[3] = {0, 0, 0};
  PageList files[2][kFileCount];  // [checkpoint][page file]
  int insert_runs = 0;
  int remove_runs = 0;
};

// Random by the target mix, but steered back when a kind runs ahead by more
// than a run: with runs of up to 2 MiB, pure chance would miss the mix by
// several percent on small trees.
Kind PickKind(const Plan& plan, Rng& rng) {
  const uint64_t r = rng.Below(100);
  Kind kind = r < static_cast<uint64_t>(kMixPercent[0])                    ? kZeroHeavy
              : r < static_cast<uint64_t>(kMixPercent[0] + kMixPercent[1]) ? kCompressible
                                                                           : kRandom;
  const double total = static_cast<double>(plan.kind_of_id.size());
  auto excess = [&](int k) {
    return static_cast<double>(plan.kind_count[k]) - total * kMixPercent[k] / 100.0;
  };
  if (excess(kind) > kMaxRunPages) {
    for (int k = 0; k < 3; ++k) {
      if (excess(k) < excess(kind)) kind = static_cast<Kind>(k);
    }
  }
  return kind;
}

// Appends `count` new page ids to `out`, in runs of one kind each.
void AppendNewPages(Plan& plan, Rng& rng, uint64_t count, PageList& out) {
  while (count > 0) {
    const Kind kind = PickKind(plan, rng);
    const uint64_t run = std::min<uint64_t>(count, rng.Between(1, kMaxRunPages));
    for (uint64_t i = 0; i < run; ++i) {
      out.push_back({static_cast<uint32_t>(plan.kind_of_id.size()), 0});
      plan.kind_of_id.push_back(kind);
    }
    plan.kind_count[kind] += run;
    count -= run;
  }
}

Plan MakePlan(uint64_t total_pages, uint64_t seed) {
  Plan plan;
  Rng rng(seed ^ 0x706c616e706c616eULL);  // the plan has its own stream
  plan.kind_of_id.reserve(total_pages + total_pages / 50);
  uint64_t assigned = 0;
  for (int f = 0; f < kFileCount; ++f) {
    const uint64_t pages =
        (f == kFileCount - 1)
            ? total_pages - assigned
            : static_cast<uint64_t>(static_cast<double>(total_pages) * kFileShares[f]);
    assigned += pages;
    AppendNewPages(plan, rng, pages, plan.files[0][f]);
  }

  for (int f = 0; f < kFileCount; ++f) {
    const PageList& before = plan.files[0][f];
    PageList after = before;
    const uint64_t n = before.size();
    if (n == 0) {
      plan.files[1][f] = after;
      continue;
    }
    // Rewrites first, on ckpt1's numbering; overlapping runs are fine, the
    // summary counts the result, not the intent.
    uint64_t to_change = static_cast<uint64_t>(static_cast<double>(n) * kChangedFraction + 0.5);
    while (to_change > 0) {
      const uint64_t run = std::min<uint64_t>(to_change, rng.Between(1, kMaxChangedRun));
      const uint64_t start = rng.Below(n - std::min(run, n - 1));
      for (uint64_t i = start; i < start + run && i < n; ++i) after[i].version = 1;
      to_change -= run;
    }
    for (int r = 0; r < kRemoveRunsPerFile && after.size() > 1; ++r) {
      const uint64_t run = rng.Between(1, std::max<uint64_t>(1, n / kRemoveRunDivisor));
      const uint64_t len = std::min<uint64_t>(run, after.size() - 1);
      const uint64_t start = rng.Below(after.size() - len + 1);
      after.erase(after.begin() + start, after.begin() + start + len);
      ++plan.remove_runs;
    }
    for (int r = 0; r < kInsertRunsPerFile; ++r) {
      const uint64_t run = rng.Between(1, std::max<uint64_t>(1, n / kInsertRunDivisor));
      PageList fresh;
      AppendNewPages(plan, rng, run, fresh);
      const uint64_t at = rng.Below(after.size() + 1);
      after.insert(after.begin() + at, fresh.begin(), fresh.end());
      ++plan.insert_runs;
    }
    plan.files[1][f] = std::move(after);
  }
  return plan;
}

// --- page contents ---------------------------------------------------------

// A few non-zero words in a zero page: pointers, counters, flags, as in bss,
// freshly touched heap or sparse tables.
void FillZeroHeavy(Rng& rng, uint64_t* words) {
  std::memset(words, 0, kPageSize);
  const uint64_t count = rng.Between(1, 8);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t value = (rng.Below(2) == 0)
                               ? 0x00007f0000000000ULL | (rng.Next() & 0xfffffffff8ULL)
                               : rng.Below(1 << 16);
    words[rng.Below(kWordsPerPage)] = value;
  }
}

// An array of 64-byte heap records: some fields repeat, some are noise.
void FillStructs(Rng& rng, uint64_t page_id, uint64_t* words) {
  static constexpr const char* kNames[] = {
      "tensor",  "buffer", "stream",    "event", "handle",    "module",  "kernel", "graph",
      "context", "device", "allocator", "queue", "optimizer", "sampler", "batch",  "layer"};
  const uint64_t heap_base = 0x0000555555550000ULL + ((page_id & 0xff) << 24);
  const uint64_t time_base = 1700000000000000ULL + page_id * 7919;
  for (size_t rec = 0; rec < kPageSize / 64; ++rec) {
    uint64_t* w = words + rec * 8;
    w[0] = heap_base + (page_id << 12) + rec * 64;              // self
    w[1] = rng.Below(6) | (rng.Below(4) << 32);                 // type, refcount
    w[2] = heap_base + (rng.Next() & 0xffff0);                  // next
    w[3] = time_base + rng.Below(1000000);                      // timestamp
    w[4] = rng.Below(4) == 0 ? rng.Next() : rng.Below(100000);  // value
    w[5] = 0;                                                   // padding
    char name[16] = {};
    const char* src = kNames[rng.Below(16)];
    std::memcpy(name, src, std::strlen(src));
    std::memcpy(&w[6], name, sizeof(name));
  }
}

// Log-like text: the kind of thing a long-running process keeps in buffers.
void FillText(Rng& rng, char* page) {
  static constexpr const char* kWords[] = {
      "INFO",    "DEBUG",     "WARN",  "step",  "loss",    "lr",      "epoch",
      "rank",    "worker",    "grad",  "norm",  "tokens",  "seconds", "batch",
      "saved",   "loaded",    "cuda",  "alloc", "free",    "stream",  "sync",
      "barrier", "allreduce", "queue", "done",  "started", "request", "response",
      "latency", "ms",        "ok",    "retry", "cache",   "hit",     "miss"};
  constexpr size_t kWordCount = sizeof(kWords) / sizeof(kWords[0]);
  size_t pos = 0;
  char line[160];
  while (pos < kPageSize) {
    int len = std::snprintf(line, sizeof(line),
                            "2024-%02" PRIu64 "-%02" PRIu64 "T%02" PRIu64 ":%02" PRIu64
                            ":%02" PRIu64 ".%06" PRIu64 " %s %s=%" PRIu64,
                            rng.Between(1, 12), rng.Between(1, 28), rng.Below(24), rng.Below(60),
                            rng.Below(60), rng.Below(1000000), kWords[rng.Below(3)],
                            kWords[3 + rng.Below(kWordCount - 3)], rng.Below(100000));
    const uint64_t extra = rng.Below(4);
    for (uint64_t i = 0; i < extra && len < 120; ++i) {
      len += std::snprintf(line + len, sizeof(line) - len, " %s=%" PRIu64 ".%04" PRIu64,
                           kWords[3 + rng.Below(kWordCount - 3)], rng.Below(100), rng.Below(10000));
    }
    line[len++] = '\n';
    const size_t n = std::min<size_t>(len, kPageSize - pos);
    std::memcpy(page + pos, line, n);
    pos += n;
  }
}

void FillPage(uint64_t seed, const PageRef& ref, Kind kind, unsigned char* page) {
  uint64_t mix = seed ^ (uint64_t{ref.id} * 0x9e3779b97f4a7c15ULL) ^
                 (uint64_t{ref.version} * 0xd1b54a32d192ed03ULL);
  Rng rng(SplitMix64(mix));
  uint64_t words[kWordsPerPage];
  switch (kind) {
    case kZeroHeavy:
      FillZeroHeavy(rng, words);
      break;
    case kCompressible:
      // Half structs, half text, fixed per page id so a rewrite keeps its style.
      if (ref.id % 2 == 0) {
        FillStructs(rng, ref.id, words);
      } else {
        FillText(rng, reinterpret_cast<char*>(words));
      }
      break;
    case kRandom:
      for (uint64_t& w : words) w = rng.Next();
      break;
  }
  std::memcpy(page, words, kPageSize);
}

// --- output ----------------------------------------------------------------

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "make_checkpoint_tree: %s\n", message.c_str());
  std::exit(1);
}

// Writes a whole file or dies: a half-written input would make the benchmark
// compare tools on garbage.
class OutFile {
 public:
  explicit OutFile(const fs::path& path) : path_(path), file_(std::fopen(path.c_str(), "wbx")) {
    if (file_ == nullptr) Die("cannot create " + path_.string() + ": " + std::strerror(errno));
  }
  ~OutFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void Write(const void* data, size_t size) {
    if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
      Die("cannot write " + path_.string() + ": " + std::strerror(errno));
    }
  }
  void Close() {
    const int rc = std::fclose(file_);
    file_ = nullptr;
    if (rc != 0) Die("cannot close " + path_.string() + ": " + std::strerror(errno));
  }

 private:
  fs::path path_;
  std::FILE* file_;
};

void WritePageFile(const fs::path& path, const PageList& pages, const Plan& plan, uint64_t seed) {
  constexpr size_t kPagesPerWrite = 256;  // 1 MiB writes
  std::vector<unsigned char> buffer(kPagesPerWrite * kPageSize);
  OutFile out(path);
  for (size_t i = 0; i < pages.size(); i += kPagesPerWrite) {
    const size_t n = std::min(kPagesPerWrite, pages.size() - i);
    for (size_t j = 0; j < n; ++j) {
      const PageRef& ref = pages[i + j];
      FillPage(seed, ref, plan.kind_of_id[ref.id], buffer.data() + j * kPageSize);
    }
    out.Write(buffer.data(), n * kPageSize);
  }
  out.Close();
}

struct MetaFile {
  const char* name;
  uint32_t magic;  // CRIU's image magic (criu/include/magic.h)
  size_t size;
  bool changes;  // differs between ckpt1 and ckpt2
};

// CRIU's v1.1 images start with IMG_COMMON_MAGIC then the image's own magic,
// except inventory.img, which has only its own.
constexpr uint32_t kImgCommonMagic = 0x54564319;
constexpr MetaFile kMetaFiles[] = {
    {"inventory.img", 0x58313116, 1024, true},    {"pstree.img", 0x50273030, 512, false},
    {"core-1234.img", 0x55053847, 6144, true},    {"mm-1234.img", 0x57492820, 3584, true},
    {"pagemap-1234.img", 0x56084025, 4608, true}, {"ids-1234.img", 0x54432030, 256, false},
    {"fdinfo-2.img", 0x56213732, 1536, false},    {"files.img", 0x56303138, 2560, false},
};

// Protobuf-ish bodies: small varints and zeros mixed with random bytes.
std::vector<unsigned char> MetaBody(Rng& rng, size_t size) {
  std::vector<unsigned char> body(size);
  for (unsigned char& b : body) {
    const uint64_t r = rng.Below(4);
    b = r == 0   ? 0
        : r == 1 ? static_cast<unsigned char>(rng.Below(32))
                 : static_cast<unsigned char>(rng.Next());
  }
  return body;
}

uint64_t WriteMetaFiles(const fs::path& dir, int checkpoint, uint64_t seed, int insert_runs,
                        int* changed_files) {
  uint64_t total = 0;
  for (size_t i = 0; i < sizeof(kMetaFiles) / sizeof(kMetaFiles[0]); ++i) {
    const MetaFile& meta = kMetaFiles[i];
    Rng rng(seed ^ (0x6d657461ULL << 20) ^ i);
    size_t size = meta.size;
    // The pagemap lists one entry (~24 bytes) per run of pages; it grows with ckpt2's runs.
    if (checkpoint == 1 && meta.magic == 0x56084025) size += 24 * insert_runs;
    std::vector<unsigned char> body = MetaBody(rng, size);
    if (checkpoint == 1 && meta.changes) {
      // Registers, counters, timestamps: a few short stretches rewritten.
      Rng edit(seed ^ (0x65646974ULL << 20) ^ i);
      for (int k = 0; k < 4; ++k) {
        const size_t at = edit.Below(body.size() - 64);
        for (size_t j = at; j < at + 64; ++j) body[j] = static_cast<unsigned char>(edit.Next());
      }
      ++*changed_files;
    }
    OutFile out(dir / meta.name);
    if (meta.magic != 0x58313116) out.Write(&kImgCommonMagic, 4);  // little endian, as CRIU
    out.Write(&meta.magic, 4);
    out.Write(body.data(), body.size());
    out.Close();
    total += body.size() + (meta.magic != 0x58313116 ? 8 : 4);
  }
  return total;
}

// --- summary ---------------------------------------------------------------

struct Summary {
  uint64_t pages[2] = {0, 0};
  uint64_t kind_pages[3] = {0, 0, 0};  // ckpt1
  uint64_t same_offset = 0, moved = 0, changed = 0, inserted = 0, removed = 0;
  uint64_t changed_runs = 0;  // places in ckpt2 where rewritten pages start
};

Summary Summarize(const Plan& plan) {
  Summary s;
  constexpr uint32_t kNone = UINT32_MAX;
  // Where each of ckpt1's page ids sits: (file, index).
  std::vector<uint32_t> file_of(plan.kind_of_id.size(), kNone);
  std::vector<uint32_t> index_of(plan.kind_of_id.size(), kNone);
  for (int f = 0; f < kFileCount; ++f) {
    const PageList& pages = plan.files[0][f];
    s.pages[0] += pages.size();
    for (uint32_t i = 0; i < pages.size(); ++i) {
      file_of[pages[i].id] = f;
      index_of[pages[i].id] = i;
      ++s.kind_pages[plan.kind_of_id[pages[i].id]];
    }
  }
  uint64_t kept = 0;  // ckpt1 pages still present in ckpt2, changed or not
  for (int f = 0; f < kFileCount; ++f) {
    const PageList& pages = plan.files[1][f];
    s.pages[1] += pages.size();
    for (uint32_t i = 0; i < pages.size(); ++i) {
      const PageRef& ref = pages[i];
      if (ref.version != 0 && (i == 0 || pages[i - 1].version == 0)) ++s.changed_runs;
      if (index_of[ref.id] == kNone) {
        ++s.inserted;
        continue;
      }
      ++kept;
      if (ref.version != 0) {
        ++s.changed;
      } else if (file_of[ref.id] == static_cast<uint32_t>(f) && index_of[ref.id] == i) {
        ++s.same_offset;
      } else {
        ++s.moved;
      }
    }
  }
  s.removed = s.pages[0] - kept;
  return s;
}

double Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

void PrintSummary(const fs::path& out_dir, uint64_t seed, const Plan& plan, const Summary& s,
                  const uint64_t meta_bytes[2], int changed_meta) {
  std::printf("make_checkpoint_tree: seed %" PRIu64 ", %zu-byte pages, output in %s\n", seed,
              kPageSize, out_dir.c_str());
  for (int c = 0; c < 2; ++c) {
    std::printf("ckpt%d: %" PRIu64 " pages = %" PRIu64 " bytes of page data in %d files (", c + 1,
                s.pages[c], s.pages[c] * kPageSize, kFileCount);
    for (int f = 0; f < kFileCount; ++f) {
      std::printf("%spages-%d.img %zu pages", f ? ", " : "", f + 1, plan.files[c][f].size());
    }
    std::printf("), + %zu metadata files of %" PRIu64 " bytes\n",
                sizeof(kMetaFiles) / sizeof(kMetaFiles[0]), meta_bytes[c]);
  }
  std::printf("page mix (ckpt1; target %d/%d/%d %%, kinds in runs of 1..%u pages):", kMixPercent[0],
              kMixPercent[1], kMixPercent[2], kMaxRunPages);
  for (int k = 0; k < 3; ++k) {
    std::printf("%s %s %" PRIu64 " (%.1f%%)", k ? "," : "", kKindNames[k], s.kind_pages[k],
                Percent(s.kind_pages[k], s.pages[0]));
  }
  std::printf("\n");
  std::printf("ckpt2 vs ckpt1 (pages of ckpt2, except removed):\n");
  std::printf("  unchanged at the same offset: %" PRIu64 " (%.2f%%)\n", s.same_offset,
              Percent(s.same_offset, s.pages[1]));
  std::printf("  unchanged, moved by whole pages: %" PRIu64 " (%.2f%%)\n", s.moved,
              Percent(s.moved, s.pages[1]));
  std::printf("  changed in place (new content): %" PRIu64 " (%.2f%%) in %" PRIu64
              " runs of 1..%u pages, spread uniformly\n",
              s.changed, Percent(s.changed, s.pages[1]), s.changed_runs, kMaxChangedRun);
  std::printf("  inserted: %" PRIu64 " (%.2f%%) in %d runs\n", s.inserted,
              Percent(s.inserted, s.pages[1]), plan.insert_runs);
  std::printf("  removed from ckpt1: %" PRIu64 " in %d runs\n", s.removed, plan.remove_runs);
  std::printf("  new page bytes in ckpt2 (changed + inserted): %" PRIu64 " (%.2f%%)\n",
              (s.changed + s.inserted) * kPageSize, Percent(s.changed + s.inserted, s.pages[1]));
  std::printf("  metadata files that differ: %d of %zu\n", changed_meta,
              sizeof(kMetaFiles) / sizeof(kMetaFiles[0]));
}

uint64_t ParseNumber(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') {
    Die(std::string("bad number for ") + flag + ": " + text);
  }
  return value;
}

[[noreturn]] void Usage() {
  std::fprintf(stderr, "usage: make_checkpoint_tree OUT_DIR [--size-mib N] [--seed N]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  uint64_t size_mib = 2048;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if ((arg == "--size-mib" || arg == "--seed") && i + 1 < argc) {
      const uint64_t value = ParseNumber(argv[i], argv[i + 1]);
      (arg == "--seed" ? seed : size_mib) = value;
      ++i;
    } else if (arg == "-h" || arg == "--help") {
      Usage();
    } else if (!arg.empty() && arg[0] != '-' && out.empty()) {
      out = arg;
    } else {
      Usage();
    }
  }
  if (out.empty()) Usage();
  if (size_mib == 0 || size_mib > (uint64_t{1} << 20)) Die("--size-mib must be in 1..1048576");

  const fs::path out_dir(out);
  const fs::path dirs[2] = {out_dir / "ckpt1", out_dir / "ckpt2"};
  std::error_code ec;
  for (const fs::path& dir : dirs) {
    // Refuse to mix with an older tree: the benchmark must see exactly this data.
    if (fs::exists(dir, ec)) Die(dir.string() + " already exists");
    fs::create_directories(dir, ec);
    if (ec) Die("cannot create " + dir.string() + ": " + ec.message());
  }

  const uint64_t total_pages = size_mib * (uint64_t{1} << 20) / kPageSize;
  const Plan plan = MakePlan(total_pages, seed);

  uint64_t meta_bytes[2];
  int changed_meta = 0;
  meta_bytes[0] = WriteMetaFiles(dirs[0], 0, seed, plan.insert_runs, &changed_meta);
  changed_meta = 0;
  meta_bytes[1] = WriteMetaFiles(dirs[1], 1, seed, plan.insert_runs, &changed_meta);

  // One job per page file, largest first, on all cores: generation (not the
  // disk, which absorbs this into the page cache) is the bottleneck.
  struct Job {
    int checkpoint, file;
    size_t pages;
  };
  std::vector<Job> jobs;
  for (int c = 0; c < 2; ++c) {
    for (int f = 0; f < kFileCount; ++f) jobs.push_back({c, f, plan.files[c][f].size()});
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.pages > b.pages; });
  std::atomic<size_t> next{0};
  const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(),
                                                           static_cast<unsigned>(jobs.size())));
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t j = next++; j < jobs.size(); j = next++) {
        const Job& job = jobs[j];
        WritePageFile(dirs[job.checkpoint] / ("pages-" + std::to_string(job.file + 1) + ".img"),
                      plan.files[job.checkpoint][job.file], plan, seed);
      }
    });
  }
  for (std::thread& w : workers) w.join();

  PrintSummary(out_dir, seed, plan, Summarize(plan), meta_bytes, changed_meta);
  return 0;
}
