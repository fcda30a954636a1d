"""Pointer and prefetch intrinsics for the table kernels (LLVM IR through numba).

``_f32_ptr(addr)``, ``_f64_ptr``, ``_i32_ptr``, ``_i64_ptr``, ``_u64_ptr`` and
``_u8_ptr`` turn an int64 address into a typed pointer that numba indexes like
an array (``p[j]``) without building an array struct; ``_prefetch_r`` / ``_prefetch_w`` emit
``llvm.prefetch`` for a read or a write of the cache line at an address;
``_fetch_add(addr, v)`` adds to an int64 in memory atomically.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _pointer_intrinsic(item: Any) -> Any:
    """Return an intrinsic turning an int64 address into a ``CPointer(item)``."""
    ptr_type = types.CPointer(item)

    def typer(typingctx, addr):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            return builder.inttoptr(args[0], context.get_value_type(ptr_type))

        return ptr_type(types.int64), codegen

    return intrinsic(typer)


_f32_ptr: Any = _pointer_intrinsic(types.float32)
_i32_ptr: Any = _pointer_intrinsic(types.int32)
_i64_ptr: Any = _pointer_intrinsic(types.int64)
_f64_ptr: Any = _pointer_intrinsic(types.float64)
_u64_ptr: Any = _pointer_intrinsic(types.uint64)
_u8_ptr: Any = _pointer_intrinsic(types.uint8)


def _prefetch_codegen(write: int):  # type: ignore[no-untyped-def]
    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(write), i32(3), i32(1)])
        return context.get_dummy_value()

    return codegen


def _prefetch_w_typer(typingctx, addr):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Hint the CPU to fetch the cache line at ``addr`` for writing (``llvm.prefetch``)."""
    return types.void(types.int64), _prefetch_codegen(1)


_prefetch_w: Any = intrinsic(_prefetch_w_typer)


def _prefetch_r_typer(typingctx, addr):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Hint the CPU to fetch the cache line at ``addr`` for reading."""
    return types.void(types.int64), _prefetch_codegen(0)


_prefetch_r: Any = intrinsic(_prefetch_r_typer)


def _fetch_add_typer(typingctx, addr, value):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
    """Add ``value`` to the int64 at ``addr`` atomically; return what it held before."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", ptr, args[1], "seq_cst")

    return types.int64(types.int64, types.int64), codegen


_fetch_add: Any = intrinsic(_fetch_add_typer)
