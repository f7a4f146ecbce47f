"""PySpark batch jobs over traffic captures: profile what clients do, replay the capture
through the proxy's own quota engine (``quota/``) under any configuration, and recommend one.
Each job is DataFrame -> DataFrame transforms; ``main.run`` is the thin entry point behind
``kafka-quota-proxy replay``."""
