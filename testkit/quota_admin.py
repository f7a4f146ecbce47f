"""A client of Kafka's client quota Admin API for the end-to-end tests: kafka-python's
connection sending DescribeClientQuotas and AlterClientQuotas (its KafkaAdminClient has no
quota calls; its protocol classes have them)."""

from __future__ import annotations

from typing import Any


class Admin:
    """kafka-python's client sending the two requests (its KafkaAdminClient has no quota
    calls; its protocol classes have them)."""

    def __init__(self, bootstrap: str) -> None:
        from kafka.admin import KafkaAdminClient

        self.client = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="quota-admin")

    def _send(self, request: Any) -> Any:
        manager = self.client._manager

        async def go() -> Any:
            return await manager.send(request)

        return manager.run(go)

    def describe(self, components: list[tuple[str, int, str | None]], strict: bool = False
                 ) -> Any:
        from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest as D

        return self._send(D(components=[D.ComponentData(entity_type=t, match_type=m, match=n)
                                        for t, m, n in components], strict=strict))

    def alter(self, entries: list[tuple[tuple[tuple[str, str | None], ...],
                                        list[tuple[str, float, bool]]]],
              validate_only: bool = False) -> list[tuple[int, str | None]]:
        from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as A

        response = self._send(A(entries=[
            A.EntryData(entity=[A.EntryData.EntityData(entity_type=t, entity_name=n)
                                for t, n in entity],
                        ops=[A.EntryData.OpData(key=k, value=v, remove=r) for k, v, r in ops])
            for entity, ops in entries], validate_only=validate_only))
        return [(e.error_code, e.error_message) for e in response.entries]

    def quotas(self) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
        response = self.describe([])
        assert response.error_code == 0, response
        return {tuple((c.entity_type, c.entity_name) for c in e.entity):
                {v.key: v.value for v in e.values} for e in response.entries}

    def close(self) -> None:
        self.client.close()
