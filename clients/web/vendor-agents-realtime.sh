#!/usr/bin/env bash
# Rebuilds clients/web/agents-realtime.mjs: OpenAI's Agents JS SDK for realtime voice,
# @openai/agents-realtime 0.20.0 from npm (MIT License, Copyright (c) 2025 OpenAI), as ONE ES module
# for the browser. The input is the package's own browser bundle (dist/bundle/openai-realtime-agents.mjs
# and the chunks it imports, the SDK with its dependencies as OpenAI builds them); esbuild 0.25.10 only
# joins it into one file and minifies it (no code of ours, no patch). The WebRTC voice page
# (voice-webrtc.html) imports it; nothing is built at serve or test time: run this script only to
# move to another version, then commit the result and update the sha256 below.
#
#   bash clients/web/vendor-agents-realtime.sh    (needs node and npm; reaches the npm registry)
#
# Result (reproducible: the same bytes on every run): agents-realtime.mjs, 938,664 bytes,
# sha256 d4101d71363a770c69caa508ae8b177926bb476c9449f25dac9fcada5b3108d9
set -euo pipefail

VERSION=0.20.0
# the registry's integrity of @openai/agents-realtime-0.20.0.tgz (npm view @openai/agents-realtime@0.20.0 dist.integrity)
INTEGRITY="sha512-KK3w9k9rkqv5mC25vykWTe/1IIcOMsqwJs9mB0aX9Z2Us487xGduZgqr+ENEzthjZbQvTi/+qUv/tfoZeN/p/w=="
ESBUILD_VERSION=0.25.10

here="$(cd "$(dirname "$0")" && pwd)"
out="$here/agents-realtime.mjs"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

npm pack --silent "@openai/agents-realtime@$VERSION" >/dev/null
tgz="openai-agents-realtime-$VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [ "$got" != "$INTEGRITY" ]; then
  echo "integrity mismatch for $tgz: $got" >&2
  exit 1
fi
tar xzf "$tgz"

echo '{"private": true}' >package.json
npm install --silent --no-audit --no-fund --no-save "esbuild@$ESBUILD_VERSION" >/dev/null

{
  echo "// @openai/agents-realtime $VERSION (npm), its browser bundle dist/bundle/openai-realtime-agents.mjs"
  echo "// joined into one minified ES module by esbuild $ESBUILD_VERSION; rebuilt by vendor-agents-realtime.sh"
  echo "// (beside this file), which records its sha256. Do not edit. The package's LICENSE:"
  awk '{ sub(/ +$/, ""); print ($0 == "" ? "//" : "// " $0) }' package/LICENSE
} >banner.txt

node_modules/.bin/esbuild package/dist/bundle/openai-realtime-agents.mjs \
  --bundle --format=esm --platform=browser --minify --legal-comments=eof \
  --log-level=warning --outfile=bundle.mjs
cat banner.txt bundle.mjs >"$out"

echo "wrote $out: $(wc -c <"$out") bytes, sha256 $(sha256sum "$out" | cut -d' ' -f1)"
