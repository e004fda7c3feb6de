"""Which top-level config keys the installed DeepSpeed reads, found in its own source.

DeepSpeed reads its JSON config by hand, key by key: ``param_dict.get(NAME, ...)``,
``get_scalar_param(param_dict, NAME, ...)``, ``NAME in param_dict``, ``param_dict[NAME]``, with ``NAME``
a string or a constant from ``deepspeed/runtime/constants.py`` (and its siblings). This module reads
those functions with ``ast``, starting where a config enters DeepSpeed (``DeepSpeedConfig`` and
``deepspeed.initialize``) and following every call that hands the whole config on (to
``get_zero_config``, ``DeepSpeedCommsConfig``, ``get_monitor_config``...), each name resolved through
the globals of the module it is written in. So a key a new DeepSpeed starts reading is known the day it
is installed; ``tests/test_ds_keys.py`` checks the result against the keys a real ``DeepSpeedConfig``
touches. ``scan`` (one function's source -> its reads and hand-ons) is pure; ``top_level_keys`` walks.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any, Callable

Lookup = Callable[[str], Any]
"""A name -> its value where the scanned function is written (its module's globals, its defaults)."""

_MISSING = object()


def scan(source: str, params: tuple[str, ...], lookup: Lookup) -> tuple[set[str], list[tuple[str, int]]]:
    """The keys the first function in ``source`` reads from the config held by ``params`` (parameter
    names, or expressions such as ``self._param_dict``), and the calls handing that config on: (callee as
    written, position of the config among its arguments)."""
    func = ast.parse(textwrap.dedent(source)).body[0]
    names = set(params)
    for _ in range(2):  # aliases of aliases: param_dict = copy.copy(self._param_dict) after self._param_dict = config
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and _holds(node.value, names):
                names.update(ast.unparse(t) for t in node.targets if isinstance(t, (ast.Name, ast.Attribute)))
    scopes = _loop_bindings(func, lookup)
    keys: set[str] = set()
    calls: list[tuple[str, int]] = []
    for node in ast.walk(func):
        bound = scopes.get(id(node), {})
        if isinstance(node, ast.Subscript) and _is(node.value, names):
            keys.update(_strings(node.slice, lookup, bound))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and _is_or_keys(node.comparators[0], names):
            keys.update(_strings(node.left, lookup, bound))
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr in ("get", "pop", "setdefault") and _is(fn.value, names) \
                    and node.args:
                keys.update(_strings(node.args[0], lookup, bound))
                continue
            for i, arg in enumerate(node.args):
                if _is(arg, names) and not _holds(node, names):  # copy.copy(param_dict) makes an alias
                    calls.append((ast.unparse(fn), i))
                    getter = ast.unparse(fn).rpartition(".")[2].startswith("get_")
                    if getter and i == 0 and len(node.args) > 1:  # get_scalar_param(param_dict, NAME, default)
                        keys.update(_strings(node.args[1], lookup, bound))
    return keys, calls


def _is(node: ast.AST, names: set[str]) -> bool:
    return isinstance(node, (ast.Name, ast.Attribute)) and ast.unparse(node) in names


def _is_or_keys(node: ast.AST, names: set[str]) -> bool:
    """``param_dict`` or ``param_dict.keys()``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys":
        return _is(node.func.value, names)
    return _is(node, names)


def _holds(value: ast.AST, names: set[str]) -> bool:
    """``param_dict`` or ``copy.copy(param_dict)`` on the right of an assignment."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("copy.copy", "copy", "dict") and value.args:
        return _is(value.args[0], names)
    return _is(value, names)


def _loop_bindings(func: ast.AST, lookup: Lookup) -> dict[int, dict[str, list[str]]]:
    """For each node inside a loop or comprehension (by ``id``), the names the loop binds to the strings it
    runs over: ``for key in (...)``, ``for key, message in TABLE.items()`` (the table's keys); an inner
    loop's binding hides an outer one's."""
    out: dict[int, dict[str, list[str]]] = {}
    for node in ast.walk(func):  # outer loops first
        if isinstance(node, ast.For):
            loops, inside = [node], node.body
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            loops = node.generators
            inside = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            inside += [cond for gen in node.generators for cond in gen.ifs]
        else:
            continue
        for loop in loops:
            target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
            if not isinstance(target, ast.Name):
                continue
            strings = _iterated(loop.iter, lookup)
            for part in inside:
                for inner in ast.walk(part):
                    out.setdefault(id(inner), {})[target.id] = strings
    return out


def _iterated(node: ast.AST, lookup: Lookup) -> list[str]:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("items", "keys"):
        node = node.func.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt, lookup, {})]
    if isinstance(node, ast.Name):
        value = lookup(node.id)
        if isinstance(value, (dict, tuple, list, set, frozenset)):
            return [v for v in value if isinstance(v, str)]
    return []


def _strings(node: ast.AST, lookup: Lookup, bound: dict[str, list[str]]) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        if node.id in bound:
            return bound[node.id]
        value = lookup(node.id)
        return [value] if isinstance(value, str) else []
    return []


def _resolve(written: str, namespace: dict, owner: type | None) -> Any:
    """``get_zero_config`` / ``self._initialize_params`` / ``module.func`` -> the object, or _MISSING."""
    head, *rest = written.split(".")
    if head == "self":
        obj: Any = owner if owner is not None else _MISSING
    else:
        obj = namespace.get(head, _MISSING)
    for part in rest:
        obj = getattr(obj, part, _MISSING)
    return obj


def _lookup_for(func) -> Lookup:
    defaults = {name: p.default for name, p in inspect.signature(func).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return lambda name: defaults.get(name, func.__globals__.get(name))


def walk(roots: list[tuple[Any, tuple[str, ...], type | None]]) -> set[str]:
    """Every key read from the config by ``roots`` ((function, names holding the config, its class))
    and by whatever they hand the config to, inside DeepSpeed."""
    keys: set[str] = set()
    seen: set[tuple[Any, tuple[str, ...]]] = set()
    todo = list(roots)
    while todo:
        func, params, owner = todo.pop()
        if (func, params) in seen or not (getattr(func, "__module__", None) or "").startswith("deepspeed"):
            continue
        seen.add((func, params))
        try:
            source = inspect.getsource(func)
            found, calls = scan(source, params, _lookup_for(func))
        except (OSError, TypeError, SyntaxError, ValueError):  # compiled, built-in, or source ast cannot take
            continue
        keys |= found
        for written, position in calls:
            todo.extend(_callee(_resolve(written, func.__globals__, owner), position, owner))
    return keys


def _callee(obj: Any, position: int, owner: type | None) -> list[tuple[Any, tuple[str, ...], type | None]]:
    """The function a call reaches and the name its ``position``-th argument takes there."""
    cls = obj if inspect.isclass(obj) else None
    func = obj.__init__ if cls is not None else obj
    if not inspect.isfunction(func):
        return []
    names = list(inspect.signature(func).parameters)
    method = cls is None and owner is not None and getattr(owner, func.__name__, None) is func
    if cls is not None or method:
        names = names[1:]  # self
    if position >= len(names):
        return []
    extra = ("self._param_dict",) if method else ()  # DeepSpeedConfig's methods also read the config it keeps
    return [(func, (names[position], *extra), cls if cls is not None else owner if method else None)]


CORE_KEYS = frozenset({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                       "optimizer", "scheduler", "zero_optimization", "bf16", "fp16", "gradient_clipping"})
"""Keys every DeepSpeed reads: a scan that misses one has lost the way DeepSpeed reads its config."""


@functools.cache
def top_level_keys() -> frozenset[str]:
    """Top-level keys the installed DeepSpeed reads; empty (the top level goes unchecked) when it or its source
    is missing, or when the scan fails or misses a key every DeepSpeed reads (``CORE_KEYS``): a DeepSpeed that
    reads its config another way must not have valid keys called unknown."""
    try:
        keys = _scan_installed()
    except Exception:  # noqa: BLE001 - a scanner surprise must never stop a run; the check is only a help
        return frozenset()
    return keys if CORE_KEYS <= keys else frozenset()


def _scan_installed() -> frozenset[str]:
    try:
        import deepspeed
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        return frozenset()

    roots: list[tuple[Any, tuple[str, ...], type | None]] = [
        (deepspeed.initialize, ("config",), None),
        (DeepSpeedConfig.__init__, ("config", "self._param_dict"), DeepSpeedConfig),
    ]
    for _, method in inspect.getmembers(DeepSpeedConfig, inspect.isfunction):  # methods reading self._param_dict
        roots.append((method, ("self._param_dict",), DeepSpeedConfig))
    return frozenset(walk(roots))
