# Shared by the s3 label's scripts (sourced): the fixture's store, a work directory, a bucket
# of the run's own (removed with everything in it at exit), curl with the credentials in a
# file only we can read (printf is a shell builtin: no command line holds the secret), and
# the failure report. Before sourcing: build, dir (the fixture's), label ("s3 kills").
[ -f "$dir.env" ] || { echo "$label: SKIPPED: the s3 fixture did not bring a store up"; exit 77; }
eval "$(cat "$dir.env")"
export AWS_ENDPOINT_URL AWS_REGION AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
store=$AWS_ENDPOINT_URL
work=$(mktemp -d)
bucket=${label// /-}-$$
mpi=(mpirun --allow-run-as-root --oversubscribe)
cleanup_extra() { :; }  # a script's own cleanup, run first
cleanup() {
  cleanup_extra
  rm -rf "$work"
  # The store is memory: what a run wrote goes with it.
  radosgw-admin -c "$dir/ceph.conf" bucket rm --bucket="$bucket" --purge-objects --bypass-gc >/dev/null 2>&1
}
trap cleanup EXIT
fail() {
  echo "$label: FAIL: $*"
  for f in "$work"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
  exit 1
}
check() { echo "$label: $*"; }
printf 'user = "%s:%s"\n' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" >"$work/curl.cfg"
s3curl() { curl -s --aws-sigv4 "aws:amz:$AWS_REGION:s3" -K "$work/curl.cfg" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@"; }
s3curl -o /dev/null -w '%{http_code}' -X PUT "$store/$bucket" | grep -q 200 || fail "could not create bucket $bucket"
