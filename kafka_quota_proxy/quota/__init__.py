"""Pure quota maths, Kafka-exact: sampled rates, throttle times, entity resolution.

No I/O, no clock: time comes in as an argument (milliseconds). The same code serves the live
proxy, ``kafka-quota-proxy quotas simulate`` and the Spark replay.
"""
