#!/bin/sh
# Fails if weak (inline / template) code is defined in more than one of the library's
# object groups (generic and one per ISA). Each group is compiled with its own -m flags,
# and the linker keeps one definition of a weak symbol for the whole program: the copy it
# keeps may be another group's build, e.g. AVX-512 code reached from the scalar path on a
# CPU without AVX-512. Code shared by ISA units must be local to each (an unnamed
# namespace, or the unit's OPTX_ISA_NS).
# usage: check_isa_symbols.sh NM group1 obj... -- group2 obj... -- ...
nm_tool=$1
shift
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
group=""
for a in "$@"; do
  if [ "$a" = "--" ]; then group=""; continue; fi
  if [ -z "$group" ]; then group=$a; continue; fi
  # W: weak code. Weak data (V, u: inline constants, the personality routine's address)
  # holds the same bytes in every unit.
  "$nm_tool" --defined-only "$a" | awk -v g="$group" '$2 == "W" { print g, $3 }'
done | sort -u > "$tmp"
dups=$(awk '{ n[$2]++ } END { for (s in n) if (n[s] > 1) print s }' "$tmp")
if [ -n "$dups" ]; then
  echo "weak code defined in more than one ISA group:"
  for s in $dups; do echo "  $s: $(awk -v s="$s" '$2 == s { printf "%s ", $1 }' "$tmp")"; done
  exit 1
fi
echo "isa symbols: $(wc -l < "$tmp") weak code definitions, none shared between ISA groups"
