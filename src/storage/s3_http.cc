#include "storage/s3_http.h"

#include <curl/curl.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "base/strings.h"
#include "transform/sha256.h"

namespace distckpt::internal_storage {
namespace {

using Clock = std::chrono::steady_clock;

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One easy handle per thread, reused so that its connections are kept alive.
struct ThreadHandle {
  CURL* curl = nullptr;
  ~ThreadHandle() {
    if (curl) curl_easy_cleanup(curl);
  }
};
CURL* thread_handle() {
  thread_local ThreadHandle handle;
  if (!handle.curl) {
    init_curl_once();
    handle.curl = curl_easy_init();
  } else {
    curl_easy_reset(handle.curl);
  }
  return handle.curl;
}

std::string encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

struct Transfer {
  std::string_view body;
  std::size_t sent = 0;
  S3Response* response = nullptr;
  void* sink = nullptr;
  std::size_t sink_size = 0;
  uint64_t max_body = 0;
  bool overflow = false;
};

size_t read_body(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = std::min(size * count, t->body.size() - t->sent);
  std::memcpy(buffer, t->body.data() + t->sent, n);
  t->sent += n;
  return n;
}

// libcurl resends a request on a fresh connection when a reused one turns out dead: the
// body starts again.
int seek_body(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > t->body.size()) return CURL_SEEKFUNC_FAIL;
  t->sent = static_cast<std::size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t write_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  S3Response& r = *t->response;
  // Only a successful ranged GET goes to the caller's buffer; error bodies are kept.
  if (t->sink != nullptr && r.status >= 200 && r.status < 300) {
    if (r.sunk + n > t->sink_size) return t->overflow = true, 0;
    std::memcpy(static_cast<char*>(t->sink) + r.sunk, data, n);
    r.sunk += n;
    return n;
  }
  // An error's XML is short; a success's body is bounded by what the caller expects.
  const uint64_t limit = r.status >= 200 && r.status < 300 ? t->max_body : uint64_t{1} << 16;
  if (r.body.size() + n > limit) return t->overflow = true, 0;
  r.body.append(data, n);
  return n;
}

size_t read_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * count);
  if (internal_base::starts_with(line, "HTTP/")) {  // a new answer (after 100 Continue)
    t->response->headers.clear();
    const std::size_t sp = line.find(' ');
    t->response->status = sp == std::string::npos ? 0 : std::strtol(line.c_str() + sp + 1, nullptr, 10);
    return size * count;
  }
  const std::size_t colon = line.find(':');
  if (colon == std::string::npos) return size * count;
  std::string name = line.substr(0, colon), value = line.substr(colon + 1);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.pop_back();
  t->response->headers[name] = value;
  return size * count;
}

bool retryable_status(const S3Response& r) {
  if (r.status >= 200 && r.status < 300) return false;  // a body of user data is no error
  if (r.status == 500 || r.status == 502 || r.status == 503 || r.status == 504 || r.status == 429) return true;
  const std::string code = r.error_code();
  // ConditionalRequestConflict (409): AWS's answer to two conditional writes of one key
  // at once; one of them is to be retried.
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" || code == "ServiceUnavailable" ||
         code == "ConditionalRequestConflict";
}

// "PUT s3://bucket/key", "list s3://bucket/prefix*": a request as messages show it.
std::string describe(const S3Request& r, const std::string& bucket) {
  if (auto it = r.query.find("prefix"); it != r.query.end() && r.key.empty())
    return "list s3://" + bucket + "/" + it->second + "*";
  return r.method + " s3://" + bucket + "/" + r.key;
}

std::string unescape_xml(std::string s) {
  s = internal_base::replace_all(s, "&quot;", "\"");
  s = internal_base::replace_all(s, "&apos;", "'");
  s = internal_base::replace_all(s, "&lt;", "<");
  s = internal_base::replace_all(s, "&gt;", ">");
  return internal_base::replace_all(s, "&amp;", "&");
}

}  // namespace

std::string S3Response::header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

std::string S3Response::error_code() const {
  auto codes = xml_values(body, "Code");
  return codes.empty() ? std::string() : codes.front();
}

S3Http::S3Http(S3Config config, std::string bucket) : config_(std::move(config)), bucket_(std::move(bucket)) {}

std::string S3Http::url(const S3Request& request) const { return s3_request_url(config_, bucket_, request); }

std::string s3_request_url(const S3Config& config, const std::string& bucket, const S3Request& request) {
  const std::size_t scheme_end = config.endpoint.find("://") + 3;
  std::string u = config.path_style()
                      ? config.endpoint + "/" + bucket
                      : config.endpoint.substr(0, scheme_end) + bucket + "." + config.endpoint.substr(scheme_end);
  u += "/" + encode(request.key, true);
  char sep = '?';
  for (const auto& [k, v] : request.query) {  // std::map: sorted, as SigV4 wants them
    u += sep + encode(k, false) + "=" + encode(v, false);
    sep = '&';
  }
  return u;
}

Result<S3Response> S3Http::attempt(const S3Request& request, double timeout_s, std::string* transport_error) const {
  CURL* curl = thread_handle();
  if (curl == nullptr) return internal_error("S3: curl_easy_init failed");
  S3Response response;
  Transfer t{request.body, 0, &response, request.sink, request.sink_size, request.max_body, false};
  const std::string target = url(request);
  curl_easy_setopt(curl, CURLOPT_URL, target.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000) + 1);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(config_.stall_s));
  if (!config_.ca_bundle.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, config_.ca_bundle.c_str());
  const std::string sigv4 = "aws:amz:" + config_.region + ":s3";
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(curl, CURLOPT_USERNAME, config_.access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, config_.secret_key.c_str());
  curl_slist* headers = nullptr;
  std::vector<std::string> lines = request.headers;
  lines.push_back("x-amz-content-sha256: " + (request.sign_payload
                                                  ? internal_transform::sha256_hex(request.body.data(), request.body.size())
                                                  : std::string("UNSIGNED-PAYLOAD")));
  if (!config_.session_token.empty()) lines.push_back("x-amz-security-token: " + config_.session_token);
  for (const std::string& h : lines) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, read_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_body);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, seek_body);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (t.overflow)
    return corruption("S3 " + describe(request, bucket_) + ": the answer is longer than expected");
  if (rc != CURLE_OK) {
    *transport_error = curl_easy_strerror(rc);
    const bool retry = rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_COULDNT_CONNECT || rc == CURLE_SEND_ERROR ||
                       rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE ||
                       rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_SSL_CONNECT_ERROR ||
                       rc == CURLE_SEND_FAIL_REWIND;
    if (!retry)
      return io_error("S3 " + describe(request, bucket_) + ": " + *transport_error + " (" + config_.describe() + ")");
    response.status = 0;
  }
  return response;
}

Result<S3Response> S3Http::call(const S3Request& request) const {
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(config_.deadline_s);
  thread_local std::minstd_rand jitter(std::random_device{}());
  std::string last;  // the last retryable failure, for the message
  for (int attempts = 1;; ++attempts) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    std::string transport_error;
    DISTCKPT_ASSIGN_OR_RETURN(S3Response r, attempt(request, std::max(left, 0.001), &transport_error));
    r.attempts = attempts;
    if (r.status != 0 && !retryable_status(r)) return r;
    last = r.status == 0 ? transport_error : std::to_string(r.status) + " " + r.error_code();
    // Full jitter: a uniform wait up to 0.1 s * 2^attempt (at most 5 s), so that ranks
    // told to slow down together do not come back together.
    const double cap = std::min(5.0, 0.1 * static_cast<double>(1u << std::min(attempts, 6)));
    const double wait = std::uniform_real_distribution<double>(0.0, cap)(jitter);
    const double remaining = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (remaining <= wait)
      return io_error("S3 " + describe(request, bucket_) + ": gave up after " +
                      std::to_string(attempts) + " attempts in " +
                      std::to_string(std::chrono::duration<double>(Clock::now() - start).count()).substr(0, 5) +
                      " s (deadline " + std::to_string(static_cast<int>(config_.deadline_s)) +
                      " s, DISTCKPT_S3_DEADLINE_S): last: " + last + " (" + config_.describe() + ")");
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
}

Status S3Http::error_status(const S3Response& response, const std::string& what, const std::string& key) const {
  const auto messages = xml_values(response.body, "Message");
  std::string detail = std::to_string(response.status);
  const std::string code = response.error_code();
  if (!code.empty()) detail += " " + code;
  if (!messages.empty()) detail += ": " + messages.front();
  const std::string m = "S3 " + what + " " + url_of(key) + ": " + detail + " (" + config_.describe() + ")";
  if (response.status == 404) return not_found(m);
  if (response.status == 403) return auth_failed(m + " (credentials from " + config_.source + ")");
  return io_error(m);
}

int64_t parse_http_date_ms(const std::string& text) {
  std::tm tm{};
  if (strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S", &tm) == nullptr) return -1;
  return static_cast<int64_t>(timegm(&tm)) * 1000;
}

int64_t parse_iso_date_ms(const std::string& text) {
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr) return -1;
  int64_t ms = static_cast<int64_t>(timegm(&tm)) * 1000;
  if (*rest == '.') ms += std::strtol(rest + 1, nullptr, 10) % 1000;
  return ms;
}

std::vector<std::string> xml_values(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  std::size_t at = 0;
  while ((at = xml.find(open, at)) != std::string_view::npos) {
    const std::size_t begin = at + open.size();
    const std::size_t end = xml.find(close, begin);
    if (end == std::string_view::npos) break;
    out.push_back(unescape_xml(std::string(xml.substr(begin, end - begin))));
    at = end + close.size();
  }
  return out;
}

}  // namespace distckpt::internal_storage
