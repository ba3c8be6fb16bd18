// The names of a manager's series: name_template with its {prefix}, {step}, {epoch}
// and {step_in_epoch} (MindSpore's "{prefix}-{epoch}_{step_in_epoch}": the step within
// its epoch, 1..steps_per_epoch), an optional "_suffix" (breakpoint, exception, collisions) and the format's
// extension. A run takes a prefix no other run's committed checkpoints use ("ckpt",
// "ckpt_1", ...), so that retention only ever sees its own.
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "distckpt/inspect.h"

namespace distckpt::internal_manager {

class SeriesNames {
 public:
  SeriesNames() = default;
  explicit SeriesNames(std::string name_template, int64_t steps_per_epoch = 0)
      : template_(std::move(name_template)), steps_per_epoch_(steps_per_epoch) {}

  std::string render(const std::string& prefix, int64_t step, int64_t epoch) const;
  // Whether `name` (a root entry's name) belongs to the series of `prefix`.
  bool matches(const std::string& prefix, const std::string& name) const;
  // The committed checkpoints of `prefix`'s series in `listing`.
  std::vector<CheckpointEntry> entries(const std::string& prefix, const RootListing& listing) const;
  // `base`, or the first "base_N" whose series has no committed checkpoint.
  std::string fresh_prefix(const std::string& base, const RootListing& listing) const;
  // Which of `base`, "base_1", ... "base_999" `name` belongs to; nullopt for none.
  std::optional<std::string> prefix_of(const std::string& base, const std::string& name) const;

 private:
  std::regex regex(const std::string& prefix) const;
  std::string template_;
  int64_t steps_per_epoch_ = 0;  // > 0 when the template has {step_in_epoch} (validated)
};

}  // namespace distckpt::internal_manager
