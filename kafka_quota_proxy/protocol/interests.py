"""Which frames the proxy's features need to see, declared once per (api_key, api_version).

Frames stay opaque unless something needs them: the streams consult one ``InterestTable``,
built once from the filters' declarations (as Kroxylicious builds its decode predicate from its
filters' interests), instead of a switch per feature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import IntFlag

from kafka_quota_proxy.protocol import apis
from kafka_quota_proxy.protocol._api_table import API_TABLE

# Fetch versions whose broker addresses (KIP-951 node_endpoints) are rewritten while the
# response streams: only the top-level tagged fields are held back.
FETCH_STREAMED_FROM = 16


class Interest(IntFlag):
    """What a feature needs of the frames of one (api_key, api_version)."""

    NONE = 0
    REQUEST_FRAME = 1  # a copy of the whole request frame
    PRODUCE_PARTITIONS = 2  # Produce requests walked as they pass: bytes per partition
    FETCH_PARTITIONS = 4  # Fetch responses walked as they pass: bytes per partition
    RESPONSE_FRAME = 8  # every response held whole: the filters' response_frame, then the rewriter
    RESPONSE_TAIL = 16  # responses streamed, their top-level tagged fields handed to the rewriter
    # requests the proxy answers itself: read whole before any byte goes upstream (so that the
    # frame can always be replaced), and their responses held whole (replaced by the answer);
    # implies REQUEST_FRAME and RESPONSE_FRAME
    ANSWERED = 32
    # requests read whole before any byte goes upstream (at most 1 MiB: see
    # ``request_stream.WHOLE_FRAME_MAX``), so that their frame can be replaced
    WHOLE_REQUEST = 64
    # Produce frames followed as they pass, their topics given to ``watch_produce``
    PRODUCE_TOPICS = 128


Declaration = Callable[[int, int], Interest]


class InterestTable:
    """The union of the declarations, for every API and version the protocol knows. Built once
    per listener; what the streams ask per frame is answered from plain sets and booleans (the
    enum's operators are Python-level code, too slow for the hot path)."""

    __slots__ = ("_answered", "_request_frames", "_whole", "answered_keys", "fetch_partitions",
                 "produce_partitions", "produce_topics", "response_frames", "response_tails",
                 "wants_answered", "wants_request_frames", "wants_whole")

    def __init__(self, declarations: Iterable[Declaration]) -> None:
        declared = list(declarations)
        wanted = Interest.NONE
        request_frames: set[tuple[int, int]] = set()
        frames: set[tuple[int, int]] = set()
        tails: set[tuple[int, int]] = set()
        answered: set[tuple[int, int]] = set()
        whole: set[tuple[int, int]] = set()
        for api_key, (_, _, top, _, _) in API_TABLE.items():
            for version in range(top + 1):
                interest = Interest.NONE
                for declare in declared:
                    interest |= declare(api_key, version)
                if interest & Interest.ANSWERED:
                    answered.add((api_key, version))
                    interest |= Interest.REQUEST_FRAME | Interest.RESPONSE_FRAME
                if interest & (Interest.ANSWERED | Interest.WHOLE_REQUEST):
                    whole.add((api_key, version))
                wanted |= interest
                if interest & Interest.REQUEST_FRAME:
                    request_frames.add((api_key, version))
                if interest & Interest.RESPONSE_FRAME:
                    frames.add((api_key, version))
                elif interest & Interest.RESPONSE_TAIL:  # a whole frame includes its tail
                    tails.add((api_key, version))
        self._request_frames = frozenset(request_frames)
        # (api_key, api_version) pairs; the response stream tests membership per response
        self.response_frames = frozenset(frames)
        self.response_tails = frozenset(tails)
        self.wants_request_frames = bool(request_frames)
        self._answered = frozenset(answered)
        self.wants_answered = bool(answered)
        # the APIs the proxy answers at some version: their frames never reach the broker, so
        # they are read whole whatever their size (``request_stream``: at most
        # ``WHOLE_FRAME_MAX``, else the connection closes)
        self.answered_keys = frozenset(api_key for api_key, _ in answered)
        self._whole = frozenset(whole)
        self.wants_whole = bool(whole)
        self.produce_topics = bool(wanted & Interest.PRODUCE_TOPICS)
        self.produce_partitions = bool(wanted & Interest.PRODUCE_PARTITIONS)
        self.fetch_partitions = bool(wanted & Interest.FETCH_PARTITIONS)

    def request_frame(self, api_key: int, api_version: int) -> bool:
        """Whether a client's request of this API and version is wanted whole."""
        return (api_key, api_version) in self._request_frames


    def answered(self, api_key: int, api_version: int) -> bool:
        """Whether requests of this API and version are answered by the proxy (read whole)."""
        return (api_key, api_version) in self._answered

    def whole(self, api_key: int, api_version: int) -> bool:
        """Whether requests of this API and version are read whole before forwarding."""
        return (api_key, api_version) in self._whole


def addresses(api_key: int, api_version: int) -> Interest:
    """The address rewriter's declaration: every response that may carry a broker address (or,
    for ApiVersions, version ranges to cap) is rewritten whole, except Fetch v16+, whose only
    addresses are in its top-level tagged fields, rewritten as the response streams."""
    if api_key == apis.ApiKey.FETCH and api_version >= FETCH_STREAMED_FROM:
        return Interest.RESPONSE_TAIL
    if apis.needs_response_rewrite(api_key, api_version):
        return Interest.RESPONSE_FRAME
    return Interest.NONE


NOTHING = InterestTable(())
ADDRESSES = InterestTable([addresses])  # what every proxied connection needs
