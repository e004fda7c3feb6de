"""A study's stack axis at run time (``config.stacks``): every stack's environment ready before the first job
(``prepare_stacks``), a point's jobs run with its stack's Python (``on_stack``), and ``--dry-run``'s account of
them (``stack_lines``). The environments themselves are ``ds_bench.machine.stack_envs``'.
"""

from __future__ import annotations

import dataclasses


def prepare_stacks(spec) -> None:
    """Each stack of the study's axis (``spec.stacks``, ``config.stacks``) with its environment, built where missing
    (``machine.stack_envs``), before the study's first job: a version that does not install is bad input (exit 2)
    while nothing has run."""
    from ds_bench.machine.stack_envs import python_of

    for stack in getattr(spec, "stacks", ()):
        python = python_of(stack)
        if stack.label:
            print(f"stack {stack.label}: {python}", flush=True)


def stack_lines(stacks) -> list[str]:
    """``--dry-run``: each stack of the axis and its environment (built, or to be built before the first point)."""
    from ds_bench.machine.stack_envs import env_path, ready_versions, stacks_root

    lines = []
    for stack in stacks:
        if stack.label and stack.own:
            lines.append(f"stack {stack.label}: this environment")
        elif stack.label:
            state = "built" if ready_versions(stack) else "to be built before the first point"
            lines.append(f"stack {stack.label}: {env_path(stack, stacks_root())} ({state})")
    return lines


def stack_named(spec, label: str):
    """The stack of the study's axis whose label is ``label`` (a point's ``Layout.stack``), None where none is."""
    return next((s for s in getattr(spec, "stacks", ()) if s.label == label), None)


def on_stack(spec, label: str):
    """``spec`` whose jobs run with the Python of its stack ``label``; itself for this environment's."""
    from ds_bench.machine.stack_envs import python_of

    stack = stack_named(spec, label)
    return spec if stack is None or stack.own else dataclasses.replace(spec, python=python_of(stack))


def stack_where(spec, where, point):
    """``where`` (``config.legality_rules.Where``) with the versions of ``point``'s stack, which a rule that needs a
    newer release reads (``config.stack_rules``); itself for this environment's."""
    stack = stack_named(spec, point.stack)
    return dataclasses.replace(where, versions=stack.versions) if stack is not None and stack.versions else where
