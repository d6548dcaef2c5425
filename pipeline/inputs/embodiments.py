"""Which embodiment slots a command is about, parsed once where the user's words come in (`--embodiments`,
`ConvertOptions`, `load(embodiment=)`, `build_model(embodiments=)`) and handed on as a typed value: every slot,
or the items named (tags, slot ids, and for a fine-tune `trained`), resolved into slot ids against a
checkpoint's own tag table and bank size only where those are known."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from pipeline.model.versions import VersionConfig
from tasks.entries.names import is_whole_number
from tasks.errors import CacheError, ConfigError

EVERY = "all"
TRAINED = "trained"  # --embodiments trained: the slots of the tags the fine-tune was trained for


@dataclass(frozen=True)
class TagMap:
    """A tag -> slot map, where it was read, and the slot its trainer gives a tag outside it: LeRobot packs
    `embodiment_mapping.get(tag, 0)`, so such a tag trained slot 0; None (Isaac-GR00T, the built-in table) refuses
    it, as Isaac-GR00T does."""
    ids: Mapping[str, int]
    source: str
    unknown_slot: int | None = None

    @classmethod
    def builtin(cls, cfg: VersionConfig) -> "TagMap":
        return cls(cfg.embodiment_ids, f"configs/{cfg.version}.toml")

    @classmethod
    def recorded(cls, source: Mapping, cfg: VersionConfig) -> "TagMap":
        """The map an entry's convert read tags with (its trainer's, kept in the manifest's `source`), else the
        built-in one (an entry converted before the map was recorded)."""
        table = source.get("embodiment_table") or {}
        if not isinstance(table.get("ids"), dict):
            return cls.builtin(cfg)
        return cls(table["ids"], str(source.get("embodiment_map") or "the map its convert recorded"),
                   table.get("unknown_slot"))


@dataclass(frozen=True)
class Embodiments:
    items: tuple[str, ...] = ()  # as written; () means every slot

    @classmethod
    def parse(cls, value: "str | int | Embodiments | None") -> "Embodiments":
        """`all` or None (every slot), a tag or slot id, or a comma list of them."""
        if isinstance(value, Embodiments):
            return value
        text = EVERY if value is None else str(value).strip()
        if text == EVERY:
            return cls()
        if not text:
            raise ConfigError("no embodiment selected (an empty list): pass 'all', tags or slot ids")
        items = tuple(item.strip() for item in text.split(","))
        if EVERY in items:
            raise ConfigError(f"embodiments {text!r}: 'all' selects every slot and stands alone; pass 'all', or "
                              "tags and slot ids")
        return cls(items)

    @property
    def every(self) -> bool:
        return not self.items

    def __str__(self) -> str:
        return ",".join(self.items) if self.items else EVERY

    def with_trained(self, trained: Sequence[str] | None, missing: str) -> "Embodiments":
        """`trained` replaced by the tags the fine-tune records (`missing`: what to say when it records none)."""
        if TRAINED not in self.items:
            return self
        if not trained:
            raise ConfigError(missing)
        return Embodiments(tuple(t for item in self.items for t in (trained if item == TRAINED else [item])))

    def slots(self, cfg: VersionConfig, bank_slots: int | None = None, tags: TagMap | None = None) -> tuple[int, ...]:
        """Sorted unique slot ids. `bank_slots`: how many slots the checkpoint's banks have (a synthetic `attn`
        one has 2; default the version's); every slot means each of them. `tags`: the map to read tags with (a
        checkpoint's own), else the built-in one."""
        n = bank_slots or cfg.num_slots
        if self.every:
            return tuple(range(n))
        tags = tags or TagMap.builtin(cfg)
        ids: set[int] = set()
        for item in self.items:
            if is_whole_number(item):
                slot = int(item)
            elif item in tags.ids:
                slot = tags.ids[item]
            elif tags.unknown_slot is not None:
                slot = tags.unknown_slot
            else:
                raise ConfigError(f"unknown embodiment tag {item!r} for {cfg.version} ({tags.source} knows: "
                                  f"{', '.join(sorted(tags.ids))}); pass a tag or a slot id 0..{n - 1}")
            if not 0 <= slot < n:
                which = f"slot {slot}" if is_whole_number(item) else f"{item} (slot {slot}, as {tags.source} maps it)"
                raise ConfigError(f"embodiment {which} is out of range for this {cfg.version} checkpoint: its banks "
                                  f"have slots 0..{n - 1}"
                                  + ("" if is_whole_number(item) else f"; pass a slot id 0..{n - 1}"))
            ids.add(slot)
        return tuple(sorted(ids))

    def one_tag(self) -> str | None:
        """The tag, when the selection is one tag (not a slot id); else None."""
        return self.items[0] if len(self.items) == 1 and not is_whole_number(self.items[0]) else None

    def outside(self, tags: TagMap) -> tuple[str, ...]:
        """The tags named that `tags` does not hold (each gets its trainer's slot for such a tag, or is refused)."""
        return tuple(item for item in self.items if not is_whole_number(item) and item not in tags.ids)

    def one(self, cfg: VersionConfig, what: str) -> int | None:
        """One slot id, or None for every slot: for a reader that takes one embodiment or all (`what` says which)."""
        if self.every:
            return None
        ids = self.slots(cfg)
        if len(ids) != 1:
            raise ConfigError(f"{what} takes one embodiment (a tag or slot id) or all, not {str(self)!r}: "
                              f"slots {list(ids)}")
        return ids[0]

    def among(self, cfg: VersionConfig, held: Sequence[int], holder: str, tags: TagMap | None = None
              ) -> tuple[int, ...]:
        """The slots asked for, each of which `holder` (an entry) must hold, tags read with `tags` (the map the
        entry recorded; default the built-in one); every slot means those it holds."""
        if self.every:
            return tuple(held)
        wanted = self.slots(cfg, tags=tags)
        missing = [s for s in wanted if s not in held]
        if missing:
            raise CacheError(f"{holder}: embodiment slot(s) {missing} were not converted into this entry (it holds "
                             f"{list(held)}); convert with --embodiments {','.join(map(str, wanted))} or all")
        return wanted
