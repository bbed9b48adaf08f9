// Tests of core/gpu/kfd_topology against fabricated sysfs trees: no AMD GPU
// is at hand, so the trees are modelled on what amdkfd's node_show() and
// mem_show() write for a two-socket host with an MI210 (gfx90a) and an MI100
// (gfx908), then damaged in the ways untrusted input can be.
#include "core/gpu/kfd_topology.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "tests/unit/test_util.h"

namespace gpuckpt {
namespace {

using ::gpuckpt::testing::MakeDirs;
using ::gpuckpt::testing::TempDir;
using ::gpuckpt::testing::WriteFile;

// nodes/0/properties of an EPYC socket: every GPU field is 0.
constexpr char kCpuProperties[] =
    "cpu_cores_count 64\n"
    "simd_count 0\n"
    "mem_banks_count 1\n"
    "caches_count 0\n"
    "io_links_count 2\n"
    "p2p_links_count 0\n"
    "cpu_core_id_base 0\n"
    "simd_id_base 0\n"
    "max_waves_per_simd 0\n"
    "lds_size_in_kb 0\n"
    "gds_size_in_kb 0\n"
    "num_gws 0\n"
    "wave_front_size 0\n"
    "array_count 0\n"
    "simd_arrays_per_engine 0\n"
    "cu_per_simd_array 0\n"
    "simd_per_cu 0\n"
    "max_slots_scratch_cu 0\n"
    "gfx_target_version 0\n"
    "vendor_id 0\n"
    "device_id 0\n"
    "location_id 0\n"
    "domain 0\n"
    "drm_render_minor 0\n"
    "hive_id 0\n"
    "num_sdma_engines 0\n"
    "num_sdma_xgmi_engines 0\n"
    "num_sdma_queues_per_engine 0\n"
    "num_cp_queues 0\n"
    "max_engine_clk_ccompute 3100\n";

// The properties of a GPU node in the order node_show() writes them, with
// the fields that differ between boards filled in.
struct GpuProps {
  uint32_t simd_count = 416;  // MI210: 104 CUs x 4 SIMDs
  uint32_t gfx_target_version = 90010;
  uint32_t device_id = 0x740f;
  uint32_t location_id = 0x0300;
  uint32_t drm_render_minor = 128;
  std::string unique_id = "6452712374892392417";  // a string to write 0 or leave it out ("")
  std::string extra;                              // appended verbatim
};

std::string GpuProperties(const GpuProps& p) {
  std::string s;
  auto line = [&s](const std::string& k, const std::string& v) { s += k + " " + v + "\n"; };
  line("cpu_cores_count", "0");
  line("simd_count", std::to_string(p.simd_count));
  line("mem_banks_count", "1");
  line("caches_count", "265");
  line("io_links_count", "1");
  line("p2p_links_count", "0");
  line("cpu_core_id_base", "0");
  line("simd_id_base", "2147487744");
  line("max_waves_per_simd", "8");
  line("lds_size_in_kb", "64");
  line("gds_size_in_kb", "0");
  line("num_gws", "64");
  line("wave_front_size", "64");
  line("array_count", "16");
  line("simd_arrays_per_engine", "1");
  line("cu_per_simd_array", "8");
  line("simd_per_cu", "4");
  line("max_slots_scratch_cu", "32");
  line("gfx_target_version", std::to_string(p.gfx_target_version));
  line("vendor_id", "4098");
  line("device_id", std::to_string(p.device_id));
  line("location_id", std::to_string(p.location_id));
  line("domain", "0");
  line("drm_render_minor", std::to_string(p.drm_render_minor));
  line("hive_id", "0");
  line("num_sdma_engines", "2");
  line("num_sdma_xgmi_engines", "6");
  line("num_sdma_queues_per_engine", "8");
  line("num_cp_queues", "24");
  line("max_engine_clk_fcompute", "1700");
  line("local_mem_size", "0");
  line("fw_version", "78");
  line("capability", "746284672");
  line("debug_prop", "1495");
  line("sdma_fw_version", "8");
  if (!p.unique_id.empty()) line("unique_id", p.unique_id);
  line("num_xcc", "1");
  s += p.extra;
  line("max_engine_clk_ccompute", "3100");
  return s;
}

std::string MemBank(uint64_t heap_type, const std::string& size_in_bytes) {
  return "heap_type " + std::to_string(heap_type) + "\nsize_in_bytes " + size_in_bytes +
         "\nflags 0\nwidth 4096\nmem_clk_max 1600\n";
}

constexpr uint64_t kMi210Vram = 68702699520;  // 64 GiB less what the driver keeps
constexpr uint64_t kGiB = uint64_t{1} << 30;

// A sysfs root under a temporary directory.
class FakeSysfs {
 public:
  const std::string& root() const { return dir_.path(); }
  std::string NodeDir(int node) const {
    return root() + "/class/kfd/kfd/topology/nodes/" + std::to_string(node);
  }

  // Writes root/rel, creating its directories.
  void Put(const std::string& rel, const std::string& data, mode_t mode = 0444) {
    const std::string path = root() + "/" + rel;
    MakeDirs(path.substr(0, path.rfind('/')));
    WriteFile(path, data, mode);
  }
  void PutNode(int node, const std::string& file, const std::string& data) {
    Put("class/kfd/kfd/topology/nodes/" + std::to_string(node) + "/" + file, data);
  }

  void AddCpuNode(int node) {
    PutNode(node, "gpu_id", "0\n");
    PutNode(node, "name", "\n");
    PutNode(node, "properties", kCpuProperties);
    PutNode(node, "mem_banks/0/properties", MemBank(0, std::to_string(256 * kGiB)));
  }
  void AddGpuNode(int node, uint32_t gpu_id, const std::string& name, const GpuProps& props) {
    PutNode(node, "gpu_id", std::to_string(gpu_id) + "\n");
    PutNode(node, "name", name + "\n");
    PutNode(node, "properties", GpuProperties(props));
  }

  // The host of most tests: node 0 a CPU, node 1 an MI210 with one public
  // frame buffer bank, node 2 an MI100 behind a small BAR (a private bank,
  // plus a public one and a system-memory bank that must not count).
  void AddTypicalHost() {
    AddCpuNode(0);
    AddGpuNode(1, 52741, "aldebaran", GpuProps{});
    PutNode(1, "mem_banks/0/properties", MemBank(1, std::to_string(kMi210Vram)));
    GpuProps mi100;
    mi100.simd_count = 480;
    mi100.gfx_target_version = 90008;
    mi100.device_id = 0x738c;
    mi100.location_id = 0x2300;
    mi100.drm_render_minor = 129;
    mi100.unique_id = "0";
    AddGpuNode(2, 16738, "arcturus", mi100);
    PutNode(2, "mem_banks/0/properties", MemBank(2, std::to_string(32 * kGiB - 256 * 1024 * 1024)));
    PutNode(2, "mem_banks/1/properties", MemBank(1, std::to_string(256 * 1024 * 1024)));
    PutNode(2, "mem_banks/2/properties", MemBank(0, std::to_string(64 * kGiB)));
  }

 private:
  TempDir dir_{"kfd-topology-test"};
};

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- ParseKfdProperties ----

TEST(ParseKfdPropertiesTest, ReadsEveryKeyOfARealNode) {
  ASSERT_OK_AND_ASSIGN(auto props, ParseKfdProperties(GpuProperties(GpuProps{})));
  EXPECT_EQ(props.size(), 38u);
  EXPECT_EQ(props.at("vendor_id"), 4098u);
  EXPECT_EQ(props.at("device_id"), 0x740fu);
  EXPECT_EQ(props.at("simd_count"), 416u);
  EXPECT_EQ(props.at("simd_id_base"), 2147487744u);
  EXPECT_EQ(props.at("unique_id"), 6452712374892392417u);
  EXPECT_EQ(props.at("max_engine_clk_ccompute"), 3100u);
}

TEST(ParseKfdPropertiesTest, ToleratesBlankLinesTabsAndNoFinalNewline) {
  ASSERT_OK_AND_ASSIGN(auto props, ParseKfdProperties("\nfoo 1  \n\n  bar\t2\nbaz 3"));
  EXPECT_EQ(props, (std::map<std::string, uint64_t>{{"foo", 1}, {"bar", 2}, {"baz", 3}}));
  ASSERT_OK_AND_ASSIGN(auto empty, ParseKfdProperties(""));
  EXPECT_TRUE(empty.empty());
}

TEST(ParseKfdPropertiesTest, AcceptsTheLargestUint64) {
  ASSERT_OK_AND_ASSIGN(auto props, ParseKfdProperties("size_in_bytes 18446744073709551615\n"));
  EXPECT_EQ(props.at("size_in_bytes"), std::numeric_limits<uint64_t>::max());
}

TEST(ParseKfdPropertiesTest, RejectsMalformedLinesNamingTheLine) {
  struct Case {
    std::string text, message;
  };
  const Case cases[] = {
      {"a 1\nvendor_id 0x1002\n", "line 2: value \"0x1002\" of \"vendor_id\" is not a decimal"},
      {"domain -1\n", "line 1: value \"-1\" of \"domain\" is not a decimal"},
      {"a 1\nb 2\nsize_in_bytes 18446744073709551616\n",
       "line 3: value \"18446744073709551616\" of \"size_in_bytes\" does not fit in 64 bits"},
      {"vendor_id\n", "line 1: expected \"key value\", got \"vendor_id\""},
      {"vendor_id 4098 4098\n", "line 1: expected \"key value\""},
      {"sibling_map 1,0,0,1\n", "value \"1,0,0,1\" of \"sibling_map\" is not a decimal"},
      {"vendor-id 4098\n", "line 1: key \"vendor-id\" has characters other than"},
      {"ven\x1b[2Jdor 1\n", "key \"ven\\x1B[2Jdor\""},
      {"gpu 1\ngpu 2\n", "line 2: \"gpu\" appears twice"},
      {"a 12abc\n", "value \"12abc\" of \"a\" is not a decimal"},
  };
  for (const Case& c : cases) {
    auto r = ParseKfdProperties(c.text);
    ASSERT_CODE(r, StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(Contains(r.status().message(), c.message))
        << "text " << c.text << "\nmessage " << r.status().message() << "\nwanted " << c.message;
  }
}

TEST(ParseKfdPropertiesTest, ShortensHugeGarbageInMessages) {
  auto r = ParseKfdProperties("k " + std::string(10000, 'x') + "\n");
  ASSERT_CODE(r, StatusCode::kInvalidArgument);
  EXPECT_LT(r.status().message().size(), 300u) << r.status().message();
}

// ---- ReadKfdTopology ----

TEST(ReadKfdTopologyTest, DescribesTheGpusAndSkipsTheCpu) {
  FakeSysfs fs;
  fs.AddTypicalHost();
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 2u);

  const KfdGpu& mi210 = gpus[0];
  EXPECT_EQ(mi210.node, 1);
  EXPECT_EQ(mi210.gpu_id, 52741u);
  EXPECT_EQ(mi210.kfd_name, "aldebaran");
  EXPECT_EQ(mi210.name, "aldebaran");
  EXPECT_EQ(mi210.gfx_target, "gfx90a");
  EXPECT_EQ(mi210.marketing_name, "");
  EXPECT_EQ(mi210.vram_bytes, kMi210Vram);
  EXPECT_EQ(mi210.vendor_id, 0x1002u);
  EXPECT_EQ(mi210.device_id, 0x740fu);
  EXPECT_EQ(mi210.uuid, "GPU-598ca3b78f3a6fe1");  // 6452712374892392417
  EXPECT_EQ(mi210.drm_render_minor, 128u);
  EXPECT_EQ(KfdGpuDisplayName(mi210), "gfx90a (AMD 1002:740f)");

  const KfdGpu& mi100 = gpus[1];
  EXPECT_EQ(mi100.node, 2);
  EXPECT_EQ(mi100.gpu_id, 16738u);
  EXPECT_EQ(mi100.gfx_target, "gfx908");
  EXPECT_EQ(mi100.vram_bytes, 32 * kGiB);  // private + public, not the system bank
  EXPECT_EQ(mi100.uuid, "") << "unique_id 0 means no uuid";
  EXPECT_EQ(mi100.drm_render_minor, 129u);
  EXPECT_EQ(KfdGpuDisplayName(mi100), "gfx908 (AMD 1002:738c)");
}

TEST(ReadKfdTopologyTest, SortsNodesByNumberAndIgnoresOtherEntries) {
  FakeSysfs fs;
  fs.AddCpuNode(0);
  for (int node : {10, 2, 1}) {
    fs.AddGpuNode(node, 1000 + node, "aldebaran", GpuProps{});
  }
  fs.Put("class/kfd/kfd/topology/nodes/README/properties", "not a node");
  fs.Put("class/kfd/kfd/topology/nodes/3a/gpu_id", "7\n");
  fs.Put("class/kfd/kfd/topology/system_properties", "platform_oem 0\n");
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].node, 1);
  EXPECT_EQ(gpus[1].node, 2);
  EXPECT_EQ(gpus[2].node, 10);
  EXPECT_EQ(gpus[2].gpu_id, 1010u);
  EXPECT_EQ(gpus[0].vram_bytes, 0u) << "no mem_banks directory";
}

TEST(ReadKfdTopologyTest, MissingTopologyIsNotFound) {
  FakeSysfs fs;
  fs.Put("class/drm/version", "drm 1.1.0 20060810\n");
  auto r = ReadKfdTopology(fs.root());
  ASSERT_CODE(r, StatusCode::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(),
                       "no KFD topology at " + fs.root() + "/class/kfd/kfd/topology/nodes"))
      << r.status().message();

  auto nowhere = ReadKfdTopology(fs.root() + "/does/not/exist");
  EXPECT_CODE(nowhere, StatusCode::kNotFound);
}

TEST(ReadKfdTopologyTest, TopologyWithoutGpusIsEmpty) {
  FakeSysfs fs;
  fs.AddCpuNode(0);
  fs.AddCpuNode(1);
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  EXPECT_TRUE(gpus.empty());
}

TEST(ReadKfdTopologyTest, MalformedPropertiesAreCorruptionNamingFileAndLine) {
  FakeSysfs fs;
  fs.AddTypicalHost();
  GpuProps bad;
  bad.extra = "vram_type HBM2e\n";
  fs.AddGpuNode(2, 16738, "arcturus", bad);
  auto r = ReadKfdTopology(fs.root());
  ASSERT_CODE(r, StatusCode::kCorruption);
  EXPECT_TRUE(
      Contains(r.status().message(), fs.NodeDir(2) + "/properties: line 38: value \"HBM2e\""))
      << r.status().message();
}

TEST(ReadKfdTopologyTest, MalformedCpuNodeDoesNotMatter) {
  // CPU properties are never read: nothing in them describes a GPU.
  FakeSysfs fs;
  fs.AddTypicalHost();
  fs.PutNode(0, "properties", "cpu_cores_count lots\n");
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  EXPECT_EQ(gpus.size(), 2u);
}

TEST(ReadKfdTopologyTest, MalformedGpuIdIsCorruption) {
  for (const char* id : {"abc\n", "\n", "-5\n", "4294967296\n", "12 34\n"}) {
    FakeSysfs fs;
    fs.AddTypicalHost();
    fs.PutNode(1, "gpu_id", id);
    auto r = ReadKfdTopology(fs.root());
    ASSERT_CODE(r, StatusCode::kCorruption) << id;
    EXPECT_TRUE(Contains(r.status().message(), fs.NodeDir(1) + "/gpu_id: "))
        << r.status().message();
  }
}

TEST(ReadKfdTopologyTest, MalformedMemBankIsCorruption) {
  FakeSysfs fs;
  fs.AddTypicalHost();
  fs.PutNode(2, "mem_banks/1/properties", "heap_type 1\nsize_in_bytes 32G\n");
  auto r = ReadKfdTopology(fs.root());
  ASSERT_CODE(r, StatusCode::kCorruption);
  EXPECT_TRUE(Contains(r.status().message(), fs.NodeDir(2) + "/mem_banks/1/properties: line 2"))
      << r.status().message();
}

TEST(ReadKfdTopologyTest, UniqueIdZeroOrMissingGivesNoUuid) {
  FakeSysfs fs;
  GpuProps zero;
  zero.unique_id = "0";
  GpuProps missing;
  missing.unique_id = "";  // gfx8 boards on old kernels: no key at all
  GpuProps max;
  max.unique_id = "18446744073709551615";
  fs.AddGpuNode(1, 11, "aldebaran", zero);
  fs.AddGpuNode(2, 12, "fiji", missing);
  fs.AddGpuNode(3, 13, "aldebaran", max);
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].uuid, "");
  EXPECT_EQ(gpus[1].uuid, "");
  EXPECT_EQ(gpus[2].uuid, "GPU-ffffffffffffffff");
}

TEST(ReadKfdTopologyTest, VramNearUint64MaxAddsUpOrIsCorruption) {
  FakeSysfs fs;
  fs.AddGpuNode(1, 11, "aldebaran", GpuProps{});
  fs.PutNode(1, "mem_banks/0/properties", MemBank(1, "18446744073709551615"));
  fs.PutNode(1, "mem_banks/1/properties", MemBank(0, "18446744073709551615"));  // not VRAM
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].vram_bytes, std::numeric_limits<uint64_t>::max());

  fs.PutNode(1, "mem_banks/2/properties", MemBank(2, "1"));
  auto r = ReadKfdTopology(fs.root());
  ASSERT_CODE(r, StatusCode::kCorruption);
  EXPECT_TRUE(Contains(r.status().message(), "more than 2^64")) << r.status().message();
}

TEST(ReadKfdTopologyTest, ValueTooLargeForA32BitFieldIsCorruption) {
  FakeSysfs fs;
  GpuProps p;
  p.device_id = 0;
  fs.AddGpuNode(1, 11, "aldebaran", p);
  // node_show() writes device_id with %u; this is not KFD's file.
  std::string text = GpuProperties(p);
  text.replace(text.find("device_id 0"), 11, "device_id 4294967296");
  fs.PutNode(1, "properties", text);
  auto r = ReadKfdTopology(fs.root());
  ASSERT_CODE(r, StatusCode::kCorruption);
  EXPECT_TRUE(Contains(r.status().message(), "device_id 4294967296 does not fit in 32 bits"))
      << r.status().message();
}

TEST(ReadKfdTopologyTest, EmptyNameFallsBackInTheDisplayName) {
  FakeSysfs fs;
  fs.AddGpuNode(1, 11, "", GpuProps{});
  GpuProps no_target;
  no_target.gfx_target_version = 0;  // kernels before gfx_target_version
  fs.AddGpuNode(2, 12, "", no_target);
  fs.AddGpuNode(3, 13, "fiji", no_target);
  fs.PutNode(3, "name", "");  // not even a newline
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].name, "");
  EXPECT_EQ(KfdGpuDisplayName(gpus[0]), "gfx90a (AMD 1002:740f)");
  EXPECT_EQ(KfdGpuDisplayName(gpus[1]), "AMD GPU (AMD 1002:740f)");
  EXPECT_EQ(gpus[2].name, "");
}

TEST(ReadKfdTopologyTest, NameIsCleanedOfControlBytes) {
  FakeSysfs fs;
  fs.AddGpuNode(1, 11, "alde\x1b]0;pwned\x07ran  ", GpuProps{});
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].kfd_name, "alde?]0;pwned?ran");
}

TEST(ReadKfdTopologyTest, MarketingNameFromTheDrmProductName) {
  FakeSysfs fs;
  fs.AddTypicalHost();
  fs.Put("class/drm/renderD128/device/product_name", "AMD Instinct MI210\n");
  fs.Put("class/drm/renderD129/device/product_name", "\n");  // board without a FRU
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].marketing_name, "AMD Instinct MI210");
  EXPECT_EQ(gpus[0].name, "AMD Instinct MI210");
  EXPECT_EQ(gpus[0].kfd_name, "aldebaran");
  EXPECT_EQ(KfdGpuDisplayName(gpus[0]), "AMD Instinct MI210 (gfx90a, 1002:740f)");
  EXPECT_EQ(gpus[1].name, "arcturus");
  EXPECT_EQ(KfdGpuDisplayName(gpus[1]), "gfx908 (AMD 1002:738c)");
}

TEST(ReadKfdTopologyTest, GfxTargetFromVersion) {
  const std::pair<uint32_t, const char*> cases[] = {
      {90010, "gfx90a"}, {90402, "gfx942"}, {100300, "gfx1030"}, {110000, "gfx1100"}};
  FakeSysfs fs;
  int node = 1;
  for (const auto& [version, name] : cases) {
    GpuProps p;
    p.gfx_target_version = version;
    fs.AddGpuNode(node, 100 + node, "ip discovery", p);
    ++node;
  }
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(gpus[i].gfx_target, cases[i].second);
}

TEST(ReadKfdTopologyTest, NodeWithoutPropertiesOrGpuIdIsSkipped) {
  // What a reader racing with hot-unplug (or hotplug) sees.
  FakeSysfs fs;
  fs.AddTypicalHost();
  fs.PutNode(3, "gpu_id", "777\n");  // no properties
  MakeDirs(fs.NodeDir(4));           // nothing at all
  fs.AddGpuNode(5, 555, "aldebaran", GpuProps{});
  fs.PutNode(5, "mem_banks/0/properties", MemBank(1, "1024"));
  MakeDirs(fs.NodeDir(5) + "/mem_banks/1");  // a bank without properties
  ASSERT_OK_AND_ASSIGN(auto gpus, ReadKfdTopology(fs.root()));
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].node, 1);
  EXPECT_EQ(gpus[1].node, 2);
  EXPECT_EQ(gpus[2].node, 5);
  EXPECT_EQ(gpus[2].vram_bytes, 1024u);
}

TEST(ReadKfdTopologyTest, OversizedFileIsCorruption) {
  FakeSysfs fs;
  fs.AddTypicalHost();
  std::string huge;
  while (huge.size() <= 64 * 1024) huge += "padding_key 0\n";
  fs.PutNode(1, "properties", GpuProperties(GpuProps{}) + huge);
  auto r = ReadKfdTopology(fs.root());
  ASSERT_CODE(r, StatusCode::kCorruption);
  EXPECT_TRUE(Contains(r.status().message(), fs.NodeDir(1) + "/properties is too large"))
      << r.status().message();
}

// KFD answers EPERM for GPUs outside the reader's device cgroup; a file
// we may not read stands in for that. Runs as nobody when the test runs as
// root, for whom file modes do not apply.
TEST(ReadKfdTopologyTest, UnreadableNodeIsSkipped) {
  FakeSysfs fs;
  fs.AddTypicalHost();
  ASSERT_EQ(chmod((fs.NodeDir(2) + "/properties").c_str(), 0), 0);
  auto check = [&fs]() -> int {
    auto gpus = ReadKfdTopology(fs.root());
    if (!gpus.ok()) return 2;
    return gpus->size() == 1 && (*gpus)[0].node == 1 ? 0 : 3;
  };
  if (geteuid() != 0) {
    EXPECT_EQ(check(), 0);
    return;
  }
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(1);
    _exit(check());
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: could not drop privileges, 2: error, 3: wrong nodes";
}

}  // namespace
}  // namespace gpuckpt
