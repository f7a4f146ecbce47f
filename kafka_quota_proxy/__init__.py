"""kafka-quota-proxy: a Kafka wire-protocol proxy that enforces Kafka's client quotas.

Every module of the distribution lives under this one import root (``docs/architecture.md``,
"One import root"): the layers keep their names as sub-packages (``proxy``, ``protocol``,
``quota``, ``spark_jobs``, ...), and nothing is installed at the top level that another
project could shadow or be shadowed by.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kafka-quota-proxy")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
