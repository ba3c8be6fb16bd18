// Object stores by bucket: the S3 client's (s3_store.cc), made from the environment's
// configuration (s3_config.h) on first use and kept for the process.
#pragma once

#include <memory>
#include <string>

#include "distckpt/status.h"
#include "storage/object_store.h"
#include "storage/s3_config.h"

namespace distckpt::internal_storage {

// A store for `bucket` through S3 with `config`. Never fails: errors come with requests.
std::shared_ptr<ObjectStore> s3_object_store(const S3Config& config, const std::string& bucket);

// The store of an s3://bucket/... location: the one registered for the bucket
// (register_object_store), else an S3 store made from s3_config_from_environment() on the
// first call and kept. Errors of the URL or the configuration. Any thread.
Result<std::shared_ptr<ObjectStore>> object_store_for(const std::string& url);
// Serves `bucket` from `store` for the rest of the process (tests: a memory store behind
// s3:// names); null forgets the bucket's store.
void register_object_store(const std::string& bucket, std::shared_ptr<ObjectStore> store);

}  // namespace distckpt::internal_storage
