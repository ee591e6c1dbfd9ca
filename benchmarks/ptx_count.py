"""Count what the GPU executes per score in the Triton forward's key loops, on a machine
without a GPU: compile ``kernels/triton_flash.py``'s ``_flash_fwd`` for an sm_90 target (the
H100/H200 launch configuration :func:`launch_config` picks for bf16, d = 128 or ``--d 64``),
find the loops in the PTX and in the SASS (``cuobjdump`` on the cubin, when the bundled tools
run here) and print, per loop, instructions per score by class: MUFU (ex2, rcp, ...), FP32
arithmetic, compares and selects, divisions (``div.rn.f32`` is IEEE; ``div.full.f32`` is the
2-ulp approximation).

    python benchmarks/ptx_count.py                       # causal and not, with and without cap
    python benchmarks/ptx_count.py --causal no --softcap yes --sass
    python benchmarks/ptx_count.py --causal no --softcap no --sass --tile 128,64,4,2,tma
    python benchmarks/ptx_count.py --causal no --softcap no --sass --tile 128,64,4,2,tma \
        --peer PATH/fused_attention_tutorial.py --opcodes

A score is one entry of the BLOCK_M × BLOCK_N tile; a thread holds
BLOCK_M·BLOCK_N/(32·warps) of them, so a loop body's count divided by that is per score.
Needs Triton ≥ 3.9 (ASTSource with attrs) and its bundled ptxas/cuobjdump for --sass.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# PTX opcode prefixes (after a predicate) and the class they count in.
_PTX_MUFU = ("ex2.", "rcp.approx", "rsqrt.", "sqrt.approx", "lg2.", "sin.", "cos.", "tanh.")
_PTX_FP32 = ("add", "sub", "mul", "fma", "neg", "abs", "min", "max", "copysign")
_SASS_FP32 = ("FADD", "FMUL", "FFMA", "FMNMX", "FSWZADD")
_MIN_LOOP = 3
_SASS_CMPSEL = ("FSETP", "FSEL", "FCHK", "SEL", "ISETP", "PLOP3", "P2R", "R2P")


@dataclass(frozen=True)
class LoopCount:
    """Instruction counts of one loop body (label to back-edge), by class."""

    first_line: int
    instructions: int
    mufu: int
    fp32: int
    cmpsel: int
    div_rn: int
    div_full: int
    mma: int


def opcode(line: str) -> str:
    """The opcode of one PTX or SASS instruction line ('' for labels, directives, comments)."""
    s = line.strip()
    s = re.sub(r"^/\*[0-9a-f]+\*/\s*", "", s)  # SASS address (cuobjdump)
    s = re.sub(r"^[0-9a-fA-F-]{2}:[-\d]:[-\d]:[-Y]:\d+\s+", "", s)  # control code (Triton)
    if not s or s.startswith(("//", ".", "{", "}", "$", "/*")) or s.endswith(":"):
        return ""
    s = re.sub(r"^@!?U?P\w*\s+", "", s)  # SASS predicate
    s = re.sub(r"^@!?%p\w*\s+", "", s)  # PTX predicate
    return s.split()[0].rstrip(";") if s.split() else ""


def classify(op: str) -> str:
    """The class of one opcode: 'mufu', 'fp32', 'cmpsel', 'div_rn', 'div_full', 'mma' or
    'other'. PTX opcodes are lower case (``fma.rn.f32``), SASS ones upper case (``FFMA``)."""
    if op.startswith(("div.rn.f32", "div.rn.ftz.f32")):
        return "div_rn"
    if op.startswith(("div.full.f32", "div.full.ftz.f32", "div.approx")):
        return "div_full"
    if op.startswith(_PTX_MUFU) or op.startswith("MUFU"):
        return "mufu"
    if op.startswith(("wgmma", "mma", "HGMMA", "HMMA", "WARPGROUP.")):
        sync = op.startswith(("wgmma.fence", "wgmma.commit", "wgmma.wait"))
        return "other" if sync else "mma"
    if op.split(".")[0] in _PTX_FP32 and ".f32" in op:
        return "fp32"
    if op.startswith(("setp.", "selp.")) and "f32" in op:
        return "cmpsel"
    if op.split(".")[0] in _SASS_FP32:
        return "fp32"
    if op.split(".")[0] in _SASS_CMPSEL:
        return "cmpsel"
    return "other"


def _loops(lines: list[str], label_re: str, branch_re: str) -> list[tuple[int, int]]:
    """(start, end) line spans of the innermost loops: a branch to a label above it."""
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(label_re, line.strip())
        if m:
            labels[m.group(1)] = i
    spans = []
    for i, line in enumerate(lines):
        m = re.search(branch_re, line)
        if m and labels.get(m.group(1), i + 1) < i:
            spans.append((labels[m.group(1)], i))
    # innermost: drop a span that contains another
    return sorted(
        s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)
    )


def count_loops(text: str, *, sass: bool) -> list[LoopCount]:
    """Per innermost loop of a PTX (``sass=False``) or SASS listing, its counts by class."""
    lines = text.splitlines()
    if sass:
        spans = _loops(lines, r"^\.?(L_x_\d+|LBB\d+):", r"\bBRA\s+`?\(?\.?(L_x_\d+|LBB\d+)")
    else:
        spans = _loops(lines, r"^(\$L__BB\d+_\d+):", r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)")
    out = []
    for a, b in spans:
        ops = [op for op in (opcode(x) for x in lines[a : b + 1]) if op]
        if len(ops) < _MIN_LOOP:  # the trap loop after EXIT, not a key loop
            continue
        classes = [classify(op) for op in ops]
        out.append(
            LoopCount(
                first_line=a + 1,
                instructions=len(ops),
                mufu=classes.count("mufu"),
                fp32=classes.count("fp32"),
                cmpsel=classes.count("cmpsel"),
                div_rn=classes.count("div_rn"),
                div_full=classes.count("div_full"),
                mma=classes.count("mma"),
            )
        )
    return out


def first_loop(text: str, *, sass: bool = True) -> list[str]:
    """The instruction lines of the first innermost loop of a listing that :func:`count_loops`
    counts (label to back-edge; labels, directives and a short trap loop left out)."""
    lines = text.splitlines()
    if sass:
        spans = _loops(lines, r"^\.?(L_x_\d+|LBB\d+):", r"\bBRA\s+`?\(?\.?(L_x_\d+|LBB\d+)")
    else:
        spans = _loops(lines, r"^(\$L__BB\d+_\d+):", r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)")
    for a, b in spans:
        body = [x for x in lines[a : b + 1] if opcode(x)]
        if len(body) >= _MIN_LOOP:
            return body
    return []


def loop_opcodes(text: str) -> Counter:
    """Opcode counts (without modifiers: ``FADD.FTZ`` counts as ``FADD``) of the first
    innermost loop of a SASS listing."""
    ops = (opcode(x) for x in first_loop(text))
    # (a control code left on a line of its own is not an opcode)
    return Counter(op.split(".")[0] for op in ops if ":" not in op)


def outside_loops(text: str) -> Counter:
    """Opcode counts (without modifiers) of a SASS listing's instructions outside every
    innermost loop: a program's fixed cost (prologue, loop set-up, epilogue), as opposed to its
    cost per key block. Straight-line code, so for one program the counts are also what runs,
    up to branches taken around parts of it."""
    lines = text.splitlines()
    spans = _loops(lines, r"^\.?(L_x_\d+|LBB\d+):", r"\bBRA\s+`?\(?\.?(L_x_\d+|LBB\d+)")
    inside = {i for a, b in spans if b - a + 1 >= _MIN_LOOP for i in range(a, b + 1)}
    ops = (opcode(x) for i, x in enumerate(lines) if i not in inside)
    return Counter(op.split(".")[0] for op in ops if op and ":" not in op)


def format_opcode_diff(ours: Counter, peer: Counter) -> str:
    """A markdown table of the opcodes whose counts differ, largest excess of ``ours`` first."""
    out = ["| opcode | this kernel | tutorial | difference |", "|---|---|---|---|"]
    for op in sorted(set(ours) | set(peer), key=lambda o: (peer[o] - ours[o], o)):
        if ours[op] != peer[op]:
            out.append(f"| {op} | {ours[op]} | {peer[op]} | {ours[op] - peer[op]:+d} |")
    return "\n".join(out)


def format_table(rows: list[tuple[str, LoopCount]], *, scores: int) -> str:
    """A markdown table: one row per (label, loop), counts divided by ``scores`` per thread."""
    head = (
        "| case | loop at line | instr/score | MUFU/score | FP32/score | cmp+sel/score "
        "| div.rn | div.full | MMA instr |"
    )
    out = [head, "|" + "---|" * 9]
    for label, c in rows:
        per = (c.instructions, c.mufu, c.fp32, c.cmpsel)
        vals = " | ".join(f"{x / scores:.2f}" for x in per)
        out.append(f"| {label} | {c.first_line} | {vals} | {c.div_rn} | {c.div_full} | {c.mma} |")
    return "\n".join(out)


def compile_forward(
    *,
    causal: bool,
    softcap: bool,
    n: int,
    old_tanh: bool = False,
    sinks: bool = False,
    config: object = None,
    approx_tanh: bool = False,
    cap_fma: bool = True,
    d: int = 128,
) -> tuple[str, str, int]:
    """Compile ``_flash_fwd`` for sm_90 (bf16, head dim ``d`` (64 or 128), B·N = 16K, H·d =
    2048, the H100 launch configuration for ``n`` keys); ``old_tanh``: with the tanh before
    the change (benchmarks/gpu_softcap_speed.py's copy); ``approx_tanh``: the cap by
    tanh.approx.f32; ``cap_fma``: the cap's product fused into the exponent (the default for
    caps the kernel fuses; False: the unfused form larger caps take). Returns
    (PTX, SASS or '', scores per thread per block)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels import triton_flash as tf

    if old_tanh:
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_softcap_speed import load_old

        tf = load_old(Path(tempfile.mkdtemp()))

    h = 2048 // d
    table = tf._HOPPER_SHORT if n <= tf._SHORT and (d, causal) in tf._HOPPER_SHORT else tf._HOPPER
    cfg = tf._H100.get((d, causal, n <= tf._SHORT), table[(d, causal)])
    if config is not None:
        cfg = tf.LaunchConfig(*config)
    fn = tf._flash_fwd
    strides = {"q": (h * n * d, n * d, d, 1), "lse": (h * n, n, 1)}
    ints = dict(
        zip(
            [f"s{x}{y}" for x in "qkvo" for y in "bhmd"],
            strides["q"] * 4,
            strict=True,
        )
    )
    # the kernel's own stride names
    names = fn.arg_names
    values = {
        "sqb": ints["sqb"], "sqh": ints["sqh"], "sqm": d, "sqd": 1,
        "skb": ints["sqb"], "skh": ints["sqh"], "skn": d, "skd": 1,
        "svb": ints["sqb"], "svh": ints["sqh"], "svn": d, "svd": 1,
        "sob": ints["sqb"], "soh": ints["sqh"], "som": d, "sod": 1,
        "slb": h * n, "slh": n, "slm": 1,
        "GROUP": 1, "NQ": n, "NK": n, "D": d, "DV": d,
        "win_left": -1, "win_right": -1,
    }  # fmt: skip
    const = {
        "CAUSAL": causal, "WINDOW": False, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
        "BLOCK_D": d, "BLOCK_DV": d, "PRECISION": "ieee", "TMA": cfg.tma,
        "WARP_SPECIALIZE": cfg.warp_specialize, "HEAVY_FIRST": causal, "SPLIT": cfg.split,
        "POS_SCALE": True, "ACC_IN_DOT": cfg.acc_in_dot, "PREFETCH": cfg.prefetch and cfg.split,
        "SOFTCAP": (2 if approx_tanh else 1) if softcap else 0, "SINKS": sinks,
        "CAP_FMA": softcap and cap_fma,
    }  # fmt: skip
    fixed = {}
    if cfg.tma:  # host-built 4-D descriptors
        for name in ("Q", "K", "V", "Out"):
            rows = cfg.block_m if name in ("Q", "Out") else cfg.block_n
            fixed[name] = f"tensordesc<bf16[1, 1, {rows}, {d}]>"
    sig, attrs = signature(
        names, const, values, bf16=("Q", "K", "V", "Out"), fp32=("LSE", "Sinks"),
        floats=("qk_scale", "c1", "c2"), fixed=fixed,
    )  # fmt: skip
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    opts = {"num_warps": cfg.warps, "num_stages": cfg.stages}
    if cfg.maxnreg is not None:
        opts["maxnreg"] = cfg.maxnreg
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    sass = ""
    try:
        from triton.tools.disasm import get_sass

        sass = get_sass(ck.asm["cubin"])
    except Exception as exc:  # the SASS table is optional
        print(f"(no SASS: {exc})", file=sys.stderr)
    print(f"{cfg}: {resource_usage(ck.asm['cubin'])}")
    return ck.asm["ptx"], sass, cfg.block_m * cfg.block_n // (32 * cfg.warps)


def signature(
    names: list[str],
    const: dict,
    values: dict,
    *,
    bf16: tuple[str, ...],
    fp32: tuple[str, ...],
    floats: tuple[str, ...],
    fixed: dict | None = None,
) -> tuple[dict, dict]:
    """A jit function's ASTSource signature and attributes from its argument ``names``, as the
    JIT would specialise a launch: ``const`` names are constexprs, ``fixed`` names take the
    type given, ``bf16`` / ``fp32`` names are 16-byte aligned pointers, ``floats`` fp32 scalars,
    and every other (integer) argument takes its ``values`` entry: equal to 1, a constant
    (added to ``const``); a multiple of 16, marked divisible by 16."""
    sig, attrs = {}, {}
    for i, name in enumerate(names):
        if name in const:
            sig[name] = "constexpr"
        elif fixed and name in fixed:
            sig[name] = fixed[name]
        elif name in bf16 or name in fp32:
            sig[name] = "*bf16" if name in bf16 else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in floats:
            sig[name] = "fp32"
        elif values[name] == 1:  # the JIT makes an argument equal to 1 a constant
            sig[name], const[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if values[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def resource_usage(cubin: bytes) -> str:
    """Registers a thread and local (spill) memory of the compiled kernel, from the bundled
    ``cuobjdump -res-usage`` (no GPU needed; spilled registers go to the stack frame), or why it
    is not known."""
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler

    tool = Path(compiler.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True)
        except OSError as exc:
            return f"(resource usage unknown: {exc})"
    found = re.search(r"REG:(\d+) STACK:(\d+).*?LOCAL:(\d+)", out.stdout)
    if found is None:
        return "(resource usage unknown: cuobjdump printed no REG line)"
    regs, stack, local = found.groups()
    return f"{regs} registers a thread, {stack} bytes of stack frame (spills), {local} bytes local"


def compile_peer(
    path: Path,
    *,
    causal: bool,
    n: int,
    tile: tuple[int, int, int, int] | None = None,
    d: int = 128,
) -> tuple[str, int, str]:
    """Compile the Triton tutorial's forward from ``path`` (a file defining the tutorial's
    autotuned ``_attn_fwd`` with host tensor descriptors, fp16, as benchmarks/RESULTS.md
    describes) for sm_90 at ``tile`` (rows, keys, warps, stages) or else the tile of this
    kernel's H100 table entry for ``causal``, ``n`` keys and head dim ``d``: (SASS, scores per
    thread per key block, the tile with the registers and spills it compiled to)."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.tools.disasm import get_sass

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels import triton_flash as tf

    table = tf._HOPPER_SHORT if n <= tf._SHORT and (d, causal) in tf._HOPPER_SHORT else tf._HOPPER
    cfg = tf._H100.get((d, causal, n <= tf._SHORT), table[(d, causal)])
    import torch

    torch.cuda.get_device_capability = lambda *a: (9, 0)  # its config filter asks; no GPU here
    spec = importlib.util.spec_from_file_location("tutorial_forward", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    bm, bn, warps, stages = tile or (cfg.block_m, cfg.block_n, cfg.warps, cfg.stages)
    sig = {
        "sm_scale": "fp32", "M": "*fp32", "Z": "i32", "H": "i32", "N_CTX": "i32",
        "desc_q": f"tensordesc<fp16[{bm}, {d}]>", "desc_o": f"tensordesc<fp16[{bm}, {d}]>",
        "desc_k": f"tensordesc<fp16[{bn}, {d}]>", "desc_v": f"tensordesc<fp16[{bn}, {d}]>",
    }  # fmt: skip
    const = {
        "HEAD_DIM": d, "BLOCK_M": bm, "BLOCK_N": bn, "FP8_OUTPUT": False,
        "STAGE": 3 if causal else 1, "warp_specialize": False,
    }  # fmt: skip
    # the jit function under its autotuner: `_attn_fwd` in later versions of the tutorial,
    # `_attn_fwd_tma` (no warp_specialize) in the one of 003da478
    fn = (getattr(mod, "_attn_fwd", None) or mod._attn_fwd_tma).fn
    if "warp_specialize" not in fn.arg_names:
        del const["warp_specialize"]
    sig.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=sig, constexprs=const)
    opts = {"num_warps": warps, "num_stages": stages}
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    label = f"{bm}x{bn} w{warps} s{stages} ({resource_usage(ck.asm['cubin'])})"
    return get_sass(ck.asm["cubin"]), bm * bn // (32 * warps), label


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--softcap", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--n", type=int, default=4096, help="keys (picks the launch config)")
    ap.add_argument("--d", type=int, choices=[64, 128], default=128, help="head dim")
    ap.add_argument("--sass", action="store_true", help="count SASS loops too")
    ap.add_argument("--old-tanh", action="store_true", help="the forward before the change")
    ap.add_argument("--sinks", action="store_true", help="with attention sinks")
    ap.add_argument("--approx-tanh", action="store_true", help="the cap's tanh by tanh.approx.f32")
    ap.add_argument(
        "--no-cap-fma",
        action="store_true",
        help="the cap's product by cap·log2 e rounded apart from the exponent (caps over "
        "CAP_FMA_MAX; every cap before the fused form)",
    )
    ap.add_argument(
        "--tile",
        help="compile this launch configuration instead of the table's: BLOCK_M,BLOCK_N,WARPS,"
        "STAGES[,tma] (e.g. 128,64,4,2,tma, the tutorial's pick on an H200)",
    )
    ap.add_argument(
        "--peer",
        type=Path,
        help="also count the Triton tutorial's forward in this file, at the same tile (SASS)",
    )
    ap.add_argument(
        "--opcodes",
        action="store_true",
        help="with --peer: the opcodes whose counts differ between the two first key loops",
    )
    ap.add_argument(
        "--outside",
        action="store_true",
        help="with --peer: the instructions outside the key loops (a program's fixed cost), "
        "total and the opcodes that differ",
    )
    args = ap.parse_args(argv)
    config = None
    if args.tile:
        parts = args.tile.split(",")
        try:
            config = (*(int(x) for x in parts[:4]), parts[4:] == ["tma"])
        except ValueError:
            ap.error(f"--tile takes BLOCK_M,BLOCK_N,WARPS,STAGES[,tma], got {args.tile!r}")
        if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "tma"):
            ap.error(f"--tile takes BLOCK_M,BLOCK_N,WARPS,STAGES[,tma], got {args.tile!r}")
    pick = {"no": [False], "yes": [True], "both": [False, True]}
    for causal in pick[args.causal]:
        rows_p, rows_s, scores, ours_sass = [], [], 1, ""
        for cap in pick[args.softcap]:
            ptx, sass, scores = compile_forward(
                causal=causal, softcap=cap, n=args.n, old_tanh=args.old_tanh, sinks=args.sinks,
                config=config, approx_tanh=args.approx_tanh, cap_fma=not args.no_cap_fma, d=args.d,
            )  # fmt: skip
            ours_sass = sass
            label = f"causal={'yes' if causal else 'no'} softcap={'yes' if cap else 'no'}"
            label += " sinks=yes" if args.sinks else ""
            rows_p += [(label, c) for c in count_loops(ptx, sass=False)]
            if args.sass and sass:
                rows_s += [(label, c) for c in count_loops(sass, sass=True)]
        print(f"\nPTX, N = {args.n}, {scores} scores per thread per key block")
        print(format_table(rows_p, scores=scores))
        if rows_s:
            print(f"\nSASS, N = {args.n}")
            print(format_table(rows_s, scores=scores))
        if args.peer is not None:
            sass, per, tile = compile_peer(
                args.peer, causal=causal, n=args.n, tile=config[:4] if args.tile else None, d=args.d
            )
            rows = [(f"tutorial {tile} causal={causal}", c) for c in count_loops(sass, sass=True)]
            print(f"\nSASS of the tutorial's forward, N = {args.n}, the same tile")
            print(format_table(rows, scores=per))
            if args.opcodes and ours_sass:
                print("\nFirst key loop's opcodes (last case compiled) against the tutorial's")
                print(format_opcode_diff(loop_opcodes(ours_sass), loop_opcodes(sass)))
            if args.outside and ours_sass:
                ours_out, peer_out = outside_loops(ours_sass), outside_loops(sass)
                print(
                    f"\nOutside the key loops (last case compiled): this kernel "
                    f"{sum(ours_out.values())} instructions, the tutorial {sum(peer_out.values())}"
                )
                print(format_opcode_diff(ours_out, peer_out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
