"""Which frames the proxy's features need to see, declared once per (api_key, api_version).

Frames stay opaque unless something needs them: the streams consult one ``InterestTable``,
built once from the filters' declarations (as Kroxylicious builds its decode predicate from its
filters' interests), instead of a switch per feature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import IntFlag

from protocol._api_table import API_TABLE


class Interest(IntFlag):
    """What a feature needs of the frames of one (api_key, api_version)."""

    NONE = 0
    CONSUMER_REQUEST_FRAME = 1  # a copy of the whole request frame, consumers' requests only
    PRODUCE_PARTITIONS = 2  # Produce requests walked as they pass: bytes per partition
    FETCH_PARTITIONS = 4  # Fetch responses walked as they pass: bytes per partition


Declaration = Callable[[int, int], Interest]


class InterestTable:
    """The union of the declarations, for every API and version the protocol knows."""

    __slots__ = ("_by_key", "any")

    def __init__(self, declarations: Iterable[Declaration]) -> None:
        declared = list(declarations)
        self._by_key: dict[int, tuple[Interest, ...]] = {}
        wanted = Interest.NONE
        for api_key, (_, _, top, _, _) in API_TABLE.items():
            per_version = []
            for version in range(top + 1):
                interest = Interest.NONE
                for declare in declared:
                    interest |= declare(api_key, version)
                per_version.append(interest)
                wanted |= interest
            if any(per_version):
                self._by_key[api_key] = tuple(per_version)
        self.any = wanted  # what some (api_key, version) wants

    def get(self, api_key: int, api_version: int) -> Interest:
        versions = self._by_key.get(api_key)
        if versions is None or not 0 <= api_version < len(versions):
            return Interest.NONE
        return versions[api_version]


NOTHING = InterestTable(())
