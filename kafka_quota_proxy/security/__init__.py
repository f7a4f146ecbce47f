"""Identities, pure: Kafka's principal mapping rules, X.500 names of certificates, SASL messages and SCRAM maths; imports nothing else of the project."""  # noqa: E501
