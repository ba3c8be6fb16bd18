#!/usr/bin/env bash
# CTest fixture of the multinode label: `up` starts from nothing (whatever an earlier
# run left is taken down first) and brings up h1 and h2; `down` takes everything down
# and fails if any namespace, link, mount, directory or process of the cluster is left.
#   fixture.sh BUILD_DIR up|down
source "$(dirname "$0")/lib.sh" "$1" "fixture_$2"
case $2 in
up)
  skip_unless_possible
  bash "$netns" down
  bash "$netns" up 2 || fail "cannot bring the cluster up"
  # h2 is named h2, has its node-local directory, resolves h1 and reaches it (a port
  # nobody listens on: "refused" comes back only over a working link).
  bash "$netns" exec h2 bash -c 'test "$(hostname)" = h2 && test -d /dck/local && getent hosts h1 >/dev/null &&
    timeout 3 bash -c "exec 3<>/dev/tcp/h1/9" 2>&1 | grep -q refused' ||
    fail "h2 does not see itself as h2, or cannot reach h1"
  say "cluster up: $(ip netns list | awk '{print $1}' | tr '\n' ' ')"
  ;;
down)
  [ "$(id -u)" -eq 0 ] || { echo "fixture down: SKIPPED: not root, nothing was brought up"; exit 77; }
  bash "$netns" down
  bash "$netns" check-clean || fail "the cluster left things behind"
  ;;
esac
