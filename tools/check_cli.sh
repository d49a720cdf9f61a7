#!/bin/sh
# The optx CLI's argument and output contract (DESIGN.md "Tool contracts"): bad arguments
# are named and exit 2, --filter selects ops by name even inside a family registered for
# several, and a --json file that cannot be written fails the run.
# Usage: check_cli.sh path/to/optx
optx="$1"
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# expect STATUS PATTERN CMD...: CMD exits STATUS and its stdout + stderr match PATTERN.
expect() {
  want=$1 pattern=$2
  shift 2
  "$@" > "$out" 2>&1
  got=$?
  if [ "$got" -ne "$want" ] || ! grep -q -- "$pattern" "$out"; then
    echo "FAIL: $* exited $got (want $want), output:"; sed -n 1,5p "$out"; echo "  expected: $pattern"
    fail=1
  fi
}

expect 2 "optx info: takes no arguments, got 'extra'" "$optx" info extra
expect 2 "optx: unknown command 'frob'" "$optx" frob
expect 2 "optx bench: --threads needs an integer in \[1, 1024\], got '2x'" "$optx" bench --threads 2x
expect 2 "optx bench: --threads needs an integer in \[1, 1024\], got '0'" "$optx" bench --threads 0
expect 2 "optx verify: --json needs a file name, got '--quick'" "$optx" verify --json --quick
expect 2 "optx verify: --filter needs a regular expression" "$optx" verify --filter
expect 2 "optx verify: unknown argument '--threads'" "$optx" verify --threads 2
expect 2 "is not a valid regular expression" "$optx" verify --filter '('
# 20000 nested groups overflowed std::regex's recursive compiler (SIGSEGV): refused by length.
deep=$(awk 'BEGIN { for (i = 0; i < 20000; i++) printf "("; printf "a"; for (i = 0; i < 20000; i++) printf ")" }')
expect 2 "optx verify: --filter is 40001 characters; at most 1024" "$optx" verify --filter "$deep"
# OPTX_IMPL entries that select nothing are named: not op=impl (the library warns), an op
# no registry has (optx info warns), an op given twice.
expect 0 "OPTX_IMPL entry 'gemm=' is not op=impl; ignored" env OPTX_IMPL="gemm=" "$optx" info
expect 0 "OPTX_IMPL names 'gem', which is not an op; ignored" env OPTX_IMPL="gem=scalar" "$optx" info
expect 0 "OPTX_IMPL names gemm more than once; its first entry applies" env OPTX_IMPL="gemm=scalar,gemm=amx" "$optx" info
expect 1 "optx verify: no op matches --filter '^no_such_op\$'" "$optx" verify --filter '^no_such_op$'
expect 1 "optx verify: cannot open /nonexistent/dir/v.json for writing" "$optx" verify --filter '^rope$' --json /nonexistent/dir/v.json
if [ -w /dev/full ]; then
  expect 1 "optx verify: cannot write /dev/full" "$optx" verify --filter '^attention_update$' --json /dev/full
fi
# One op of a family registered as "paged_decode_attention|mla_decode_attention".
expect 0 "^verify: [1-9][0-9]* cases, [1-9][0-9]* passed, 0 failed" "$optx" verify --filter '^mla_decode_attention$'
if grep -q "^paged_decode_attention " "$out"; then echo "FAIL: --filter '^mla_decode_attention\$' kept paged_decode_attention rows"; fail=1; fi
OPTX_MAX_ISA=scalar "$optx" info > "$out" 2>&1
if ! grep -q "^active isa: scalar  (OPTX_MAX_ISA=scalar)$" "$out"; then echo "FAIL: optx info's active isa line:"; grep "isa" "$out"; fail=1; fi
exit $fail
