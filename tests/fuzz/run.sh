#!/usr/bin/env bash
# Builds the record parser fuzzer with clang's libFuzzer (+ASan/UBSan) and
# runs it. Usage: run.sh SOURCE_DIR WORK_DIR [SECONDS]
# CI runs a short session (default 20 s); for a long one:
#   bash tests/fuzz/run.sh . /tmp/fuzz 3600
set -euo pipefail
SRC=$1; WORK=$2; SECONDS_=${3:-20}
CXX=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$CXX" ]; then echo "fuzz: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)"; exit 1; fi
mkdir -p "$WORK/corpus"
# Public headers from include/ ("patchstore/store/format.h"), internal ones
# from the source root ("store/shard.h"), as in the CMake build.
"$CXX" -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$SRC/include" -I"$SRC" "$SRC/tests/fuzz/record_fuzzer.cc" "$SRC/store/format.cc" "$SRC/store/status.cc" \
  -lxxhash -o "$WORK/record_fuzzer"
# Seeds: a valid record header, a valid metadata text.
printf 'patchstore_format=1\ntool_version=0.1.0\nkind=frames\nsealed=0\nsample_count=0\nfield_count=0\n' \
  > "$WORK/corpus/meta-seed"
"$WORK/record_fuzzer" -max_total_time="$SECONDS_" -max_len=8192 -print_final_stats=1 "$WORK/corpus" 2>&1 |
  tee "$WORK/fuzz.log" | grep -E "stat::number_of_executed_units|ERROR|SUMMARY|Done" || true
grep -q "stat::number_of_executed_units" "$WORK/fuzz.log"
! grep -q "ERROR: " "$WORK/fuzz.log"
