"""Error taxonomy of the protocol layer.

Every error carries a short, stable ``reason`` that becomes a log field and the label of the
closed-connections metric. Which peer broke the protocol follows from which stream raised:
the request stream reads what the client sent, the response stream what the broker sent.
Either way only that one connection closes.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """A peer sent bytes that break the Kafka protocol (or that the proxy cannot handle)."""

    reason = "protocol_error"


class NegativeFrameSize(ProtocolError):
    reason = "negative_frame_size"


class FrameTooLarge(ProtocolError):
    reason = "frame_too_large"


class MalformedFrame(ProtocolError):
    reason = "malformed_frame"


class UnknownApiKey(ProtocolError):
    reason = "unknown_api_key"


class UnsupportedVersion(ProtocolError):
    reason = "unsupported_version"


class CorrelationError(ProtocolError):
    reason = "correlation_mismatch"
