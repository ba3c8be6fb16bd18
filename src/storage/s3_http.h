// One bucket's S3 requests over libcurl: addressing, SigV4 signing (libcurl's own signer,
// CURLOPT_AWS_SIGV4, with the payload hash set by us), and retries of what a store asks
// to be retried (503 SlowDown, 500, 502, 504, 429, dropped connections, stalls) with
// jittered exponential backoff, under one deadline per call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/status.h"
#include "storage/s3_config.h"

namespace distckpt::internal_storage {

struct S3Request {
  std::string method = "GET";  // GET, PUT, POST, DELETE, HEAD
  std::string key;             // the object's key, unencoded ("" for the bucket)
  // Query parameters, unencoded; sent sorted and encoded as SigV4 wants them ("uploads"
  // with an empty value is sent as "uploads=").
  std::map<std::string, std::string> query;
  std::vector<std::string> headers;  // "Name: value"
  std::string_view body;
  // The body's SHA-256 is signed; false sends UNSIGNED-PAYLOAD (data parts, whose bytes
  // the checkpoint's own checksums cover), sparing a pass over them.
  bool sign_payload = true;
  // A ranged GET's destination: the body is written here and must be exactly `sink_size`.
  void* sink = nullptr;
  std::size_t sink_size = 0;
  uint64_t max_body = uint64_t{1} << 30;  // a longer body is refused
};

struct S3Response {
  long status = 0;
  std::string body;  // the answer's body (a ranged GET's goes to the request's sink)
  std::size_t sunk = 0;  // bytes written to the request's sink
  std::map<std::string, std::string> headers;  // names in lower case
  int attempts = 0;
  std::string header(const std::string& name) const;
  // The XML error's <Code>, or "".
  std::string error_code() const;
};

class S3Http {
 public:
  S3Http(S3Config config, std::string bucket);
  // Sends `request`, retrying what may be retried until the deadline. Returns the final
  // answer whatever its status (the caller maps it: error_status), or kIoError for a
  // transport failure that outlived the retries. Any thread.
  Result<S3Response> call(const S3Request& request) const;
  // The Status of a final non-2xx answer to `what` of `key`: kNotFound (404),
  // kAuthFailed (403), kIoError otherwise, with the store's code and message.
  Status error_status(const S3Response& response, const std::string& what, const std::string& key) const;
  const S3Config& config() const { return config_; }
  const std::string& bucket() const { return bucket_; }
  // "s3://bucket/key" for messages.
  std::string url_of(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

 private:
  std::string url(const S3Request& request) const;
  Result<S3Response> attempt(const S3Request& request, double timeout_s, std::string* transport_error) const;

  S3Config config_;
  std::string bucket_;
};

// The request's URL: path-style (endpoint/bucket/key) or virtual-hosted
// (scheme://bucket.host/key), the key percent-encoded but for '/', the query sorted.
std::string s3_request_url(const S3Config& config, const std::string& bucket, const S3Request& request);

// S3's date formats, to milliseconds since the epoch: RFC 1123 (headers: "Mon, 30 Nov 2026
// 01:43:00 GMT") and ISO 8601 (listings: "2026-11-30T01:43:00.000Z"); -1 if unreadable.
int64_t parse_http_date_ms(const std::string& text);
int64_t parse_iso_date_ms(const std::string& text);
// Every <tag>value</tag> in `xml`, unescaped, in order (flat: S3's answers nest shallowly
// and the tags looked up are unique to their level).
std::vector<std::string> xml_values(std::string_view xml, std::string_view tag);

}  // namespace distckpt::internal_storage
