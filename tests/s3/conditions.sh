#!/usr/bin/env bash
# What the object-store commit relies on, checked on the fixture's store (curl's SigV4
# signer, as the library's client signs): a create with If-None-Match: * succeeds once and
# fails (412) the second time; a swap with If-Match and a stale ETag fails (412), with the
# current one succeeds; a request signed with a wrong secret is refused (403). A store
# that fails any of these cannot hold checkpoints safely.
# Usage: conditions.sh DIR (the fixture's)
set -euo pipefail
dir=$1
[ -f "$dir.env" ] || { echo "s3 conditions: SKIPPED: the s3 fixture did not bring a store up"; exit 77; }
eval "$(cat "$dir.env")"
# The credentials go to curl in a file only we can read (printf is a shell builtin: no
# command line ever holds the secret).
secrets=$(mktemp -d)
printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$secrets/curl"
sign=(--aws-sigv4 "aws:amz:$AWS_REGION:s3" -K "$secrets/curl")
bucket=conditions-$$
body=$(mktemp)
trap 'rm -rf "$body" "$secrets"' EXIT
echo "index bytes" >"$body"
sha=$(sha256sum "$body" | cut -d' ' -f1)
status() {  # the HTTP status of a signed request; $1 the method, $2 the key, then curl's options
  local method=$1 key=$2
  shift 2
  curl -s -o /dev/null -w '%{http_code}' "${sign[@]}" -X "$method" "$@" "$AWS_ENDPOINT_URL/$bucket$key"
}
expect() {  # expect WHAT WANT GOT
  if [ "$2" != "$3" ]; then
    echo "s3 conditions: FAIL: $1: HTTP $3, expected $2"
    exit 1
  fi
  echo "s3 conditions: $1: HTTP $3"
}
expect "create the bucket" 200 "$(status PUT "" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")"
put=(-H "x-amz-content-sha256: $sha" --data-binary "@$body")
expect "create with If-None-Match: *" 200 "$(status PUT /index "${put[@]}" -H 'If-None-Match: *')"
expect "create again with If-None-Match: *" 412 "$(status PUT /index "${put[@]}" -H 'If-None-Match: *')"
etag=$(curl -s -I "${sign[@]}" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$AWS_ENDPOINT_URL/$bucket/index" |
  tr -d '\r' | awk 'tolower($1) == "etag:" {gsub(/"/, "", $2); print $2}')
[ -n "$etag" ] || { echo "s3 conditions: FAIL: no ETag on HEAD"; exit 1; }
expect "swap with a stale If-Match" 412 "$(status PUT /index "${put[@]}" -H 'If-Match: 00000000000000000000000000000000')"
# RGW 16.2 compares If-Match with the ETag unquoted (AWS S3 accepts either).
expect "swap with the current If-Match" 200 "$(status PUT /index "${put[@]}" -H "If-Match: $etag")"
wrong=(--aws-sigv4 "aws:amz:$AWS_REGION:s3" --user "$AWS_ACCESS_KEY_ID:not-the-secret")
got=$(curl -s -o /dev/null -w '%{http_code}' "${wrong[@]}" -X PUT "${put[@]}" "$AWS_ENDPOINT_URL/$bucket/other")
expect "a wrong signature" 403 "$got"
echo "s3 conditions: ok"
