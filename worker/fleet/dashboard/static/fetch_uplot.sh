#!/bin/sh
# How the vendored uPlot files here were fetched (no CDN at run time: the dashboard works offline).
# Run from this folder; needs npm. Pin the version; check the sums against the committed files.
set -eu
VERSION=1.6.32
tmp=$(mktemp -d)
(cd "$tmp" && npm pack "uplot@$VERSION" >/dev/null && tar xzf "uplot-$VERSION.tgz")
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" .
cp "$tmp/package/LICENSE" uPlot.LICENSE
rm -rf "$tmp"
sha256sum uPlot.iife.min.js uPlot.min.css
