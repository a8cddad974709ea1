"""Session-wide test set-up.

Without a CUDA device the Triton kernels run in the interpreter: TRITON_INTERPRET=1 is set here,
before Triton is first imported (``import torch`` does not import it). With a CUDA device it is
left unset, so the Triton backend runs compiled on the GPU (the ``gpu`` marker selects those
tests). Tests run torch single-threaded: on small test images the intra-op pool costs more than
it saves. The Triton launches keep their planned rows per program (no timing on CUDA).
"""

import dataclasses
import gc
import math
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)


# The Triton interpreter, made quicker for the test run without changing what it computes (triton
# 3.7.1, the pinned version; any other version runs unchanged). Profiled on the conformance suite's
# Triton cases, about a quarter of the interpreter's time was two kinds of repeated set-up (in
# alternated runs of test_triton_unit_grads.py and test_triton_double_backward.py: 32 s against 42 s):
# - every call of a @triton.jit helper inside a kernel re-patches triton.language for the
#   interpreter (``_patch_lang``: inspect.getmembers over the language modules, about 1.4 ms a call,
#   thousands of calls per launch). The launch has patched those modules already and a nested
#   scope is never restored, so the re-patch changes nothing: it is skipped while a launch is
#   running and has patched every language module the helper sees.
# - ``_get_np_dtype`` builds a 20-entry dict on each of its tens of thousands of calls: memoised.
# - the interpreter's integer-overflow sanitiser (``sanitize_overflow``, on by default there, a no-op
#   in a compiled kernel without debug) redoes every int32 add, sub and mul in int64 and asserts
#   the result's range: about a third of a masked backward's time (test_flat_images.py's masked
#   "reflect" case: 24 s against 33 s). It is off in the quicker interpreter; the plain run of
#   tests/test_interpreter_shim.py keeps it on over every kernel family.
# - each binary operation's type checks (promotion, casts, broadcast: half of what remained): for
#   two tensors of one element type that no operation promotes (float32, float64, integers) the
#   casts are the identity, so only the broadcast is done.
# - block types and tensors: every operation built a new block_type for its result (validating the
#   shape) and every tensor re-wrapped its type's shape as a tuple of constexprs. The block types are
#   now made once per element type and shape, and a tensor takes its type's wrapped shape from a
#   small table: the objects the interpreter would build, shared (it never mutates them).
#   test_flat_images.py's masked "reflect" case alone: 15.2 s against 24.9 s.
# tests/test_interpreter_shim.py checks that the kernels' results are bitwise those of the plain
# interpreter.
_PLAIN_INTERPRETER: dict = {}  # the interpreter's own functions while the quicker ones are in place


def quicker_triton_interpreter(on: bool = True) -> bool:
    """Put the quicker interpreter functions in place (``on``) or the interpreter's own back; True if
    the quicker ones are in place afterwards."""
    import triton

    if os.environ.get("TRITON_INTERPRET") != "1" or triton.__version__ != "3.7.1":
        return False
    from triton.runtime import interpreter as interp

    tl = interp.tl
    if not on:
        if _PLAIN_INTERPRETER:
            interp._patch_lang = _PLAIN_INTERPRETER.pop("patch_lang")
            interp._get_np_dtype = _PLAIN_INTERPRETER.pop("np_dtype")
            interp.GridExecutor.__call__ = _PLAIN_INTERPRETER.pop("grid_call")
            interp.interpreter_builder.options = _PLAIN_INTERPRETER.pop("options")
            del interp.interpreter_semantic.binary_op_type_checking_impl  # the class's method again
            del interp.interpreter_builder.get_block_ty  # the class's methods again
            tl.block_type.with_element_ty = _PLAIN_INTERPRETER.pop("with_element_ty")
            tl.tensor.__init__ = _PLAIN_INTERPRETER.pop("tensor_init")
        return False
    if _PLAIN_INTERPRETER:
        return True
    patch_lang, np_dtype, grid_call = interp._patch_lang, interp._get_np_dtype, interp.GridExecutor.__call__
    patched: list = []  # [ids of the language modules the running launch patched]; [] between launches

    def langs_of(fn):
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def quick_patch_lang(fn):
        if patched and patched[-1] is not None and langs_of(fn) <= patched[-1]:
            return interp._LangPatchScope()  # nothing to restore
        scope = patch_lang(fn)  # the launch's own patch (restored when it ends), or a new module's
        if patched:
            patched[-1] = (patched[-1] or set()) | langs_of(fn)
        return scope

    def quick_grid_call(self, *args, **kwargs):
        patched.append(None)  # its first _patch_lang is the launch's own
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    dtypes: dict = {}

    def quick_np_dtype(tt_dtype):
        try:
            return dtypes[tt_dtype]
        except KeyError:
            dtypes[tt_dtype] = found = np_dtype(tt_dtype)
            return found
        except TypeError:  # unhashable
            return np_dtype(tt_dtype)

    semantic = interp.interpreter_semantic
    type_check = semantic.binary_op_type_checking_impl

    def quick_type_check(lhs, rhs, *args, **kwargs):
        # two tensors of one element type that no operation promotes: the casts are the identity
        # and only the broadcast remains (none for one block type)
        if type(lhs) is semantic.tensor and type(rhs) is semantic.tensor and lhs.type is rhs.type:
            scalar = lhs.type.scalar
            if scalar.is_fp32() or scalar.is_fp64() or scalar.is_int():
                return lhs, rhs
        if type(lhs) is semantic.tensor and type(rhs) is semantic.tensor and lhs.type.scalar == rhs.type.scalar:
            scalar = lhs.type.scalar
            if scalar.is_fp32() or scalar.is_fp64() or scalar.is_int():
                return (lhs, rhs) if lhs.type == rhs.type else semantic.broadcast_impl_value(lhs, rhs)
        return type_check(lhs, rhs, *args, **kwargs)

    block_types: dict = {}  # (id(element type), shape) -> (element type, its block_type)
    block_type = tl.block_type

    def quick_block_type(element_ty, shape):
        key = tuple(shape)
        if not all(type(s) is int for s in key):  # constexprs: built as the interpreter does
            return block_type(element_ty, shape)
        key = (id(element_ty), key)
        found = block_types.get(key)
        if found is None or found[0] is not element_ty:
            if len(block_types) > 4096:
                block_types.clear()
            found = block_types[key] = (element_ty, block_type(element_ty, shape))
        return found[1]

    def quick_get_block_ty(dtype, shape):
        return quick_block_type(dtype, shape)

    def quick_with_element_ty(self, scalar_ty):
        return quick_block_type(scalar_ty, self.shape)

    tensor_init = tl.tensor.__init__
    shapes: dict = {}  # id(block type) -> (block type, its shape as the tensor holds it, numel)
    scalar_shape = (tl.tuple([]), tl.constexpr(1))

    def quick_tensor_init(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        if not type.is_block():
            self.shape, self.numel = scalar_shape
            return
        found = shapes.get(id(type))
        if found is None or found[0] is not type:
            if len(shapes) > 4096:
                shapes.clear()
            wrapped = tl.tuple([tl.constexpr(s) for s in type.shape])
            found = shapes[id(type)] = (type, wrapped, tl.constexpr(math.prod(type.shape)))
        self.shape, self.numel = found[1], found[2]

    options = interp.interpreter_builder.options
    _PLAIN_INTERPRETER.update(patch_lang=patch_lang, np_dtype=np_dtype, grid_call=grid_call, options=options)
    _PLAIN_INTERPRETER.update(with_element_ty=tl.block_type.with_element_ty, tensor_init=tensor_init)
    interp.interpreter_builder.get_block_ty = quick_get_block_ty
    tl.block_type.with_element_ty = quick_with_element_ty
    tl.tensor.__init__ = quick_tensor_init
    interp.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    semantic.binary_op_type_checking_impl = quick_type_check
    interp._patch_lang = quick_patch_lang
    interp.GridExecutor.__call__ = quick_grid_call
    interp._get_np_dtype = quick_np_dtype
    return True


def pytest_collection_finish(session):
    """Everything imported by now (torch, Lightning, Hydra, the test modules: about half a million
    objects in a worker) lives to the end of the run: frozen out of the cyclic collector's view, so
    that the collections the tests' own allocations trigger (the Triton interpreter's, by the
    thousand) walk only what the tests made. On one interpreter case 2.7 s of 6.1 s were collections
    with those modules loaded, 1.7 s with them frozen."""
    gc.freeze()


def pytest_runtest_setup(item):
    # from a worker's first Triton test on (the marker), or once anything has imported Triton
    if not _PLAIN_INTERPRETER and ("triton" in sys.modules or item.get_closest_marker("triton")):
        quicker_triton_interpreter()
