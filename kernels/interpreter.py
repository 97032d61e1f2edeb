"""Triton interpreter (TRITON_INTERPRET=1): skip its repeated patching of triton.language inside one launch.

Triton 3.6's interpreter patches triton.language (an `inspect.getmembers` scan of tl, tl.core, tl.math and
tl.tensor) when a launch starts, and again at every call of a nested @triton.jit function, although the launch's
patch is still in place: the repeat finds no builtin left to wrap and only re-sets equivalent closures. Under the
interpreter a decode step's kernels call such helpers per program and loop iteration, and the repeat took about a
quarter of a kernel-path test's time (py-spy, tests/test_batch_invariance.py). `skip_nested_lang_patches` makes a
call whose modules (tl, tl.core: those its globals name) are all patched already reuse that patch; whoever patched
them restores them as before, and the numbers are the same. Nothing changes on the GPU, nor on another Triton
version (the interpreter's internals differ).
"""
from __future__ import annotations

import triton

PATCHED_VERSIONS = ("3.6.",)


def _lang_modules(fn, tl) -> tuple:
    """The language modules the interpreter patches for `fn`: tl and / or tl.core where fn's globals name them."""
    return tuple(module for module in (tl, tl.core) if any(value is module for value in fn.__globals__.values()))


def skip_nested_lang_patches() -> bool:
    """Install the skip once (idempotent); True when it is installed."""
    if not triton.__version__.startswith(PATCHED_VERSIONS):
        return False
    import triton.language as tl
    from triton.runtime import interpreter
    if getattr(interpreter._patch_lang, "skips_nested", False):
        return True
    modules_of = {}                                       # jit function -> the modules its patch covers

    def patch_unless_in_place(fn):
        if fn not in modules_of:
            modules_of[fn] = _lang_modules(fn, tl)
        modules = modules_of[fn]
        if modules and not any(tl.core.is_builtin(module.load) for module in modules):
            return interpreter._LangPatchScope()          # patched already: whoever patched it restores it
        return patch_unless_in_place.original(fn)

    patch_unless_in_place.skips_nested, patch_unless_in_place.original = True, interpreter._patch_lang
    interpreter._patch_lang = patch_unless_in_place
    return True
