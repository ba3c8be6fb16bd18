// The S3 client's configuration (the environment, then ~/.aws's files of the profile),
// its URLs (path-style and virtual-hosted), s3:// names, and the parsing of S3's answers.
// No store needed: the requests themselves are tested against Ceph RGW (tests/s3/).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "storage/s3_config.h"
#include "storage/s3_http.h"

namespace distckpt::internal_storage {
namespace {

// Every variable the configuration reads, cleared for the test and restored after it.
class S3Configuration : public ::testing::Test {
 protected:
  static constexpr const char* kVariables[] = {
      "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
      "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
      "AWS_CA_BUNDLE", "DISTCKPT_S3_ADDRESSING", "DISTCKPT_S3_DEADLINE_S", "DISTCKPT_S3_PART_MIB",
      "DISTCKPT_S3_UNSAFE_NO_CONDITIONS", "HOME"};
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("s3cfg-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / ".aws");
    for (const char* v : kVariables) {
      if (const char* old = std::getenv(v)) saved_.emplace_back(v, old);
      unsetenv(v);
    }
    setenv("HOME", dir_.c_str(), 1);
  }
  void TearDown() override {
    for (const char* v : kVariables) unsetenv(v);
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
    std::filesystem::remove_all(dir_);
  }
  void write(const std::string& relative, const std::string& text) { std::ofstream(dir_ / relative) << text; }
  std::filesystem::path dir_;
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(S3Configuration, TheEnvironmentComesFirst) {
  write(".aws/credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n");
  setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
  setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:7480/", 1);
  setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
  auto c = s3_config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->access_key, "ENVKEY");
  EXPECT_EQ(c->secret_key, "envsecret");
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(c->region, "eu-west-3");
  EXPECT_TRUE(c->path_style());
  setenv("AWS_ENDPOINT_URL_S3", "http://s3.example:9000", 1);  // the service's own wins
  setenv("AWS_REGION", "ap-south-1", 1);
  c = s3_config_from_environment();
  EXPECT_EQ(c->endpoint, "http://s3.example:9000");
  EXPECT_EQ(c->region, "ap-south-1");
}

TEST_F(S3Configuration, TheProfilesFilesFillTheRest) {
  write(".aws/credentials",
        "[default]\naws_access_key_id = D\naws_secret_access_key = d\n"
        "# a comment\n[other]\naws_access_key_id = O\naws_secret_access_key = o\naws_session_token = t\n");
  write(".aws/config", "[default]\nregion = us-west-1\n[profile other]\nregion = eu-north-1\n"
                       "endpoint_url = https://objects.example\n");
  auto c = s3_config_from_environment();
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->access_key, "D");
  EXPECT_EQ(c->region, "us-west-1");
  EXPECT_EQ(c->endpoint, "https://s3.us-west-1.amazonaws.com");  // AWS's own: virtual-hosted
  EXPECT_FALSE(c->path_style());
  setenv("AWS_PROFILE", "other", 1);
  c = s3_config_from_environment();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key, "O");
  EXPECT_EQ(c->session_token, "t");
  EXPECT_EQ(c->region, "eu-north-1");
  EXPECT_EQ(c->endpoint, "https://objects.example");
  EXPECT_NE(c->source.find("profile 'other'"), std::string::npos);
  // Files elsewhere, as the variables say.
  write("creds", "[other]\naws_access_key_id = X\naws_secret_access_key = x\n");
  setenv("AWS_SHARED_CREDENTIALS_FILE", (dir_ / "creds").c_str(), 1);
  EXPECT_EQ(s3_config_from_environment()->access_key, "X");
}

TEST_F(S3Configuration, WhatCannotBeUsedIsRefusedWithoutShowingASecret) {
  auto none = s3_config_from_environment();
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  setenv("AWS_ACCESS_KEY_ID", "K", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value", 1);
  for (auto [variable, value] : {std::pair{"AWS_ENDPOINT_URL", "ftp://x"}, std::pair{"DISTCKPT_S3_ADDRESSING", "dns"},
                                 std::pair{"DISTCKPT_S3_DEADLINE_S", "soon"}, std::pair{"DISTCKPT_S3_PART_MIB", "1"}}) {
    setenv(variable, value, 1);
    auto c = s3_config_from_environment();
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << variable;
    EXPECT_NE(c.status().message().find(variable == std::string("AWS_ENDPOINT_URL") ? "ftp://x" : variable),
              std::string::npos)
        << c.status().to_string();
    EXPECT_EQ(c.status().message().find("very-secret-value"), std::string::npos);
    unsetenv(variable);
  }
  // An answer refusing the credentials names where they came from, never the secret.
  auto c = s3_config_from_environment();
  ASSERT_TRUE(c.ok());
  S3Http http(*c, "bucket");
  S3Response refused;
  refused.status = 403;
  refused.body = "<Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>";
  Status st = http.error_status(refused, "PUT", "k");
  EXPECT_EQ(st.code(), StatusCode::kAuthFailed);
  EXPECT_NE(st.message().find("SignatureDoesNotMatch"), std::string::npos);
  EXPECT_NE(st.message().find("credentials from environment"), std::string::npos);
  EXPECT_EQ(st.message().find("very-secret-value"), std::string::npos);
}

TEST(S3Urls, PathStyleForCustomEndpointsVirtualHostedForAws) {
  S3Config c;
  c.endpoint = "http://127.0.0.1:7480";
  S3Request r;
  r.key = "jobs/run 1/index.pb";
  r.query = {{"uploadId", "a/b+c"}, {"partNumber", "3"}};
  EXPECT_EQ(s3_request_url(c, "bkt", r), "http://127.0.0.1:7480/bkt/jobs/run%201/index.pb?partNumber=3&uploadId=a%2Fb%2Bc");
  c.endpoint = "https://s3.eu-west-3.amazonaws.com";
  EXPECT_EQ(s3_request_url(c, "bkt", r),
            "https://bkt.s3.eu-west-3.amazonaws.com/jobs/run%201/index.pb?partNumber=3&uploadId=a%2Fb%2Bc");
  c.addressing = Addressing::kPath;
  EXPECT_EQ(s3_request_url(c, "bkt", S3Request{}), "https://s3.eu-west-3.amazonaws.com/bkt/");
  c.endpoint = "http://minio.local:9000";
  c.addressing = Addressing::kVirtualHost;
  S3Request uploads;
  uploads.key = "k";
  uploads.query = {{"uploads", ""}};
  EXPECT_EQ(s3_request_url(c, "bkt", uploads), "http://bkt.minio.local:9000/k?uploads=");
}

TEST(S3Urls, S3NamesAreParsedAndCheckedBeforeUse) {
  auto u = parse_s3_url("s3://my-bucket.1/a/b/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->bucket, "my-bucket.1");
  EXPECT_EQ(u->prefix, "a/b");
  EXPECT_EQ(parse_s3_url("s3://bkt")->prefix, "");
  for (const char* bad : {"s3://", "s3://Upper/x", "s3://ab", "s3://-bkt/x", "s3://bkt//x", "/local/path", "s3:/x"})
    EXPECT_EQ(parse_s3_url(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  EXPECT_TRUE(is_object_path("s3://b/x"));
  EXPECT_FALSE(is_object_path("/s3://b"));
}

TEST(S3Answers, DatesAndXmlAreRead) {
  EXPECT_EQ(parse_http_date_ms("Mon, 30 Nov 2026 01:43:00 GMT"), int64_t{1796002980} * 1000);
  EXPECT_EQ(parse_iso_date_ms("2026-11-30T01:43:00.250Z"), int64_t{1796002980} * 1000 + 250);
  EXPECT_EQ(parse_http_date_ms("yesterday"), -1);
  const std::string xml =
      "<ListBucketResult><Contents><Key>a&amp;b</Key><Size>3</Size></Contents>"
      "<Contents><Key>c</Key></Contents><IsTruncated>false</IsTruncated></ListBucketResult>";
  EXPECT_EQ(xml_values(xml, "Key"), (std::vector<std::string>{"a&b", "c"}));
  EXPECT_EQ(xml_values(xml, "Contents").size(), 2u);
  EXPECT_TRUE(xml_values("<Key>unterminated", "Key").empty());
}

}  // namespace
}  // namespace distckpt::internal_storage
