// Exports follow the umask: convert_checkpoint and publish_checkpoint outputs take 0666 /
// 0777 less the umask once committed, unless owner_only keeps a checkpoint's 0600 / 0700.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "distckpt/checkpoint.h"
#include "distckpt/convert.h"
#include "local_ranks.h"
#include "test_util.h"

namespace distckpt {
namespace {

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(ExportModes, FollowTheUmaskUnlessOwnerOnly) {
  const mode_t before = ::umask(022);  // before any thread starts: umask is the process's
  testing::TempDir dir;
  for (const auto& r : testing::run_ranks(1, [&](Comm& comm) -> Status {
         std::vector<float> w(8, 1.0f);
         StateDict state(comm.rank());
         DISTCKPT_ASSIGN_OR_RETURN(TensorLayout layout, TensorLayout::from_device_matrix({8}, {1}, {-1}));
         DISTCKPT_RETURN_IF_ERROR(state.add_tensor("w", DType::kFloat32, w.data(), layout));
         SaveOptions options;
         options.name = "c";
         return save(comm, state, dir.path(), options).status();
       }))
    ASSERT_EQ(r, "ok");
  const std::string source = dir.path() + "/c";
  EXPECT_EQ(mode_of(source), 0700u);  // a checkpoint is the owner's
  EXPECT_EQ(mode_of(source + "/index.pb"), 0600u);

  auto shared = convert_checkpoint(source, dir.path() + "/shared", Format::kNative);
  ASSERT_TRUE(shared.ok()) << shared.status().to_string();
  EXPECT_EQ(mode_of(shared->path), 0755u);
  for (const auto& e : std::filesystem::directory_iterator(shared->path))
    EXPECT_EQ(mode_of(e.path()), e.is_directory() ? 0755u : 0644u) << e.path();
  auto file = convert_checkpoint(source, dir.path() + "/file", Format::kSafetensors);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(mode_of(file->path), 0644u);

  ConvertOptions private_copy;
  private_copy.owner_only = true;
  auto kept = convert_checkpoint(source, dir.path() + "/kept", Format::kCkpt, private_copy);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(mode_of(kept->path), 0600u);

  PublishOptions publish;
  publish.directory = dir.path() + "/out";
  auto published = publish_checkpoint(source, publish);
  ASSERT_TRUE(published.ok()) << published.status().to_string();
  EXPECT_EQ(mode_of(published->path), 0644u);
  ::umask(before);
}

}  // namespace
}  // namespace distckpt
