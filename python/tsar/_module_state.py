"""What a module holds, as load_into binds it: the tensors its state_dict()
lists, found by one walk of the module tree (state_items), and the errors
that walk raises. Both paths' binds use it (tsar/_bind.py with the
accelerator, tsar/_portable_bind.py); their C++ walks (python/src/
module_walk.cc) decline exactly where this one calls state_dict()."""
from __future__ import annotations

import torch

from ._errors import Error, ErrorCode

_Module = torch.nn.Module
PLAIN = {}  # type -> whether state_dict of its instances is Module's own walk


def plain(cls) -> bool:
    """True when ``cls`` keeps nn.Module's state_dict: no override of
    state_dict, _save_to_state_dict or get_extra_state."""
    answer = PLAIN.get(cls)
    if answer is None:
        answer = (cls.state_dict is _Module.state_dict
                  and cls._save_to_state_dict is _Module._save_to_state_dict
                  and cls.get_extra_state is _Module.get_extra_state)
        PLAIN[cls] = answer
    return answer


def state_items(module):
    """The tensors of ``module.state_dict(keep_vars=True)`` (not its extra
    state: no archive holds it), as (name, tensor) in its order, whether any
    submodule is training, and the non-persistent buffers on meta (which no
    archive holds: ``loose``), in one walk of the module tree. state_dict()
    itself costs 2.4 us and modules() 0.8 us a module in Python (0.43 s for a
    mixture of experts of 133,000 modules); this walk reads the same dicts in
    the same order. Modules with state_dict hooks or their own state_dict
    logic are left to state_dict(). load_into first tries the same walk in
    C++ (``_tsar.bind_module``, python/src/module_walk.cc), which declines
    (None) exactly where this one calls state_dict() or refuses a module
    that contains itself (deeper than MAX_DEPTH)."""
    items, training, loose = [], False, []
    stack = [("", module, 1)]
    while stack:
        prefix, m, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise invalid(f"the module tree is more than {MAX_DEPTH} levels deep at "
                           f"{shorten(prefix)!r}: a module that contains itself (state_dict() "
                           f"cannot list it either: RecursionError)")
        if (m._state_dict_hooks or m._state_dict_pre_hooks or not plain(type(m))):
            # Not the extra state (get_extra_state()): no archive holds it.
            items = [(n, t) for n, t in module.state_dict(keep_vars=True).items()
                     if isinstance(t, torch.Tensor)]
            listed = {id(t) for _, t in items}
            loose = [(n, t) for n, t in module.named_parameters(remove_duplicate=False)
                     if t.is_meta and id(t) not in listed]
            loose += [(n, t) for n, t in module.named_buffers(remove_duplicate=False)
                      if t.is_meta and id(t) not in listed]
            return items, any(x.training for x in module.modules()), loose
        training = training or m.training
        for name, p in m._parameters.items():
            if p is not None:
                if not isinstance(p, torch.Tensor):
                    raise not_a_tensor(prefix + name, "_parameters", p)
                items.append((prefix + name, p))
        skip = m._non_persistent_buffers_set
        for name, b in m._buffers.items():
            if b is not None and not isinstance(b, torch.Tensor):
                raise not_a_tensor(prefix + name, "_buffers", b)
            if b is not None and name not in skip:
                items.append((prefix + name, b))
            elif b is not None and b.is_meta:
                loose.append((prefix + name, b))
        children = [(prefix + name + ".", c, depth + 1) for name, c in m._modules.items()
                    if c is not None]
        stack.extend(reversed(children))
    return items, training, loose


# Python's own limit on nesting (state_dict() recurses): deeper is a cycle in
# the module graph. python/src/module_walk.cc declines past the same depth.
MAX_DEPTH = 1000


def shorten(name: str, most: int = 120) -> str:
    return name if len(name) <= most else f"{name[:most]}..."


def not_a_tensor(name: str, where: str, value) -> Error:
    return invalid(f"{shorten(name)!r} is a {type(value).__name__} in the module's {where}, "
                    "where torch keeps tensors (an assignment that bypassed register_parameter or "
                    "register_buffer?): tsar binds tensors")


def invalid(message: str) -> Error:
    return Error(f"load_into: {message}. Nothing was changed", ErrorCode.INVALID_ARGUMENT)
