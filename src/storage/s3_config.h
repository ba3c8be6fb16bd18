// Where an S3 client sends its requests and how it signs them, read from the places every
// AWS tool reads: the environment, then the shared files (~/.aws/credentials and
// ~/.aws/config) of the profile $AWS_PROFILE (else "default").
#pragma once

#include <string>

#include "distckpt/status.h"

namespace distckpt::internal_storage {

// Path-style (http://host/bucket/key) suits custom endpoints (Ceph RGW, MinIO);
// virtual-hosted (http://bucket.host/key) is what AWS asks for. Auto picks virtual-hosted
// for *.amazonaws.com endpoints and path-style for the rest.
enum class Addressing { kAuto, kPath, kVirtualHost };

struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing slash
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;  // never printed
  Addressing addressing = Addressing::kAuto;
  std::string ca_bundle;  // AWS_CA_BUNDLE: a PEM file of trusted CAs for HTTPS
  // Each request, its retries included, gives up after this long (DISTCKPT_S3_DEADLINE_S).
  double deadline_s = 120;
  // A transfer that moves nothing for this long is a timeout (then retried).
  double stall_s = 30;
  // Multipart uploads' part size (DISTCKPT_S3_PART_MIB, 5 MiB at least as S3 requires);
  // smaller objects go in one PUT.
  uint64_t part_bytes = uint64_t{16} << 20;
  // DISTCKPT_S3_UNSAFE_NO_CONDITIONS=1: commit into a store whose conditional writes the
  // start-up probe found not enforced (two writers could both commit a name). Logged.
  bool unsafe_no_conditions = false;
  // Where the settings came from, for messages: "environment", "profile 'x' of ~/.aws/...".
  std::string source;

  bool path_style() const;
  // Endpoint and region alone: what an error message may show (never a key).
  std::string describe() const;
};

// The configuration for S3 requests: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (else the
// profile's endpoint_url, else AWS's regional endpoint), AWS_REGION or AWS_DEFAULT_REGION
// (else the profile's region), AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN (else the profile's aws_access_key_id, ... in AWS_SHARED_CREDENTIALS_FILE
// or ~/.aws/credentials, then in AWS_CONFIG_FILE or ~/.aws/config), AWS_CA_BUNDLE,
// DISTCKPT_S3_ADDRESSING (path|virtual), DISTCKPT_S3_DEADLINE_S, DISTCKPT_S3_PART_MIB,
// DISTCKPT_S3_UNSAFE_NO_CONDITIONS. kInvalidArgument for a setting that cannot be
// used (naming the variable or file and key, never a secret's value), and when no
// credentials are found. Any thread.
Result<S3Config> s3_config_from_environment();

// s3://bucket[/prefix]: the bucket and the key prefix (no leading or trailing slash).
struct S3Url {
  std::string bucket, prefix;
};
// kInvalidArgument for anything else (a bucket name S3 would refuse, an empty one).
Result<S3Url> parse_s3_url(const std::string& url);
// Whether `path` names an object-store location (starts with "s3://").
bool is_object_path(const std::string& path);

}  // namespace distckpt::internal_storage
