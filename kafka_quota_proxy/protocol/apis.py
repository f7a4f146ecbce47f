"""API keys, header versions, and which versions the proxy offers clients.

The version table comes from kio (see ``_api_table.py`` and ``tools/gen_api_table.py``).
"""

from __future__ import annotations

from enum import IntEnum

from kafka_quota_proxy.protocol._api_table import API_TABLE


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    METADATA = 3
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    SASL_AUTHENTICATE = 36
    DESCRIBE_QUORUM = 55
    DESCRIBE_CLUSTER = 60
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79


def api_name(api_key: int) -> str:
    entry = API_TABLE.get(api_key)
    return entry[0] if entry else f"unknown_{api_key}"


def is_known(api_key: int) -> bool:
    return api_key in API_TABLE


def kio_version_range(api_key: int) -> tuple[int, int]:
    entry = API_TABLE[api_key]
    return entry[1], entry[2]


def request_is_flexible(api_key: int, api_version: int) -> bool:
    entry = API_TABLE.get(api_key)
    first = entry[3] if entry else -1
    return first >= 0 and api_version >= first


def response_is_flexible(api_key: int, api_version: int) -> bool:
    entry = API_TABLE.get(api_key)
    first = entry[4] if entry else -1
    return first >= 0 and api_version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header v2 for flexible versions, v1 otherwise (v0 is only ControlledShutdown v0,
    an inter-broker API the proxy does not accept)."""
    return 2 if request_is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header v1 for flexible versions, v0 otherwise; ApiVersions always uses v0 so a
    client can read it whatever version the broker answered with."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if response_is_flexible(api_key, api_version) else 0


# Responses that may carry a broker address (or, for ApiVersions, the version ranges the
# proxy must cap). Value: the lowest version of that API that needs the proxy's attention.
ADDRESS_BEARING: dict[int, int] = {
    ApiKey.API_VERSIONS: 0,
    ApiKey.METADATA: 0,
    ApiKey.FIND_COORDINATOR: 0,
    ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.PRODUCE: 10,  # KIP-951 node_endpoints
    ApiKey.FETCH: 16,  # KIP-951 node_endpoints
    ApiKey.SHARE_FETCH: 0,  # KIP-932 node_endpoints
    ApiKey.SHARE_ACKNOWLEDGE: 0,
}

# Extra caps, each with its reason:
# - DescribeQuorum v2 lists controller listener endpoints (host, port): clients stay on v1.
# - SaslHandshake v0 is followed by raw, header-less SASL tokens the proxy cannot frame: v1+.
_MAX_CAPS: dict[int, int] = {ApiKey.DESCRIBE_QUORUM: 1}
# APIs the proxy answers itself, never forwarded, and the versions it answers (KIP-546's
# client quota admin APIs: ``protocol.client_quota_frames``)
ANSWERED_BY_PROXY: dict[int, tuple[int, int]] = {
    48: (0, 1), 49: (0, 1)}  # DescribeClientQuotas, AlterClientQuotas
_MIN_CAPS: dict[int, int] = {ApiKey.SASL_HANDSHAKE: 1}
# Read by the proxy (SASL inspection: the mechanism, the client's identity, the broker's
# verdict): capped at the highest version kio decodes.
DECODED: frozenset[int] = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


def needs_response_rewrite(api_key: int, api_version: int) -> bool:
    lowest = ADDRESS_BEARING.get(api_key)
    return lowest is not None and api_version >= lowest


def offered_range(api_key: int, broker_min: int, broker_max: int) -> tuple[int, int] | None:
    """The version range the proxy offers a client for one API, or ``None`` to hide the API.

    Unknown API keys are hidden. Address-bearing APIs are capped at the highest version kio
    can decode (the proxy must be able to rewrite them); every other API passes through at
    the broker's range since the proxy forwards those frames without decoding them.
    ApiVersions itself is not capped: the proxy edits only its leading ``api_keys`` array,
    whose layout every version shares.
    """
    entry = API_TABLE.get(api_key)
    if entry is None:
        return None
    lo, hi = broker_min, broker_max
    if api_key in ADDRESS_BEARING and api_key != ApiKey.API_VERSIONS:
        hi = min(hi, entry[2])
        if ADDRESS_BEARING[api_key] < entry[1]:  # versions below kio's would need rewriting
            lo = max(lo, entry[1])
    elif api_key in DECODED:
        hi = min(hi, entry[2])
    if api_key in _MAX_CAPS:
        hi = min(hi, _MAX_CAPS[api_key])
    if api_key in _MIN_CAPS:
        lo = max(lo, _MIN_CAPS[api_key])
    if lo > hi:
        return None
    return lo, hi


def accepts_request_version(api_key: int, api_version: int) -> bool:
    """Whether the proxy can carry a request of this version (the response must be decodable
    when the API is address-bearing)."""
    if api_version < 0:
        return False
    if (
        api_key != ApiKey.API_VERSIONS
        and needs_response_rewrite(api_key, api_version)
        and not API_TABLE[api_key][1] <= api_version <= API_TABLE[api_key][2]
    ):
        return False
    if api_key in _MAX_CAPS and api_version > _MAX_CAPS[api_key]:
        return False
    if api_key in DECODED and api_version > API_TABLE[api_key][2]:
        return False
    return not (api_key in _MIN_CAPS and api_version < _MIN_CAPS[api_key])
