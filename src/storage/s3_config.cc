#include "storage/s3_config.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>

#include "base/strings.h"

namespace distckpt::internal_storage {
namespace {

using internal_base::ends_with;
using internal_base::starts_with;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// The keys of one section of an AWS shared file (INI: "[name]", "key = value", comments
// with # or ;). A missing file is an empty map.
std::map<std::string, std::string> read_section(const std::string& path, const std::string& section) {
  std::map<std::string, std::string> keys;
  std::ifstream in(path);
  std::string line, current;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      current = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const std::size_t eq = line.find('=');
    if (current != section || eq == std::string::npos) continue;
    keys[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return keys;
}

std::string home_file(const char* variable, const char* relative) {
  std::string path = env(variable);
  if (!path.empty()) return path;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + relative;
}

Status set_number(const char* variable, double low, double* out) {
  const std::string text = env(variable);
  if (text.empty()) return Status();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= low) || v > 1e6)
    return invalid_argument(std::string(variable) + "='" + text + "': expected a number >= " + std::to_string(low));
  *out = v;
  return Status();
}

bool valid_bucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
          c == '.'))
      return false;
  return std::isalnum(static_cast<unsigned char>(b.front())) && std::isalnum(static_cast<unsigned char>(b.back()));
}

}  // namespace

bool S3Config::path_style() const {
  if (addressing != Addressing::kAuto) return addressing == Addressing::kPath;
  return !ends_with(endpoint, ".amazonaws.com");
}

std::string S3Config::describe() const {
  // An endpoint may carry user:password@ (never shown).
  std::string shown = endpoint;
  const std::size_t scheme = shown.find("://"), at = shown.find('@');
  if (scheme != std::string::npos && at != std::string::npos && at > scheme) shown.erase(scheme + 3, at - scheme - 2);
  return "endpoint " + shown + ", region " + region;
}

Result<S3Config> s3_config_from_environment() {
  S3Config c;
  std::string profile = env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  const std::string credentials_file = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  const std::string config_file = home_file("AWS_CONFIG_FILE", ".aws/config");
  const auto credentials = read_section(credentials_file, profile);
  const auto config = read_section(config_file, profile == "default" ? profile : "profile " + profile);
  auto from_files = [&](const char* key) {
    if (auto it = credentials.find(key); it != credentials.end()) return it->second;
    if (auto it = config.find(key); it != config.end()) return it->second;
    return std::string();
  };
  c.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (c.endpoint.empty()) c.endpoint = env("AWS_ENDPOINT_URL");
  if (c.endpoint.empty()) c.endpoint = from_files("endpoint_url");
  std::string region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (region.empty()) region = from_files("region");
  if (!region.empty()) c.region = region;
  c.access_key = env("AWS_ACCESS_KEY_ID");
  c.secret_key = env("AWS_SECRET_ACCESS_KEY");
  c.session_token = env("AWS_SESSION_TOKEN");
  c.source = "environment";
  if (c.access_key.empty() && c.secret_key.empty()) {
    c.access_key = from_files("aws_access_key_id");
    c.secret_key = from_files("aws_secret_access_key");
    c.session_token = from_files("aws_session_token");
    c.source = "profile '" + profile + "' of " + credentials_file + " / " + config_file;
  }
  if (c.access_key.empty() || c.secret_key.empty())
    return invalid_argument("S3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile '" +
                            profile + "' aws_access_key_id and aws_secret_access_key in " + credentials_file);
  if (c.endpoint.empty()) c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  while (ends_with(c.endpoint, "/")) c.endpoint.pop_back();
  if (!starts_with(c.endpoint, "http://") && !starts_with(c.endpoint, "https://"))
    return invalid_argument("S3: endpoint '" + c.endpoint + "' (" + c.source +
                            "): expected http://host[:port] or https://host[:port]");
  c.ca_bundle = env("AWS_CA_BUNDLE");
  const std::string addressing = env("DISTCKPT_S3_ADDRESSING");
  if (addressing == "path") c.addressing = Addressing::kPath;
  else if (addressing == "virtual") c.addressing = Addressing::kVirtualHost;
  else if (!addressing.empty() && addressing != "auto")
    return invalid_argument("DISTCKPT_S3_ADDRESSING='" + addressing + "': expected path, virtual or auto");
  DISTCKPT_RETURN_IF_ERROR(set_number("DISTCKPT_S3_DEADLINE_S", 1, &c.deadline_s));
  double part_mib = static_cast<double>(c.part_bytes >> 20);
  DISTCKPT_RETURN_IF_ERROR(set_number("DISTCKPT_S3_PART_MIB", 5, &part_mib));
  c.part_bytes = static_cast<uint64_t>(part_mib * (1 << 20));
  const std::string unsafe = env("DISTCKPT_S3_UNSAFE_NO_CONDITIONS");
  c.unsafe_no_conditions = !unsafe.empty() && unsafe != "0";
  return c;
}

bool is_object_path(const std::string& path) { return starts_with(path, "s3://"); }

Result<S3Url> parse_s3_url(const std::string& url) {
  if (!is_object_path(url)) return invalid_argument("'" + url + "' is not an s3://bucket/prefix location");
  std::string rest = url.substr(5);
  const std::size_t slash = rest.find('/');
  S3Url out;
  out.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) out.prefix = rest.substr(slash + 1);
  while (ends_with(out.prefix, "/")) out.prefix.pop_back();
  if (!valid_bucket(out.bucket))
    return invalid_argument("'" + url + "': '" + out.bucket +
                            "' is not a bucket name (3-63 of a-z, 0-9, '-' and '.', starting and ending with a "
                            "letter or digit)");
  if (out.prefix.find("//") != std::string::npos || starts_with(out.prefix, "/"))
    return invalid_argument("'" + url + "': empty path components");
  return out;
}

}  // namespace distckpt::internal_storage
