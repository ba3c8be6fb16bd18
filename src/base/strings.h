// Small string and path helpers shared by every floor (no I/O).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace distckpt::internal_base {

bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
// Every occurrence of `from` in `s` replaced by `to` (left to right, not rescanned).
std::string replace_all(std::string s, const std::string& from, const std::string& to);
// "a\nb" -> {"a", "b"}; "" -> {} (not {""}).
std::vector<std::string> split(const std::string& s, char sep);
std::string join(const std::vector<std::string>& parts, char sep);

// The last component of `path` ("a/b/c" -> "c"; "c" -> "c").
std::string base_name(const std::string& path);
// The directory `path` is in ("a/b/c" -> "a/b"; "c" -> ".").
std::string dir_name(const std::string& path);
// `path` without trailing slashes (but "/" stays "/").
std::string trim_trailing_slashes(std::string path);

}  // namespace distckpt::internal_base
