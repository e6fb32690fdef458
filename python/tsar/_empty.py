"""tsar.empty_parameters: build a module whose parameters cost nothing, for
load_into to bind."""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from typing import Iterator

import torch

_META = torch.device("meta")
_lock = threading.Lock()
_inside = 0  # threads' contexts open, all threads together
_inits = []  # what _patch_initializers replaced, while any is open
_original = torch.nn.Module.register_parameter  # what the first thread in found there
_local = threading.local()  # .stack: this thread's open contexts' `made` dicts


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _register_parameter(self, name, param):
    """nn.Module.register_parameter while some thread is inside
    empty_parameters(): for that thread, a parameter not yet on meta is
    registered as its meta twin (one per object); for any other thread, and
    for what torch itself refuses, torch's own."""
    stack = getattr(_local, "stack", None)
    if not stack or not isinstance(param, torch.Tensor) or param.device.type == "meta":
        return _original(self, name, param)
    made = stack[-1]
    key = id(param)
    known = made.get(key)
    if known is None or known[0]() is not param:
        known = (weakref.ref(param), _to_meta(param))
        made[key] = known
    return _original(self, name, known[1])


def _to_meta(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """A meta Parameter of ``param``'s class, shape, dtype, requires_grad and
    attributes (a subclass's own state, such as vLLM's weight loader and
    dimensions, kept).

    A Parameter subclass is made as ``Parameter.__new__`` makes one,
    ``Tensor._make_subclass``, and given the original's ``__dict__``: its
    ``__init__`` is not called, because the arguments it takes cannot be told
    from what it stored (vLLM's ``RowvLLMParameter(input_dim=...)`` keeps
    ``_input_dim``; calling it with the ``__dict__`` as keywords failed). A
    tensor subclass made a parameter (a torchao weight: ``Parameter()`` of it
    returns the subclass itself, flagged ``_is_param``) moves to meta as
    itself, inner tensors included, and is flagged again."""
    data = param.data.to(_META)
    cls = type(param)
    if issubclass(cls, torch.nn.Parameter) and cls is not torch.nn.Parameter:
        meta = torch.Tensor._make_subclass(cls, data, param.requires_grad)
    else:
        meta = torch.nn.Parameter(data, requires_grad=param.requires_grad)
        if cls is not torch.nn.Parameter:  # its __dict__ holds its real inner tensors
            return meta
    if param.__dict__:
        meta.__dict__.update(param.__dict__)
    return meta


# Where initializers are reached by name: torch.nn.init itself, the modules
# that import its functions, and transformers' table of them.
_INIT_MODULES = ("torch.nn.init", "torch.nn.modules.linear", "torch.nn.modules.sparse",
                 "torch.nn.modules.normalization", "torch.nn.modules.conv",
                 "torch.nn.modules.activation", "torch.nn.modules.batchnorm")


def _skipping(fn):
    @functools.wraps(fn)
    def init(tensor, *args, **kwargs):
        if isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return fn(tensor, *args, **kwargs)
    return init


def _patch_initializers():
    """Makes the initializers (``torch.nn.init.*_``, and transformers' through
    its ``TORCH_INIT_FUNCTIONS`` where transformers is imported) return a meta
    tensor as it is: filling one has no effect, yet costs about 2-4 ms a tensor
    through torch's reference decompositions (the larger part of building a
    LLaMA with empty parameters). Real tensors, the buffers, are initialized
    as before. Returns what to restore."""
    saved = []
    table = getattr(sys.modules.get("transformers.initialization"), "TORCH_INIT_FUNCTIONS", None)
    for name, fn in list((table or {}).items()):
        saved.append((table, name, fn, True))
        table[name] = _skipping(fn)
    for module_name in _INIT_MODULES:
        module = sys.modules.get(module_name)
        for name in dir(torch.nn.init) if module is not None else ():
            fn = getattr(module, name, None)
            if (name.endswith("_") and not name.startswith("_") and callable(fn)
                    and getattr(torch.nn.init, name, None) is fn):
                saved.append((module, name, fn, False))
                setattr(module, name, _skipping(fn))
    return saved


def _restore(saved) -> None:
    for where, name, fn, is_table in reversed(saved):
        if is_table:
            where[name] = fn
        else:
            setattr(where, name, fn)


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Inside it, every parameter a module registers is made on the meta
    device (no memory), and everything else as usual: buffers are real
    tensors, computed by the constructor. Then :func:`tsar.load_into` binds
    the parameters to the archive, zero copy::

        with tsar.empty_parameters():
            model = transformers.LlamaForCausalLM(config)
        tsar.load_into(model.eval(), "llama.tsar")

    Why not ``with torch.device("meta")``: that makes the buffers meta too,
    and the non-persistent ones (BERT's ``position_ids``, LLaMA's rotary
    ``inv_freq``) are in no state_dict and so in no archive: load_into refuses
    such a module rather than leave them on meta. This is what accelerate's
    ``init_empty_weights(include_buffers=False)`` does, without that
    dependency.

    The constructor's initializers skip meta tensors (``torch.nn.init``'s
    functions and transformers' return them as they are: filling a meta
    tensor does nothing, but costs milliseconds a tensor); buffers are
    initialized as usual, and no random number is drawn for a parameter.

    Ties made by the constructor are kept: a parameter already on meta is
    registered as it is (``self.lm_head.weight = self.embed.weight``), and a
    parameter registered twice (``register_parameter`` of one object under
    two names) becomes one meta Parameter. The constructor's own
    initialization (``reset_parameters``, ``_init_weights``) runs on meta,
    where it costs nothing; each parameter's first allocation happens on the
    CPU, as the constructor makes it, and is freed at once (untouched memory
    of large tensors is never faulted in).

    It applies to the thread that entered it (and may be nested there);
    other threads, inside one of their own or not, are unaffected, whatever
    order threads enter and leave in (two threads calling
    ``tsar.transformers.load_model`` at once each get a meta model). The
    patches of ``torch.nn.Module.register_parameter`` and the initializers
    are installed while any thread is inside and removed when the last one
    leaves; a thread that is not inside gets torch's own behaviour from them.
    """
    global _inside, _inits, _original
    # id(original) -> (weak reference to it, its meta Parameter): one meta
    # Parameter per object, without keeping the originals' memory alive.
    made = {}
    with _lock:
        if _inside == 0:
            _original = torch.nn.Module.register_parameter
            torch.nn.Module.register_parameter = _register_parameter
            _inits = _patch_initializers()
        _inside += 1
    stack = _stack()
    stack.append(made)
    try:
        yield
    finally:
        # This context's own entry, even if an inner one was abandoned open.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is made:
                del stack[i]
                break
        with _lock:
            _inside -= 1
            if _inside == 0:
                torch.nn.Module.register_parameter = _original
                _restore(_inits)
                _inits = []
        made.clear()
