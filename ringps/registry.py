"""Name -> class registries for strategies, selectors, memories, policies, datasets and models.

`@STRATEGIES.register("ring-topk")` on a class makes it buildable by name; an unknown name fails
with the list of the known ones (STYLE.md rule 1: registries, not if/elif).
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from ringps.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return add

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ConfigError(self.unknown(name))
        return self._entries[name]

    def unknown(self, name: str) -> str:
        return f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}"

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.get(name)(*args, **kwargs)  # type: ignore[operator]
