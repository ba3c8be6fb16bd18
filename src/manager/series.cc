#include "manager/series.h"

#include "base/strings.h"
#include "format/format.h"

namespace distckpt::internal_manager {

namespace {

std::string regex_escape(const std::string& s) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(s, special, R"(\$&)");
}

std::string prefix_n(const std::string& base, int n) { return n == 0 ? base : base + "_" + std::to_string(n); }

}  // namespace

std::regex SeriesNames::regex(const std::string& prefix) const {
  using internal_base::replace_all;
  std::string pattern = regex_escape(template_);
  pattern = replace_all(pattern, regex_escape("{prefix}"), regex_escape(prefix));
  pattern = replace_all(pattern, regex_escape("{step}"), "-?[0-9]+");
  pattern = replace_all(pattern, regex_escape("{step_in_epoch}"), "-?[0-9]+");
  pattern = replace_all(pattern, regex_escape("{epoch}"), "-?[0-9]+");
  std::string extensions;
  for (const auto* d : internal_format::all_drivers())
    for (std::string_view ext : d->read_extensions)
      extensions += (extensions.empty() ? "" : "|") + regex_escape(std::string(ext));
  return std::regex(pattern + "(_[A-Za-z0-9]+)?(" + extensions + ")?");
}

std::string SeriesNames::render(const std::string& prefix, int64_t step, int64_t epoch) const {
  using internal_base::replace_all;
  std::string name = replace_all(template_, "{prefix}", prefix);
  name = replace_all(name, "{step}", std::to_string(step));
  if (steps_per_epoch_ > 0) {
    // MindSpore: (cur_step_num - 1) % batch_num + 1, the steps counted from 1.
    const int64_t in_epoch = step > 0 ? (step - 1) % steps_per_epoch_ + 1 : step;
    name = replace_all(name, "{step_in_epoch}", std::to_string(in_epoch));
  }
  return replace_all(name, "{epoch}", std::to_string(epoch));
}

bool SeriesNames::matches(const std::string& prefix, const std::string& name) const {
  return std::regex_match(name, regex(prefix));
}

std::vector<CheckpointEntry> SeriesNames::entries(const std::string& prefix, const RootListing& listing) const {
  const std::regex re = regex(prefix);
  std::vector<CheckpointEntry> out;
  for (const auto& e : listing.entries)
    if (e.state == EntryState::kCommitted && std::regex_match(e.name, re)) out.push_back(e);
  return out;
}

std::string SeriesNames::fresh_prefix(const std::string& base, const RootListing& listing) const {
  std::string prefix = base;
  for (int n = 1; !entries(prefix, listing).empty(); ++n) prefix = prefix_n(base, n);
  return prefix;
}

std::optional<std::string> SeriesNames::prefix_of(const std::string& base, const std::string& name) const {
  for (int n = 0; n < 1000; ++n)
    if (matches(prefix_n(base, n), name)) return prefix_n(base, n);
  return std::nullopt;
}

}  // namespace distckpt::internal_manager
