"""Bound launches: one recorded kernel launch with every argument that is not one of the call's
tensors fixed, launched per call with the call's tensors (their addresses) filled in.

The first run goes through the JIT (`kernel[grid](...)`: compiles or loads, or only that inside
codegen.static.jit.compiled_not_launched); the compiled kernel is then launched directly. On
Triton 3.6's CUDA launcher (`_direct_entry`) that is its C entry point, with addresses for
tensors and each TMA descriptor encoded once per cache address: the launcher's Python wrapper
would call every tensor's data_ptr(), query the driver about each pointer and encode the
descriptor at every launch. Elsewhere it is the CompiledKernel's launcher; under the interpreter,
the JIT with the stored arguments.
"""
from __future__ import annotations

import dataclasses
import os

import torch
from triton import knobs as _knobs

MAX_DESCRIPTORS = 1024  # TMA descriptors per launch: one per layer's cache tensor


def bind_recorded(recorded: list, roles: tuple, *, device: int) -> list:
    """Runs each recorded launch once (the plan's first call) and returns them bound."""
    bound = []
    for kernel, grid, args, kwargs in recorded:
        launch = BoundLaunch(kernel, grid, args, kwargs, roles, device=device)
        launch.first_run()
        bound.append(launch)
    return bound


def _descriptor_types() -> tuple:
    """The host TMA descriptor classes a recorded launch may pass: Triton's, and Gluon's (which also
    carries the shared-memory layout of its box). Both are dataclasses whose `base` is the tensor."""
    types = []
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
        types.append(TensorDescriptor)
    except ImportError:  # pragma: no cover - a Triton without host descriptors
        pass
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
        types.append(GluonTensorDescriptor)
    except ImportError:  # pragma: no cover - a Triton without Gluon
        pass
    return tuple(types)


def _rebased(template, base):
    """`template` (a recorded descriptor) over another base: a tensor, or an _Address."""
    return dataclasses.replace(template, base=base)


class BoundLaunch:
    """One kernel launch whose non-tensor arguments are fixed; calling it with the call's tensors
    (in the order of `roles`) fills their slots and launches.

    On a GPU it launches the compiled kernel directly (see the module docstring: the argument
    binding, specialization and cache lookup of `JITFunction.run` were done by the first run and
    cannot change under the plan's key). Under the interpreter, or with a Triton whose compiled
    kernel lacks that interface, it goes through `kernel[grid](...)` with the stored arguments.
    The call's tensors are not kept: their slots hold None between calls.
    """

    __slots__ = ("kernel", "grid", "args", "kwargs", "slots", "descriptor_slots", "descriptors",
                 "device", "compiled", "launcher", "function", "packed_metadata", "values", "fast")

    def __init__(self, kernel, grid, args, kwargs, roles: tuple, *, device: int):
        self.kernel, self.kwargs, self.device = kernel, kwargs, device
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.args = list(args)
        by_id = {id(t): i for i, t in enumerate(roles) if t is not None}
        descriptors = _descriptor_types()
        self.slots, self.descriptor_slots = [], []
        for pos, arg in enumerate(self.args):
            if id(arg) in by_id:
                self.slots.append((pos, by_id[id(arg)]))
            elif descriptors and isinstance(arg, descriptors) and id(arg.base) in by_id:
                # kept as a template over the address alone (no cache kept alive): shape, strides, box
                # and layout are the plan key's, only the address varies
                template = _rebased(arg, _Address(arg.base.data_ptr(), arg.base.dtype))
                self.descriptor_slots.append((pos, by_id[id(arg.base)], template))
            elif isinstance(arg, torch.Tensor) and not _owned(arg, roles):
                raise RuntimeError(f"{getattr(kernel, '__name__', kernel)}: argument {pos} is a tensor that is "
                                   "neither one of the call's nor a buffer its launch allocated")
        self.descriptors = {}
        self.compiled = self.launcher = self.values = self.fast = None

    def first_run(self) -> None:
        """The first launch, through the JIT (compiling or loading the kernel, or only that inside
        codegen.static.jit.compiled_not_launched), then bound to the compiled kernel."""
        compiled = self.kernel[self.grid](*self.args, **self.kwargs)
        for pos in [pos for pos, _ in self.slots] + [pos for pos, _, _ in self.descriptor_slots]:
            self.args[pos] = None  # the call's tensors (and descriptors over them) are not kept
        if os.environ.get("TRITON_INTERPRET") != "1":
            self._bind(compiled)

    def _bind(self, compiled) -> None:
        try:
            launcher = compiled.run  # loads the module and builds its launcher if not yet
            function, packed = compiled.function, compiled.packed_metadata
            names, params = self.kernel.arg_names, {p.name: p for p in self.kernel.params}
        except AttributeError:  # a Triton whose kernels launch otherwise: stay on the JIT path
            return
        values = list(self.args)  # the launcher takes every parameter in order, constexprs too
        for name in names[len(self.args):]:
            if name in self.kwargs:
                values.append(self.kwargs[name])
            elif params[name].has_default:
                values.append(params[name].default)
            else:
                raise TypeError(f"{name}: missing from the recorded launch of {self.kernel.__name__}")
        self.compiled, self.launcher, self.function, self.packed_metadata = compiled, launcher, function, packed
        self.values = values
        self.fast = self._generate_fast()

    def _descriptor(self, cache: torch.Tensor, template):
        """The JIT path's descriptor over a cache tensor (one per tensor, by address)."""
        ptr = cache.data_ptr()
        desc = self.descriptors.get(ptr)
        if desc is None:
            if len(self.descriptors) >= MAX_DESCRIPTORS:
                self.descriptors.pop(next(iter(self.descriptors)))
            desc = _rebased(template, cache)
            self.descriptors[ptr] = desc
        return desc

    def __call__(self, tensors: tuple, pointers: list, stream: int) -> None:
        if self.fast is not None:
            self.fast(tensors, pointers, stream)
            return
        args = self.args.copy()
        for pos, role in self.slots:
            args[pos] = tensors[role]
        for pos, role, template in self.descriptor_slots:
            args[pos] = self._descriptor(tensors[role], template)
        self.kernel[self.grid](*args, **self.kwargs)

    def _launch_with_hooks(self, tensors: tuple, pointers: list, stream: int) -> None:
        """The launch as JITFunction.run makes it when a profiler registered launch hooks."""
        values = self.values.copy()
        for pos, role in self.slots:
            values[pos] = tensors[role]
        for pos, role, template in self.descriptor_slots:
            cache = tensors[role]
            values[pos] = _rebased(template, _Address(cache.data_ptr(), cache.dtype))
        grid = self.grid
        metadata = self.compiled.launch_metadata(grid, stream, *values)
        self.launcher(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata, metadata,
                      _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook, *values)

    def _generate_fast(self):
        """A function that makes this launch from the call's pointers in one Python call: every
        fixed argument a name of its namespace, every tensor its address. Where the launcher's C
        entry point can be reached (codegen.plan._direct_entry) it is called as is, with each TMA
        descriptor already encoded (once per cache address); else the CompiledKernel's launcher."""
        entry = _direct_entry(self.launcher)
        roles = dict(self.slots)
        descriptors = {pos: (role, template) for pos, role, template in self.descriptor_slots}
        metas = list(getattr(self.compiled.metadata, "tensordesc_meta", None) or [None] * len(descriptors))
        namespace = dict(launcher=self.launcher, function=self.function, packed=self.packed_metadata,
                         runtime=_knobs.runtime, hooks_active=_hooks_active, with_hooks=self._launch_with_hooks)
        args = []
        for pos, value in enumerate(self.values):
            if pos in roles:  # an address on the direct path; the tensor for Triton's launcher
                args.append(f"p[{roles[pos]}]" if entry else f"t[{roles[pos]}]")
            elif pos in descriptors:
                role, template = descriptors[pos]
                descriptors_of = _Descriptors(template, metas.pop(0), encode=entry is not None)
                namespace[f"d{pos}"], namespace[f"D{pos}"] = descriptors_of, descriptors_of.cache
                found = f"(D{pos}.get(p[{role}]) or d{pos}(p[{role}]))"
                args.append(f"*{found}" if entry else found)
            else:
                namespace[f"c{pos}"] = value
                args.append(f"c{pos}")
        g0, g1, g2 = self.grid
        if entry is not None:
            namespace.update(entry=entry.launch, coop=entry.cooperative, pdl=entry.pdl)
            call = f"entry({g0}, {g1}, {g2}, stream, function, coop, pdl, None, None, packed, None, None, None, "
        else:
            call = f"launcher({g0}, {g1}, {g2}, stream, function, packed, None, None, None, "
        hooks = ("runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls" if _hook_chains()
                 else "hooks_active()")
        source = (f"def launch(t, p, stream):\n"
                  f"    if {hooks}:\n"
                  f"        return with_hooks(t, p, stream)\n"
                  f"    {call}{', '.join(args)})\n")
        exec(compile(source, f"<msa-tune launch of {self.kernel.__name__}>", "exec"), namespace)
        return namespace["launch"]


class _Descriptors:
    """TMA descriptors of one launch argument by cache address (under a plan only the address
    varies: shape, strides, dtype, box and layout are the key's, held by `template`). encode=True:
    the launcher's C entry point's form, the descriptor encoded once per address (the launcher would
    encode it at every launch); else the descriptor Triton's launcher takes. Built over the address
    alone, they keep no cache alive."""

    __slots__ = ("template", "meta", "encode", "cache")

    def __init__(self, template, meta, *, encode: bool):
        self.template, self.meta, self.encode, self.cache = template, meta, encode, {}

    def __call__(self, ptr: int):
        found = self.cache.get(ptr)
        if found is None:
            if len(self.cache) >= MAX_DESCRIPTORS:
                self.cache.pop(next(iter(self.cache)))
            found = _rebased(self.template, _Address(ptr, self.template.base.dtype))
            if self.encode:
                found = tuple(_make_tensordesc_arg(found, self.meta))
            self.cache[ptr] = found
        return found


class _Entry:
    """The C entry point of a CUDA launcher (Triton 3.6's layout) and the flags it is called with."""

    __slots__ = ("launch", "cooperative", "pdl")

    def __init__(self, launch, cooperative, pdl):
        self.launch, self.cooperative, self.pdl = launch, cooperative, pdl


def _direct_entry(launcher):
    """The launcher's C function when this Triton's CUDA launcher has the layout this module was
    written against (triton 3.6: `launch(grid x3, stream, function, cooperative, pdl, scratch x2,
    metadata, launch metadata, hooks x2, *args)`, descriptors expanded by a Python wrapper) and the
    kernel needs no scratch memory; else None (Triton's own launcher is used)."""
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return None
    if (type(launcher).__name__ != "CudaLauncher" or getattr(nvidia, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO"
            or getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1)):
        return None
    try:
        import inspect

        if len(inspect.signature(nvidia.make_tensordesc_arg).parameters) != 2:
            return None
    except (AttributeError, TypeError, ValueError):
        return None
    launch = launcher.launch
    if type(launch).__name__ != "builtin_function_or_method":  # the descriptor-expanding wrapper
        cells = [cell.cell_contents for cell in (getattr(launch, "__closure__", None) or ())]
        builtins = [c for c in cells if type(c).__name__ == "builtin_function_or_method"]
        if len(builtins) != 1:
            return None
        launch = builtins[0]
    return _Entry(launch, launcher.launch_cooperative_grid, launcher.launch_pdl)


def _make_tensordesc_arg(desc, meta):
    from triton.backends.nvidia.driver import make_tensordesc_arg

    return make_tensordesc_arg(desc, meta)


def _hook_chains() -> bool:
    """Whether this Triton keeps launch hooks as hook chains (3.6: knobs.runtime, a `calls` list)."""
    return all(hasattr(getattr(_knobs.runtime, name, None), "calls")
               for name in ("launch_enter_hook", "launch_exit_hook"))


class _Address:
    """What a host TMA descriptor needs of its base: the address and the element type."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


def _owned(arg: torch.Tensor, roles: tuple) -> bool:
    """Whether a recorded tensor argument is not a view of one of the call's tensors (so a buffer
    the launch allocated, which the plan may keep)."""
    ptr = arg.untyped_storage().data_ptr()
    return all(t is None or t.untyped_storage().data_ptr() != ptr for t in roles)


try:
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover
    def _current_stream(device: int):
        return torch.cuda.current_stream(device).cuda_stream


def _hooks_active() -> bool:
    """Whether a profiler registered Triton launch hooks (Triton 3.6 keeps them in knobs.runtime as
    hook chains; older ones as a callable or None): then launches go the JIT's way, with metadata."""
    enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))
