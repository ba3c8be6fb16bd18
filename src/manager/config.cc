#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "distckpt/config.h"

#include "collective/save_strategies.h"
#include "manager/best.h"
#include "tier/parity.h"
#include "base/text.h"

namespace distckpt {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Status bad(const std::string& what) { return invalid_argument("checkpoint config: " + what); }

}  // namespace

Result<CompareRule> CheckpointConfig::rule_for(const std::string& metric, CompareRule given) const {
  if (given != CompareRule::kAuto) return given;
  // MMEngine's inference: an exact (case-insensitive) match first, then a substring.
  static const std::vector<std::string> kGreater = {"acc", "top", "AR@", "auc", "precision",
                                                    "mAP", "mDice", "mIoU", "mAcc", "aAcc"};
  static const std::vector<std::string> kLess = {"loss"};
  const std::vector<std::string>& greater = greater_keys.empty() ? kGreater : greater_keys;
  const std::vector<std::string>& less = less_keys.empty() ? kLess : less_keys;
  const std::string m = lower(metric);
  for (const auto& k : greater)
    if (m == lower(k)) return CompareRule::kGreater;
  for (const auto& k : less)
    if (m == lower(k)) return CompareRule::kLess;
  for (const auto& k : greater)
    if (m.find(lower(k)) != std::string::npos) return CompareRule::kGreater;
  for (const auto& k : less)
    if (m.find(lower(k)) != std::string::npos) return CompareRule::kLess;
  return bad("cannot tell whether a larger or a smaller '" + metric +
             "' is better: set the rule (kGreater or kLess), or greater_keys/less_keys");
}

Result<CompareRule> CheckpointConfig::effective_rule() const { return rule_for(best_metric, rule); }

Result<CompareRule> CheckpointConfig::save_best_rule(std::size_t i, const std::string& metric) const {
  const CompareRule given = save_best_rules.empty() ? CompareRule::kAuto
                            : save_best_rules.size() == 1 ? save_best_rules[0]
                            : i < save_best_rules.size() ? save_best_rules[i] : CompareRule::kAuto;
  return rule_for(metric, given);
}

std::string CheckpointConfig::effective_name_template() const {
  if (filename_tmpl.empty()) return name_template;
  std::string t = filename_tmpl;
  // A trailing extension after the "{}" (MMEngine's ".pth") gives way to the format's.
  const std::size_t dot = t.rfind('.'), hole = t.find("{}");
  if (dot != std::string::npos && hole != std::string::npos && dot > hole + 1 && dot + 1 < t.size() &&
      std::all_of(t.begin() + static_cast<std::ptrdiff_t>(dot) + 1, t.end(),
                  [](unsigned char c) { return std::isalnum(c) != 0; }))
    t.resize(dot);
  if (hole != std::string::npos) t.replace(hole, 2, by_epoch ? "{epoch}" : "{step}");
  return t;
}

CheckpointConfig CheckpointConfig::mindspore(int64_t steps_per_epoch) {
  CheckpointConfig c;
  c.save_every_steps = 1;       // save_checkpoint_steps=1
  c.save_every_seconds = 0;     // save_checkpoint_seconds=0
  c.keep_max = 5;               // keep_checkpoint_max=5
  c.keep_per_n_minutes = 0;     // keep_checkpoint_per_n_minutes=0
  c.prefix = "CKP";             // ModelCheckpoint(prefix='CKP')
  c.steps_per_epoch = steps_per_epoch;
  c.name_template = steps_per_epoch > 0 ? "{prefix}-{epoch}_{step_in_epoch}" : "{prefix}-{epoch}_{step}";
  c.format = Format::kCkpt;     // format='ckpt'
  c.integrated = true;          // integrated_save=True
  c.ckpt_crc_footer = false;    // crc_check=False
  c.remove_redundancy = false;  // remove_redundancy=False
  c.save_last = true;           // ModelCheckpoint.end() saves the last step (unless just saved)
  return c;
}

CheckpointConfig CheckpointConfig::mmengine() {
  CheckpointConfig c;
  c.save_every_steps = 0;       // interval=-1: no periodic save
  c.by_epoch = true;            // by_epoch=True
  c.keep_max = 0;               // max_keep_ckpts=-1: keep all
  c.save_last = true;           // save_last=True
  c.filename_tmpl = "epoch_{}.pth";  // filename_tmpl=None with by_epoch
  c.format = Format::kNative;
  c.regular_at_best = true;     // _save_best_checkpoint's _save_checkpoint_with_step
  return c;
}

Status CheckpointConfig::validate() const {
  if (directory.empty()) return bad("directory is empty");
  if (save_every_steps < 0) return bad("save_every_steps " + std::to_string(save_every_steps) + " is negative");
  if (!(save_every_seconds >= 0) || std::isinf(save_every_seconds))
    return bad("save_every_seconds must be a finite number >= 0");
  if (!local.dir.empty()) {
    if (local_every_steps < 0) return bad("local_every_steps is negative");
    if (!(local_every_seconds >= 0) || std::isinf(local_every_seconds))
      return bad("local_every_seconds must be a finite number >= 0");
    if (global_every < 0) return bad("global_every is negative");
    if (keep_local < 1) return bad("keep_local must be >= 1 (the newest local checkpoint is always kept)");
    if (keep_global < -1) return bad("keep_global must be -1 (keep_max) or >= 0");
    if (internal_collective::save_shape(*this) != internal_collective::SaveShape::kSharded) return bad("the local tier keeps native sharded checkpoints only");
    if (by_epoch) return bad("by_epoch is not supported with the local tier (local_every_steps counts steps)");
    if (local_every_steps == 0 && local_every_seconds == 0 && save_every_epochs == 0 && !save_last)
      return bad("nothing would ever be saved: set local_every_steps, local_every_seconds or save_last");
    if (auto r = internal_tier::parse_redundancy(local.redundancy); !r.ok()) return bad(r.status().message());
  } else if (save_every_steps == 0 && save_every_seconds == 0 && save_every_epochs == 0 && !save_last &&
             save_best.empty())  // (an MMEngine hook that keeps only its best saves that)
    return bad("nothing would ever be saved: set save_every_steps, save_every_seconds, save_every_epochs, save_last "
               "or save_best");
  if (save_every_epochs < 0) return bad("save_every_epochs is negative");
  if (save_every_epochs > 0 && by_epoch)
    return bad("save_every_epochs is for step-counted runs: with by_epoch, save_every_steps counts epochs");
  if (by_epoch && save_every_seconds > 0 && save_every_steps == 0)
    return bad("by_epoch counts epochs: save_every_seconds cannot be used with it");
  if (save_begin < 0) return bad("save_begin is negative");
  if (keep_max < 0)
    return bad("keep_max " + std::to_string(keep_max) + " is negative (0 keeps all, or one per keep_per_n_minutes)");
  // Bounded so that the period in milliseconds fits an int64 (10^9 minutes: 1900 years).
  if (!(keep_per_n_minutes >= 0 && keep_per_n_minutes <= 1e9))
    return bad("keep_per_n_minutes must be a number of minutes from 0 to 1e9");
  if (keep_best < 0) return bad("keep_best is negative");
  if (!(gc_lease_s >= 120) || std::isinf(gc_lease_s))
    return bad("gc_lease_s must be a finite number >= 120 (several heartbeats of a save in flight)");
  if (!best_metric.empty()) {
    if (keep_best == 0) return bad("best_metric is set but keep_best is 0");
    DISTCKPT_RETURN_IF_ERROR(effective_rule());
  } else if (rule != CompareRule::kAuto) {
    return bad("rule is set but best_metric is empty");
  }
  if (!save_best.empty()) {
    if (!local.dir.empty()) return bad("save_best is not supported with the local tier");
    if (save_best_rules.size() > 1 && save_best_rules.size() != save_best.size())
      return bad("save_best_rules must have one rule, or one per save_best metric (" + std::to_string(save_best.size()) +
                 "), not " + std::to_string(save_best_rules.size()));
    std::vector<std::string> seen;
    for (std::size_t i = 0; i < save_best.size(); ++i) {
      const std::string& m = save_best[i];
      if (m.empty() || !internal_base::is_printable_utf8(m))
        return bad("save_best has an empty or unprintable metric name");
      // Two metrics whose files would share a name ('/' is written '_').
      const std::string file_name = internal_manager::best_file_metric(m);
      if (std::find(seen.begin(), seen.end(), file_name) != seen.end())
        return bad("save_best names '" + m + "' twice (best checkpoint names write '/' as '_')");
      seen.push_back(file_name);
      if (m == "auto" && save_best.size() > 1) return bad("save_best: \"auto\" must be alone");
      if (m != "auto") DISTCKPT_RETURN_IF_ERROR(save_best_rule(i, m).status());
      if (append_info.count(m)) return bad("append_info may not set '" + m + "' (save_best stores the metric under that key)");
    }
  } else if (!save_best_rules.empty()) {
    return bad("save_best_rules is set but save_best is empty");
  }
  if (upload && !upload_command.empty()) return bad("set upload or upload_command, not both");
  if (!upload_command.empty() && upload_command[0].empty()) return bad("upload_command's program is empty");
  if (upload_queue < 1) return bad("upload_queue must be >= 1");
  if (!(upload_wait_s >= 0) || std::isinf(upload_wait_s)) return bad("upload_wait_s must be a finite number >= 0");
  for (const auto& p : best_prefixes)
    if (p.empty()) return bad("best_prefixes contains an empty prefix (it would match everything)");
  if (prefix.empty() || prefix.find('/') != std::string::npos || !internal_base::is_printable_utf8(prefix))
    return bad("prefix '" + internal_base::printable(prefix) + "' must be non-empty printable text without '/'");
  if (!out_dir.empty() && out_dir != directory) {
    std::string d = directory;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const std::size_t slash = d.rfind('/');
    const std::string base = slash == std::string::npos ? d : d.substr(slash + 1);
    if (base.empty() || base == "." || base == "..")
      return bad("out_dir is set but directory '" + directory + "' has no name to join with it");
  }
  if (!filename_tmpl.empty()) {
    if (name_template != CheckpointConfig().name_template)
      return bad("filename_tmpl and name_template are both set: use one");
    const std::size_t hole = filename_tmpl.find("{}");
    if (hole == std::string::npos || filename_tmpl.find("{}", hole + 2) != std::string::npos ||
        std::count(filename_tmpl.begin(), filename_tmpl.end(), '{') != 1 ||
        std::count(filename_tmpl.begin(), filename_tmpl.end(), '}') != 1)
      return bad("filename_tmpl '" + internal_base::printable(filename_tmpl) +
                 "' must contain exactly one \"{}\" and no other braces");
    if (filename_tmpl.find('/') != std::string::npos || !internal_base::is_printable_utf8(filename_tmpl))
      return bad("filename_tmpl must be printable text without '/'");
  }
  if (name_template.find("{step}") == std::string::npos && name_template.find("{epoch}") == std::string::npos)
    return bad("name_template '" + name_template + "' contains neither {step} nor {epoch}: names would repeat");
  if (name_template.find('/') != std::string::npos) return bad("name_template contains '/'");
  if (steps_per_epoch < 0) return bad("steps_per_epoch is negative");
  if (name_template.find("{step_in_epoch}") != std::string::npos) {
    if (steps_per_epoch == 0) return bad("name_template uses {step_in_epoch}: set steps_per_epoch");
    if (name_template.find("{epoch}") == std::string::npos && name_template.find("{step}") == std::string::npos)
      return bad("name_template has {step_in_epoch} without {epoch}: names would repeat every epoch");
  }
  {
    // What the names will look like: never one the catalog or resume reads otherwise.
    std::string sample = effective_name_template();
    for (const auto& [field, value] : {std::pair<std::string, std::string>{"{prefix}", prefix}, {"{step}", "1"},
                                       {"{epoch}", "1"}, {"{step_in_epoch}", "1"}})
      for (std::size_t at; (at = sample.find(field)) != std::string::npos;) sample.replace(at, field.size(), value);
    const auto ends_with = [&](const std::string& tail) {
      return sample.size() >= tail.size() && sample.compare(sample.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (sample.empty() || sample[0] == '.' || sample.find(".tmp-") != std::string::npos ||
        sample.rfind("best_", 0) == 0 || ends_with("_exception") || ends_with("_breakpoint") || sample == "latest" ||
        sample == "stats.jsonl")
      return bad("names like '" + internal_base::printable(sample) +
                 "' are reserved (a leading '.', '.tmp-', 'best_', '_exception', '_breakpoint', latest, stats.jsonl)");
  }
  for (const char* reserved : {"epoch_num", "step_num", "epoch_end", "best_of"})
    if (append_info.count(reserved)) return bad(std::string("append_info may not set '") + reserved + "' (the manager stores it)");
  if (!best_metric.empty() && append_info.count(best_metric))
    return bad("append_info may not set '" + best_metric + "' (the metric is stored under that key)");
  for (const auto& p : save_prefixes)
    if (p.empty()) return bad("save_prefixes contains an empty prefix (it would match everything)");
  if (!(exception_save_timeout_s > 0) || std::isinf(exception_save_timeout_s))
    return bad("exception_save_timeout_s must be a finite number > 0");
  if (Status st = encryption.validate(); !st.ok()) return bad(st.message());
  if (encryption.enabled() && format != Format::kNative && format != Format::kCkpt)
    return bad("encryption needs the native or ckpt format (" + std::string(format_name(format)) + " cannot carry it)");
  if (encryption.enabled() && publish_at_end)
    return bad("publish_at_end would export the encrypted checkpoints unencrypted; publish them explicitly");
  if (incremental && (format != Format::kNative || integrated.value_or(false)))
    return bad("incremental saves are sharded native checkpoints (format native, not integrated)");
  if (incremental && encryption.enabled())
    return bad("incremental saves cannot be encrypted (each checkpoint has its own keys)");
  if (incremental && (upload || !upload_command.empty()))
    return bad("incremental saves with uploads: an uploaded checkpoint directory would lack the files of earlier "
               "checkpoints it references (upload published files, which are self-contained, instead)");
  if (incremental && !local.dir.empty())
    return bad("incremental saves are not taken with the local tier (its saves and drains write every chunk)");
  if (async.slab_bytes == 0 || async.slab_bytes % kDirectIoAlignment != 0)
    return bad("async.slab_bytes must be a positive multiple of " + std::to_string(kDirectIoAlignment));
  if (load.fs || load.key || !load.only.empty() || !load.strict)
    return bad("load.fs, load.key, load.only and load.strict are the manager's: set fs, encryption and "
               "ResumeOptions instead");
  if (publish_format == Format::kNative)
    return bad("publish_format must be a single-file format (ckpt, safetensors or hdf5)");
  for (const auto& p : publish_only)
    if (p.empty()) return bad("publish_only contains an empty prefix (it would match everything)");
  return Status();
}

}  // namespace distckpt
