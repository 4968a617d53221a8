#!/usr/bin/env bash
# Puts the Debian packages of LMDB and xxHash (headers, static and shared
# libraries) into .gpu/debs, for bench/gpu/run.sh on a machine that has no
# network and no such packages. Run on a Debian machine with apt.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/debs
cd .gpu/debs
apt-get download liblmdb-dev liblmdb0 libxxhash-dev libxxhash0
ls -l
