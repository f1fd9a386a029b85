#!/usr/bin/env bash
# Moves one session from one ctxbroker replica to another with
# ExportSession and ImportSession, checks that the copy reads the same,
# then deletes the original.
#
#   move-session.sh [-k] SESSION_ID FROM TO
#
# FROM and TO are grpcurl addresses (host:port). Behind the Envoy of
# deploy/envoy, give Envoy's address for both and set FROM_REPLICA to the
# pod that holds the session now: the export, the checks and the delete on
# FROM then carry `x-ctxbroker-replica: $FROM_REPLICA`, and every call on TO
# carries `x-ctxbroker-session: SESSION_ID`, so the import lands on the pod
# that owns the id on the current ring.
#
#   -k              keep the original (copy, do not move)
#   GRPCURL         the grpcurl to run (default: grpcurl)
#   GRPCURL_FLAGS   its connection flags (default: -plaintext)
#   FROM_REPLICA    see above (default: none)
#
# Needs grpcurl and jq. Writes between the export and the delete would be
# lost: stop the session's traffic first (or switch the ring to TO, which
# sends it to TO). The session's revision on FROM is checked again just
# before the delete; if it moved, nothing is deleted and the script fails.
set -euo pipefail

keep=0
if [[ "${1:-}" == "-k" ]]; then
  keep=1
  shift
fi
if [[ $# -ne 3 ]]; then
  sed -n '2,23p' "$0" >&2
  exit 2
fi
id=$1 from=$2 to=$3
grpcurl=${GRPCURL:-grpcurl}
read -r -a flags <<< "${GRPCURL_FLAGS:--plaintext}"
flags+=(-max-msg-sz 268435456)
from_headers=()
if [[ -n "${FROM_REPLICA:-}" ]]; then
  from_headers=(-H "x-ctxbroker-replica: ${FROM_REPLICA}")
fi
to_headers=(-H "x-ctxbroker-session: ${id}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

call() { # ADDRESS METHOD [grpcurl args...], request JSON on stdin
  local address=$1 method=$2
  shift 2
  "$grpcurl" "${flags[@]}" "$@" -d @ "$address" "ctxbroker.v1.ContextBroker/${method}"
}
request=$(jq -cn --arg id "$id" '{session_id: $id}')

echo "exporting ${id} from ${from}" >&2
call "$from" ExportSession "${from_headers[@]}" <<< "$request" > "$work/export.json"
revision=$(jq -r '.session.revision // "0"' "$work/export.json")
echo "  revision ${revision}, $(jq -r '.snapshotBytes' "$work/export.json") bytes," \
  "$(jq -r '.archivedSpans // "0"' "$work/export.json") archived spans," \
  "$(jq -r '.idempotencyKeys // "0"' "$work/export.json") idempotency keys" >&2

echo "importing into ${to}" >&2
jq '{snapshot: .snapshot}' "$work/export.json" | call "$to" ImportSession "${to_headers[@]}" > /dev/null

echo "checking that both read the same" >&2
for side in from to; do
  if [[ $side == from ]]; then address=$from headers=("${from_headers[@]}"); else address=$to headers=("${to_headers[@]}"); fi
  call "$address" GetSession "${headers[@]}" <<< "$request" | jq -S . > "$work/$side.session.json"
  call "$address" GetContext "${headers[@]}" <<< "$request" | jq -S . > "$work/$side.context.json"
done
for what in session context; do
  if ! diff -u "$work/from.$what.json" "$work/to.$what.json" >&2; then
    echo "the copy's ${what} differs from the original's; the original is kept" >&2
    exit 1
  fi
done

if [[ $keep -eq 1 ]]; then
  echo "copied; the original on ${from} is kept" >&2
  exit 0
fi
now=$(jq -r '.session.revision // "0"' "$work/from.session.json")
if [[ "$now" != "$revision" ]]; then
  echo "the original moved on (revision ${revision} -> ${now}) after the export; nothing deleted." >&2
  echo "delete the copy on ${to} and move again once the session's traffic is stopped" >&2
  exit 1
fi
echo "deleting the original on ${from}" >&2
call "$from" DeleteSession "${from_headers[@]}" <<< "$request" > /dev/null
echo "moved ${id}" >&2
