#!/usr/bin/env python3
"""Lists the innermost loops of compiled kernels that touch the stack with vector registers.

A microkernel whose accumulators, widened operands and broadcasts need more registers than
the ISA has (16 ymm on AVX2, 32 zmm on AVX-512) gets some of them spilled by the compiler:
an FMA chain then runs through a load and a store, and the kernel stays at a fraction of
the FMA peak whether its operands are in L1 or in DRAM. This is how the AVX2 bf16 kernels
of 2 and 4 rows were found (gemm README, stop 34). A row here is a place to look, not a
verdict: a loop may use the stack for an array on purpose (row pointers, a tail buffer).

  python3 tools/kernel_spills.py build/liboptx.a ['avx2::.*kern_']   # regex on the symbol

Reads `objdump -d -C` of the given object, archive or shared library; prints, worst first,
(stack operands, vector instructions, instructions, loop address, function).
"""
import re
import subprocess
import sys


def functions(path):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path], capture_output=True, text=True, check=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            cur = m.group(2)
            funcs.setdefault(cur, [])
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if cur and m:
            funcs[cur].append((int(m.group(1), 16), m.group(2)))
    return funcs


def inner_loops(ins):
    """[lo, hi] address ranges of backward jumps that contain no other backward jump."""
    if not ins:
        return []
    loops = []
    for addr, text in ins:
        m = re.match(r"j\w+\s+([0-9a-f]+)\s", text)
        if m and ins[0][0] <= int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    return [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    pattern = re.compile(sys.argv[2] if len(sys.argv) > 2 else r"kern_|gemv|scores|pv_|tiles|strip")
    stack = re.compile(r"[xyz]mm\d+.*\(%r[sb]p\)|\(%r[sb]p\).*[xyz]mm\d+")
    rows = []
    for name, ins in functions(sys.argv[1]).items():
        if not pattern.search(name):
            continue
        for lo, hi in inner_loops(ins):
            body = [t for a, t in ins if lo <= a <= hi]
            vec = sum(bool(re.search(r"[xyz]mm\d+", t)) for t in body)
            spills = sum(bool(stack.search(t)) for t in body)
            if spills and vec >= 8:
                rows.append((spills, vec, len(body), hex(lo), name))
    for r in sorted(rows, reverse=True):
        print(f"{r[0]:4d} stack  {r[1]:4d} vector  {r[2]:4d} instr  {r[3]:>10}  {r[4][:160]}")


if __name__ == "__main__":
    main()
