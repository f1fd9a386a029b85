#!/usr/bin/env bash
# Checks the wire contract (proto/) as a client in another language would
# meet it:
#   - buf lint, the STANDARD rules with the exceptions buf.yaml lists;
#   - buf breaking against the contract of HEAD's first parent (FILE rules:
#     wire, JSON and generated-code compatibility);
#   - Go code generated from it (messages and the gRPC service) compiles.
# Installs what it needs: the buf CLI pinned in .ci/contract/package-lock.json
# (npm), and Debian's Go toolchain with its protobuf and gRPC packages (no
# Go module proxy is needed: the build uses Debian's GOPATH tree).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

echo "== contract: install"
(cd .ci/contract && npm ci --no-audit --no-fund --loglevel=error)
buf=$root/.ci/contract/node_modules/.bin/buf
"$buf" --version
go_packages=(golang-go protoc-gen-go protoc-gen-go-grpc golang-google-protobuf-dev golang-google-grpc-dev)
missing=()
for p in "${go_packages[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
go version

echo "== contract: buf lint"
"$buf" lint
echo "lint: clean"

echo "== contract: buf breaking against the first parent"
if ! parent=$(git rev-parse --verify --quiet 'HEAD^1'); then
  echo "breaking: HEAD has no parent; nothing to compare"
elif ! git cat-file -e "$parent:proto/ctxbroker/v1/broker.proto" 2>/dev/null; then
  echo "breaking: $parent has no contract; nothing to compare"
elif ! git cat-file -e "$parent:buf.yaml" 2>/dev/null; then
  # The commit that introduced these checks also gave the contract its
  # language options, which the FILE rules count as changes.
  echo "breaking: $parent predates the contract checks; nothing to compare"
else
  "$buf" breaking --against ".git#ref=$parent,subdir=proto"
  echo "breaking: compatible with $(git rev-parse --short "$parent")"
fi

echo "== contract: Go code generated from it compiles"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && "$buf" generate "$root/proto" --template "$root/.ci/contract/buf.gen.go.yaml")
package=ctxbroker/gen/go/ctxbroker/v1
mkdir -p "$work/gopath/src/$(dirname "$package")"
mv "$work/gen/$package" "$work/gopath/src/$package"
ls "$work/gopath/src/$package"
# Debian's Go packages are a GOPATH tree: build in GOPATH mode, offline.
go_offline() {
  GO111MODULE=off GOPATH="$work/gopath:/usr/share/gocode" GOCACHE="$work/cache" GOFLAGS='' \
    GOPROXY=off go "$@"
}
go_offline vet "$package"
go_offline build "$package"
echo "go: $package builds and vets"
