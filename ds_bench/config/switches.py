"""The run options of a layout beyond its parallel degrees, one ``Switch`` each, registered once (``SWITCHES``).

A switch is either on or off (a ``Layout`` bool field: ALST's tiled MLP and tiled loss, DeepCompile) or one value of
a few (a ``Layout`` str field: the optimizer, the master-state precision, the sequence-parallel path). Everything
that would otherwise name one by hand reads this registry: the layout's key word (``tiled-mlp``, ``opt=muon``), its
``ds-bench run`` flag (``--tiled-mlp``, ``--optimizer muon``; defined in ``config.run_config``), the studies' axis
flag of the same name (``--tiled-mlp off,on``, ``--optimizer adamw,muon``), the legality table's refusals
(``rules``, each with its source and DeepSpeed version), the DeepSpeed config the run trains with (``edit``, pure on
a dict: ``config.deepspeed.switch_sections``) and the value a config already holds (``of_config``, what a run
without the flag records). The memory a switch changes is the performance model's (``ds_bench.perf.states``).

A str switch's empty value is "the config's own" (no key word, no flag); ``plain`` names the value that is the same
as that (``--sp-path ulysses``: the sequence-parallel degree's own path), read as empty so that one layout has one
key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ds_bench.config.degrees.protocol import DegreeRule


@dataclass(frozen=True)
class Switch:
    field: str
    word: str
    """The key's word: ``tiled-mlp`` when on; ``opt`` -> ``opt=muon``."""
    what: str
    choices: tuple[str, ...] = ()
    """Empty: on or off (``--WORD``); else the values of ``--FLAG VALUE``."""
    flag: str = ""
    """Its ``ds-bench run`` flag and the studies' axis flag; empty: ``--WORD``."""
    plain: str = ""
    """A choice that means the same as the empty value (read as empty)."""
    long_context: bool = False
    """Only a workload that takes the long-context options takes it (``Workload.check_long_context_flag``)."""
    numerics: bool = False
    """It changes what is computed, not only how (a sweep's table then shows each point's loss)."""
    planned: bool = False
    """``ds-bench plan`` tries each of its values by default (ALST's tiling: what fits at long sequences). The
    optimizer and the master states, whose terms the model has too, are tried when named (``--optimizer
    default,muon``): they change what is trained, which ``plan`` ranks on speed and memory alone, and six times the
    candidates would make every plan six times slower."""
    rules: tuple[DegreeRule, ...] = ()
    """Its refusals, in the legality table's terms."""
    edit: Callable[[dict, object], None] | None = None
    """Writes its value into a DeepSpeed config (in place; never called with the empty value)."""
    of_config: Callable[[dict], object] | None = None
    """The value a DeepSpeed config holds already (a run without the flag); None: off."""

    @property
    def option(self) -> str:
        return self.flag or f"--{self.word}"

    @property
    def off(self):
        return "" if self.choices else False

    @property
    def axis_values(self) -> tuple[str, ...]:
        """What the studies' axis flag takes: ``off,on``, or ``default`` (the config's own: no key word) and the
        choices."""
        return ("default", *self.choices) if self.choices else ("off", "on")

    def normal(self, value):
        """A value as a layout holds it: a bool, or a choice with ``plain`` read as empty."""
        if not self.choices:
            return bool(value)
        return "" if value in (None, self.plain) else str(value)

    def of_axis(self, word: str):
        """One value of the axis flag as a layout holds it (``on`` -> True, ``ulysses`` -> "")."""
        return word == "on" if not self.choices else "" if word == "default" else self.normal(word)

    def key_word(self, value) -> str:
        """Its word in a layout's key; empty when off."""
        if not value:
            return ""
        return self.word if not self.choices else f"{self.word}={value}"

    def run_flags(self, value) -> list[str]:
        """Its ``ds-bench run`` flags for ``value``."""
        if not value:
            return []
        return [self.option] if not self.choices else [self.option, str(value)]

    def parse_word(self, part: str):
        """The value a key word gives, or None when the word is not this switch's (pure)."""
        if not self.choices:
            return True if part == self.word else None
        name, _, value = part.partition("=")
        return self.normal(value) if name == self.word and value in self.choices else None

    def value_of(self, flags):
        """A run's value as its flags give it (a ``RunConfig`` or parsed flags; what its config holds is
        ``of_config``'s, read by ``derive.axes_of``)."""
        return self.normal(getattr(flags, self.field, None))
