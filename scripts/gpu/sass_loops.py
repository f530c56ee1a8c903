#!/usr/bin/env python3
"""Instruction counts of the loops of CUDA kernels, and their registers: what a kernel issues per iteration,
read from the SASS of a build made here (no GPU needed), so that a change to a hot loop can be weighed
before it is measured (docs/performance.md, twenty-seventh session: the batched products' loop went from
1005 to 795 instructions a super-block this way).

  scripts/gpu/sass_loops.py OBJECT_OR_BINARY REGEX [--top N]

OBJECT_OR_BINARY: a .cu.o of build-device/ or a linked binary; REGEX selects kernels by their mangled
name (e.g. 'mma_rows_kernelILNS_5DTypeE12ELi2ELi2'). For each kernel: its registers and stack (cuobjdump
-res-usage), then each loop (a backward branch and the instructions from its target to it) with its
length and its most frequent opcodes. cuobjdump is the CUDA toolkit's (the GPU machine has it; this
machine's nvcc package may not): CUOBJDUMP=path overrides `cuobjdump` on the PATH."""
import collections
import os
import re
import subprocess
import sys

INSTR = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")
FUNC = re.compile(r"Function : (\S+)")  # cuobjdump -sass
RES_FUNC = re.compile(r"^\s*Function (\S+):\s*$")  # cuobjdump -res-usage


def run(args):
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    try:
        return subprocess.run([tool] + args, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit(f"sass_loops.py: {tool} not found (set CUOBJDUMP to the CUDA toolkit's cuobjdump)")
    except subprocess.CalledProcessError as e:
        sys.exit(f"sass_loops.py: {tool} failed: {e.stderr.strip().splitlines()[-1] if e.stderr.strip() else e}")


def functions(sass):
    """(name, [(address, opcode, operands)]) for every function of a cuobjdump -sass listing."""
    name, body = None, []
    for line in sass.splitlines():
        m = FUNC.search(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSTR.match(line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if name:
        yield name, body


def loops(body):
    """(first, last address, opcode counts) of each backward branch's span."""
    for addr, op, args in body:
        if not op.startswith("BRA"):
            continue
        t = re.search(r"0x([0-9a-f]+)", args)
        if t and int(t.group(1), 16) < addr:
            start = int(t.group(1), 16)
            span = [o.split(".")[0] for a, o, _ in body if start <= a <= addr]
            yield start, addr, collections.Counter(span)


def resources(path):
    usage, name = {}, None
    for line in run(["-res-usage", path]).splitlines():
        m = RES_FUNC.match(line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            regs = re.search(r"REG:(\d+)", line)
            stack = re.search(r"STACK:(\d+)", line)
            usage[name] = (int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else 0)
            name = None
    return usage


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) > 1 else 2
    path, pattern = argv[1], re.compile(argv[2])
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 12
    usage = resources(path)
    found = 0
    for name, body in functions(run(["-sass", path])):
        if not pattern.search(name):
            continue
        found += 1
        regs, stack = usage.get(name, (-1, 0))
        print(f"{name}\n  registers {regs}, stack {stack} bytes, {len(body)} instructions")
        for start, end, counts in loops(body):
            common = ", ".join(f"{op} {n}" for op, n in counts.most_common(top))
            print(f"  loop {start:#x}-{end:#x}: {sum(counts.values())} instructions: {common}")
    if not found:
        print(f"sass_loops.py: no kernel of {path} matches {argv[2]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
