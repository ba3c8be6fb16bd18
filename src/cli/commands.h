// The subcommands of the `distckpt` tool. Each returns the process exit code:
// 0 success, 1 the checkpoint is bad / the operation failed, 2 bad usage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace distckpt::internal_cli {

struct LayoutArgs {
  std::string shape, dev_mat, tensor_map, ranks;
};
int cmd_layout(const LayoutArgs& args);
int cmd_ls(const std::string& root, bool json);
int cmd_inspect(const std::string& path, bool json);
int cmd_verify(const std::string& path, bool json, bool deep);

struct ConvertArgs {
  std::string src, dst, to;
  bool no_crc_footer = false;
  uint64_t region_mib = 0;
};
int cmd_convert(const ConvertArgs& args);

struct PublishArgs {
  std::string src, to = "safetensors", out_dir;
  std::vector<std::string> only;
  bool json = false;
};
int cmd_publish(const PublishArgs& args);

}  // namespace distckpt::internal_cli
