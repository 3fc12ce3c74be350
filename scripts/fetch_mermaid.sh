#!/usr/bin/env bash
# Brings the documentation site's copy of Mermaid (docs/assets/javascripts/mermaid.min.js) from
# the npm registry, at the pinned version, checked against its SHA-256. The site loads this copy
# (mkdocs.yml's extra_javascript), so the Material theme finds `mermaid` already on the page and
# never fetches it from a CDN: the diagrams render without a network. Run it to change the version
# (then update both pins below); the file is committed, so building the site needs no npm.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=11.17.2
SHA256=581ed7d74bd9048d0e3a91363927d72ef22942d7722546b27f7cc29e35390eb8
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mermaid@$VERSION" >/dev/null)
tar -xzf "$tmp/mermaid-$VERSION.tgz" -C "$tmp" package/dist/mermaid.min.js package/LICENSE
echo "$SHA256  $tmp/package/dist/mermaid.min.js" | sha256sum -c --quiet
mkdir -p docs/assets/javascripts
cp "$tmp/package/dist/mermaid.min.js" docs/assets/javascripts/mermaid.min.js
{ echo "mermaid $VERSION (npm), docs/assets/javascripts/mermaid.min.js"; echo; cat "$tmp/package/LICENSE"; } \
    > docs/assets/javascripts/mermaid.LICENSE.txt
echo "docs/assets/javascripts/mermaid.min.js: mermaid $VERSION"
