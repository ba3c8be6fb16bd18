// The version: distckpt::version() is the CMake project's, and every save and conversion
// records it in the checkpoint's index (inspect shows it as writer_version).
#include <gtest/gtest.h>

#include <string>

#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "distckpt/inspect.h"
#include "format_model.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

TEST(Version, IsTheProjectsAndEverySaveRecordsIt) {
  EXPECT_EQ(std::string(version()), DISTCKPT_PROJECT_VERSION);
  testing::TempDir dir;
  for (Format format : {Format::kNative, Format::kCkpt, Format::kSafetensors, Format::kHdf5}) {
    SaveOptions options;
    options.name = "v" + std::to_string(static_cast<int>(format));
    options.format = format;
    std::string path;
    for (const auto& r : testing::run_ranks(2, [&](Comm& comm) -> Status {
           testing::FormatModel m(comm.rank(), 2, /*irregular=*/false);
           auto saved = save(comm, m.state, dir.path(), options);
           if (saved.ok() && comm.rank() == 0) path = saved->path;
           return saved.status();
         }))
      ASSERT_EQ(r, "ok");
    auto info = read_checkpoint_info(path);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_EQ(info->writer_version, version()) << path;
  }
  auto converted = convert_checkpoint(dir.path() + "/v0", dir.path() + "/as-ckpt", Format::kCkpt);
  ASSERT_TRUE(converted.ok()) << converted.status().to_string();
  auto info = read_checkpoint_info(converted->path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->writer_version, version());
}

}  // namespace
}  // namespace distckpt
