"""Kafka framing shared by the two directions of one proxied connection
(``protocol.request_stream``: client -> broker; ``protocol.response_stream``: broker -> client).

Kafka frames are a 4-byte big-endian size followed by that many bytes. The proxy does not
wait for whole frames it does not need to change: once a frame's size and header are read
and accepted, the rest of the frame is forwarded as it arrives, as the same bytes. Only
responses that must be rewritten (what ``protocol.interests`` says, per API and version, or
what the caller asks for when a response starts) are held until complete and handed to the
rewriter.

Sizes are checked before any buffering: a negative size or one above ``max_frame_bytes``
raises at once, so a hostile size never causes an allocation.
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.errors import FrameTooLarge, NegativeFrameSize

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes

Buffer = bytes | memoryview
NOTHING = memoryview(b"")


def check_size(size: int, max_frame_bytes: int) -> None:
    if size < 0:
        raise NegativeFrameSize(f"frame size {size} is negative")
    if size > max_frame_bytes:
        raise FrameTooLarge(f"frame size {size} exceeds the maximum of {max_frame_bytes} bytes")
