// Names of best checkpoints (CheckpointConfig::save_best): "best_<metric>_<name>", with
// '/' in the metric written '_' (as MMEngine names its files). Shared by the manager
// and `distckpt ls`, which marks them.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "distckpt/state_dict.h"

namespace distckpt::internal_manager {

// The metric as it appears in a best checkpoint's name.
std::string best_file_metric(const std::string& metric);
// An info value as a number (double or int64), if it is one.
std::optional<double> numeric_info(const std::map<std::string, InfoValue>& info, const std::string& key);
// The metric a checkpoint named `entry_name` with these info values is the best copy
// of ("best_<metric>_..." whose info holds <metric> as a number), or "".
std::string best_metric_of(const std::string& entry_name, const std::map<std::string, InfoValue>& info);

}  // namespace distckpt::internal_manager
