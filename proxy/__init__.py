"""The network runtime: listeners, connections, filters. Imports config, protocol, quota, routing"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kafka-quota-proxy")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
