#include "plan/load_names.h"

#include <set>

namespace distckpt::internal_plan {
namespace {

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (name.compare(0, p.size(), p) == 0) return true;
  return false;
}

Status check_prefixes(const LoadOptions& options) {
  for (const auto* list : {&options.specify_prefix, &options.filter_prefix})
    for (const auto& p : *list)
      if (p.empty()) return invalid_argument("an empty prefix in specify_prefix or filter_prefix");
  // As MindSpore: a tensor may not be both asked for and excluded by prefix.
  for (const auto& s : options.specify_prefix)
    for (const auto& f : options.filter_prefix)
      if (s.compare(0, f.size(), f) == 0 || f.compare(0, s.size(), s) == 0)
        return invalid_argument("specify_prefix '" + s + "' and filter_prefix '" + f + "' overlap");
  if (!options.rename.empty() && options.rename_func)
    return invalid_argument("set rename or rename_func, not both");
  return Status();
}

}  // namespace

Result<LoadNames> load_names(const proto::Index& index, const LoadOptions& options) {
  DISTCKPT_RETURN_IF_ERROR(check_prefixes(options));
  LoadNames out;
  out.selective = !options.specify_prefix.empty() || !options.filter_prefix.empty() || options.choice_func ||
                  !options.rename.empty() || options.rename_func;
  std::map<std::string, std::string> renamed_from;  // new name -> stored name
  for (int i = 0; i < index.tensors_size(); ++i) {
    const std::string& stored = index.tensors(i).name();
    const bool kept = (options.specify_prefix.empty() || starts_with_any(stored, options.specify_prefix)) &&
                      !starts_with_any(stored, options.filter_prefix) &&
                      (!options.choice_func || options.choice_func(stored));
    if (!kept) {
      out.filtered_out.push_back(stored);
      continue;
    }
    std::string name = stored;
    if (auto it = options.rename.find(stored); it != options.rename.end()) name = it->second;
    else if (options.rename_func) name = options.rename_func(stored);
    if (name.empty()) return invalid_argument("tensor '" + stored + "' is renamed to an empty name");
    auto [pos, fresh] = renamed_from.emplace(name, stored);
    if (!fresh)
      return invalid_argument("tensors '" + pos->second + "' and '" + stored + "' would both be loaded as '" +
                              name + "'");
    out.by_state_name[name] = i;
    const auto& shape = index.tensors(i).global_shape();
    if (index.info().count(stored) && (shape.empty() || (shape.size() == 1 && shape[0] == 1)))
      out.info_scalars.insert(name);
  }
  return out;
}

Status refuse_unexpected(const LoadNames& names, const StateDict& state, const LoadOptions& options,
                         const std::string& where) {
  if (options.allow_unexpected || !options.only.empty()) return Status();  // `only` loads a subset by design
  std::vector<std::string> unexpected;
  for (const auto& [name, index] : names.by_state_name)
    if (state.find(name) < 0 && !names.info_scalars.count(name)) unexpected.push_back(name);
  if (unexpected.empty()) return Status();
  constexpr std::size_t kNamed = 8;
  std::string listed;
  for (std::size_t i = 0; i < unexpected.size() && i < kNamed; ++i) listed += (i ? ", '" : "'") + unexpected[i] + "'";
  if (unexpected.size() > kNamed) listed += " and " + std::to_string(unexpected.size() - kNamed) + " more";
  return mismatch("checkpoint '" + where + "' holds " + std::to_string(unexpected.size()) +
                  " tensor(s) the state dict has no place for: " + listed +
                  " (named as the state would name them; set allow_unexpected to load the others, or leave them "
                  "out with filter_prefix / choice_func)");
}

}  // namespace distckpt::internal_plan
