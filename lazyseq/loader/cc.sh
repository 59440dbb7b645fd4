#!/bin/sh
# lazyseq's C compiler shim (see lazyseq/cc.py): tinygrad's clang command line, compiled by the clang
# inside the Zig toolchain that pip installs (the `ziglang` package), for machines without clang.
# tinygrad 0.14 runs `$CC -c -x c -O2 -fPIC -ffreestanding -fno-math-errno -nostdlib -fno-ident
#   --target=<arch>-none-unknown-elf <-march=... | -ffixed-x18 -mcpu=...> - -o -`
# Zig spells the target its own way, and -g0 keeps out the debug relocations tinygrad's loader
# rejects. A flag this script does not know stops it (exit 2): a newer tinygrad may need a newer lazyseq.
# A shell script, not Python: it adds ~1 ms per kernel compile rather than an interpreter's start-up.
me="lazyseq-cc"
zig=${LAZYSEQ_ZIG:-}
if [ -z "$zig" ]; then  # run by hand, or CC exported from an earlier session: ziglang beside lazyseq, or zig on PATH
  here=${0%/*}
  if [ -x "$here/../ziglang/zig" ]; then zig="$here/../ziglang/zig"; else zig=$(command -v zig || true); fi
fi
if [ -z "$zig" ] || [ ! -x "$zig" ]; then
  echo "$me: no Zig compiler: set LAZYSEQ_ZIG to the zig binary of the ziglang package (python3 -m pip install ziglang)," \
    "or install clang and unset CC" >&2
  exit 2
fi
arch=
expect=
for a do
  shift
  case $expect in
    lang) [ "$a" = c ] || { echo "$me: only C is supported (-x $a)" >&2; exit 2; }; set -- "$@" -x c; expect=; continue ;;
    out) set -- "$@" -o "$a"; expect=; continue ;;
  esac
  case $a in
    -x) expect=lang ;;
    -o) expect=out ;;
    --target=x86_64-none-unknown-elf|--target=x86_64-none-elf) arch=x86_64; set -- "$@" -target x86_64-freestanding-none ;;
    --target=arm64-none-unknown-elf|--target=aarch64-none-unknown-elf|--target=arm64-none-elf|--target=aarch64-none-elf)
      arch=aarch64; set -- "$@" -target aarch64-freestanding-none ;;
    --target=*)
      echo "$me: unsupported target ${a#--target=}: the Zig shim compiles for x86_64 and arm64 only; install clang" >&2
      exit 2 ;;
    -c|-O0|-O1|-O2|-O3|-Os|-fPIC|-ffreestanding|-fno-math-errno|-nostdlib|-fno-ident|-ffixed-x18|-) set -- "$@" "$a" ;;
    -mcpu=*+*)
      echo "$me: $a: CPU feature lists are not translated to Zig's spelling; use -mcpu=<cpu> alone, or install clang" >&2
      exit 2 ;;
    -mcpu=*|-march=*) set -- "$@" "$a" ;;
    -m*=*) echo "$me: unknown flag $a (install clang)" >&2; exit 2 ;;
    -m[a-z0-9]*) set -- "$@" "$a" ;;  # x86 feature switches (-mavx2, -mno-avx512f) from tinygrad's arch string
    *)
      echo "$me: unknown flag $a (lazyseq's shim knows the flags of tinygrad 0.14's clang compiler;" \
        "a newer tinygrad may need a newer lazyseq, or install clang)" >&2
      exit 2 ;;
  esac
done
if [ -z "$arch" ]; then
  echo "$me: no --target=<arch>-none-unknown-elf given: the shim only compiles tinygrad's freestanding kernels" >&2
  exit 2
fi
exec "$zig" cc "$@" -g0 -fno-asynchronous-unwind-tables -fno-unwind-tables
